"""Which event days a load day re-aggregates (SPEC section 5, `days_to_process`), in plain Python.

Everything here is derived from stored data, never incremented in place:

- `counts[(L, D)]`: rows of event day D in `filtered_events` with load day L (from the Delta log's
  file statistics: the table is partitioned by both days).
- horizon(D): the last load day whose rows `daily_aggregates(D)` includes (or will include once
  the requested partition has run): the greatest load day that decided "process" for D, or the
  horizon a materialization of `daily_aggregates(D)` recorded (a keyhole repair), whichever is later.
- pending(D) as of load day L: rows of D with horizon(D) < load day <= L.

So any partition can be re-run without double counting.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

Counts = Mapping[tuple[dt.date, dt.date], int]  # (load day, event day) -> rows


class Decision(StrEnum):
    PROCESS = "process"
    SKIP = "skip"


@dataclass(frozen=True)
class DayDecision:
    """One row of `days_to_process`: what load day L decided for event day D."""

    load_date: dt.date
    event_date: dt.date
    rows: int  # rows of D in filtered_events(L)
    is_late: bool  # D < L
    horizon_before: dt.date | None  # horizon(D) when L was decided
    pending: int  # pending(D) as of L (including L's own rows when L > horizon)
    decision: Decision
    reason: str


def decide(
    load_day: dt.date,
    event_day: dt.date,
    horizon: dt.date | None,
    pending: int,
    reprocess_days: int,
    min_rows_to_process: int,
) -> tuple[Decision, str]:
    """The decision rule for one (load day L, event day D), with its reason.

    - L <= horizon(D) (D's rows of L were already counted: a re-run or backfilled load day): process.
    - D >= L (on time; D > L only within the clock-skew tolerance): process.
    - D < L: process if L - D <= reprocess_days and pending(D) >= min_rows_to_process, else skip
      (pending(D) carries forward to the next load day).
    """
    if horizon is not None and load_day <= horizon:
        return (
            Decision.PROCESS,
            f"load day already counted (horizon {horizon.isoformat()}): re-aggregate",
        )
    if event_day >= load_day:
        return (
            Decision.PROCESS,
            "on time" if event_day == load_day else "ahead of its load day (clock skew)",
        )
    lateness = (load_day - event_day).days
    if lateness > reprocess_days:
        return Decision.SKIP, f"late by {lateness} days > reprocess_days {reprocess_days}"
    if pending < min_rows_to_process:
        return (
            Decision.SKIP,
            f"late by {lateness} days, pending {pending} < min_rows_to_process {min_rows_to_process}",
        )
    return (
        Decision.PROCESS,
        f"late by {lateness} days, pending {pending} >= min_rows_to_process {min_rows_to_process}",
    )


def pending_rows(
    counts: Counts, event_day: dt.date, horizon: dt.date | None, as_of: dt.date | None = None
) -> int:
    """Rows of D with horizon(D) < load day (<= as_of when given): not yet counted into D."""
    return sum(
        rows
        for (load_day, day), rows in counts.items()
        if day == event_day
        and (horizon is None or load_day > horizon)
        and (as_of is None or load_day <= as_of)
    )


def decided_horizons(
    decisions: Iterable[tuple[dt.date, dt.date, str]],
    materialized: Mapping[dt.date, dt.date | None] | None = None,
) -> dict[dt.date, dt.date]:
    """horizon(D) from stored data: the latest load day that decided "process" for D, or the
    horizon recorded by a materialization of daily_aggregates(D), whichever is later.

    `decisions` are (load day, event day, decision) rows of days_to_process.
    """
    out: dict[dt.date, dt.date] = {}
    for load_day, event_day, decision in decisions:
        if decision == Decision.PROCESS and (event_day not in out or load_day > out[event_day]):
            out[event_day] = load_day
    for event_day, horizon in (materialized or {}).items():
        if horizon is not None and (event_day not in out or horizon > out[event_day]):
            out[event_day] = horizon
    return out


def decide_load_days(
    load_days: Sequence[dt.date],
    counts: Counts,
    horizons: Mapping[dt.date, dt.date],
    reprocess_days: int,
    min_rows_to_process: int,
    previous_event_days: Mapping[dt.date, Iterable[dt.date]] | None = None,
) -> list[DayDecision]:
    """Decide load days in ascending order, each seeing the decisions of the ones before it.

    `horizons` is horizon(D) before these load days (see `decided_horizons`; it may include the
    previous decisions of the load days being re-decided). `previous_event_days[L]` are the event
    days L's previous `days_to_process` listed: if a re-run of L no longer touches one of them, it
    is still decided (with 0 rows) so that a day that counted L's old rows is re-aggregated.
    """
    horizon = dict(horizons)
    touched: dict[dt.date, set[dt.date]] = defaultdict(set)
    for (load_day, event_day), rows in counts.items():
        if rows > 0:
            touched[load_day].add(event_day)
    out: list[DayDecision] = []
    for load_day in sorted(set(load_days)):
        days = set(touched.get(load_day, ()))
        for event_day in (previous_event_days or {}).get(load_day, ()):
            if (
                event_day not in days
                and horizon.get(event_day) is not None
                and load_day <= horizon[event_day]
            ):
                days.add(event_day)
        for event_day in sorted(days):
            before = horizon.get(event_day)
            pending = pending_rows(counts, event_day, before, as_of=load_day)
            decision, reason = decide(
                load_day, event_day, before, pending, reprocess_days, min_rows_to_process
            )
            out.append(
                DayDecision(
                    load_date=load_day,
                    event_date=event_day,
                    rows=counts.get((load_day, event_day), 0),
                    is_late=event_day < load_day,
                    horizon_before=before,
                    pending=pending,
                    decision=decision,
                    reason=reason,
                )
            )
            if decision == Decision.PROCESS and (before is None or load_day > before):
                horizon[event_day] = load_day
    return out


def event_days_to_request(decisions: Iterable[DayDecision]) -> list[dt.date]:
    """The late-day mapping: the event days whose daily_aggregates partitions a materialized load
    day asks for (every event day it decided to process), ascending, each once."""
    return sorted({d.event_date for d in decisions if d.decision == Decision.PROCESS})


@dataclass(frozen=True)
class DecisionRecord:
    """A stored `days_to_process` row, as the sensor and the run command read it (delta-rs)."""

    load_date: dt.date
    event_date: dt.date
    decision: str
    decided_at: dt.datetime
    rows: int = 0


@dataclass(frozen=True)
class AggregationRecord:
    """What the last materialization of daily_aggregates(D) recorded (`daily_aggregate_horizons`)."""

    event_date: dt.date
    horizon: dt.date | None
    rows_aggregated: int
    decided_through: dt.datetime | None  # the latest "process" decision it had seen
    aggregated_at: dt.datetime


def latest_process_decisions(records: Iterable[DecisionRecord]) -> dict[dt.date, dt.datetime]:
    """Per event day, when the latest "process" decision for it was made."""
    out: dict[dt.date, dt.datetime] = {}
    for r in records:
        if r.decision == Decision.PROCESS and (
            r.event_date not in out or r.decided_at > out[r.event_date]
        ):
            out[r.event_date] = r.decided_at
    return out


def outstanding_event_days(
    records: Iterable[DecisionRecord], aggregated: Mapping[dt.date, AggregationRecord]
) -> dict[dt.date, dt.datetime]:
    """Event days decided "process" after daily_aggregates(D) last ran: {D: latest decision time}.

    A materialization of daily_aggregates(D) records the latest decision time it saw (it computes
    up to the horizon of every decision made before it), so D is outstanding exactly when a newer
    "process" decision exists. Derived from the lake: a restart or a lost cursor changes nothing.
    """
    out = {}
    for event_day, decided_at in latest_process_decisions(records).items():
        done = aggregated.get(event_day)
        if done is None or done.decided_through is None or done.decided_through < decided_at:
            out[event_day] = decided_at
    return dict(sorted(out.items()))


@dataclass(frozen=True)
class ManifestRow:
    """One row of `daily_aggregation_manifest`: the state of one event day."""

    event_date: dt.date
    rows_loaded: int  # rows of D in filtered_events, all load days
    rows_aggregated: int  # rows counted into daily_aggregates(D)
    pending: int  # rows of D with load day > horizon(D)
    rows_skipped_so_far: int  # summed from days_to_process "skip" decisions
    horizon: dt.date | None  # of the materialized daily_aggregates(D)
    decided_horizon: dt.date | None  # including decisions whose request has not run yet
    last_processed_at: dt.datetime | None
    awaiting_aggregation: bool  # a "process" decision newer than the last materialization
    accounted: bool  # rows_loaded == rows_aggregated + pending


def manifest_rows(
    counts: Counts,
    records: Sequence[DecisionRecord],
    aggregated: Mapping[dt.date, AggregationRecord],
) -> list[ManifestRow]:
    """Per event day (any day with rows, decisions or an aggregate): the manifest's row."""
    days = {d for (_, d) in counts} | {r.event_date for r in records} | set(aggregated)
    decided = decided_horizons(
        ((r.load_date, r.event_date, r.decision) for r in records),
        {d: a.horizon for d, a in aggregated.items()},
    )
    waiting = outstanding_event_days(records, aggregated)
    skipped: dict[dt.date, int] = defaultdict(int)
    for r in records:
        if r.decision == Decision.SKIP:
            skipped[r.event_date] += r.rows
    out = []
    for day in sorted(days):
        done = aggregated.get(day)
        horizon = done.horizon if done else None
        loaded = sum(rows for (_, d), rows in counts.items() if d == day)
        aggregated_rows = done.rows_aggregated if done else 0
        pending = pending_rows(counts, day, horizon)
        out.append(
            ManifestRow(
                event_date=day,
                rows_loaded=loaded,
                rows_aggregated=aggregated_rows,
                pending=pending,
                rows_skipped_so_far=skipped.get(day, 0),
                horizon=horizon,
                decided_horizon=decided.get(day),
                last_processed_at=done.aggregated_at if done else None,
                awaiting_aggregation=day in waiting,
                accounted=loaded == aggregated_rows + pending,
            )
        )
    return out


def rows_up_to_horizon(counts: Counts, event_day: dt.date, horizon: dt.date | None) -> int:
    """Rows of D with load day <= horizon(D): what daily_aggregates(D) must count."""
    if horizon is None:
        return 0
    return sum(
        rows for (load_day, d), rows in counts.items() if d == event_day and load_day <= horizon
    )


def accounting_differences(
    counts: Counts,
    counted: Mapping[dt.date, tuple[int, dt.date | None]],
    awaiting: Collection[dt.date] = (),
) -> list[str]:
    """The accounting invariant per event day, as named differences (empty: it holds).

    `counted[D]` = (rows counted into daily_aggregates(D), i.e. the sum of its `total_events`, and
    the horizon it recorded). For every D: rows of D in filtered_events = counted + pending(D).
    Days `awaiting` re-aggregation (a "process" decision newer than their aggregate:
    `outstanding_event_days`) are left out: a later run re-aggregates them, and until then a
    rewritten load day may have taken their rows away.
    """
    out = []
    for event_day in sorted({d for (_, d) in counts} | set(counted)):
        if event_day in awaiting:
            continue
        rows_counted, horizon = counted.get(event_day, (0, None))
        loaded = sum(rows for (_, d), rows in counts.items() if d == event_day)
        pending = pending_rows(counts, event_day, horizon)
        if loaded != rows_counted + pending:
            out.append(
                f"event day {event_day}: {loaded} rows in filtered_events != {rows_counted} counted into "
                f"daily_aggregates (horizon {horizon}) + {pending} pending"
            )
    return out


def aggregation_horizons(
    decisions: Iterable[DecisionRecord],
    aggregated: Mapping[dt.date, AggregationRecord],
    counts: Mapping[tuple[dt.date, dt.date], int],
    event_days: Iterable[dt.date],
    all_loaded_rows: bool,
) -> dict[dt.date, dt.date | None]:
    """The horizon each event day is recomputed up to: the decided one, or (keyhole repair) the
    last load day holding rows of it, whichever is later."""
    decided = decided_horizons(
        ((r.load_date, r.event_date, r.decision) for r in decisions),
        {d: a.horizon for d, a in aggregated.items()},
    )
    out: dict[dt.date, dt.date | None] = {}
    for day in event_days:
        horizon = decided.get(day)
        if all_loaded_rows:
            loaded = [ld for (ld, d), rows in counts.items() if d == day and rows > 0]
            if loaded and (horizon is None or max(loaded) > horizon):
                horizon = max(loaded)
        out[day] = horizon
    return out
