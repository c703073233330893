"""How the session models move: what a run reads, a new model's backfill (state 2), a model
that failed (state 3), and a change feed that no longer covers the consumed version."""

from __future__ import annotations

import datetime as dt
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
from pyspark.sql import functions as F

from sessionize_assets.commands.sessions import verify_sessions
from sessionize_assets.core.run_limits import PackageState
from sessionize_assets.home import Home
from sessionize_assets.resources.lake import LakeResource
from sessionize_assets.resources.tables import FILTERED_EVENTS, SESSIONS, USERS
from sessionize_assets.sessions.outcome import SessionModelError
from sessionize_assets.sessions.state import current_limits, read_manifest
from sessionize_assets_tests.plans import executed_nodes, metric
from sessionize_assets_tests.sessions.support import (
    delete_events,
    event,
    make_settings,
    rows_of,
    run,
    run_until_caught_up,
    table,
    utc,
    write_load_day,
    write_load_days,
    write_settings,
)

DAY0 = dt.date(2021, 1, 1)


def daily_activity(day: dt.date, users: int = 3) -> list[dict]:
    """Every user: a morning and an evening session of 4 events, loaded the same day."""
    rows = []
    for u in range(users):
        for hour in (8, 19):
            for minute in (0, 5, 10, 15):
                when = dt.datetime.combine(day, dt.time(hour, minute + u), tzinfo=dt.UTC)
                rows.append(
                    event(
                        when,
                        f"user{u}",
                        f"user{u}-{day}-{hour}",
                        loaded=when + dt.timedelta(minutes=5),
                    )
                )
    return rows


def two_chains(day: dt.datetime) -> list[dict]:
    """Gap mode's two sessions of user `u` on `day`: A (09:00-09:05) and B (10:00-10:10), loaded
    a minute after each event; a late event at 09:32 is within 30 minutes of both."""
    at = [dt.timedelta(hours=9, minutes=m) for m in (0, 5)]
    at += [dt.timedelta(hours=10, minutes=m) for m in (0, 10)]
    return [event(day + t, "u", loaded=day + t + dt.timedelta(minutes=1)) for t in at]


@contextmanager
def stopped_at(monkeypatch, point: str, when: Callable[[], bool] = lambda: True) -> Iterator[None]:
    """The session run inside stops (an exception) the first time it reaches the fail point
    `point` while `when()` holds, as a kill there would stop it; the body must fail so."""
    from sessionize_assets import faults

    original = faults.point

    def stop(name: str) -> None:
        if name == point and when():
            raise RuntimeError(f"stopped at {point}")
        original(name)

    monkeypatch.setattr(faults, "point", stop)
    try:
        with pytest.raises(SessionModelError, match=f"stopped at {point}"):
            yield
    finally:
        monkeypatch.setattr(faults, "point", original)


def lake_for(home, settings, now: str) -> LakeResource:
    return LakeResource(home=str(home), config_file=str(write_settings(home, settings)), now=now)


@pytest.mark.parametrize("mode", ["id", "gap"])
def test_rows_read_grow_with_new_data_not_with_history(spark, tmp_path, mode):
    """One new day on 4 or on 24 days of history: the incremental run reads the same rows."""
    reads = {}
    for history_days in (4, 24):
        home = tmp_path / f"h{history_days}"
        home.mkdir()
        s = make_settings(
            start_date=DAY0.isoformat(),
            session_mode=mode,
            backfill_limit_days=30,
            max_session_days=1,
            session_gap_minutes=30,
        )
        days = [DAY0 + dt.timedelta(days=i) for i in range(history_days)]
        write_load_days(spark, home, {d: daily_activity(d) for d in days})
        new_day = DAY0 + dt.timedelta(days=history_days)
        first = run(spark, home, s, dt.datetime.combine(new_day, dt.time(0), tzinfo=dt.UTC))
        assert first.models["sessions"].touched == history_days * 6
        write_load_day(spark, home, new_day, daily_activity(new_day))
        outcome = run(
            spark,
            home,
            s,
            dt.datetime.combine(new_day + dt.timedelta(days=1), dt.time(0), tzinfo=dt.UTC),
        )
        reads[history_days] = (
            outcome.models["sessions"].rows_read,
            outcome.models["users"].rows_read,
        )
        assert outcome.models["sessions"].touched == 6  # the new day's sessions
        # The lookback's sessions are recomputed as they were: only the new ones are written
        # to the lifecycle manifest (frames.without_unchanged).
        assert outcome.models["sessions"].rows_written["lifecycle rows"] == 6
    (sessions_short, users_short), (sessions_long, users_long) = reads[4], reads[24]
    assert sessions_short == sessions_long, (sessions_short, sessions_long)
    # the new day (24 rows) in the window and the feed, plus the 6-hour lookback before it
    assert sessions_long["change feed rows"] == 24
    assert (
        sum(sessions_long.values()) < 24 * 7
    )  # fewer rows than a week of events, on 24 days of history
    # users are recomputed from the sessions of the users the run touched (not from events)
    assert users_long["sessions of touched users"] == 3 * 2 * 25
    assert users_short["sessions of touched users"] == 3 * 2 * 5


