"""The decision rule of days_to_process, horizons and pending rows, the late-day mapping and the
manifest: tables of cases, plus a randomized model of many runs (no Spark)."""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sessionize_assets.core.late_days import (
    AggregationRecord,
    Decision,
    DecisionRecord,
    accounting_differences,
    decide,
    decide_load_days,
    decided_horizons,
    event_days_to_request,
    manifest_rows,
    outstanding_event_days,
    pending_rows,
    rows_up_to_horizon,
)

BASE = dt.date(2024, 3, 1)


def day(n: int) -> dt.date:
    return BASE + dt.timedelta(days=n)


def at(n: int) -> dt.datetime:
    return dt.datetime(2024, 1, 1, tzinfo=dt.UTC) + dt.timedelta(minutes=n)


P, S = Decision.PROCESS, Decision.SKIP


@pytest.mark.parametrize(
    ("load", "event", "horizon", "pending", "reprocess", "min_rows", "expected", "reason_part"),
    [
        (10, 10, None, 1, 5, 1000, P, "on time"),
        (10, 11, None, 1, 5, 1000, P, "clock skew"),
        (10, 9, None, 999, 5, 1000, S, "pending 999 < min_rows_to_process 1000"),
        (10, 9, None, 1000, 5, 1000, P, "pending 1000 >= min_rows_to_process"),
        (10, 5, None, 5000, 5, 1000, P, "late by 5 days"),
        (10, 4, None, 5000, 5, 1000, S, "late by 6 days > reprocess_days 5"),
        (10, 4, day(0), 0, 0, 10**9, S, "late by 6 days"),
        # A re-run or backfilled load day already counted: process whatever the thresholds.
        (10, 4, day(10), 0, 5, 1000, P, "already counted"),
        (10, 4, day(12), 0, 0, 10**9, P, "already counted"),
        (10, 10, day(10), 0, 5, 1000, P, "already counted"),
        # min_rows_to_process 0: every late day within reprocess_days is processed.
        (10, 7, day(7), 0, 5, 0, P, "pending 0 >= min_rows_to_process 0"),
        (10, 10, day(3), 1, 0, 5, P, "on time"),
    ],
)
def test_decide(load, event, horizon, pending, reprocess, min_rows, expected, reason_part) -> None:
    decision, reason = decide(day(load), day(event), horizon, pending, reprocess, min_rows)
    assert decision == expected
    assert reason_part in reason


def test_pending_rows_and_rows_up_to_horizon() -> None:
    counts = {(day(1), day(1)): 5, (day(2), day(1)): 3, (day(4), day(1)): 2, (day(2), day(2)): 7}
    assert pending_rows(counts, day(1), None) == 10
    assert pending_rows(counts, day(1), day(1)) == 5
    assert pending_rows(counts, day(1), day(1), as_of=day(3)) == 3
    assert pending_rows(counts, day(1), day(4)) == 0
    assert pending_rows(counts, day(9), None) == 0
    assert rows_up_to_horizon(counts, day(1), day(2)) == 8
    assert rows_up_to_horizon(counts, day(1), None) == 0


def test_decided_horizons_take_the_latest_process_decision_or_a_later_materialized_horizon() -> (
    None
):
    decisions = [
        (day(1), day(1), "process"),
        (day(3), day(1), "skip"),
        (day(2), day(1), "process"),
        (day(2), day(0), "skip"),
    ]
    assert decided_horizons(decisions) == {day(1): day(2)}
    assert decided_horizons(decisions, {day(1): day(5), day(0): day(1), day(7): None}) == {
        day(1): day(5),
        day(0): day(1),
    }
    assert decided_horizons(decisions, {day(1): day(0)}) == {day(1): day(2)}


def rows(decisions) -> list[tuple]:
    return [(d.load_date, d.event_date, d.rows, d.pending, d.decision) for d in decisions]


def test_skipped_rows_carry_forward_until_the_threshold() -> None:
    # Event day 0 gets 2 late rows on each of load days 1..4; threshold 5, reprocess 3 days.
    counts = {(day(0), day(0)): 10}
    for n in range(1, 5):
        counts[(day(n), day(0))] = 2
    out = decide_load_days(
        [day(n) for n in range(0, 5)], counts, {}, reprocess_days=3, min_rows_to_process=5
    )
    assert rows(out) == [
        (day(0), day(0), 10, 10, P),
        (day(1), day(0), 2, 2, S),
        (day(2), day(0), 2, 4, S),
        (day(3), day(0), 2, 6, P),  # 3 days late, 6 pending rows: re-aggregate
        (day(4), day(0), 2, 2, S),  # 4 days late: beyond reprocess_days
    ]
    assert out[3].horizon_before == day(0) and out[4].horizon_before == day(3)
    assert all(d.is_late for d in out[1:]) and not out[0].is_late
    assert event_days_to_request(out) == [day(0)]
    assert event_days_to_request(out[1:3]) == []


