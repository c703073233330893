"""Cursor windows after Airbyte's DatetimeBasedCursor (SPEC section 7, seed 004).

A cursor turns "from the saved cursor to now" into half-open windows `[a, b)` of one `step`:

- with no state, windows start at `start - lookback_window` (the seed's example: start
  2022-02-01 with lookback P31D reads from 2022-01-01);
- with state, they start at `max(start, cursor) - lookback_window`;
- they end at `min(end, now)` (the last window is cut there);
- after each completed window the state becomes that window's end and is checkpointed, so a
  failed run resumes at its first unfinished window (minus the lookback window, if any);
- state is kept per partition (e.g. per app_id or source) and falls back to one global cursor
  when there are more than `max_partitions` partitions. The state's shape follows the seed's:
  `{"states": [{"partition_key": ..., "cursor": ...}], "state": {"cursor": ...},
  "use_global_cursor": bool}`.

Deviation from Airbyte: windows are half-open, so there is no `cursor_granularity` and no end
that is one granularity before the next start; the cursor is "everything before it is done"
(the end of the last completed window), not the last record's cursor value. The global cursor of
per-partition state is the *minimum* of the partition cursors, so falling back to it never
skips data of a known partition (it may re-read some); it is updated only when a run completes every slice.
"""

from __future__ import annotations

import calendar
import datetime as dt
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from sessionize_assets.core.clock import as_utc
from sessionize_assets.errors import UserError

DEFAULT_MAX_PARTITIONS = 10_000
"""Airbyte's per-partition limit before the global cursor takes over."""


class InvalidDurationError(UserError, ValueError):
    """Text that is not an ISO 8601 duration this module understands."""


# ------------------------------------------------------------------------- ISO 8601 durations

_DURATION = re.compile(
    r"^P(?!$)"
    r"(?:(?P<years>\d+)Y)?(?:(?P<months>\d+)M)?(?:(?P<weeks>\d+)W)?(?:(?P<days>\d+)D)?"
    r"(?:T(?=\d)(?:(?P<hours>\d+)H)?(?:(?P<minutes>\d+)M)?(?:(?P<seconds>\d+(?:[.,]\d+)?)S)?)?$"
)


@dataclass(frozen=True)
class Duration:
    """An ISO 8601 duration: calendar months (years are 12 months), days, and a fixed time."""

    months: int = 0
    days: int = 0
    time: dt.timedelta = dt.timedelta(0)
    text: str = field(default="", compare=False)

    @property
    def is_zero(self) -> bool:
        return self.months == 0 and self.days == 0 and self.time == dt.timedelta(0)

    @property
    def is_fixed(self) -> bool:
        """True when the length does not depend on the calendar (no months or years)."""
        return self.months == 0

    def approximate(self) -> dt.timedelta:
        """The length, with months counted as 30.436875 days (for estimates only)."""
        return dt.timedelta(days=self.days + self.months * 30.436875) + self.time

    def shift(self, instant: dt.datetime, times: int = 1) -> dt.datetime:
        """`instant` plus `times` of this duration (negative: minus). Month ends are clamped."""
        shifted = _add_months(instant, self.months * times) if self.months else instant
        return shifted + dt.timedelta(days=self.days * times) + self.time * times

    def __str__(self) -> str:
        return self.text or repr(self)


def _add_months(instant: dt.datetime, months: int) -> dt.datetime:
    index = instant.year * 12 + (instant.month - 1) + months
    year, month = divmod(index, 12)
    day = min(instant.day, calendar.monthrange(year, month + 1)[1])
    return instant.replace(year=year, month=month + 1, day=day)


def parse_duration(text: str | Duration) -> Duration:
    """`P1D`, `PT6H`, `P31D`, `P1M`, `P1Y2M3W4DT5H6M7.5S`, `PT0.000001S` -> Duration."""
    if isinstance(text, Duration):
        return text
    cleaned = str(text).strip().upper()
    match = _DURATION.match(cleaned)
    if match is None:
        raise InvalidDurationError(
            f"{text!r} is not an ISO 8601 duration such as P1D, PT6H or P31D."
        )
    parts = {k: v for k, v in match.groupdict().items() if v is not None}
    seconds = Decimal(parts.get("seconds", "0").replace(",", "."))
    micros = int(seconds * 1_000_000)
    time = dt.timedelta(
        hours=int(parts.get("hours", 0)), minutes=int(parts.get("minutes", 0)), microseconds=micros
    )
    return Duration(
        months=int(parts.get("years", 0)) * 12 + int(parts.get("months", 0)),
        days=int(parts.get("weeks", 0)) * 7 + int(parts.get("days", 0)),
        time=time,
        text=cleaned,
    )


