"""A settings change stops the session branch with one sentence; `sessionize refresh` is guarded,
rebuilds the session models under the new settings through Dagster, and runs go on."""

from __future__ import annotations

import datetime as dt

import pytest
from dagster import DagsterInstance

from sessionize_assets.cli import main
from sessionize_assets.commands.refresh import refresh_refusal
from sessionize_assets.commands.sessions import run_sessions, verify_sessions
from sessionize_assets.errors import SettingsError
from sessionize_assets.home import Home
from sessionize_assets.resources.spark import SparkDeltaResource
from sessionize_assets.sessions.state import read_manifest
from sessionize_assets_tests.commands.test_sessions import DAY0, day_rows, lake
from sessionize_assets_tests.sessions.support import make_settings, write_load_day


def test_refresh_refusals_name_what_to_do():
    enabled = ("sessions", "users")
    assert refresh_refusal(["sessions"], enabled, yes=True, allowed=False) is None
    assert refresh_refusal([], enabled, yes=False, allowed=True) is None
    assert "confirm it with --yes" in refresh_refusal([], enabled, yes=False, allowed=False)
    assert "time-based branch" in refresh_refusal(["daily_aggregates"], enabled, True, False)
    assert "is not enabled" in refresh_refusal(["user_session_stats"], enabled, True, False)
    assert "is not a model" in refresh_refusal(["session"], enabled, True, False)


def test_a_settings_change_stops_the_run_until_a_confirmed_refresh(spark, home, capsys):
    settings = make_settings(start_date=DAY0.isoformat(), backfill_limit_days=5)
    for i in range(3):
        day = DAY0 + dt.timedelta(days=i)
        write_load_day(spark, home, day, day_rows(day))
    instance = DagsterInstance.ephemeral()
    first = run_sessions(
        lake(home, settings, "2021-01-04T00:00:00"), SparkDeltaResource(), instance
    )
    assert first.ok and first.caught_up, "\n".join(first.lines())
    assert read_manifest(Home(home).table)["sessions"].definition

    changed = settings.replace(session_mode="gap")
    day = DAY0 + dt.timedelta(days=3)
    write_load_day(spark, home, day, day_rows(day))
    now = "2021-01-05T00:00:00"
    with pytest.raises(SettingsError, match="session_mode changed from id to gap"):
        run_sessions(lake(home, changed, now), SparkDeltaResource(), instance)

    cli = ["--home", str(home), "--now", now]
    capsys.readouterr()
    assert main([*cli, "refresh"]) == 2
    assert "error: A refresh rebuilds every session model" in capsys.readouterr().err
    assert main([*cli, "refresh", "sessions", "--yes"]) == 0
    out = capsys.readouterr().out
    assert "Refreshed sessions, users in full from filtered_events" in out, out
    assert "refresh requested" in out, out
    assert read_manifest(Home(home).table)["sessions"].definition.find('"session_mode":"gap"') >= 0

    after = run_sessions(lake(home, changed, now), SparkDeltaResource(), instance)
    assert after.ok, "\n".join(after.lines())
    report = verify_sessions(lake(home, changed, now), spark)
    assert report.ok, "\n".join(report.lines())
    assert report.compared["sessions"] == 8  # 2 users x 4 days, recomputed in gap mode
