"""`run_sessions`, `verify_sessions` and `status_sessions`: the session branch from the CLI."""

from __future__ import annotations

import datetime as dt

from dagster import DagsterInstance
from delta.tables import DeltaTable

from sessionize_assets.commands.sessions import run_sessions, status_sessions, verify_sessions
from sessionize_assets.core.run_limits import PackageState
from sessionize_assets.home import Home
from sessionize_assets.resources.delta import fresh_table, read_small_table
from sessionize_assets.resources.lake import LakeResource
from sessionize_assets.resources.spark_resource import SparkDeltaResource
from sessionize_assets.resources.tables import (
    FILTERED_EVENTS,
    SESSIONS,
    SESSIONS_LIFECYCLE_MANIFEST,
    USERS,
)
from sessionize_assets_tests.sessions.support import (
    event,
    make_settings,
    write_load_day,
    write_settings,
)

DAY0 = dt.date(2021, 1, 1)


def day_rows(day: dt.date) -> list[dict]:
    rows = []
    for u in range(2):
        for minute in (0, 10, 20):
            when = dt.datetime.combine(day, dt.time(9, minute + u), tzinfo=dt.UTC)
            rows.append(
                event(when, f"user{u}", f"user{u}-{day}", loaded=when + dt.timedelta(minutes=1))
            )
    return rows


def lake(home, settings, now: str) -> LakeResource:
    return LakeResource(home=str(home), config_file=str(write_settings(home, settings)), now=now)


def test_run_until_caught_up_then_status_and_verify(spark, home):
    settings = make_settings(start_date=DAY0.isoformat(), backfill_limit_days=2)
    for i in range(4):
        write_load_day(
            spark, home, DAY0 + dt.timedelta(days=i), day_rows(DAY0 + dt.timedelta(days=i))
        )
    now = "2021-01-05T00:00:00"
    resource = lake(home, settings, now)

    before = status_sessions(resource)
    assert before.limits.state == PackageState.FIRST_RUN
    assert (
        "  next run: Snowplow: Processing data between 2021-01-01 00:00:00 and 2021-01-03 00:00:00"
        in before.lines()
    )
    assert before.pending_versions == {"sessions": 5, "users": 5}

    instance = DagsterInstance.ephemeral()
    report = run_sessions(resource, SparkDeltaResource(), instance)
    assert report.ok and report.caught_up, "\n".join(report.lines())
    assert [r.state_message for r in report.runs][
        0
    ] == "Snowplow: No data in manifest. Processing data from start_date"
    assert report.runs[-1].upper_limit == dt.datetime(2021, 1, 5, tzinfo=dt.UTC)
    assert len(report.runs) == 3
    assert all(m.status == "ran" for r in report.runs for m in r.models)
    # every run is recorded in the instance the CLI passes in
    assert len(instance.get_runs()) == 3

    after = status_sessions(resource)
    assert after.limits.state == PackageState.STANDARD
    assert after.pending_versions == {"sessions": 0, "users": 0}
    assert any(
        line.startswith("  sessions: last_success 2021-01-04 09:21:00") for line in after.lines()
    )

    # Nothing new: no Dagster run, no event read (the Delta log and the manifest say so).
    again = run_sessions(resource, SparkDeltaResource(), instance)
    assert again.ok and again.caught_up and again.runs == []
    assert again.nothing_new and "consumed filtered_events v4" in again.nothing_new
    assert len(instance.get_runs()) == 3

    verified = verify_sessions(resource, spark)
    assert verified.ok, "\n".join(verified.lines())
    assert verified.compared == {"sessions": 8, "users": 2}

    # tampering is named: a session's count, a missing user
    DeltaTable.forPath(spark, Home(home).table(SESSIONS)).update(
        "session_identifier = 'user0-2021-01-02'", {"total_events": "99"}
    )
    DeltaTable.forPath(spark, Home(home).table(USERS)).delete("user_identifier = 'user1'")
    broken = verify_sessions(resource, spark)
    lines = [d.line() for d in broken.differences]
    assert "sessions: different user0-2021-01-02: total_events: table 99, recompute 3" in lines
    assert any(line.startswith("users: missing user1: the recompute has") for line in lines)

    # new data not yet consumed is named too
    write_load_day(spark, home, DAY0 + dt.timedelta(days=4), day_rows(DAY0 + dt.timedelta(days=4)))
    pending = verify_sessions(resource, spark)
    assert any(d.kind == "pending" and d.table == "sessions" for d in pending.differences)
    assert status_sessions(resource).pending_versions["sessions"] == 1