def test_a_new_model_backfills_while_the_others_wait(spark, tmp_path):
    """Enabling user_session_stats: state 2 replays from start_date for it alone (the others are
    past those windows and skip them), then state 3 syncs it, then the models run together."""
    home = tmp_path / "home"
    home.mkdir()
    s = make_settings(start_date=DAY0.isoformat(), backfill_limit_days=3, session_mode="gap")
    write_load_days(
        spark,
        home,
        {
            DAY0 + dt.timedelta(days=i): daily_activity(DAY0 + dt.timedelta(days=i))
            for i in range(5)
        },
    )
    now = "2021-01-06T00:00:00"
    states = [o.limits.state for o in run_until_caught_up(spark, home, s, now)]
    assert states == [PackageState.FIRST_RUN, PackageState.STANDARD]

    with_stats = s.replace(session_models=["sessions", "users", "user_session_stats"])
    log = []
    for _ in range(6):
        log.append(run(spark, home, with_stats, now))
        if len({m.last_success for m in read_manifest(Home(home).table).values()}) == 1:
            break
    assert log[0].limits.state == PackageState.NEW_MODEL
    assert log[0].limits.log_lines()[0] == "Snowplow: New Snowplow incremental model. Backfilling"
    assert log[0].limits.lower_limit == dt.datetime(2021, 1, 1, tzinfo=dt.UTC)
    assert log[0].models["user_session_stats"].ran
    assert log[0].models["sessions"].skipped_reason and log[0].models["users"].skipped_reason
    assert log[0].models["sessions"].total_rows_read == 0
    assert [o.limits.state for o in log[1:]] == [PackageState.OUT_OF_SYNC] * (len(log) - 1)
    assert all(o.models["sessions"].skipped_reason for o in log)  # it waited in every window
    assert current_limits(with_stats, Home(home).table, utc(now)).state == PackageState.STANDARD
    report = verify_sessions(lake_for(home, with_stats, now), spark)
    assert report.compared["user_session_stats"] == 3
    assert report.ok, "\n".join(report.lines())