def test_decisions_do_not_depend_on_the_order_load_days_are_given() -> None:
    counts = {(day(0), day(0)): 1, (day(1), day(0)): 1, (day(2), day(0)): 1, (day(2), day(2)): 1}
    a = decide_load_days([day(2), day(0), day(1)], counts, {}, 5, 2)
    b = decide_load_days([day(0), day(1), day(2)], counts, {}, 5, 2)
    assert a == b
    assert [d.decision for d in a] == [P, S, P, P]


def test_rerun_of_counted_load_day_processes_and_lists_days_it_no_longer_touches() -> None:
    # Load day 3 was decided before: it processed event day 1 (horizon 3) and skipped event day 0.
    # Re-running it after its rows of day 1 vanished (e.g. now duplicates of an earlier load).
    counts = {(day(3), day(3)): 4, (day(3), day(0)): 1}
    horizons = {day(1): day(3), day(3): day(3)}
    out = decide_load_days(
        [day(3)],
        counts,
        horizons,
        reprocess_days=5,
        min_rows_to_process=100,
        previous_event_days={day(3): [day(0), day(1), day(3)]},
    )
    assert rows(out) == [
        (day(3), day(0), 1, 1, S),  # never counted, below the threshold
        (day(3), day(1), 0, 0, P),  # counted before: re-aggregate without L's vanished rows
        (day(3), day(3), 4, 0, P),
    ]


def test_rerun_of_an_old_load_day_after_later_decisions() -> None:
    # Horizon of event day 0 is load day 4 (processed then); re-running load day 2 re-aggregates.
    counts = {(day(2), day(0)): 3, (day(4), day(0)): 1}
    out = decide_load_days(
        [day(2)], counts, {day(0): day(4)}, reprocess_days=0, min_rows_to_process=10**6
    )
    assert rows(out) == [(day(2), day(0), 3, 0, P)]


def test_outstanding_event_days() -> None:
    records = [
        DecisionRecord(day(1), day(1), "process", at(1)),
        DecisionRecord(day(2), day(1), "process", at(5)),
        DecisionRecord(day(2), day(0), "skip", at(5)),
        DecisionRecord(day(2), day(2), "process", at(5)),
        DecisionRecord(day(3), day(3), "process", at(9)),
    ]
    aggregated = {
        day(1): AggregationRecord(day(1), day(1), 3, at(1), at(2)),  # saw only the first decision
        day(2): AggregationRecord(day(2), day(2), 4, at(5), at(6)),  # up to date
        day(3): AggregationRecord(day(3), day(3), 4, None, at(6)),  # keyhole repair before it
    }
    assert outstanding_event_days(records, aggregated) == {day(1): at(5), day(3): at(9)}
    assert outstanding_event_days(records, {}) == {day(1): at(5), day(2): at(5), day(3): at(9)}
    assert outstanding_event_days([], aggregated) == {}


def test_manifest_rows() -> None:
    counts = {(day(0), day(0)): 10, (day(1), day(0)): 2, (day(2), day(0)): 3, (day(2), day(2)): 4}
    records = [
        DecisionRecord(day(0), day(0), "process", at(1), 10),
        DecisionRecord(day(1), day(0), "skip", at(2), 2),
        DecisionRecord(day(2), day(0), "skip", at(3), 3),
        DecisionRecord(day(2), day(2), "process", at(3), 4),
    ]
    aggregated = {day(0): AggregationRecord(day(0), day(0), 10, at(1), at(4))}
    out = {r.event_date: r for r in manifest_rows(counts, records, aggregated)}
    assert set(out) == {day(0), day(2)}
    r0 = out[day(0)]
    assert (r0.rows_loaded, r0.rows_aggregated, r0.pending, r0.rows_skipped_so_far) == (
        15,
        10,
        5,
        5,
    )
    assert (r0.horizon, r0.decided_horizon, r0.last_processed_at) == (day(0), day(0), at(4))
    assert r0.accounted and not r0.awaiting_aggregation
    r2 = out[day(2)]
    assert (r2.rows_loaded, r2.rows_aggregated, r2.pending, r2.horizon, r2.decided_horizon) == (
        4,
        0,
        4,
        None,
        day(2),
    )
    assert r2.awaiting_aggregation and r2.accounted
    # A stale aggregate (rows of a counted load day changed since) breaks the invariant.
    stale = {day(0): AggregationRecord(day(0), day(0), 9, at(1), at(4))}
    assert not {r.event_date: r for r in manifest_rows(counts, records, stale)}[day(0)].accounted