ZERO = Duration(text="P0D")


# ------------------------------------------------------------------------------- windows


@dataclass(frozen=True, order=True)
class Window:
    """A half-open interval `[start, end)` of cursor values."""

    start: dt.datetime
    end: dt.datetime

    def __contains__(self, instant: dt.datetime) -> bool:
        return self.start <= as_utc(instant) < self.end

    def as_dict(self) -> dict[str, str]:
        return {"start": self.start.isoformat(), "end": self.end.isoformat()}

    def __str__(self) -> str:
        return f"[{self.start.isoformat()}, {self.end.isoformat()})"


@dataclass(frozen=True)
class CursorConfig:
    """A DatetimeBasedCursor: `start`, optional `end` (default: now), `step`, `lookback_window`.

    `align_to_start`: window ends fall on `start + k * step` (a resumed or looked-back first
    window may then be shorter); otherwise windows are anchored at where reading begins, as
    Airbyte's are. `max_partitions`: beyond this many partitions the global cursor is used.
    Durations may be given as ISO 8601 text; instants as ISO 8601 text (UTC if no zone).
    """

    start: dt.datetime
    step: Duration = field(default_factory=lambda: parse_duration("P1D"))
    end: dt.datetime | None = None
    lookback_window: Duration = ZERO
    align_to_start: bool = False
    max_partitions: int = DEFAULT_MAX_PARTITIONS

    def __post_init__(self) -> None:
        object.__setattr__(self, "start", as_utc(self.start))
        if self.end is not None:
            object.__setattr__(self, "end", as_utc(self.end))
        object.__setattr__(self, "step", parse_duration(self.step))
        object.__setattr__(self, "lookback_window", parse_duration(self.lookback_window or ZERO))
        if self.step.is_zero or self.step.approximate() <= dt.timedelta(0):
            raise InvalidDurationError(f"The cursor step {self.step} must be longer than zero.")
        if self.max_partitions < 0:
            raise ValueError("max_partitions must be zero or more")


def reading_start(config: CursorConfig, cursor: dt.datetime | None) -> dt.datetime:
    """Where reading begins: `max(start, cursor) - lookback_window` (cursor None: `start - lookback`)."""
    begin = config.start if cursor is None else max(config.start, as_utc(cursor))
    return config.lookback_window.shift(begin, -1)


def reading_end(config: CursorConfig, now: dt.datetime) -> dt.datetime:
    """Where reading ends (exclusive): `min(end, now)`."""
    now = as_utc(now)
    return now if config.end is None else min(config.end, now)


def _first_boundary_after(anchor: dt.datetime, step: Duration, instant: dt.datetime) -> int:
    """The smallest k with `anchor + k * step > instant`."""
    k = math.floor((instant - anchor) / step.approximate())
    while step.shift(anchor, k) > instant:
        k -= 1
    while step.shift(anchor, k) <= instant:
        k += 1
    return k


def plan_windows(
    config: CursorConfig, cursor: dt.datetime | None, now: dt.datetime
) -> list[Window]:
    """The windows still to read, in order: from `reading_start` to `reading_end`, one step each."""
    begin = reading_start(config, cursor)
    end = reading_end(config, now)
    if begin >= end:
        return []
    anchor, k = (config.start, None) if config.align_to_start else (begin, 1)
    if k is None:
        k = _first_boundary_after(anchor, config.step, begin)
    windows: list[Window] = []
    start = begin
    while start < end:
        stop = min(config.step.shift(anchor, k), end)
        windows.append(Window(start, stop))
        start, k = stop, k + 1
    return windows


def advance(cursor: dt.datetime | None, window: Window) -> dt.datetime:
    """The cursor after completing `window`: its end (never moving backwards)."""
    return window.end if cursor is None else max(as_utc(cursor), window.end)


# ------------------------------------------------------------------ per-partition state


