"""The lifecycle manifest's update rule (core.lifecycle) as a table of cases, and the same table
through its Spark form (core.sessionize.sessionize_by_id) and the modes' lifecycle MERGE source."""

from __future__ import annotations

import datetime as dt

import pytest
from pyspark.sql import functions as F

from sessionize_assets.core import sessionize as core
from sessionize_assets.core.lifecycle import (
    AFTER_MAX_SESSION_DAYS,
    QUARANTINED_SESSION,
    Action,
    Case,
    Event,
    LifecycleRow,
    action,
    next_lifecycle,
)
from sessionize_assets.sessions.modes import GapMode, IdMode
from sessionize_assets_tests.sessions.support import (
    event,
    events_frame,
    make_settings,
    rows_of,
    utc,
)

MAX_DAYS = 3
AFTER, QUARANTINED = AFTER_MAX_SESSION_DAYS, QUARANTINED_SESSION


def t(text: str) -> dt.datetime:
    return utc(f"2021-{text}")


def row(user: str | None, start: str, end: str, quarantined: bool) -> LifecycleRow:
    return LifecycleRow(user, t(start), t(end), quarantined)


# (case id, old row, events (session timestamp, user), expected case, new row, reasons per event)
CASES = [
    (
        "new",
        None,
        [("03-01T10:00", "b"), ("03-01T10:05", "a"), ("03-01T10:06", None)],
        Case.NEW,
        row("b", "03-01T10:00", "03-01T10:06", False),
        [None, None, None],
    ),
    (
        "new-without-user",
        None,
        [("03-01T10:00", None)],
        Case.NEW,
        row(None, "03-01T10:00", "03-01T10:00", False),
        [None],
    ),
    (
        "new-at-the-cap",  # an event exactly at start + 3 days is kept and quarantines
        None,
        [("03-01T00:00", "u"), ("03-04T00:00", "u"), ("03-04T00:00:01", "u")],
        Case.NEW,
        row("u", "03-01T00:00", "03-04T00:00", True),
        [None, None, AFTER],
    ),
    (
        "new-past-the-cap-ends-at-the-cap",  # Snowplow: least(start + cap, max tstamp)
        None,
        [("03-01T00:00", "u"), ("03-02T00:00", "u"), ("03-05T12:00", "u")],
        Case.NEW,
        row("u", "03-01T00:00", "03-04T00:00", True),
        [None, None, AFTER],
    ),
    (
        "new-under-the-cap",
        None,
        [("03-01T00:00", "u"), ("03-03T23:59:59", "u")],
        Case.NEW,
        row("u", "03-01T00:00", "03-03T23:59:59", False),
        [None, None],
    ),
    (
        "open-late-event-moves-the-start",
        row("a", "03-01T10:00", "03-01T11:00", False),
        [("02-28T09:00", "a"), ("03-01T10:00", "a"), ("03-01T11:00", "a")],
        Case.OPEN,
        row("a", "02-28T09:00", "03-01T11:00", False),
        [None, None, None],
    ),
    (
        "open-keeps-the-first-seen-user",
        row("a", "03-01T10:00", "03-01T10:00", False),
        [("03-01T10:00", "a"), ("03-01T10:30", "z")],
        Case.OPEN,
        row("a", "03-01T10:00", "03-01T10:30", False),
        [None, None],
    ),
    (
        "open-without-user-takes-the-largest",
        row(None, "03-01T10:00", "03-01T10:00", False),
        [("03-01T10:00", None), ("03-01T10:30", "k"), ("03-01T10:40", "m")],
        Case.OPEN,
        row("m", "03-01T10:00", "03-01T10:40", False),
        [None, None, None],
    ),
    (
        "open-late-event-past-the-cap",
        row("u", "03-01T00:00", "03-01T00:00", False),
        [("03-01T00:00", "u"), ("03-05T00:00", "u")],
        Case.OPEN,
        # Snowplow's end: least(start + cap, latest event) = the cap, not the last kept event
        row("u", "03-01T00:00", "03-04T00:00", True),
        [None, AFTER],
    ),
    (
        "frozen-takes-in-span-events-only",
        row("u", "03-01T10:00", "03-04T10:00", True),
        [
            ("02-28T10:00", "u"),
            ("03-02T10:00", "v"),
            ("03-04T10:00", "u"),
            ("03-04T10:00:01", "u"),
        ],
        Case.FROZEN,
        row("u", "03-01T10:00", "03-04T10:00", True),
        [QUARANTINED, None, None, QUARANTINED],
    ),
    (
        "frozen-without-user-takes-the-largest",
        row(None, "03-01T10:00", "03-01T12:00", True),
        [("03-01T11:00", "k")],
        Case.FROZEN,
        # the frozen span ends at its cap, whatever events this run read
        row("k", "03-01T10:00", "03-04T10:00", True),
        [None],
    ),
    (
        "frozen-every-event-outside",  # no row: the old one stays (id mode, `action`)
        row("u", "03-01T10:00", "03-04T10:00", True),
        [("02-20T10:00", "u"), ("03-09T10:00", "u")],
        Case.FROZEN,
        None,
        [QUARANTINED, QUARANTINED],
    ),
    (
        "open-left-without-events",
        row("u", "03-01T10:00", "03-01T10:00", False),
        [],
        Case.OPEN,
        None,
        [],
    ),
]