# A model of many runs: loads land in random load days (late rows, out-of-order load days, re-runs),
# each run decides the pending load days in order and aggregates what they decided.
loads = st.lists(
    st.tuples(st.integers(0, 8), st.integers(0, 6), st.integers(1, 4)),  # load day, lateness, rows
    min_size=1,
    max_size=12,
)


def simulate(events, reprocess_days, min_rows):
    counts: dict = {}
    decisions: dict = {}  # load day -> list[DayDecision]
    aggregated: dict = {}  # event day -> horizon
    clock = 0
    for load_day, lateness, n in events:
        key = (day(load_day), day(load_day - lateness))
        counts[key] = counts.get(key, 0) + n
        # The run: this load day is pending; decide it (a re-run if it was decided before).
        records = [(x.load_date, x.event_date, x.decision) for ds in decisions.values() for x in ds]
        horizons = decided_horizons(records, aggregated)
        previous = {day(load_day): [x.event_date for x in decisions.get(day(load_day), [])]}
        out = decide_load_days(
            [day(load_day)], counts, horizons, reprocess_days, min_rows, previous
        )
        decisions[day(load_day)] = out
        records = [(x.load_date, x.event_date, x.decision) for ds in decisions.values() for x in ds]
        horizons = decided_horizons(records, aggregated)
        for event_day in event_days_to_request(out):
            aggregated[event_day] = horizons[event_day]
        clock += 1
    return counts, decisions, aggregated


@settings(max_examples=150, deadline=None)
@given(loads, st.integers(0, 6), st.integers(0, 6))
def test_accounting_invariant_in_any_sequence_of_loads(events, reprocess_days, min_rows) -> None:
    counts, decisions, aggregated = simulate(events, reprocess_days, min_rows)
    for event_day in {d for (_, d) in counts}:
        horizon = aggregated.get(event_day)
        # The aggregate's horizon is a load day that decided "process" for this event day (the
        # latest one when it was aggregated): rows up to it are counted, rows after it pending.
        processed = [
            x.load_date
            for ds in decisions.values()
            for x in ds
            if x.event_date == event_day and x.decision == P
        ]
        assert horizon is None or horizon in processed
        if horizon is not None:
            assert rows_up_to_horizon(counts, event_day, horizon) > 0
        # Pending rows are exactly the rows of the current "skip" decisions after the horizon.
        skipped_after = sum(
            x.rows
            for ds in decisions.values()
            for x in ds
            if x.event_date == event_day
            and x.decision == S
            and (horizon is None or x.load_date > horizon)
        )
        assert pending_rows(counts, event_day, horizon) == skipped_after


@settings(max_examples=150, deadline=None)
@given(loads)
def test_no_pending_rows_with_min_rows_1_and_reprocess_covering_the_lateness(events) -> None:
    counts, _, aggregated = simulate(events, reprocess_days=6, min_rows=1)
    for event_day in {d for (_, d) in counts}:
        assert pending_rows(counts, event_day, aggregated.get(event_day)) == 0


def test_the_accounting_leaves_out_a_day_awaiting_re_aggregation():
    """A rewritten load day took event day 6's only row away; the command re-aggregates day 4 in
    one run and day 6 in the next. Until then day 6 breaks the invariant, and it is awaiting
    re-aggregation: left out. Any other broken day is still reported."""
    d = dt.date
    counts = {(d(2024, 3, 4), d(2024, 3, 4)): 1, (d(2024, 3, 5), d(2024, 3, 4)): 2}
    counted = {d(2024, 3, 4): (3, d(2024, 3, 5)), d(2024, 3, 6): (1, d(2024, 3, 6))}
    broken = (
        "event day 2024-03-06: 0 rows in filtered_events != 1 counted into daily_aggregates "
        "(horizon 2024-03-06) + 0 pending"
    )
    assert accounting_differences(counts, counted) == [broken]
    assert accounting_differences(counts, counted, {d(2024, 3, 6)}) == []
    assert accounting_differences(counts, counted, {d(2024, 3, 4)}) == [broken]
