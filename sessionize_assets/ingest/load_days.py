"""Which load days of `events` changed: read from the Delta log with delta-rs (no Spark).

A load day's fingerprint is a hash of the data files of its partition. Any writer that appends to,
rewrites or deletes from a load day changes it, so comparing fingerprints with the ones the last
`filtered_events` materialization consumed tells which load days are pending -- from the lake, not
from a sensor cursor.

A compaction (OPTIMIZE) rewrites files without changing a row, so it changes fingerprints too.
`sessionize maintain` carries the consumed fingerprints across its compactions
(`carry_consumed_fingerprints`): a load day consumed as its files were just before an OPTIMIZE
commit is consumed as they are just after it.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections import defaultdict

from sessionize_assets.core.schema import LOAD_DATE


def _add_actions(path: str, version: int | None = None):
    from sessionize_assets.resources.delta import delta_table

    table = delta_table(path, version)
    if table is None:
        return None, None
    actions = table.get_add_actions(flatten=True)
    columns = actions.schema.names
    paths = actions.column("path").to_pylist() if "path" in columns else []
    key = f"partition.{LOAD_DATE}"
    days = actions.column(key).to_pylist() if key in columns else [None] * len(paths)
    counts = (
        actions.column("num_records").to_pylist()
        if "num_records" in columns
        else [None] * len(paths)
    )
    return table.version(), list(zip(paths, days, counts, strict=True))


def events_fingerprints(events_path: str) -> tuple[int | None, dict[dt.date, str]]:
    """(table version, {load day: fingerprint of its files}); (None, {}) when the table is absent."""
    version, actions = _add_actions(events_path)
    if actions is None:
        return None, {}
    return version, _by_load_day(actions)


def _by_load_day(actions: list[tuple[str, object, object]]) -> dict[dt.date, str]:
    """{load day: fingerprint of its files} from (path, load day, rows) add actions."""
    files: dict[dt.date, list[str]] = defaultdict(list)
    for path, day, _ in actions:
        if day is not None:
            files[_as_date(day)].append(path)
    return {day: _fingerprint(paths) for day, paths in files.items()}


def events_rows_per_load_day(events_path: str) -> dict[dt.date, int]:
    """Rows per load day from the file statistics in the Delta log (no data read)."""
    _, actions = _add_actions(events_path)
    rows: dict[dt.date, int] = defaultdict(int)
    for _, day, count in actions or []:
        if day is not None and count is not None:
            rows[_as_date(day)] += count
    return dict(rows)


def changed_load_days(current: dict[dt.date, str], consumed: dict[dt.date, str]) -> list[dt.date]:
    """Load days whose files differ from what was consumed (new, changed or emptied), ascending."""
    days = {d for d, fp in current.items() if consumed.get(d) != fp}
    days |= {d for d in consumed if d not in current and consumed[d] != EMPTY_FINGERPRINT}
    return sorted(days)


EMPTY_FINGERPRINT = "empty"


def _fingerprint(paths: list[str]) -> str:
    if not paths:
        return EMPTY_FINGERPRINT
    digest = hashlib.sha256()
    for path in sorted(paths):
        digest.update(path.encode())
        digest.update(b"\n")
    return digest.hexdigest()[:32]


def _as_date(value) -> dt.date:  # noqa: ANN001 - arrow gives date or str
    if isinstance(value, dt.datetime):
        return value.date()
    if isinstance(value, dt.date):
        return value
    return dt.date.fromisoformat(str(value))


def consumed_fingerprints(accounting_path: str) -> dict[dt.date, str]:
    """{load day: events fingerprint} that each filtered_events materialization consumed.

    Read from `filtered_events_accounting` (columns `load_date`, `events_fingerprint`) with delta-rs.
    """
    from sessionize_assets.resources.delta import read_small_table

    rows = read_small_table(accounting_path, [LOAD_DATE, "events_fingerprint"])
    return {
        _as_date(r[LOAD_DATE]): r["events_fingerprint"] for r in rows if r["events_fingerprint"]
    }


def pending_load_days(
    events_path: str, accounting_path: str
) -> tuple[int | None, dict[dt.date, str]]:
    """(events version, {pending load day: its current fingerprint}) derived from the lake."""
    version, current = events_fingerprints(events_path)
    consumed = consumed_fingerprints(accounting_path)
    return version, {
        d: current.get(d, EMPTY_FINGERPRINT) for d in changed_load_days(current, consumed)
    }


# Operations that rewrite files without changing a row (Spark's and delta-rs's compaction).
COMPACTIONS = frozenset({"OPTIMIZE"})


def carried_fingerprints(
    consumed: dict[dt.date, str], compactions: list[tuple[dict[dt.date, str], dict[dt.date, str]]]
) -> dict[dt.date, str]:
    """The consumed fingerprints that compactions carry, in order (`compactions`: each commit's
    fingerprints just before and just after it): {load day: fingerprint to record}. A day whose
    consumed fingerprint is not the one just before a compaction (changed or never consumed)
    is not carried by it: it stays pending."""
    current = dict(consumed)
    for before, after in compactions:
        for day, fingerprint in current.items():
            if before.get(day) == fingerprint and day in after:
                current[day] = after[day]
    return {d: fp for d, fp in current.items() if fp != consumed[d]}


def compactions_since(
    events_path: str, version: int
) -> list[tuple[dict[dt.date, str], dict[dt.date, str]]]:
    """(fingerprints just before, just after) for each compaction commit of `events` after
    `version`, ascending."""
    from sessionize_assets.resources.delta import delta_table

    table = delta_table(events_path)
    if table is None:
        return []
    newer = table.history(limit=max(1, table.version() - version))  # the commits after `version`
    versions = sorted(
        int(c["version"])
        for c in newer
        if int(c["version"]) > version and str(c.get("operation")) in COMPACTIONS
    )
    return [
        (_fingerprints_at(events_path, v - 1), _fingerprints_at(events_path, v)) for v in versions
    ]


def _fingerprints_at(events_path: str, version: int) -> dict[dt.date, str]:
    return _by_load_day(_add_actions(events_path, version)[1] or [])


def carry_consumed_fingerprints(events_path: str, accounting_path: str, version: int) -> int:
    """After compactions of `events` since `version`: record the carried fingerprints in
    `filtered_events_accounting` (one MERGE that updates a day only if its fingerprint is still
    the one read, so a materialization that ran meanwhile wins). Returns the days carried."""
    import pyarrow as pa
    from deltalake import DeltaTable

    from sessionize_assets.resources.delta import committed, exists

    if not exists(accounting_path):
        return 0
    consumed = consumed_fingerprints(accounting_path)
    carried = carried_fingerprints(consumed, compactions_since(events_path, version))
    if not carried:
        return 0
    source = pa.table(
        {
            LOAD_DATE: pa.array(sorted(carried), pa.date32()),
            "consumed_fp": pa.array([consumed[d] for d in sorted(carried)], pa.string()),
            "carried_fp": pa.array([carried[d] for d in sorted(carried)], pa.string()),
        }
    )

    def write() -> None:
        (
            DeltaTable(accounting_path)
            .merge(
                source,
                predicate=f"t.{LOAD_DATE} = s.{LOAD_DATE}",
                source_alias="s",
                target_alias="t",
            )
            .when_matched_update(
                updates={"events_fingerprint": "s.carried_fp"},
                predicate="t.events_fingerprint = s.consumed_fp",
            )
            .execute()
        )

    committed(write)
    return len(carried)
