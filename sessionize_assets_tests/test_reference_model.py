"""The reference model (docs/testing.md) on hand-computed cases: plain Python, no Spark."""

from __future__ import annotations

import datetime as dt
import hashlib

from sessionize_assets.settings import from_mapping
from sessionize_assets_tests import reference_model as reference
from sessionize_assets_tests.sessions.support import event, make_settings
from sessionize_assets_tests.time_based.test_steps import ROWS, SETTINGS


def test_filtered_events_and_daily_aggregates_of_the_time_based_scenario() -> None:
    settings = from_mapping(SETTINGS)
    kept = reference.filtered_events(ROWS, settings)
    # the same rows test_steps expects from the Spark assets
    assert sorted((r["load_date"].day, r["event_id"], r["event_date"].day) for r in kept) == [
        (1, "a", 1),
        (1, "b", 1),
        (2, "c", 2),
        (2, "d", 1),
        (3, "e", 1),
        (3, "f", 1),
        (5, "h", 1),
    ]
    horizons = {dt.date(2024, 3, 1): dt.date(2024, 3, 3), dt.date(2024, 3, 2): dt.date(2024, 3, 2)}
    daily = {
        (r["user_identifier"], r["event_date"].day): r
        for r in reference.daily_aggregates(kept, settings, horizons)
    }
    assert {k: v["total_events"] for k, v in daily.items()} == {
        ("u1", 1): 2,
        ("u2", 1): 2,
        ("u3", 1): 1,  # h (loaded 03-05) is past the horizon
        ("u1", 2): 1,
    }
    assert daily[("u1", 1)]["event_counts"] == {"page_view": 1, "link_click": 1}


def test_decisions_of_an_in_order_catch_up_of_the_time_based_scenario() -> None:
    settings = from_mapping(SETTINGS)  # min_rows_to_process 2, reprocess_days 2
    kept = reference.filtered_events(ROWS, settings)
    decisions, horizons = reference.days_to_process_in_order(kept, settings)
    d = dt.date(2024, 3, 1).replace
    got = [
        (
            r["load_date"].day,
            r["event_date"].day,
            r["rows"],
            r["is_late"],
            r["horizon_before"] and r["horizon_before"].day,
            r["pending"],
            r["decision"],
        )
        for r in decisions
    ]
    assert got == [
        (1, 1, 2, False, None, 2, "process"),  # on time
        (2, 1, 1, True, 1, 1, "skip"),  # 1 day late, pending 1 < 2
        (2, 2, 1, False, None, 1, "process"),
        (3, 1, 2, True, 1, 3, "process"),  # 2 days late, pending d + e + f = 3
        (5, 1, 1, True, 3, 1, "skip"),  # 4 days late > reprocess_days
    ]
    assert horizons == {d(day=1): d(day=3), d(day=2): d(day=2)}
    # the strict policy (min_rows_to_process 1, reprocess_days >= the largest lateness): every
    # touched day is processed, so each horizon is the last load day with rows of it
    strict = from_mapping({**SETTINGS, "min_rows_to_process": 1, "reprocess_days": 4})
    decisions, horizons = reference.days_to_process_in_order(kept, strict)
    assert {r["decision"] for r in decisions} == {"process"}
    assert horizons == {d(day=1): d(day=5), d(day=2): d(day=2)}