def test_a_failed_model_keeps_its_last_success_and_catches_up(spark, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    s = make_settings(start_date=DAY0.isoformat(), backfill_limit_days=10)
    write_load_day(spark, home, DAY0, daily_activity(DAY0))
    run(spark, home, s, "2021-01-02T00:00:00")
    before = read_manifest(Home(home).table)
    write_load_day(
        spark, home, DAY0 + dt.timedelta(days=1), daily_activity(DAY0 + dt.timedelta(days=1))
    )
    users_path = Home(home).table(USERS)
    shutil.move(users_path, users_path + ".away")
    with open(users_path, "w") as f:  # the users table is unreadable for this run
        f.write("not a table")
    with pytest.raises(SessionModelError) as failure:
        run(spark, home, s, "2021-01-03T00:00:00")
    outcome = failure.value.outcome
    assert outcome.models["sessions"].ran and outcome.models["users"].failed
    after = read_manifest(Home(home).table)
    assert after["sessions"].last_success > before["sessions"].last_success
    assert after["users"] == before["users"]  # failed: nothing moved
    shutil.os.remove(users_path)
    shutil.move(users_path + ".away", users_path)
    retry = run(spark, home, s, "2021-01-03T00:00:00")
    assert retry.limits.state == PackageState.OUT_OF_SYNC
    assert retry.models["sessions"].skipped_reason and retry.models["users"].ran
    report = verify_sessions(lake_for(home, s, "2021-01-03T00:00:00"), spark)
    assert report.ok, "\n".join(report.lines())


def test_a_vacuumed_change_feed_means_a_full_rebuild(spark, tmp_path):
    from deltalake import DeltaTable

    home = tmp_path / "home"
    home.mkdir()
    s = make_settings(start_date=DAY0.isoformat(), backfill_limit_days=10, session_mode="gap")
    write_load_day(spark, home, DAY0, daily_activity(DAY0))
    run(spark, home, s, "2021-01-02T00:00:00")
    # the load day is re-materialized twice (one user's evening gone), then the table vacuumed
    rows = daily_activity(DAY0)
    write_load_day(spark, home, DAY0, rows[:-4])
    write_load_day(
        spark,
        home,
        DAY0,
        [r for r in rows if not (r["domain_userid"] == "user2" and r["derived_tstamp"].hour == 19)],
    )
    DeltaTable(Home(home).table(FILTERED_EVENTS)).vacuum(
        retention_hours=0, enforce_retention_duration=False, dry_run=False
    )
    outcome = run(spark, home, s, "2021-01-02T00:00:00")
    sessions = outcome.models["sessions"]
    assert sessions.full_rebuild_reason and "no longer covers" in sessions.full_rebuild_reason
    assert outcome.models["users"].full_rebuild_reason
    assert any("rebuilding sessions in full" in w for w in outcome.warnings)
    assert sessions.touched == 5
    report = verify_sessions(lake_for(home, s, "2021-01-02T00:00:00"), spark)
    assert report.ok, "\n".join(report.lines())


def scans(df, name: str) -> int:
    """A metric summed over the file scans of `df`'s executed plan (run it first)."""
    return sum(
        metric(node, name)
        for node in executed_nodes(df)
        if node.getClass().getSimpleName() == "FileSourceScanExec"
    )


def files_read(df) -> int:
    """Files the scans of `df`'s executed plan opened (run it first)."""
    return scans(df, "numFiles")


def test_the_read_opens_the_touched_sessions_days_not_the_days_between(spark, tmp_path):
    """Touched sessions on day 2 and day 22 of 24: the session read opens those two days' files
    (Delta skips the others on their timestamp statistics), where one span from the earliest to
    the latest range opened 21."""
    from sessionize_assets.core.read_spans import covering_spans
    from sessionize_assets.resources.delta import read_version
    from sessionize_assets.sessions.frames import window_filter
    from sessionize_assets.sessions.modes import spans_filter

    s = make_settings(start_date=DAY0.isoformat())
    days = [DAY0 + dt.timedelta(days=i) for i in range(24)]
    write_load_days(spark, tmp_path, {d: daily_activity(d) for d in days})
    snapshot = read_version(spark, Home(tmp_path).table(FILTERED_EVENTS))

    def micros(day: int, hour: int) -> int:
        when = dt.datetime.combine(days[day], dt.time(hour), tzinfo=dt.UTC)
        return (when - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)) // dt.timedelta(microseconds=1)

    ranges = [(micros(2, 8), micros(2, 9)), (micros(22, 19), micros(22, 20))]
    upper = utc("2021-02-01T00:00:00")
    spans = covering_spans(ranges)
    narrow = snapshot.filter(spans_filter(spans, lambda a, b: window_filter(s, a, b), upper))
    from sessionize_assets.core.clock import from_micros

    wide = snapshot.filter(window_filter(s, from_micros(spans[0][0]), from_micros(spans[-1][1])))
    assert len(narrow.collect()) == 2 * 4 * 3  # the two sessions' hours: 4 events of 3 users each
    assert files_read(narrow) == 2
    assert len(wide.collect()) > 20 * 24
    assert files_read(wide) == 21


