"""Load windows of the time-based branch (SPEC section 5, its "run limits"): which load days one
run takes on.

A run starts at the day of the last processed load time (that day is re-run in full: it may have
grown) and takes at most `backfill_limit_days` further load days, up to now. Windows are half-open
`[start, end)` of load time; a load day is in a window when any instant of it is. Nothing here
subtracts a granularity (no "23:59:59"): a row stamped 23:59:59.412 belongs to its day.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from sessionize_assets.core.clock import as_utc, midnight
from sessionize_assets.core.cursor import CursorConfig, Window, plan_windows

ONE_DAY = dt.timedelta(days=1)


class RunState(StrEnum):
    """The state of the time-based models, in Snowplow's words."""

    FIRST_RUN = "first run"
    OUT_OF_SYNC = "out of sync"
    STANDARD = "standard"

    @property
    def sentence(self) -> str:
        return {
            RunState.FIRST_RUN: "First run of the time-based models",
            RunState.OUT_OF_SYNC: "Time-based models are out of sync: catching up the ones behind",
            RunState.STANDARD: "Standard incremental run",
        }[self]


def load_days_between(start: dt.datetime, end: dt.datetime) -> list[dt.date]:
    """The load days that overlap the half-open window `[start, end)`, ascending."""
    start, end = as_utc(start), as_utc(end)
    if end <= start:
        return []
    days = []
    day = start.date()
    while midnight(day) < end:
        days.append(day)
        day += ONE_DAY
    return days


@dataclass(frozen=True)
class LoadWindow:
    """A run's state and its half-open window `[start, end)` of load time."""

    state: RunState
    start: dt.datetime
    end: dt.datetime
    last_success: Mapping[str, dt.datetime | None] = field(default_factory=dict)

    @property
    def is_empty(self) -> bool:
        return self.end <= self.start

    @property
    def load_days(self) -> list[dt.date]:
        """The load days the window touches (the current day may be partial)."""
        return load_days_between(self.start, self.end)

    def describe(self) -> str:
        """The state and the window, e.g. for logs and metadata."""
        return f"{self.state.sentence}: processing load times in [{self.start.isoformat()}, {self.end.isoformat()})"


def load_window(
    start_date: dt.date,
    backfill_limit_days: int,
    now: dt.datetime,
    last_success: Mapping[str, dt.datetime | None],
) -> LoadWindow:
    """The state and window of a time-based run.

    `last_success` maps each load-day model (filtered_events, days_to_process) to the last load time
    it has processed (None: never ran). With B = `backfill_limit_days`:

    - first run (no model ran): `[start_date, least(start_date + B days, now))`
    - out of sync (models differ): `[day(min), least(max, day(min) + B + 1 days, now))`, where a
      model that never ran counts as `start_date` and takes B days like a first run
    - standard: `[day(last), least(day(last) + B + 1 days, now))`: the last day again, B more days
    """
    if backfill_limit_days < 1:
        raise ValueError("backfill_limit_days must be at least 1")
    now = as_utc(now)
    limit = dt.timedelta(days=backfill_limit_days)
    values = {name: (as_utc(v) if v is not None else None) for name, v in last_success.items()}
    done = [v for v in values.values() if v is not None]
    first = midnight(start_date)
    if not done:
        state, start, end = RunState.FIRST_RUN, first, min(first + limit, now)
    elif len(done) < len(values) or min(done) < max(done):
        behind = min(done) if len(done) == len(values) else None
        if behind is None:
            start, cap = first, first + limit
        else:
            start = midnight(behind.date())
            cap = start + limit + ONE_DAY
        state, end = RunState.OUT_OF_SYNC, min(max(done), cap, now)
    else:
        start = midnight(max(done).date())
        state, end = RunState.STANDARD, min(start + limit + ONE_DAY, now)
    return LoadWindow(state=state, start=start, end=max(end, start), last_success=dict(values))


@dataclass(frozen=True)
class RunPlan:
    """The load days one run takes on, in order, and why the others wait."""

    window: LoadWindow
    load_days: tuple[dt.date, ...]
    # Pending load days before the window: new rows landed in already-processed load days.
    earlier: tuple[dt.date, ...] = ()
    # Pending load days left for the next run (over the cap or after the window).
    deferred: tuple[dt.date, ...] = ()
    # When nothing in the window was pending, the window moved over load days without new data.
    passed_over: tuple[dt.date, dt.date] | None = None

    @property
    def nothing_to_do(self) -> bool:
        return not self.load_days

    def lines(self) -> list[str]:
        """What the plan is, in sentences."""
        out = [self.window.describe()]
        if self.passed_over:
            out.append(
                f"Load days {self.passed_over[0]} to {self.passed_over[1]} hold no new data: marked done "
                "without a Spark job."
            )
        if self.earlier:
            out.append(
                "Earlier load days with new rows (re-processed first, in order): "
                + ", ".join(d.isoformat() for d in self.earlier)
            )
        if self.nothing_to_do:
            out.append(
                "Nothing to do: no load day has new data. The run succeeds and moves nothing."
            )
        else:
            out.append(
                f"Processing {len(self.load_days)} load day(s): "
                + ", ".join(d.isoformat() for d in self.load_days)
            )
        if self.deferred:
            out.append(
                f"{len(self.deferred)} pending load day(s) wait for the next run (backfill_limit_days): "
                + ", ".join(d.isoformat() for d in self.deferred)
            )
        return out


