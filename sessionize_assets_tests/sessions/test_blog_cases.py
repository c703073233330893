"""The blog's five late-event cases (seed 002), gap mode, through the `session_models` asset.

One history holds the five cases (one user each); it is materialized with Dagster, the late
events are loaded in a later load day, and it is materialized again. Cases 1-4 arrive with their
own (old) collector timestamp, so only the change data feed brings them; case 5 arrives with a
new collector timestamp, so the run window brings it too.
"""

from __future__ import annotations

import datetime as dt

import pytest
from dagster import DagsterInstance

from sessionize_assets.resources.tables import SESSIONS, SUPERSEDED_SESSIONS, USERS
from sessionize_assets_tests.sessions.support import (
    event,
    make_settings,
    materialize,
    rows_of,
    table,
    utc,
    write_load_day,
)

SETTINGS = make_settings(
    start_date="2019-10-20",
    session_mode="gap",
    session_gap_minutes=30,
    max_session_days=3,
    backfill_limit_days=30,
)
FIRST_LOAD = dt.date(2019, 10, 24)
LATE_LOAD = dt.date(2019, 11, 1)


def spread(user: str, start: str, end: str, n: int) -> list[dict]:
    """n events evenly from start to end (both included)."""
    a, b = utc(start), utc(end)
    return [
        event(a + (b - a) * i // max(n - 1, 1), user, loaded="2019-10-24T12:00") for i in range(n)
    ]


def blog_day(user: str) -> list[dict]:
    """The blog's table: 09:21-09:30 (10 events), 10:05-10:23 (15), 13:25-14:10 (20) on 2019-10-23."""
    return (
        spread(user, "2019-10-23T09:21", "2019-10-23T09:30", 10)
        + spread(user, "2019-10-23T10:05", "2019-10-23T10:23", 15)
        + spread(user, "2019-10-23T13:25", "2019-10-23T14:10", 20)
    )


INITIAL = (
    blog_day("case1")
    + blog_day("case2")
    + blog_day("case3")
    + spread("case4", "2019-10-22T23:30", "2019-10-22T23:59", 5)
    + spread("case4", "2019-10-23T09:00", "2019-10-23T09:10", 3)
    + spread("case5", "2019-10-23T20:00", "2019-10-23T20:10", 2)
    + spread("case5", "2019-10-24T00:01", "2019-10-24T00:20", 4)
)
LATE = [
    event("2019-10-23T09:45", "case1", loaded="2019-11-01T10:00"),
    event("2019-10-23T09:23", "case2", loaded="2019-11-01T10:00"),
    event("2019-10-23T11:15", "case3", loaded="2019-11-01T10:00"),
    event("2019-10-23T00:01", "case4", loaded="2019-11-01T10:00"),
    event("2019-10-23T23:59", "case5", collector="2019-11-01T09:00", loaded="2019-11-01T10:00"),
]


@pytest.fixture(scope="module")
def history(spark, tmp_path_factory):
    """Sessions before and after the late events, and what the second materialization recorded."""
    home = tmp_path_factory.mktemp("blog") / "home"
    home.mkdir()
    instance = DagsterInstance.ephemeral()
    write_load_day(spark, home, FIRST_LOAD, INITIAL)
    first = materialize(home, SETTINGS, "2019-10-25T00:00:00", instance)
    columns = (
        "user_identifier",
        "start_tstamp",
        "end_tstamp",
        "total_events",
        "session_number",
        "session_identifier",
    )
    before = rows_of(table(spark, home, SESSIONS), *columns)
    write_load_day(spark, home, LATE_LOAD, LATE)
    second = materialize(home, SETTINGS, "2019-11-02T00:00:00", instance)
    after = rows_of(table(spark, home, SESSIONS), *columns)
    superseded = rows_of(
        table(spark, home, SUPERSEDED_SESSIONS),
        "superseded_session_identifier",
        "session_identifier",
        "user_identifier",
        "reason",
    )
    users = rows_of(table(spark, home, USERS), "user_identifier", "sessions", "total_events")
    return {
        "before": before,
        "after": after,
        "superseded": superseded,
        "users": users,
        "first": first,
        "second": second,
        "instance": instance,
    }


def sessions_of(rows, user):
    """(start, end, events, session_number) of a user's sessions, by number."""
    return sorted((r[1], r[2], r[3], r[4]) for r in rows if r[0] == user)


def ids_of(rows, user):
    return {r[4]: r[5] for r in rows if r[0] == user}


def t(text: str) -> dt.datetime:
    return utc(text)


BLOG_BEFORE = [
    (t("2019-10-23T09:21"), t("2019-10-23T09:30"), 10, 1),
    (t("2019-10-23T10:05"), t("2019-10-23T10:23"), 15, 2),
    (t("2019-10-23T13:25"), t("2019-10-23T14:10"), 20, 3),
]


def test_case_1_late_event_merges_two_sessions(history):
    assert sessions_of(history["before"], "case1") == BLOG_BEFORE
    assert sessions_of(history["after"], "case1") == [
        (t("2019-10-23T09:21"), t("2019-10-23T10:23"), 26, 1),
        (t("2019-10-23T13:25"), t("2019-10-23T14:10"), 20, 2),
    ]
    before, after = ids_of(history["before"], "case1"), ids_of(history["after"], "case1")
    assert after[1] == before[1]  # the merged session keeps the id of its first event
    assert (before[2], before[1], "case1", "merged") in history["superseded"]


def test_case_2_late_event_falls_within_a_session(history):
    assert sessions_of(history["before"], "case2") == BLOG_BEFORE
    assert sessions_of(history["after"], "case2") == [
        (t("2019-10-23T09:21"), t("2019-10-23T09:30"), 11, 1),
        (t("2019-10-23T10:05"), t("2019-10-23T10:23"), 15, 2),
        (t("2019-10-23T13:25"), t("2019-10-23T14:10"), 20, 3),
    ]
    assert ids_of(history["before"], "case2") == ids_of(history["after"], "case2")
    assert not [s for s in history["superseded"] if s[2] == "case2"]


def test_case_3_late_event_makes_a_new_session_and_renumbers(history):
    assert sessions_of(history["before"], "case3") == BLOG_BEFORE
    assert sessions_of(history["after"], "case3") == [
        (t("2019-10-23T09:21"), t("2019-10-23T09:30"), 10, 1),
        (t("2019-10-23T10:05"), t("2019-10-23T10:23"), 15, 2),
        (t("2019-10-23T11:15"), t("2019-10-23T11:15"), 1, 3),
        (t("2019-10-23T13:25"), t("2019-10-23T14:10"), 20, 4),
    ]
    before, after = ids_of(history["before"], "case3"), ids_of(history["after"], "case3")
    assert after[4] == before[3]  # same session, next number


def test_case_4_late_event_extends_a_session_past_midnight(history):
    assert sessions_of(history["before"], "case4") == [
        (t("2019-10-22T23:30"), t("2019-10-22T23:59"), 5, 1),
        (t("2019-10-23T09:00"), t("2019-10-23T09:10"), 3, 2),
    ]
    assert sessions_of(history["after"], "case4") == [
        (t("2019-10-22T23:30"), t("2019-10-23T00:01"), 6, 1),
        (t("2019-10-23T09:00"), t("2019-10-23T09:10"), 3, 2),
    ]


def test_case_5_late_event_pulls_a_session_back_into_the_previous_day(history):
    assert sessions_of(history["before"], "case5") == [
        (t("2019-10-23T20:00"), t("2019-10-23T20:10"), 2, 1),
        (t("2019-10-24T00:01"), t("2019-10-24T00:20"), 4, 2),
    ]
    assert sessions_of(history["after"], "case5") == [
        (t("2019-10-23T20:00"), t("2019-10-23T20:10"), 2, 1),
        (t("2019-10-23T23:59"), t("2019-10-24T00:20"), 5, 2),
    ]
    before, after = ids_of(history["before"], "case5"), ids_of(history["after"], "case5")
    assert after[2] != before[2]  # its first event changed: a new id, and the old one is recorded
    assert (before[2], after[2], "case5", "first event changed") in history["superseded"]


def test_users_follow_the_sessions(history):
    users = {u: (n, events) for u, n, events in history["users"]}
    assert users["case1"] == (2, 46)
    assert users["case3"] == (4, 46)
    assert users["case5"] == (2, 7)


def test_materializations_say_what_they_did(history):
    """State, window and Snowplow's log lines reach the Dagster event log and metadata."""
    second = history["second"]
    assert second.success
    md = {
        e.event_specific_data.materialization.asset_key.to_user_string(): e.event_specific_data.materialization.metadata
        for e in second.get_asset_materialization_events()
    }
    sessions = md[SESSIONS]
    assert sessions["state_message"].value == "Snowplow: Standard incremental run"
    assert (
        sessions["window"].value
        == "Snowplow: Processing data between 2019-10-23 18:20:00 and 2019-11-02 00:00:00"
    )
    assert sessions["rows read: change feed rows"].value == 5
    # the window re-reads the 6 hours before last_success (case 5's six events from 20:00) and
    # takes case 5's late event by its collector time
    assert sessions["rows read: window rows"].value == 7
    # sessions touched: case 1's two merged, case 2's first, case 3's new, case 4's first, case 5's old and new
    assert sessions["sessions touched"].value == 7
    messages = [entry.user_message for entry in history["instance"].all_logs(second.run_id)]
    assert any("Snowplow: Standard incremental run" in m for m in messages)
    assert any(
        "Snowplow: Processing data between 2019-10-23 18:20:00 and 2019-11-02 00:00:00" in m
        for m in messages
    )
    first_logs = [
        entry.user_message for entry in history["instance"].all_logs(history["first"].run_id)
    ]
    assert any(
        "Snowplow: No data in manifest. Processing data from start_date" in m for m in first_logs
    )