@pytest.mark.parametrize(
    ("old", "events", "case", "new", "reasons"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_next_lifecycle(old, events, case, new, reasons):
    decision = next_lifecycle(old, [Event(t(ts), user) for ts, user in events], MAX_DAYS)
    assert decision.case == case
    assert decision.row == new
    assert list(decision.reasons) == reasons


# (had a row, has a row, keeps vanished sessions (id mode)) -> action
ACTIONS = [
    (False, True, True, Action.INSERT),
    (False, True, False, Action.INSERT),
    (True, True, True, Action.UPDATE),
    (True, True, False, Action.UPDATE),
    (True, False, True, Action.KEEP),
    (True, False, False, Action.DELETE),
    (False, False, True, Action.NOTHING),
    (False, False, False, Action.NOTHING),
]


@pytest.mark.parametrize(("had", "has", "keeps", "expected"), ACTIONS)
def test_action(had, has, keeps, expected):
    assert action(had, has, keeps) == expected


LIFECYCLE_SCHEMA = (
    "session_identifier string, user_identifier string, start_tstamp timestamp, "
    "end_tstamp timestamp, is_quarantined boolean"
)


def test_spark_form_follows_the_same_cases(spark):
    """Every case with events, as one session each, through `sessionize_by_id` in one pass."""
    s = make_settings(start_date="2021-01-01", max_session_days=MAX_DAYS)
    rows, old_rows, expected_reasons = [], [], {}
    for name, old, events, _, _, reasons in CASES:
        if old is not None:
            old_rows.append(
                (name, old.user_identifier, old.start_tstamp, old.end_tstamp, old.is_quarantined)
            )
        for i, ((ts, user), reason) in enumerate(zip(events, reasons, strict=True)):
            rows.append(event(t(ts), user, name, event_id=f"{name}-{i}"))
            expected_reasons[f"{name}-{i}"] = reason
    prepared = core.usable(core.prepare_events(events_frame(spark, rows), s), s)
    lifecycle = spark.createDataFrame(old_rows, LIFECYCLE_SCHEMA)
    result = core.sessionize_by_id(prepared, s, lifecycle)
    got = {
        r[0]: LifecycleRow(*r[1:])
        for r in rows_of(core.lifecycle_rows(result.sessions), *LIFECYCLE_SCHEMA_COLUMNS)
    }
    assert got == {name: new for name, _, events, _, new, _ in CASES if new is not None}
    reasons = dict.fromkeys(expected_reasons)
    for event_id, reason in rows_of(result.excluded, "event_id", core.REASON):
        reasons[event_id] = reason
    assert reasons == expected_reasons


LIFECYCLE_SCHEMA_COLUMNS = tuple(p.strip().split(" ")[0] for p in LIFECYCLE_SCHEMA.split(","))


def test_modes_merge_source_follows_action(spark):
    """The lifecycle MERGE source of each mode: recomputed sessions upserted; a replaced session
    no longer computed deleted in gap mode, left alone (kept) in id mode."""
    s = make_settings(start_date="2021-01-01")
    computed = spark.createDataFrame(
        [("kept-session", "u", utc("2021-03-01T10:00"), utc("2021-03-01T11:00"), False)],
        LIFECYCLE_SCHEMA,
    ).select(
        "session_identifier",
        "user_identifier",
        F.col("start_tstamp").alias(core.LC_START),
        F.col("end_tstamp").alias(core.LC_END),
        "is_quarantined",
    )
    replaced = spark.createDataFrame(
        [("kept-session",), ("vanished",)], "session_identifier string"
    )
    for mode in (IdMode(s), GapMode(s)):
        update = mode.lifecycle_update(computed, replaced, fresh=1, deleted=1)
        got = {
            sid: delete for sid, delete in rows_of(update.source, "session_identifier", "_delete")
        }
        vanished = action(True, False, mode.keeps_vanished)
        expected = {"kept-session": False} | (
            {"vanished": True} if vanished == Action.DELETE else {}
        )
        assert got == expected, mode.name
        assert update.rows == (1 if mode.keeps_vanished else 2)