def test_gap_sessions_split_on_gaps_strictly_longer_and_cut_long_chains_at_fixed_days() -> None:
    settings = make_settings(session_mode="gap", session_gap_minutes=30, max_session_days=1)
    rows = [
        event("2024-03-01T10:00:00", "u", event_id="a"),
        event("2024-03-01T10:30:00", "u", event_id="b"),  # exactly the gap: same session
        event("2024-03-01T11:00:01", "u", event_id="c"),  # longer: a new session
    ]
    sessions = sorted(reference.gap_sessions(rows, settings), key=lambda s: s["session_number"])
    assert [(s["total_events"], s["first_page_url"], s["last_page_url"]) for s in sessions] == [
        (2, "https://example.com/a", "https://example.com/b"),
        (1, "https://example.com/c", "https://example.com/c"),
    ]
    assert sessions[0]["session_identifier"] == hashlib.sha256(b"u|a").hexdigest()
    # every 20 minutes from 03-01 20:00 to 03-03 04:00: one chain of 32 hours, cut at midnights
    start = dt.datetime(2024, 3, 1, 20, tzinfo=dt.UTC)
    chain = [event(start + dt.timedelta(minutes=20 * i), "v") for i in range(97)]
    pieces = sorted(reference.gap_sessions(chain, settings), key=lambda s: s["start_tstamp"])
    assert [(s["start_tstamp"].day, s["end_tstamp"].day, s["is_quarantined"]) for s in pieces] == [
        (1, 1, True),
        (2, 2, True),
        (3, 3, True),
    ]
    users = reference.users(pieces)
    assert users[0]["sessions"] == 3 and users[0]["total_events"] == 97


def test_user_session_stats_interpolate_the_median_and_skip_sessions_without_a_user() -> None:
    t0 = dt.datetime(2024, 3, 1, tzinfo=dt.UTC)

    def session(user, seconds):
        return {
            "user_identifier": user,
            "start_tstamp": t0,
            "end_tstamp": t0 + dt.timedelta(seconds=seconds),
        }

    rows = [session("a", 10), session("a", 40), session("a", 0.5), session("a", 100)]
    rows += [session("b", 7), session(None, 1_000)]
    stats = {r["user_identifier"]: r for r in reference.user_session_stats(rows)}
    assert set(stats) == {"a", "b"}
    assert stats["a"] == {
        "user_identifier": "a",
        "sessions": 4,
        "total_duration_s": 150.5,
        "mean_duration_s": 37.625,
        "median_duration_s": 25.0,  # between 10 and 40
        "min_duration_s": 0.5,
        "max_duration_s": 100.0,
    }
    assert stats["b"]["median_duration_s"] == 7.0 and stats["b"]["sessions"] == 1


def test_gap_superseded_names_each_reason_and_successor() -> None:
    def s(sid: str, user: str, start: int, end: int, quarantined: bool = False) -> dict:
        day = dt.datetime(2024, 3, 1, tzinfo=dt.UTC)
        return {
            "session_identifier": sid,
            "user_identifier": user,
            "start_tstamp": day + dt.timedelta(hours=start),
            "end_tstamp": day + dt.timedelta(hours=end),
            "is_quarantined": quarantined,
        }

    old = [
        s("a1", "u1", 1, 2),
        s("a2", "u1", 4, 5),  # a late event closes the gap between a1 and a2: merged into m
        s("b1", "u2", 1, 3),  # a late first event: same span, new id
        s("c1", "u3", 1, 9),  # a deleted middle event: two sessions
        s("d1", "u4", 1, 2),  # every event deleted
        s("e1", "u5", 1, 60),  # a long chain now cut at a day boundary
        s("k1", "u6", 1, 2),  # untouched
    ]
    new = [
        s("m", "u1", 1, 5),
        s("b2", "u2", 0, 3),
        s("c2", "u3", 1, 2),
        s("c3", "u3", 8, 9),
        s("e2", "u5", 1, 23, True),
        s("e3", "u5", 24, 60, True),
        s("k1", "u6", 1, 2),
    ]
    got = sorted(
        (r["superseded_session_identifier"], r["session_identifier"], r["reason"])
        for r in reference.gap_superseded(old, new)
    )
    assert got == [
        ("a1", "m", "merged"),
        ("a2", "m", "merged"),
        ("b1", "b2", "first event changed"),
        ("c1", "c2", "split"),
        ("c1", "c3", "split"),
        ("d1", None, "removed"),
        ("e1", "e2", "cut at max_session_days"),
        ("e1", "e3", "cut at max_session_days"),
    ]