def test_a_gap_longer_than_the_backfill_limit_stops_with_a_reason(spark, home):
    settings = make_settings(start_date=DAY0.isoformat(), backfill_limit_days=3)
    late_day = DAY0 + dt.timedelta(days=10)
    write_load_day(spark, home, late_day, day_rows(late_day))
    resource = lake(home, settings, "2021-01-20T00:00:00")
    report = run_sessions(resource, SparkDeltaResource(), DagsterInstance.ephemeral())
    assert report.ok and not report.caught_up
    assert len(report.runs) == 1
    run = report.runs[0]
    assert (
        run.window_message
        == "Snowplow: Processing data between 2021-01-01 00:00:00 and 2021-01-04 00:00:00"
    )
    assert [m.status for m in run.models] == ["no data", "no data"]
    assert any(w.startswith("Snowplow Warning: No data in filtered_events") for w in run.warnings)
    assert "data resumes at 2021-01-11 09:00:00" in report.stopped
    assert status_sessions(resource).manifest == {}  # nothing moved


def test_verify_replays_id_modes_memory_from_the_recorded_runs(spark, home):
    """id mode keeps a session's first-seen user; a bug that wrote another user everywhere
    (lifecycle, sessions, users) agrees with itself, and only a replay of the recorded runs
    (`verify --replay`), oldest first from an empty memory, can see it. After a VACUUM the old
    versions a replay reads may be gone: verify says so and takes the memory as given."""
    settings = make_settings(start_date=DAY0.isoformat(), backfill_limit_days=2, session_mode="id")
    day1 = DAY0 + dt.timedelta(days=1)
    at = lambda day, h, m: dt.datetime.combine(day, dt.time(h, m), tzinfo=dt.UTC)  # noqa: E731
    first = [event(at(DAY0, 9, m), "alice", "s1", loaded=at(DAY0, 9, 30)) for m in (0, 10)]
    # The load day written twice, as a reload does: the first write's file is left unreferenced.
    write_load_day(spark, home, DAY0, first[:1])
    write_load_day(
        spark, home, DAY0, first + [event(at(DAY0, 11, 0), "bob", "s2", loaded=at(DAY0, 11, 5))]
    )
    resource = lake(home, settings, "2021-01-02T00:00:00")
    instance = DagsterInstance.ephemeral()
    assert run_sessions(resource, SparkDeltaResource(), instance).ok
    # A day later, a late event of s1 from another (larger) user: s1 keeps alice, first seen;
    # a recompute without memory would name zed (the largest user among its events).
    write_load_day(
        spark,
        home,
        day1,
        [event(at(DAY0, 9, 20), "zed", "s1", loaded=at(day1, 8, 0))]
        + [event(at(day1, 7, 0), "bob", "s3", loaded=at(day1, 7, 5))],
    )
    resource = lake(home, settings, "2021-01-02T12:00:00")
    assert run_sessions(resource, SparkDeltaResource(), instance).ok

    # (That a replay of a correct history finds nothing, the random histories of
    # sessions/test_equivalence.py show in id mode.)
    lifecycle = read_small_table(Home(home).table(SESSIONS_LIFECYCLE_MANIFEST))
    assert {r["session_identifier"]: r["user_identifier"] for r in lifecycle} == {
        "s1": "alice",
        "s2": "bob",
        "s3": "bob",
    }
    # The bug: zed written as s1's user everywhere, consistently.
    for table in (SESSIONS_LIFECYCLE_MANIFEST, SESSIONS):
        DeltaTable.forPath(spark, Home(home).table(table)).update(
            "session_identifier = 's1'", {"user_identifier": "'zed'"}
        )
    DeltaTable.forPath(spark, Home(home).table(USERS)).update(
        "user_identifier = 'alice'", {"user_identifier": "'zed'"}
    )
    # Without --replay, verify takes the memory as given (cheap, one recompute), which agrees
    # with the bug, and says what --replay would do.
    cheap = verify_sessions(resource, spark)
    assert cheap.ok and cheap.runs_replayed is None, "\n".join(cheap.lines())
    assert "`sessionize verify --replay` replays the 2 recorded session run(s)" in (
        cheap.lifecycle_given or ""
    )
    broken = verify_sessions(resource, spark, replay=True)
    assert broken.runs_replayed == 2 and broken.lifecycle_given is None
    assert broken.compared["sessions_lifecycle_manifest"] == 3
    assert any("replayed from 2 recorded session run(s)" in line for line in broken.lines())
    lines = [d.line() for d in broken.differences]
    assert (
        "sessions_lifecycle_manifest: different s1: user_identifier: table 'zed', recompute 'alice'"
        in lines
    ), lines
    assert "sessions: different s1: user_identifier: table 'zed', recompute 'alice'" in lines

    # A VACUUM that deletes files of filtered_events: old versions may have lost theirs, so no
    # replay now; the memory is taken as given, which agrees with the bug, and the report says why.
    # (delta-rs's VACUUM, which records its commits as Spark's does: milliseconds, not a minute.)
    vacuum = fresh_table(Home(home).table(FILTERED_EVENTS)).vacuum(
        retention_hours=0, enforce_retention_duration=False, dry_run=False
    )
    assert vacuum, "the first write's file was to be deleted"
    given = verify_sessions(resource, spark, replay=True)
    assert given.runs_replayed is None
    assert given.lifecycle_given and "VACUUM deleted files of filtered_events" in (
        given.lifecycle_given
    )
    assert given.ok, "\n".join(given.lines())
    assert "sessions_lifecycle_manifest" not in given.compared