def test_a_span_of_few_users_opens_only_the_files_of_their_user_range(spark, tmp_path):
    """filtered_events written clustered by user (`clustered_by_user`: 40 users' day in 4
    files of contiguous user ranges): a span that names its one touched user reads one file and
    exactly that user's rows; without the list, all four."""
    from sessionize_assets.core.filtering import clustered_by_user
    from sessionize_assets.core.read_spans import covering_spans, span_members
    from sessionize_assets.core.sessionize import user_key
    from sessionize_assets.sessions.modes import spans_filter, user_filter
    from sessionize_assets_tests.sessions.support import events_frame

    s = make_settings(start_date=DAY0.isoformat(), session_mode="gap")
    rows = daily_activity(DAY0, users=40)
    path = str(tmp_path / "filtered_events")
    clustered_by_user(
        events_frame(spark, rows), user_key(s), len(rows), len(rows) // 4
    ).write.format("delta").partitionBy("load_date").save(path)
    snapshot = spark.read.format("delta").load(path)

    def micros(hour: int) -> int:
        when = dt.datetime.combine(DAY0, dt.time(hour), tzinfo=dt.UTC)
        return (when - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)) // dt.timedelta(microseconds=1)

    ranges = [(micros(8), micros(9), ["user17"])]
    spans = covering_spans([(lo, hi) for lo, hi, _ in ranges])
    members = span_members(ranges, spans)

    def within(a, b):
        return F.col("derived_tstamp").between(F.lit(a), F.lit(b))

    of_users = user_filter(s, dict(snapshot.dtypes))
    named = snapshot.filter(spans_filter(spans, within, members=members, of_users=of_users))
    everyone = snapshot.filter(spans_filter(spans, within))
    got = named.collect()  # once: the metrics are those of this execution
    assert {r.domain_userid for r in got} == {"user17"}
    assert len(got) == 4  # user17's morning session
    assert files_read(named) == 1
    assert len(everyone.collect()) == 40 * 4
    files = int(spark.sql(f"DESCRIBE DETAIL delta.`{path}`").collect()[0]["numFiles"])
    assert files >= 3  # a sample's bounds: about 4
    assert files_read(everyone) == files


