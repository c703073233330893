"""One read of filtered_events' touched event days, shared by both branches of one command.

`sessionize run` (and `backfill`, the demo) runs the time-based branch and then the session-based
branch in one process. Both read the same event days of filtered_events: daily_aggregates
recomputes every event day the new rows touch, and the session branch re-reads the events of the
touched sessions, which (late rows reach back weeks) span those same days. Inside `sharing()`,
daily_aggregates keeps the event days it read (persisted, pinned to the Delta version it read) and
the session branch takes them from memory, reading only the other days from storage.

Narrow: only the columns its readers name are kept (`columns`: what daily_aggregates and the
session branch read, about a third of filtered_events' width), and a read is served from memory
only when the kept columns hold every column it asks for.

Exactness: a Delta version is immutable, so "the days kept at version v" plus "the table at
version v without those days" is the table at version v. Rows of another version are never
served: a read at any other version goes to storage (and a newer version drops what was kept).

Outside `sharing()` (Dagster runs launched by the webserver or the daemon, each in its own
process) nothing is kept and every read goes to storage, as before.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from pyspark import StorageLevel
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from sessionize_assets.core.schema import EVENT_DATE

log = logging.getLogger(__name__)


# --- the pure part ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Kept:
    """Event days of one table, kept at one version."""

    path: str
    version: int
    days: frozenset[dt.date]
    columns: frozenset[str] | None = None  # None: every column of the table


def usable(
    kept: Sequence[Kept], path: str, version: int, columns: Iterable[str] | None = None
) -> list[int]:
    """Indexes of the kept reads that can serve `path` at `version` (`columns` of it; None:
    every column): same table, same version, the columns kept, and no event day served twice
    (earlier kept reads win)."""
    wanted = None if columns is None else frozenset(columns)
    chosen: list[int] = []
    covered: set[dt.date] = set()
    for i, k in enumerate(kept):
        if k.path != path or k.version != version or not k.days or k.days & covered:
            continue
        if k.columns is not None and (wanted is None or not wanted <= k.columns):
            continue
        chosen.append(i)
        covered |= k.days
    return chosen


def stale(kept: Sequence[Kept], path: str, version: int) -> list[int]:
    """Indexes of the kept reads of `path` at an older version than `version` (to drop)."""
    return [i for i, k in enumerate(kept) if k.path == path and k.version < version]


# --- the registry (process-wide, active only inside `sharing()`) -----------------------------


@dataclass
class SharedReads:
    kept: list[Kept] = field(default_factory=list)
    frames: list[DataFrame] = field(default_factory=list)
    served_days: int = 0  # event days served from memory (for tests and logs)
    served_reads: int = 0

    def keep(self, entry: Kept, frame: DataFrame) -> None:
        for i in sorted(stale(self.kept, entry.path, entry.version), reverse=True):
            self.frames.pop(i).unpersist()
            self.kept.pop(i)
        self.kept.append(entry)
        self.frames.append(frame)

    def release(self) -> None:
        for frame in self.frames:
            frame.unpersist()
        self.kept.clear()
        self.frames.clear()


_active: SharedReads | None = None


@contextmanager
def sharing() -> Iterator[SharedReads]:
    """Share event-day reads between the runs started inside this block (nested blocks share the
    outer one). Everything kept is released at the end."""
    global _active
    if _active is not None:
        yield _active
        return
    _active = SharedReads()
    try:
        yield _active
    finally:
        shared, _active = _active, None
        shared.release()


def _days_filter(days: Iterable[dt.date]) -> object:
    return F.col(EVENT_DATE).isin(sorted(days))


def narrowed(table: DataFrame, columns: Iterable[str] | None) -> DataFrame:
    """`table` with the named columns it has, in its own order (None: every column)."""
    if columns is None:
        return table
    wanted = set(columns)
    return table.select(*[c for c in table.columns if c in wanted])


def event_days(
    table: DataFrame,
    path: str,
    version: int | None,
    days: Sequence[dt.date],
    columns: Iterable[str] | None = None,
) -> tuple[DataFrame, bool]:
    """`table` (the Delta table at `path`, read at `version`) restricted to `days` and to the
    named `columns` it has (None: every column).

    Inside `sharing()` the rows are persisted and kept for later readers of the same version; the
    second value is then True and the caller must not unpersist them (the block does)."""
    rows = narrowed(table.filter(_days_filter(days)), columns)
    if _active is None or version is None or not days:
        return rows, False
    rows = rows.persist(StorageLevel.MEMORY_AND_DISK_DESER)
    kept_columns = None if columns is None else frozenset(rows.columns)
    _active.keep(Kept(path, version, frozenset(days), kept_columns), rows)
    return rows, True


def table_at(
    path: str,
    version: int,
    read: Callable[[], DataFrame],
    columns: Iterable[str] | None = None,
) -> DataFrame:
    """The table at `path` and `version` (`read()` reads it from storage), with the named
    `columns` it has (None: every column): the event days kept at that version come from memory
    when they hold those columns, the rest from storage. Same rows, the table's column order."""
    storage = narrowed(read(), columns)
    if _active is None:
        return storage
    chosen = usable(_active.kept, path, version, storage.columns)
    if not chosen:
        return storage
    days: set[dt.date] = set()
    parts: list[DataFrame] = []
    for i in chosen:
        days |= _active.kept[i].days
        parts.append(_active.frames[i].select(*storage.columns))
    # Rows without an event day cannot be kept ones: they always come from storage.
    rest = storage.filter(F.col(EVENT_DATE).isNull() | ~_days_filter(days))
    _active.served_days += len(days)
    _active.served_reads += 1
    log.info(
        f"{path} at version {version}: {len(days)} event day(s) from memory, rest from storage"
    )
    combined = rest
    for part in parts:
        combined = combined.unionByName(part)
    return combined


def active() -> SharedReads | None:
    """The registry of the enclosing `sharing()` block, if any."""
    return _active
