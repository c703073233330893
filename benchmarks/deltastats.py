"""Delta's own metrics: each commit's `operationMetrics` (what `DESCRIBE HISTORY` shows), read with
delta-rs (no Spark), summed per table over the commits a measurement made."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

# operationMetrics keys (Spark's Delta writer) -> our names. WRITE / CTAS / REPLACE: numFiles,
# numOutputRows, numOutputBytes; MERGE: numTargetRows*, numTargetFilesAdded/Removed; DELETE /
# UPDATE / OPTIMIZE: numAddedFiles, numRemovedFiles, num*Bytes.
# delta-rs (the small tables, and since session 24 the driver's writes of few rows): WRITE
# num_added_rows, num_added_files, num_removed_files; MERGE num_output_rows, num_target_rows_*,
# num_target_files_added/removed (no byte counts).
ROWS_WRITTEN_KEYS = ("numOutputRows", "num_added_rows", "num_output_rows")
FILES_ADDED_KEYS = (
    "numFiles",
    "numAddedFiles",
    "numTargetFilesAdded",
    "num_added_files",
    "num_target_files_added",
)
FILES_REMOVED_KEYS = (
    "numRemovedFiles",
    "numTargetFilesRemoved",
    "num_removed_files",
    "num_target_files_removed",
)
BYTES_ADDED_KEYS = ("numOutputBytes", "numAddedBytes", "numTargetBytesAdded")
BYTES_REMOVED_KEYS = ("numRemovedBytes", "numTargetBytesRemoved")
ROWS_CHANGED_KEYS = (
    "numTargetRowsInserted",
    "numTargetRowsUpdated",
    "numTargetRowsDeleted",
    "numTargetRowsCopied",
    "numDeletedRows",
    "numUpdatedRows",
    "numCopiedRows",
    "num_target_rows_inserted",
    "num_target_rows_updated",
    "num_target_rows_deleted",
    "num_target_rows_copied",
)


def table_dirs(warehouse: Path) -> list[Path]:
    """The Delta tables directly under the warehouse folder."""
    root = Path(warehouse)
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if (p / "_delta_log").is_dir())


def table_versions(warehouse: Path) -> dict[str, int]:
    """Each table's current version (delta-rs)."""
    from deltalake import DeltaTable

    out = {}
    for path in table_dirs(warehouse):
        try:
            out[path.name] = DeltaTable(str(path)).version()
        except Exception:  # noqa: BLE001 - a table being created has no version yet
            continue
    return out


def _int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def summarize_commits(commits: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Totals of some commits' `operationMetrics` (pure: the commit-info dicts in)."""
    out: dict[str, Any] = {
        "commits": 0,
        "rows_written": 0,
        "rows_changed": dict.fromkeys(ROWS_CHANGED_KEYS, 0),
        "files_added": 0,
        "files_removed": 0,
        "bytes_added": 0,
        "bytes_removed": 0,
        "operations": Counter(),
    }
    for commit in commits:
        metrics = commit.get("operationMetrics") or {}
        out["commits"] += 1
        out["operations"][str(commit.get("operation"))] += 1
        out["rows_written"] += sum(_int(metrics.get(k)) for k in ROWS_WRITTEN_KEYS)
        for key in ROWS_CHANGED_KEYS:
            out["rows_changed"][key] += _int(metrics.get(key))
        out["files_added"] += sum(_int(metrics.get(k)) for k in FILES_ADDED_KEYS)
        out["files_removed"] += sum(_int(metrics.get(k)) for k in FILES_REMOVED_KEYS)
        out["bytes_added"] += sum(_int(metrics.get(k)) for k in BYTES_ADDED_KEYS)
        out["bytes_removed"] += sum(_int(metrics.get(k)) for k in BYTES_REMOVED_KEYS)
    out["operations"] = dict(sorted(out["operations"].items()))
    out["rows_changed"] = {k: v for k, v in out["rows_changed"].items() if v}
    return out


def commits_since(warehouse: Path, before: Mapping[str, int]) -> dict[str, dict[str, Any]]:
    """Per table, the totals of the commits after version `before[table]` (all commits of a
    table that did not exist before)."""
    from deltalake import DeltaTable

    out = {}
    for path in table_dirs(warehouse):
        start = before.get(path.name, -1)
        try:
            table = DeltaTable(str(path))
        except Exception:  # noqa: BLE001
            continue
        if table.version() <= start:
            continue
        history = [c for c in table.history() if _int(c.get("version", -1)) > start]
        out[path.name] = summarize_commits(history)
        out[path.name]["version"] = table.version()
        out[path.name]["files_now"] = len(table.file_uris())
    return out


def totals(per_table: Mapping[str, Mapping[str, Any]]) -> dict[str, int]:
    """Sums over tables of the per-table totals' numbers."""
    keys = (
        "commits",
        "rows_written",
        "files_added",
        "files_removed",
        "bytes_added",
        "bytes_removed",
    )
    return {k: sum(int(t.get(k, 0)) for t in per_table.values()) for k in keys}