def test_a_few_users_read_decodes_only_their_pages_of_a_file(spark, tmp_path):
    """filtered_events' files are sorted by user and written with pages of 1,000 rows and INT64
    timestamps (`PARQUET_LAYOUT` through `replace_partitions`): a read naming one user of a
    4,000-row file decodes one or two pages (Parquet's page index), also when the user is asked
    for within a time span, ORed with a span of every user (the gap-mode read's shape); with
    Parquet's default pages, the whole file, and with INT96 timestamps (no Parquet statistics,
    so Spark pushes no part of that filter to the reader) too. The Spark session's settings are
    as before once the write is done."""
    from sessionize_assets.core.clock import to_micros
    from sessionize_assets.core.filtering import PARQUET_LAYOUT, clustered_by_user
    from sessionize_assets.core.sessionize import user_key
    from sessionize_assets.resources.delta import replace_partitions
    from sessionize_assets.sessions.modes import spans_filter, user_filter
    from sessionize_assets_tests.sessions.support import events_frame

    s = make_settings(start_date=DAY0.isoformat(), session_mode="gap")
    rows = [
        event(
            dt.datetime.combine(DAY0, dt.time(hour, minute), tzinfo=dt.UTC),
            f"user{u}",
            f"user{u}-{hour}",
        )
        for hour in (8, 19)
        for minute in (0, 5, 10, 15)
        for u in range(500)  # in time order: the write must sort by user
    ]
    frame = events_frame(spark, rows).withColumn("event_date", F.to_date("derived_tstamp"))
    int96 = {**PARQUET_LAYOUT, "spark.sql.parquet.outputTimestampType": "INT96"}
    before = {key: spark.conf.get(key, None) for key in int96}
    morning = (
        dt.datetime.combine(DAY0, dt.time(7), tzinfo=dt.UTC),
        dt.datetime.combine(DAY0, dt.time(9), tzinfo=dt.UTC),
    )
    nobody = (  # a span of every user that holds no row of the file
        dt.datetime.combine(DAY0 + dt.timedelta(days=2), dt.time(0), tzinfo=dt.UTC),
        dt.datetime.combine(DAY0 + dt.timedelta(days=2), dt.time(1), tzinfo=dt.UTC),
    )
    user317 = spans_filter(
        [
            (to_micros(morning[0]), to_micros(morning[1])),
            (to_micros(nobody[0]), to_micros(nobody[1])),
        ],
        lambda lo, hi: F.col("derived_tstamp").between(F.lit(lo), F.lit(hi)),
        members=[frozenset({"user317"}), None],
        of_users=user_filter(s, {"domain_userid": "string"}),
    )
    scanned, spanned = {}, {}
    for name, parquet in (("paged", PARQUET_LAYOUT), ("default", None), ("int96", int96)):
        path = str(tmp_path / name)
        one_file = clustered_by_user(frame, user_key(s), len(rows), len(rows))
        replace_partitions(
            spark, one_file, path, "load_date", [DAY0], ["load_date", "event_date"], parquet=parquet
        )
        read = spark.read.format("delta").load(path).filter(F.col("domain_userid") == "user317")
        assert len(read.collect()) == 8
        assert files_read(read) == 1
        scanned[name] = scans(read, "numOutputRows")
        read = spark.read.format("delta").load(path).filter(user317)
        assert len(read.collect()) == 4
        spanned[name] = scans(read, "numOutputRows")
    assert len(rows) == 4000
    assert scanned["default"] == 4000
    assert scanned["paged"] <= 2000
    assert spanned["paged"] <= 2000
    assert spanned["int96"] == 4000
    assert {key: spark.conf.get(key, None) for key in int96} == before


def test_named_spans_are_guarded_by_one_set_lookup_and_pass_the_same_rows(spark):
    """The spans that name users are ANDed with one set lookup of every named user per user
    column (`UserFilter.any_user`): the filter passes exactly the rows the plain OR of named
    spans passes (rows of two user columns, nulls, users named in another span, rows in a span
    of every user), and Spark's optimized plan tests the set before the spans."""
    from sessionize_assets.core.clock import to_micros
    from sessionize_assets.sessions.modes import UserFilter, spans_filter, user_filter
    from sessionize_assets.settings import from_mapping

    s = from_mapping({"user_identifier": ["user_id", "domain_userid"]})
    at = [dt.datetime.combine(DAY0, dt.time(h), tzinfo=dt.UTC) for h in range(24)]
    rows = [
        (uid, did, at[h].replace(tzinfo=None))
        for h in range(24)
        for uid, did in [
            (f"u{i}", None) if i % 3 == 0 else (None, f"u{i}") if i % 3 == 1 else (f"x{i}", f"u{i}")
            for i in range(30)
        ]
        + [(None, None)]
    ]
    df = spark.createDataFrame(
        rows, "user_id string, domain_userid string, derived_tstamp timestamp"
    )
    spans = [(to_micros(at[h]), to_micros(at[h + 1])) for h in (2, 6, 10, 20)]
    members = [frozenset({"u1", "u2", "u3"}), frozenset({"u4", "u29"}), None, frozenset({"u1"})]

    def within(lo, hi):
        return F.col("derived_tstamp").between(F.lit(lo), F.lit(hi))

    guarded = user_filter(s, dict(df.dtypes))
    assert isinstance(guarded, UserFilter)
    plain = guarded.__call__  # the same equalities, without the set lookup
    got = df.filter(spans_filter(spans, within, members=members, of_users=guarded))
    expected = df.filter(spans_filter(spans, within, members=members, of_users=plain))
    assert sorted(map(repr, got.collect())) == sorted(map(repr, expected.collect()))
    assert 0 < got.count() < df.count()
    assert got.filter(F.hour("derived_tstamp").isin(10, 11)).count() == 2 * 31  # every user
    # five users: Spark keeps `IN (…)` (a hash set, INSET, only above ten values)
    plan = got._jdf.queryExecution().optimizedPlan().toString()
    assert plan.index(" IN (") < plan.index("= u1)")  # the lookup before the named spans
    assert " IN (" not in expected._jdf.queryExecution().optimizedPlan().toString()