def plan_load_days(
    limits: LoadWindow,
    pending: Iterable[dt.date],
    backfill_limit_days: int,
    now: dt.datetime,
) -> RunPlan:
    """The pending load days this run processes, ascending, at most `backfill_limit_days + 1`.

    Pending load days before the window (rows loaded late into a processed day) go first. When the
    window holds no pending load day but later ones exist, the days in between hold no new data:
    the window moves to the first pending day (same width), so a gap in the loads never stalls runs.
    """
    now = as_utc(now)
    pending_days = sorted({d for d in pending if midnight(d) < now})
    start_day = limits.start.date()
    window_days = set(limits.load_days)
    earlier = [d for d in pending_days if d < start_day]
    inside = [d for d in pending_days if d in window_days]
    later = [d for d in pending_days if d >= start_day and d not in window_days]
    passed_over = None
    if not earlier and not inside and later:
        new_start = midnight(later[0])
        span = dt.timedelta(days=backfill_limit_days) + ONE_DAY
        moved = LoadWindow(
            state=limits.state,
            start=new_start,
            end=min(new_start + span, now),
            last_success=limits.last_success,
        )
        if later[0] > start_day:
            passed_over = (start_day, later[0] - ONE_DAY)
        limits = moved
        window_days = set(moved.load_days)
        inside = [d for d in later if d in window_days]
        later = [d for d in later if d not in window_days]
    cap = backfill_limit_days + 1
    candidates = earlier + inside
    return RunPlan(
        window=limits,
        load_days=tuple(candidates[:cap]),
        earlier=tuple(d for d in earlier[:cap]),
        deferred=tuple(candidates[cap:] + later),
        passed_over=passed_over,
    )


def last_processed_load_times(
    max_load_tstamps: Mapping[str, Sequence[dt.datetime | None]],
) -> dict[str, dt.datetime | None]:
    """Per model, the greatest load time it has processed (None: nothing yet)."""
    out: dict[str, dt.datetime | None] = {}
    for model, values in max_load_tstamps.items():
        present = [as_utc(v) for v in values if v is not None]
        out[model] = max(present) if present else None
    return out


def stale_decision_days(
    consumed: Mapping[dt.date, tuple[str, int]],
    decided_from: Mapping[dt.date, Iterable[str]],
) -> list[dt.date]:
    """Load days whose days_to_process is behind their filtered_events, ascending.

    `consumed[L]` = (id of filtered_events(L)'s last materialization, rows it kept);
    `decided_from[L]` = the filtered_events materialization ids L's stored decisions came from.
    A load day whose filtered_events kept nothing needs no decisions unless old ones remain.
    """
    out = []
    for day, (materialization, kept) in consumed.items():
        sources = set(decided_from.get(day, ()))
        if sources == {materialization} or (not sources and kept == 0):
            continue
        out.append(day)
    out += [d for d in decided_from if d not in consumed]
    return sorted(set(out))


def contiguous_ranges(days: Iterable[dt.date], max_days: int) -> list[tuple[dt.date, dt.date]]:
    """Sorted days as inclusive ranges of consecutive days, each at most `max_days` long
    (one Dagster run per range of the command line)."""
    if max_days < 1:
        raise ValueError("max_days must be at least 1")
    out: list[tuple[dt.date, dt.date]] = []
    for day in sorted(set(days)):
        if out and day == out[-1][1] + ONE_DAY and (day - out[-1][0]).days < max_days:
            out[-1] = (out[-1][0], day)
        else:
            out.append((day, day))
    return out


# ------------------------------------------------------------------------------- backfills


def backfill_cursor(start: dt.date, end: dt.date, backfill_limit_days: int) -> CursorConfig:
    """A backfill of load days `start` .. `end` (inclusive) as cursor windows (seed 004): one
    window per Dagster run of at most `backfill_limit_days` load days, aligned to `start`, so a
    resumed backfill cuts the same windows as the interrupted one."""
    if end < start:
        raise ValueError(f"end {end} is before start {start}")
    if backfill_limit_days < 1:
        raise ValueError("backfill_limit_days must be at least 1")
    return CursorConfig(
        start=midnight(start),
        end=midnight(end) + ONE_DAY,
        step=f"P{backfill_limit_days}D",
        align_to_start=True,
    )


def backfill_cursor_name(start: dt.date, end: dt.date) -> str:
    """The name a backfill's checkpoints are kept under in `cursor_state`."""
    return f"backfill/{start.isoformat()}/{end.isoformat()}"


def backfill_windows(
    config: CursorConfig, cursor: dt.datetime | None, now: dt.datetime
) -> list[tuple[Window, list[dt.date]]]:
    """The windows a backfill still has to run (from its checkpointed cursor, up to now), each
    with its load days."""
    return [(w, load_days_between(w.start, w.end)) for w in plan_windows(config, cursor, now)]


# ----------------------------------------------------------------- loading folders by time

LOAD_CURSOR_NAME = "load"


def folder_load_day(name: str) -> dt.date | None:
    """The load day a landing folder is named for (`load_date=2024-03-01` or `2024-03-01`)."""
    text = name.split("=", 1)[1] if name.startswith("load_date=") else name
    try:
        return dt.date.fromisoformat(text)
    except ValueError:
        return None


def folders_in_window(folders: Mapping[dt.date, Any], window: Window) -> list[Any]:
    """The folders whose load day overlaps the half-open window, in day order."""
    wanted = set(load_days_between(window.start, window.end))
    return [folders[day] for day in sorted(folders) if day in wanted]
