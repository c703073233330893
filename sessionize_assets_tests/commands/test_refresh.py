"""A settings change stops the session branch with one sentence; `sessionize refresh` is guarded,
rebuilds the session models under the new settings through Dagster, and runs go on."""

from __future__ import annotations

import datetime as dt
import shutil

import pytest
from dagster import DagsterInstance, build_sensor_context
from deltalake import DeltaTable

from sessionize_assets.cli import main
from sessionize_assets.commands.refresh import refresh_refusal
from sessionize_assets.commands.sessions import run_sessions, verify_sessions
from sessionize_assets.commands.time_based import _Runner
from sessionize_assets.definitions import build_definitions
from sessionize_assets.errors import SettingsError
from sessionize_assets.home import Home
from sessionize_assets.refresh_job import REFRESH_JOB
from sessionize_assets.resources.lake import LakeResource
from sessionize_assets.resources.spark_resource import SparkDeltaResource
from sessionize_assets.resources.tables import FILTERED_EVENTS
from sessionize_assets.sensors.late_days import build_sensors as late_days_sensors
from sessionize_assets.sensors.new_loads import build_sensors as new_loads_sensors
from sessionize_assets.sessions.state import read_manifest
from sessionize_assets_tests.commands.test_sessions import DAY0, day_rows, lake
from sessionize_assets_tests.conftest import TWO_DAYS_START, cli_now
from sessionize_assets_tests.sessions.support import make_settings, write_load_day


def test_refresh_refusals_name_what_to_do():
    enabled = ("sessions", "users")
    assert refresh_refusal(["sessions"], enabled, yes=True, allowed=False) is None
    assert refresh_refusal([], enabled, yes=False, allowed=True) is None
    assert "confirm it with --yes" in refresh_refusal([], enabled, yes=False, allowed=False)
    assert refresh_refusal(["daily_aggregates"], enabled, True, False) is None
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
    # A reader holding the old table (a delta-rs snapshot, as a dashboard or an export would).
    reader = DeltaTable(Home(home).table("sessions"))
    held_version = reader.version()
    held_rows = sorted(reader.to_pyarrow_table().to_pylist(), key=lambda r: r["session_identifier"])
    capsys.readouterr()
    assert main([*cli, "refresh"]) == 2
    assert "error: A refresh rebuilds every session model" in capsys.readouterr().err
    assert main([*cli, "refresh", "sessions", "--yes"]) == 0
    out = capsys.readouterr().out
    assert "Refreshed sessions, users in full from filtered_events" in out, out
    assert "refresh requested" in out, out
    assert read_manifest(Home(home).table)["sessions"].definition.find('"session_mode":"gap"') >= 0
    # The refresh replaced the table in one commit: the reader kept reading the old version
    # whole until it asked for the new one, which holds only gap-mode sessions.
    after_refresh = DeltaTable(Home(home).table("sessions"))
    commits = [h for h in after_refresh.history() if h.get("version", -1) > held_version]
    print("sessions commits of the refresh:", [(h["version"], h["operation"]) for h in commits])
    assert len(commits) == 1, commits
    assert (
        sorted(reader.to_pyarrow_table().to_pylist(), key=lambda r: r["session_identifier"])
        == held_rows
    )
    assert not {r["session_identifier"] for r in held_rows} & {
        r["session_identifier"] for r in after_refresh.to_pyarrow_table().to_pylist()
    }

    after = run_sessions(lake(home, changed, now), SparkDeltaResource(), instance)
    assert after.ok, "\n".join(after.lines())
    report = verify_sessions(lake(home, changed, now), spark)
    assert report.ok, "\n".join(report.lines())
    assert report.compared["sessions"] == 8  # 2 users x 4 days, recomputed in gap mode


def test_a_changed_filter_stops_the_time_based_branch_until_a_confirmed_refresh(
    spark, two_days, tmp_path, capsys
):
    home = tmp_path / "home"
    shutil.copytree(two_days[0], home)
    cli = ["--home", str(home), *cli_now(3)]
    filtered = Home(home).table(FILTERED_EVENTS)
    names_before = {
        r[0]
        for r in spark.read.format("delta").load(filtered).select("event_name").distinct().collect()
    }
    assert len(names_before) > 1
    # A run limit of one load day: the refresh still changes each table in one commit.
    (home / "sessionize.yaml").write_text(
        f"start_date: {TWO_DAYS_START}\nevent_names: [page_view]\nbackfill_limit_days: 1\n"
    )

    capsys.readouterr()
    assert main([*cli, "run"]) == 2
    err = capsys.readouterr().err
    assert "The setting event_names changed from [] to [page_view] since filtered_events" in err
    assert "`sessionize refresh filtered_events --yes`" in err
    assert main([*cli, "backfill", "--start", "2024-03-01", "--end", "2024-03-01"]) == 2
    # A run the sensors or the UI launch fails with the same sentence, before writing anything.
    resource = LakeResource(
        home=str(home), config_file=str(home / "sessionize.yaml"), now="2024-03-03T00:30:00"
    )
    version = DeltaTable(filtered).version()
    with pytest.raises(Exception, match="event_names changed from"):
        _Runner(resource, DagsterInstance.ephemeral()).run(
            ("filtered_events",), dt.date(2024, 3, 2), dt.date(2024, 3, 2)
        )
    assert DeltaTable(filtered).version() == version
    # The time-based sensors skip with it instead of launching runs that would fail.
    for build in (new_loads_sensors, late_days_sensors):
        sensor = build(resource.settings)[0]
        with build_sensor_context(
            instance=DagsterInstance.ephemeral(), resources={"lake": resource}
        ) as context:
            result = sensor(context)
        assert "event_names changed from [] to [page_view]" in str(result.skip_reason), build
    assert main([*cli, "refresh", "filtered_events"]) == 2
    assert "rebuilds every load day of the time-based branch" in capsys.readouterr().err

    held = {
        name: DeltaTable(Home(home).table(name)).version()
        for name in (FILTERED_EVENTS, "daily_aggregates")
    }
    assert main([*cli, "refresh", "filtered_events", "--yes"]) == 0, capsys.readouterr()
    out = capsys.readouterr().out
    assert "re-materialized for 2024-03-01..2024-03-02" in out, out
    for name, version in held.items():
        commits = _data_commits(Home(home).table(name), version)
        assert len(commits) == 1, (name, commits)
    names = spark.read.format("delta").load(filtered).select("event_name").distinct().collect()
    assert [r[0] for r in names] == ["page_view"]
    assert main([*cli, "verify"]) == 0, capsys.readouterr()
    assert main([*cli, "run"]) == 0, capsys.readouterr()

    # A setting that shapes both branches: refused before any rebuild unless both are named.
    (home / "sessionize.yaml").write_text(
        f"start_date: {TWO_DAYS_START}\nevent_names: [page_view]\n"
        "user_identifier: [user_id, domain_userid]\n"
    )
    capsys.readouterr()
    assert main([*cli, "refresh", "daily_aggregates", "--yes"]) == 2
    err = capsys.readouterr().err
    assert "user_identifier changed" in err and "name both" in err, err