def test_a_changed_setting_stops_the_run_and_a_refresh_rebuilds_under_the_new_one(spark, tmp_path):
    """session_mode changed from id to gap after the models were built: the run refuses with one
    sentence (a run limit changed does not); a refresh rebuilds every model in full, after which
    the tables differ from before and equal a home built under the new setting from the start,
    and runs go on."""
    from sessionize_assets.errors import SettingsError
    from sessionize_assets.resources.tables import SESSIONS, SESSIONS_LIFECYCLE_MANIFEST
    from sessionize_assets.sessions.run import run_session_models
    from sessionize_assets_tests.sessions.support import rows_of, table

    days = {
        DAY0 + dt.timedelta(days=i): daily_activity(DAY0 + dt.timedelta(days=i)) for i in range(4)
    }
    now = "2021-01-05T00:00:00"
    before = make_settings(start_date=DAY0.isoformat(), backfill_limit_days=30, max_session_days=1)
    after = before.replace(session_mode="gap")
    home, fresh = tmp_path / "home", tmp_path / "fresh"
    for h, s in ((home, before), (fresh, after)):
        h.mkdir()
        write_load_days(spark, h, days)
        run_until_caught_up(spark, h, s, now)

    with pytest.raises(SettingsError, match="session_mode changed from id to gap") as refused:
        run(spark, home, after, now)
    assert "sessionize refresh sessions --yes" in str(refused.value)
    run(spark, home, before.replace(backfill_limit_days=5), now)  # a run limit: no refusal

    columns = ("session_identifier", "user_identifier", "start_tstamp", "end_tstamp")
    built_by_id = rows_of(table(spark, home, SESSIONS), *columns)
    outcome = run_session_models(spark, Home(home).table, after, utc(now), refresh=True)
    assert outcome.models["sessions"].full_rebuild_reason.startswith("refresh requested")
    assert outcome.models["users"].full_rebuild_reason
    for name, compared in (
        (SESSIONS, columns),
        (USERS, ("user_identifier", "sessions")),
        (SESSIONS_LIFECYCLE_MANIFEST, ("session_identifier", "end_tstamp", "is_quarantined")),
    ):
        got = rows_of(table(spark, home, name), *compared)
        assert got == rows_of(table(spark, fresh, name), *compared), name
        assert got, name
    # gap mode names its sessions differently: no session id of the id-mode build is left
    ids_now = {r[0] for r in rows_of(table(spark, home, SESSIONS), "session_identifier")}
    assert ids_now and not ids_now & {r[0] for r in built_by_id}
    run(spark, home, after, now)  # the manifest records the new definition: no refusal
    assert verify_sessions(lake_for(home, after, now), spark).ok


