"""What `sessionize maintain` may delete: the VACUUM retention rule, in plain Python (no Spark).

VACUUM deletes the data files (and change-data files) that no current table version references
and that were removed longer ago than the retention. A reader that still needs an older version
breaks when its files go. Here the one such reader is the session branch: each session model
reads `filtered_events`' change data feed from the version after the one it consumed last
(`incremental_manifest.consumed_version`), so the files of every version since that commit must
stay. Nothing else reads old versions (the time-based branch, `verify` and `status` read the
latest version, and a Delta time travel older than the retention is the user's own choice).
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

DELTA_MINIMUM_HOURS = 168.0  # Delta's own retentionDurationCheck: 7 days

# Commits that change no data: a change data feed reads no file of theirs (VACUUM logs two
# commits, OPTIMIZE rewrites files with dataChange = false).
NO_DATA_OPERATIONS = frozenset(
    {"VACUUM START", "VACUUM END", "OPTIMIZE", "SET TBLPROPERTIES", "UNSET TBLPROPERTIES"}
)


def first_data_change(operations: Mapping[int, str], after: int) -> int | None:
    """The first version after `after` whose commit changed data (`operations`: version ->
    operation, from the table's history), or None: a reader of the change feed from `after + 1`
    needs no file older than that commit."""
    changed = [v for v, op in operations.items() if v > after and op not in NO_DATA_OPERATIONS]
    return min(changed, default=None)


def last_data_change(recent: Sequence[tuple[int, str]], version: int) -> int:
    """The latest version up to `version` whose commit changed data, from the table's most
    recent commits (`recent`: (version, operation), any order). When every commit read changed
    nothing (an OPTIMIZE, a VACUUM's two commits...), the one just before them is taken as a
    change: the answer is never later than the truth, so a reader comparing it with what it
    consumed may run for nothing but never skips a change."""
    if not recent:
        return version
    changed = [v for v, op in recent if v <= version and op not in NO_DATA_OPERATIONS]
    return max(changed) if changed else min(v for v, _ in recent) - 1


@dataclass(frozen=True)
class OldVersionReader:
    """A reader that still needs `table`'s versions committed since `since`."""

    table: str
    reader: str  # e.g. "session model `sessions` (change data feed from version 42)"
    since: dt.datetime


def hours_needed(readers: Sequence[OldVersionReader], now: dt.datetime) -> float:
    """The smallest retention (hours) that keeps what every reader still needs (0: none)."""
    ages = [(now - r.since).total_seconds() / 3600.0 for r in readers]
    return max([0.0, *ages])


def vacuum_refusal(
    retention_hours: float, readers: Sequence[OldVersionReader], now: dt.datetime
) -> str | None:
    """One sentence when VACUUM with this retention would delete files a reader still needs
    (None: safe). Negative retentions are refused too."""
    if retention_hours < 0:
        return f"--vacuum-hours must be 0 or more, not {retention_hours:g}."
    if readers and retention_hours < hours_needed(readers, now):
        reader = min(readers, key=lambda r: r.since)  # the oldest read decides
        age = hours_needed([reader], now)
        return (
            f"VACUUM of {reader.table} with a retention of {retention_hours:g} hours would "
            f"delete files that {reader.reader} still reads (committed {age:.1f} hours ago); "
            f"run the pipeline first, or use --vacuum-hours {math.ceil(age) + 1} or more."
        )
    return None


def compaction_finds_work(partitions: Sequence[tuple]) -> bool:
    """Would OPTIMIZE rewrite anything? `partitions` holds each live file's partition values.
    Delta's bin-packing merges files within one partition and leaves a partition of one file
    alone, so a table whose every partition is one file (or that has none) is already compact:
    its OPTIMIZE would plan, list and commit nothing, and is skipped."""
    return len(partitions) != len(set(partitions))


# A small state table (the processing manifest, the accounting, the horizons, the load log) gains
# a file with nearly every commit, and a delta-rs read costs about 2.5 ms a file: at 30 load days
# the manifest's 424 files took 0.85 s to read for 520 rows. Its writer compacts it once it holds
# more than this many files beyond two per partition.
FRAGMENTED_SLACK_FILES = 8


def fragmented(partitions: Sequence[tuple], slack: int = FRAGMENTED_SLACK_FILES) -> bool:
    """Is a small table worth compacting after a commit? `partitions` holds each live file's
    partition values. True once the files exceed two per partition by more than `slack`: the
    bound keeps every read within a few files a partition while a compaction (one more commit)
    comes only every `slack` or so commits."""
    return len(partitions) > 2 * len(set(partitions)) + slack


def vacuum_finds_work(unreferenced_ages_hours: Sequence[float], retention_hours: float) -> bool:
    """Would VACUUM delete anything? It deletes only files no current version references, and
    only once they are older than the retention (a removed file's tombstone is never older than
    the file itself), so with no such file old enough it lists the table for nothing and is
    skipped. `unreferenced_ages_hours`: the age of each file on disk that the current version
    does not reference."""
    return any(age >= retention_hours for age in unreferenced_ages_hours)