def _data_commits(path: str, after: int) -> list[tuple[int, str]]:
    """(version, operation) of the commits after `after` that changed data."""
    from sessionize_assets.core.maintenance import NO_DATA_OPERATIONS

    return sorted(
        (h["version"], h["operation"])
        for h in DeltaTable(path).history()
        if h["version"] > after and h["operation"] not in NO_DATA_OPERATIONS
    )


def _files_of_load_day(path: str, day: str) -> set[str]:
    from sessionize_assets.resources.delta import add_actions

    return {a["path"] for a in add_actions(path)[1] if str(a["partition.load_date"]) == day}


def test_refresh_from_a_day_restates_later_days_from_the_command_line_and_the_ui(
    spark, two_days, tmp_path, capsys
):
    home = tmp_path / "home"
    shutil.copytree(two_days[0], home)
    # A run limit of one load day: a refresh still changes each table in one commit.
    (home / "sessionize.yaml").write_text(f"start_date: {TWO_DAYS_START}\nbackfill_limit_days: 1\n")
    cli = ["--home", str(home), *cli_now(3)]
    table = Home(home).table
    held = {
        name: DeltaTable(table(name)).version() for name in (FILTERED_EVENTS, "daily_aggregates")
    }
    first_day_files = _files_of_load_day(table(FILTERED_EVENTS), "2024-03-01")
    # A damaged sessions table: one session of the second day is gone, so verify fails.
    sessions = spark.read.format("delta").load(table("sessions"))
    lost = sessions.filter("to_date(start_tstamp) = '2024-03-02'").first()["session_identifier"]
    spark.sql(f"DELETE FROM delta.`{table('sessions')}` WHERE session_identifier = '{lost}'")
    capsys.readouterr()
    assert main([*cli, "verify"]) == 1, capsys.readouterr()

    restate = [*cli, "refresh", "daily_aggregates", "sessions", "--from", "2024-03-02"]
    assert main(restate) == 2
    assert "confirm it with --yes" in capsys.readouterr().err
    # The same restatement from the UI's refresh_job: unconfirmed, it fails with the sentence.
    refresh_job = build_definitions(home, now="2024-03-03T00:30:00").get_job_def(REFRESH_JOB)
    config = {"models": ["daily_aggregates", "sessions"], "from_day": "2024-03-02"}
    refused = refresh_job.execute_in_process(
        run_config={"ops": {"refresh_models": {"config": config}}},
        instance=DagsterInstance.ephemeral(),
        raise_on_error=False,
    )
    assert not refused.success
    assert "confirm it with --yes" in str(refused.failure_data_for_node("refresh_models"))
    done = refresh_job.execute_in_process(
        run_config={"ops": {"refresh_models": {"config": {**config, "yes": True}}}},
        instance=DagsterInstance.ephemeral(),
    )
    out = "\n".join(done.output_for_node("refresh_models"))
    assert "re-materialized for 2024-03-02\n" in out, out
    assert "for every session with an event from 2024-03-02 on" in out, out
    # Load day 1 kept its files; each time-based table changed in one commit (with a limit of
    # one load day per run); the lost session is back.
    assert _files_of_load_day(table(FILTERED_EVENTS), "2024-03-01") == first_day_files
    for name, version in held.items():
        commits = _data_commits(table(name), version)
        assert len(commits) == 1, (name, commits)
    restored = spark.read.format("delta").load(table("sessions"))
    assert restored.filter(f"session_identifier = '{lost}'").count() == 1
    capsys.readouterr()
    assert main([*cli, "verify"]) == 0, capsys.readouterr().out[-2000:]

    # A restatement keeps earlier rows, so it cannot apply a settings change.
    (home / "sessionize.yaml").write_text(
        f"start_date: {TWO_DAYS_START}\nbackfill_limit_days: 1\nevent_names: [page_view]\n"
    )
    assert main([*cli, "refresh", "filtered_events", "--from", "2024-03-02", "--yes"]) == 2
    err = capsys.readouterr().err
    assert "cannot apply a settings change (run it without --from)" in err, err
    assert "event_names changed from [] to [page_view]" in err, err