def test_a_late_event_within_a_gap_of_two_chains_merges_them_both(spark, tmp_path):
    """Gap mode: chains A (09:00-09:05) and B (10:00-10:10), gap 30 minutes; a late event at
    09:32 is 27 minutes after A and 28 before B, overlapping neither: the run must re-read both
    neighbours and make one session of the three (the chains that narrow the re-read range are
    those within a gap of the change, not only those overlapping it). Another user's activity
    two days later moves the run window past A and B, so only the change feed brings the late
    event and nothing else re-reads A or B."""
    from sessionize_assets_tests import reference_model as reference

    settings = make_settings(
        start_date=DAY0.isoformat(), session_mode="gap", session_gap_minutes=30
    )
    day = dt.datetime.combine(DAY0, dt.time(), tzinfo=dt.UTC)
    first = two_chains(day)
    later = day + dt.timedelta(days=2, hours=12)
    other = [event(later, "v", loaded=later + dt.timedelta(minutes=1))]
    home = tmp_path / "home"
    home.mkdir()
    write_load_day(spark, home, DAY0, first)
    write_load_day(spark, home, DAY0 + dt.timedelta(days=2), other)
    run_until_caught_up(spark, home, settings, "2021-01-04T00:00:00")
    mine = [
        s for s in reference.delta_rows(Home(home).table("sessions")) if s["user_identifier"] == "u"
    ]
    assert len(mine) == 2
    late = event(day + dt.timedelta(hours=9, minutes=32), "u", loaded="2021-01-04T06:00:00")
    write_load_day(spark, home, DAY0 + dt.timedelta(days=3), [late])
    run_until_caught_up(spark, home, settings, "2021-01-05T00:00:00")
    stored = reference.delta_rows(Home(home).table("sessions"))
    mine = [s for s in stored if s["user_identifier"] == "u"]
    assert [(s["start_tstamp"], s["end_tstamp"], s["total_events"]) for s in mine] == [
        (day + dt.timedelta(hours=9), day + dt.timedelta(hours=10, minutes=10), 5)
    ]
    problems = reference.differences(
        "sessions",
        stored,
        reference.gap_sessions([*first, *other, late], settings),
        key=["session_identifier"],
    )
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("mode", ["id", "gap"])
def test_a_run_stopped_after_its_sessions_commit_heals_users_on_the_next_run(
    spark, tmp_path, monkeypatch, mode
):
    """A later run deletes sessions (user2's events are all gone, user1 loses one session) and
    stops right after its sessions commit, before the lifecycle manifest, users and the
    manifest: `sessions` no longer holds the deleted sessions, and the manifest still names the
    previous run. The next run must still recompute user2 (now without sessions) and user1: a
    user set taken only from the sessions this run replaces misses user2, whose session is
    already gone."""
    settings = make_settings(start_date=DAY0.isoformat(), session_mode=mode)
    home = tmp_path / "home"
    home.mkdir()
    day1 = DAY0 + dt.timedelta(days=1)
    write_load_day(spark, home, DAY0, daily_activity(DAY0))
    run_until_caught_up(spark, home, settings, "2021-01-02T00:00:00")
    users_before = dict(rows_of(table(spark, home, USERS), "user_identifier", "sessions"))
    assert users_before == {"user0": 2, "user1": 2, "user2": 2}

    write_load_day(
        spark, home, day1, [r for r in daily_activity(day1) if r["domain_userid"] != "user2"]
    )
    delete_events(spark, home, f"domain_userid = 'user2' OR domain_sessionid = 'user1-{DAY0}-8'")
    manifest_before = read_manifest(Home(home).table)

    with stopped_at(monkeypatch, f"after-commit:{SESSIONS}"):
        run(spark, home, settings, "2021-01-03T00:00:00")
    assert read_manifest(Home(home).table) == manifest_before  # the manifest names the old run
    in_sessions = {r[0] for r in rows_of(table(spark, home, SESSIONS), "user_identifier")}
    assert "user2" not in in_sessions  # the deletion is committed to sessions
    assert dict(rows_of(table(spark, home, USERS), "user_identifier", "sessions")) == users_before

    run_until_caught_up(spark, home, settings, "2021-01-03T00:00:00")
    users_after = dict(rows_of(table(spark, home, USERS), "user_identifier", "sessions"))
    assert users_after == {"user0": 4, "user1": 3}
    report = verify_sessions(lake_for(home, settings, "2021-01-03T00:00:00"), spark)
    assert report.ok, "\n".join(report.lines())