@dataclass(frozen=True)
class CursorState:
    """Per-partition cursors, the global cursor, and whether the global one is in use."""

    partitions: Mapping[str, dt.datetime] = field(default_factory=dict)
    global_cursor: dt.datetime | None = None
    use_global_cursor: bool = False

    def cursor_for(self, partition: str | None) -> dt.datetime | None:
        """The cursor a slice of `partition` starts from (None: the global cursor)."""
        if partition is None or self.use_global_cursor:
            return self.global_cursor
        return self.partitions.get(partition)

    def to_dict(self) -> dict[str, Any]:
        """The seed's shape: `{"states": [...], "state": {...}, "use_global_cursor": bool}`."""
        return {
            "states": [
                {"partition_key": key, "cursor": self.partitions[key].isoformat()}
                for key in sorted(self.partitions)
            ],
            "state": {}
            if self.global_cursor is None
            else {"cursor": self.global_cursor.isoformat()},
            "use_global_cursor": self.use_global_cursor,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> CursorState:
        """The inverse of `to_dict` (None or {} is the empty state)."""
        if not data:
            return cls()
        partitions = {
            str(entry["partition_key"]): as_utc(entry["cursor"]) for entry in data.get("states", [])
        }
        cursor = (data.get("state") or {}).get("cursor")
        return cls(
            partitions=partitions,
            global_cursor=as_utc(cursor) if cursor else None,
            use_global_cursor=bool(data.get("use_global_cursor", False)),
        )


@dataclass(frozen=True)
class Slice:
    """One unit of work: a window of one partition (None: all partitions, the global cursor)."""

    partition: str | None
    window: Window

    def as_dict(self) -> dict[str, Any]:
        return {"partition": self.partition, **self.window.as_dict()}


def with_fallback(
    config: CursorConfig, state: CursorState, partitions: Sequence[str] | None
) -> CursorState:
    """Switch to the global cursor when the partitions (known and new) exceed `max_partitions`.

    The global cursor becomes the smallest partition cursor, so no known partition skips data.
    """
    if partitions is None or state.use_global_cursor:
        return state
    known = set(state.partitions) | set(partitions)
    if len(known) <= config.max_partitions:
        return state
    cursors = list(state.partitions.values())
    global_cursor = min(cursors) if cursors else state.global_cursor
    return CursorState(partitions={}, global_cursor=global_cursor, use_global_cursor=True)


def plan_slices(
    config: CursorConfig,
    state: CursorState,
    now: dt.datetime,
    partitions: Sequence[str] | None = None,
) -> list[Slice]:
    """The slices still to read: per partition (partition by partition), or global.

    `partitions=None` means an unpartitioned cursor. Apply `with_fallback` first (the driver does).
    """
    if partitions is None or state.use_global_cursor:
        return [Slice(None, w) for w in plan_windows(config, state.global_cursor, now)]
    return [
        Slice(partition, window)
        for partition in dict.fromkeys(partitions)
        for window in plan_windows(config, state.partitions.get(partition), now)
    ]


def advance_state(state: CursorState, done: Slice) -> CursorState:
    """The state after completing one slice (the pure step the driver checkpoints)."""
    if done.partition is None or state.use_global_cursor:
        return CursorState(
            partitions=dict(state.partitions),
            global_cursor=advance(state.global_cursor, done.window),
            use_global_cursor=state.use_global_cursor,
        )
    partitions = dict(state.partitions)
    partitions[done.partition] = advance(partitions.get(done.partition), done.window)
    return CursorState(partitions=partitions, global_cursor=state.global_cursor)


def finish_run(state: CursorState) -> CursorState:
    """The state after a run whose slices all completed: in per-partition mode the global
    cursor becomes the smallest partition cursor (Airbyte updates it only at the end of a sync)."""
    if state.use_global_cursor or not state.partitions:
        return state
    return CursorState(
        partitions=dict(state.partitions), global_cursor=min(state.partitions.values())
    )


def run_slices(
    config: CursorConfig,
    state: CursorState,
    process: Callable[[Slice], Any],
    checkpoint: Callable[[CursorState], Any],
    now: dt.datetime,
    partitions: Sequence[str] | None = None,
) -> CursorState:
    """Process every pending slice in order, checkpointing the state after each one.

    When all slices completed, the global cursor is brought up (`finish_run`) and checkpointed. If `process` raises, the error propagates after the earlier slices were checkpointed, so the
    next run (given the checkpointed state) resumes at the first unfinished window. A switch to
    the global cursor is checkpointed before the first slice.
    """
    prepared = with_fallback(config, state, partitions)
    if prepared != state:
        checkpoint(prepared)
    state = prepared
    for piece in plan_slices(config, state, now, partitions):
        process(piece)
        state = advance_state(state, piece)
        checkpoint(state)
    finished = finish_run(state)
    if finished != state:
        checkpoint(finished)
    return finished


def run_windows(
    config: CursorConfig,
    cursor: dt.datetime | None,
    process: Callable[[Window], Any],
    checkpoint: Callable[[dt.datetime], Any],
    now: dt.datetime,
) -> dt.datetime | None:
    """The unpartitioned driver: process windows in order, checkpoint the cursor after each."""
    for window in plan_windows(config, cursor, now):
        process(window)
        cursor = advance(cursor, window)
        checkpoint(cursor)
    return cursor


def windows_between(windows: Iterable[Window]) -> Window | None:
    """The span `[first.start, last.end)` of consecutive windows (None when there are none)."""
    items = list(windows)
    if not items:
        return None
    return Window(items[0].start, items[-1].end)
