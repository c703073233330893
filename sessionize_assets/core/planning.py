"""The time-based branch's planner: what to materialize next. Pure functions, called alike by the
sensors (which turn a plan into run requests) and by `sessionize run` / `backfill` (which
materialize the same plan in-process), so both drivers take on the same days in the same order.

1. Load days: `next_load_days` — the pending load days inside the load window
   (`core.load_windows.plan_load_days`: run limits, at most `backfill_limit_days + 1` days,
   earlier days with late rows first), minus those the processing manifest blocks.
2. Runs for those days: `load_day_runs` — contiguous ranges of at most `backfill_limit_days`
   partitions, split where the need changes (filtered_events + days_to_process, or only
   days_to_process when filtered_events already consumed the day's files).
3. Load days a change reached: `reached_load_days` — later, already processed load days that
   became pending because their duplicates were reached (within `dedupe_lookback_days`);
   `redo_cascade` redoes them, and what their redo reaches in turn, to the end.
4. Event days: `ready_event_days` — the outstanding event days (decided "process" after their
   last aggregation) that are partitions by now, and those that must wait (clock skew).
5. Attributes and the manifest: `finish_due`.

The session branch's "caught up" rule is `core.run_limits.caught_up`.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from sessionize_assets.core.clock import midnight
from sessionize_assets.core.load_windows import (
    LoadWindow,
    RunPlan,
    contiguous_ranges,
    plan_load_days,
)

FILTER_AND_DECIDE = ("filtered_events", "days_to_process")
DECIDE_ONLY = ("days_to_process",)


def days_between(first: dt.date, last: dt.date) -> list[dt.date]:
    """first .. last, inclusive."""
    return [first + dt.timedelta(days=i) for i in range((last - first).days + 1)]


def next_load_days(
    window: LoadWindow,
    pending: Iterable[dt.date],
    backfill_limit_days: int,
    now: dt.datetime,
    blocked: Collection[dt.date] = (),
) -> tuple[RunPlan, list[dt.date]]:
    """(the plan of the next run, the pending days left out because the processing manifest
    blocks them). Blocked days are left out before planning, so they neither run nor hold the
    window back."""
    pending = sorted(set(pending))
    held = [d for d in pending if d in set(blocked)]
    plan = plan_load_days(
        window, [d for d in pending if d not in set(blocked)], backfill_limit_days, now
    )
    return plan, held


@dataclass(frozen=True)
class LoadDayRun:
    """One run over the load days first .. last (inclusive) of `assets`."""

    first: dt.date
    last: dt.date
    assets: tuple[str, ...]

    @property
    def days(self) -> list[dt.date]:
        return days_between(self.first, self.last)


def load_day_runs(
    days: Iterable[dt.date], refilter: Collection[dt.date], max_days: int
) -> list[LoadDayRun]:
    """The runs that materialize `days`, ascending: contiguous ranges of at most `max_days`
    partitions, split where the need changes, so a load day whose filtered_events is current only
    gets its decisions redone."""
    runs: list[LoadDayRun] = []
    wanted = set(refilter)
    for first, last in contiguous_ranges(days, max_days):
        segment = days_between(first, last)
        start = segment[0]
        for i, day in enumerate(segment):
            if i == len(segment) - 1 or (segment[i + 1] in wanted) != (day in wanted):
                runs.append(
                    LoadDayRun(start, day, FILTER_AND_DECIDE if day in wanted else DECIDE_ONLY)
                )
                if i < len(segment) - 1:
                    start = segment[i + 1]
    return runs


def reached_load_days(
    pending: Iterable[dt.date],
    processed: Sequence[dt.date],
    known: Collection[dt.date],
    dedupe_lookback_days: int,
    latest: dt.date,
) -> list[dt.date]:
    """Pending load days that processing `processed` reached through duplicates: after the first
    processed day, at most `dedupe_lookback_days` after the last, not already known to be pending
    before, and not after `latest` (see `last_started_day`)."""
    if not processed:
        return []
    first, last = min(processed), max(processed)
    reach_end = last + dt.timedelta(days=dedupe_lookback_days)
    return sorted(
        d for d in set(pending) if d not in known and first < d <= reach_end and d <= latest
    )


def redo_cascade(
    pending_now: Callable[[], Iterable[dt.date]],
    redo: Callable[[list[dt.date]], None],
    processed: Sequence[dt.date],
    left_for_later: Collection[dt.date],
    dedupe_lookback_days: int,
    latest: dt.date,
) -> list[dt.date]:
    """Redo (`redo(days)`, ascending) the load days that processing `processed` reached through
    duplicates (`reached_load_days`, read from `pending_now()`), then those the redone days reach
    in turn, until none is left. Returns every day redone, in order (a day may come twice).

    A day is redone again when a day redone after it reaches it again: a run processes load days
    4, 6 and 7, day 4's new rows reach day 5, and redoing 5 reaches 6 once more (found by a random
    history). Days in `left_for_later` (pending before this run and not taken by it: run limits)
    stay for a later run. It ends: redoing day X marks only days after X, so the earliest pending
    day moves later every round; more rounds than days in reach means that no longer holds."""
    if not processed:
        return []
    redone: list[dt.date] = []
    done = list(processed)
    rounds = (latest - min(processed)).days + 2
    for _ in range(max(rounds, 1)):
        reached = reached_load_days(
            pending_now(), done, left_for_later, dedupe_lookback_days, latest
        )
        if not reached:
            return redone
        redo(reached)
        redone += reached
        done += reached
    raise RuntimeError(
        f"redoing the load days reached by duplicates did not settle after {rounds} rounds "
        f"(redone: {', '.join(d.isoformat() for d in redone)}); this is a bug, please report it"
    )


def last_started_day(now: dt.datetime) -> dt.date:
    """The last load day that has started by `now` (a day starts just after its midnight)."""
    today = now.date()
    return today if midnight(today) < now else today - dt.timedelta(days=1)


def ready_event_days(
    outstanding: Mapping[dt.date, dt.datetime] | Iterable[dt.date], today: dt.date
) -> tuple[list[dt.date], list[dt.date]]:
    """(outstanding event days that are partitions by `today`, those after it: they wait)."""
    days = sorted(set(outstanding))
    return [d for d in days if d <= today], [d for d in days if d > today]


def finish_due(has_aggregates: bool, changed: bool, attributes_stale: bool) -> bool:
    """attributes and daily_aggregation_manifest are recomputed when daily_aggregates exists and
    this run changed a load day or an event day, or attributes was computed from another
    daily_aggregates version or for another day."""
    return has_aggregates and (changed or attributes_stale)