@pytest.mark.parametrize(
    ("mode", "stop"), [("id", "after-commit"), ("gap", "after-commit"), ("id", "before-commit")]
)
def test_a_run_stopped_around_its_lifecycle_commit_lists_the_quarantined_session_once(
    spark, tmp_path, monkeypatch, mode, stop
):
    """A run quarantines a session longer than max_session_days and stops right after its
    lifecycle manifest commit (which then says the session is quarantined), or right before it
    (with `quarantined_sessions` written). The next run must list the session in
    `quarantined_sessions`, once. (Before session 31 the side tables were written after the
    lifecycle manifest, and a stop between the two lost the listing for good.)"""
    from sessionize_assets.resources.tables import (
        QUARANTINED_SESSIONS,
        SESSIONS_LIFECYCLE_MANIFEST,
    )

    settings = make_settings(
        start_date=DAY0.isoformat(), session_mode=mode, max_session_days=1, session_gap_minutes=30
    )
    home = tmp_path / "home"
    home.mkdir()
    write_load_day(spark, home, DAY0, daily_activity(DAY0))
    run_until_caught_up(spark, home, settings, "2021-01-02T00:00:00")
    # One session of 20-minute steps from day 1, 01:00 to day 2, 03:00: longer than a day.
    start = dt.datetime.combine(DAY0 + dt.timedelta(days=1), dt.time(1), tzinfo=dt.UTC)
    times = [start + dt.timedelta(minutes=20 * i) for i in range(79)]
    day2 = DAY0 + dt.timedelta(days=2)
    write_load_day(
        spark,
        home,
        day2,
        [event(t, "long", "long-1", loaded=times[-1] + dt.timedelta(minutes=5)) for t in times],
    )

    def listed_any() -> bool:
        return table(spark, home, QUARANTINED_SESSIONS).count() > 0

    with stopped_at(monkeypatch, f"{stop}:{SESSIONS_LIFECYCLE_MANIFEST}", listed_any):
        run_until_caught_up(spark, home, settings, "2021-01-04T00:00:00")

    def lifecycle_quarantined() -> list[tuple]:
        lifecycle = table(spark, home, SESSIONS_LIFECYCLE_MANIFEST)
        return rows_of(lifecycle.filter(F.col("is_quarantined")), "session_identifier")

    assert bool(lifecycle_quarantined()) == (stop == "after-commit")

    run_until_caught_up(spark, home, settings, "2021-01-04T00:00:00")
    listed = rows_of(table(spark, home, QUARANTINED_SESSIONS), "session_identifier")
    assert listed and listed == lifecycle_quarantined()  # each once
    users = rows_of(table(spark, home, QUARANTINED_SESSIONS), "user_identifier")
    assert {u for (u,) in users} == {"long"}
    report = verify_sessions(lake_for(home, settings, "2021-01-04T00:00:00"), spark)
    assert report.ok, "\n".join(report.lines())


def test_a_gap_run_stopped_before_its_lifecycle_commit_records_a_superseded_id_once(
    spark, tmp_path, monkeypatch
):
    """Gap mode: a late event merges two sessions, and the run stops right before its lifecycle
    commit, with `superseded_sessions` written. The next run derives the same superseded ids from
    the same stored lifecycle rows; it must not record them again."""
    from sessionize_assets.resources.tables import SESSIONS_LIFECYCLE_MANIFEST, SUPERSEDED_SESSIONS

    settings = make_settings(
        start_date=DAY0.isoformat(), session_mode="gap", session_gap_minutes=30
    )
    day = dt.datetime.combine(DAY0, dt.time(), tzinfo=dt.UTC)
    first = two_chains(day)
    home = tmp_path / "home"
    home.mkdir()
    write_load_day(spark, home, DAY0, first)
    run_until_caught_up(spark, home, settings, "2021-01-02T00:00:00")
    late = event(day + dt.timedelta(hours=9, minutes=32), "u", loaded="2021-01-02T06:00:00")
    write_load_day(spark, home, DAY0 + dt.timedelta(days=1), [late])

    def recorded() -> list[tuple]:
        superseded = table(spark, home, SUPERSEDED_SESSIONS)
        return rows_of(superseded, "superseded_session_identifier", "session_identifier")

    point = f"before-commit:{SESSIONS_LIFECYCLE_MANIFEST}"
    with stopped_at(monkeypatch, point, lambda: bool(recorded())):
        run_until_caught_up(spark, home, settings, "2021-01-03T00:00:00")
    before = recorded()
    assert before

    run_until_caught_up(spark, home, settings, "2021-01-03T00:00:00")
    assert recorded() == before  # nothing recorded twice
    report = verify_sessions(lake_for(home, settings, "2021-01-03T00:00:00"), spark)
    assert report.ok, "\n".join(report.lines())
