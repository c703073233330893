"""A small gap-mode `sessions` run on the driver: `process_sessions`' steps in plain Python
(`core.gap_rows`, `core.renumbering`) over rows delta-rs reads, with no Spark statement but the
writes the driver cannot take.

It takes a run when the change set is driver-local (`Changes.rows_table`), the changed users'
lifecycle rows, the touched sessions' events (files chosen by the Delta log's statistics on
`derived_tstamp`, rows filtered by the driver) and the side tables' rows of the keys in question
are read by delta-rs within their limits, and the rows hold no null `derived_tstamp` or
`event_id` (`gap_rows.handles`). Everything is read before the first write; when any read is
refused, nothing is written and `process_sessions` runs the Spark steps instead. The results
are the Spark steps' (each function is tested against its Spark twin, `core/test_gap_rows.py`,
and the whole run against the Spark run, `sessions/test_driver_run.py`).

Why: a small run's Spark statements over a few thousand driver-local rows cost 0.1-0.6 s each
over Spark Connect, whatever the rows (docs/benchmarks.md, "Session 36" and "Session 37").
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import SparkSession

from sessionize_assets.core import gap_rows
from sessionize_assets.core import sessionize as core
from sessionize_assets.core.run_limits import RunLimits
from sessionize_assets.resources.delta import (
    delta_table,
    ensure_table,
    merge_rows,
    naive_rows,
    rows_by_key,
    scan_pruned,
    schema_pairs,
    timestamp_spans_pruning,
)
from sessionize_assets.resources.spark import arrow_frame
from sessionize_assets.resources.tables import (
    FILTERED_EVENTS,
    QUARANTINED_SESSIONS,
    SESSIONS,
    SESSIONS_LIFECYCLE_MANIFEST,
    SUPERSEDED_SESSIONS,
)
from sessionize_assets.sessions.changes import Changes, driver_columns
from sessionize_assets.sessions.frames import KEYED_ROWS, add_counts
from sessionize_assets.sessions.outcome import ModelOutcome

if TYPE_CHECKING:
    from sessionize_assets.sessions.steps import SessionsWrite
from sessionize_assets.sessions.tables import (
    LIFECYCLE_SCHEMA,
    QUARANTINED_SCHEMA,
    SUPERSEDED_SCHEMA,
    TablePath,
)
from sessionize_assets.settings import Settings

# The touched sessions' events are read by the driver when the files the Delta log's statistics
# leave hold at most this many rows, and at most TOUCHED_ROWS of them are kept.
TOUCHED_SCAN_ROWS = 2_000_000
TOUCHED_ROWS = 100_000

UTC_MICROS = pa.timestamp("us", tz="UTC")
# The recomputed sessions as Spark's `in_scope` gives them (`core.sessionize._finish` + PART).
COMPUTED_SCHEMA = pa.schema(
    [
        ("session_identifier", pa.string()),
        ("user_identifier", pa.string()),
        ("start_tstamp", UTC_MICROS),
        ("end_tstamp", UTC_MICROS),
        ("total_events", pa.int64()),
        ("page_views", pa.int64()),
        ("duration_s", pa.float64()),
        ("first_page_url", pa.string()),
        ("last_page_url", pa.string()),
        ("is_quarantined", pa.bool_()),
        (core.LC_START, UTC_MICROS),
        (core.LC_END, UTC_MICROS),
        (core.PART, pa.int64()),
    ]
)
LIFECYCLE_SOURCE = pa.schema(
    [
        ("session_identifier", pa.string()),
        ("user_identifier", pa.string()),
        ("start_tstamp", UTC_MICROS),
        ("end_tstamp", UTC_MICROS),
        ("is_quarantined", pa.bool_()),
        ("_delete", pa.bool_()),
    ]
)
# The side rows `write_side_tables` writes (its `side` DataFrame's columns).
SIDE_SCHEMA = pa.schema(
    [
        ("session_identifier", pa.string()),
        ("user_identifier", pa.string()),
        ("start_tstamp", UTC_MICROS),
        ("capped_at", UTC_MICROS),
        ("quarantined_at", UTC_MICROS),
        ("_delete", pa.bool_()),
        ("_table", pa.string()),
        ("_superseded", pa.string()),
        ("_reason", pa.string()),
    ]
)


def process_sessions_on_driver(
    spark: SparkSession,
    table_path: TablePath,
    settings: Settings,
    limits: RunLimits,
    version: int,
    changes: Changes,
    now: dt.datetime,
    outcome: ModelOutcome,
) -> SessionsWrite | None:
    """`process_sessions` of a small gap-mode run on the driver: the replacement (its touched
    users driver-local), or None, having read and written nothing, when the driver cannot take
    the run (module docstring)."""
    if settings.session_mode != "gap" or changes.rows_table is None:
        return None
    changed = [
        r
        for r in gap_rows.plain_rows(
            changes.rows_table.select([*core.PREPARED_COLUMNS, "_sign", core.REASON])
        )
        if r[core.REASON] is None and r["_sign"] != 0
    ]
    if not gap_rows.handles(changed):
        return None
    users = sorted({c[core.USER_KEY] for c in changed})
    lc_path = table_path(SESSIONS_LIFECYCLE_MANIFEST)
    theirs = _rows_of(lc_path, LIFECYCLE_SCHEMA, {"user_identifier": users})
    if theirs is None or not gap_rows.handles_lifecycle(theirs):
        return None
    chains = gap_rows.gap_chains(theirs, settings)
    ranges = gap_rows.gap_change_ranges(changed, settings, chains)
    on_user = {"user_identifier": core.USER_KEY}
    old_lifecycle = gap_rows.overlapping(theirs, ranges, ["user_identifier"], on_user)
    read = touched_events(table_path(FILTERED_EVENTS), version, settings, ranges, users, limits)
    if read is None:
        return None
    read = gap_rows.with_reason(read, settings)
    usable = [
        {k: v for k, v in r.items() if k != core.REASON} for r in read if r[core.REASON] is None
    ]
    if not gap_rows.handles(usable):
        return None
    sessions, dupes = gap_rows.sessionize_by_gap(usable, settings)
    computed = gap_rows.overlapping(sessions, ranges, ["user_identifier", core.PART], on_user)
    side = _side_rows(table_path, settings, computed, old_lifecycle, now)
    if side is None:
        return None

    from sessionize_assets.sessions.steps import count_replacement, replace_session_rows

    outcome.rows_read["lifecycle rows"] = len(old_lifecycle)
    outcome.rows_read["events of touched sessions"] = len(read)
    add_counts(outcome.excluded, _reasons(read))
    add_counts(outcome.excluded, _reasons(dupes))
    computed_table = pa.Table.from_pylist(computed, schema=COMPUTED_SCHEMA)
    replaced = [o["session_identifier"] for o in old_lifecycle]
    write = replace_session_rows(spark, table_path(SESSIONS), computed_table, replaced)
    count_replacement(outcome, write)
    _write_bookkeeping(spark, table_path, side, computed, old_lifecycle, write, outcome)
    return write


def bookkeep_on_driver(
    spark: SparkSession,
    table_path: TablePath,
    settings: Settings,
    computed: pa.Table,
    old_lifecycle: pa.Table,
    write: SessionsWrite,
    now: dt.datetime,
    outcome: ModelOutcome,
) -> bool:
    """The side tables and the lifecycle manifest of a gap-mode Spark run whose recomputed
    sessions (`in_scope`'s rows) and replaced lifecycle rows the driver holds, written as
    `write_side_tables` and `process_sessions` write them, with no Spark statement but the writes
    the driver cannot take. False, having written nothing, when the driver cannot compute them
    (a stored row the driver cannot read, or a null start or end); Spark does then.

    On the 30-day benchmark home, Spark's plans over these driver-local rows cost a 200,000-event
    day 13 of its Spark jobs (docs/benchmarks.md, "Session 53")."""
    new_rows = naive_rows(computed)
    old_rows = naive_rows(old_lifecycle.select([c for c, _ in schema_pairs(LIFECYCLE_SCHEMA)]))
    if not gap_rows.handles_lifecycle(old_rows) or not gap_rows.handles_lifecycle(new_rows):
        return False
    side = _side_rows(table_path, settings, new_rows, old_rows, now)
    if side is None:
        return False
    _write_bookkeeping(spark, table_path, side, new_rows, old_rows, write, outcome)
    return True


def _write_bookkeeping(
    spark: SparkSession,
    table_path: TablePath,
    side: pa.Table,
    computed: Sequence[Mapping[str, Any]],
    old_lifecycle: Sequence[Mapping[str, Any]],
    write: SessionsWrite,
    outcome: ModelOutcome,
) -> None:
    """Write the side rows, then the lifecycle manifest's changes, of the recomputed sessions
    that replace the sessions of `old_lifecycle` (the side tables first: see `process_sessions`)."""
    from sessionize_assets.sessions.steps import write_side_rows

    lc_path = table_path(SESSIONS_LIFECYCLE_MANIFEST)
    write_side_rows(spark, table_path, arrow_frame(spark, side), side, outcome)
    written = 0
    if write.fresh + write.deleted:
        replaced = [o["session_identifier"] for o in old_lifecycle]
        source = _lifecycle_source(computed, replaced, old_lifecycle)
        written = source.num_rows
        if written:
            merge_rows(spark, lc_path, source, "session_identifier", LIFECYCLE_SCHEMA)
    if not written:
        ensure_table(spark, lc_path, LIFECYCLE_SCHEMA)
    outcome.rows_written["lifecycle rows"] = written


def _reasons(rows: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for r in rows:
        if r[core.REASON] is not None:
            counts[r[core.REASON]] = counts.get(r[core.REASON], 0) + 1
    return counts


def _rows_of(path: str, schema: str, keys: Mapping[str, Sequence[str]]) -> list[dict] | None:
    """The rows of the table at `path` (its current version) where a column of `keys` holds one
    of its values, as dicts of `schema`'s columns (none when the table is absent); None when
    delta-rs cannot read them within KEYED_ROWS (`rows_by_key`) or their types are not the
    table's usual ones."""
    table = delta_table(path)
    if table is None:
        return []
    names = [c for c, _ in schema_pairs(schema)]
    if not any(keys.values()):
        return []
    arrays = {c: pa.array(sorted(set(v)), pa.string()) for c, v in keys.items() if v}
    rows = rows_by_key(table, arrays, columns=names, limit=KEYED_ROWS)
    if rows is None or not _plain_types(rows.schema):
        return None
    return rows.to_pylist()


def _plain_types(schema: pa.Schema) -> bool:
    """Strings, booleans, longs, doubles and UTC timestamps: the types these rows are compared
    and written in."""
    for field in schema:
        kind = field.type
        if pa.types.is_timestamp(kind):
            if kind.tz not in ("UTC", "+00:00", "Etc/UTC"):
                return False
        elif not (
            pa.types.is_string(kind)
            or pa.types.is_large_string(kind)
            or pa.types.is_boolean(kind)
            or pa.types.is_int64(kind)
            or pa.types.is_float64(kind)
        ):
            return False
    return True


def _spans(ranges: Sequence[Mapping[str, Any]]) -> list[tuple[int, int]]:
    """The union of the ranges' read intervals (microseconds), as disjoint spans."""
    intervals = sorted(
        (gap_rows.micros(r["_read_lo"]), gap_rows.micros(r["_read_hi"])) for r in ranges
    )
    spans: list[list[int]] = []
    for lo, hi in intervals:
        if spans and lo <= spans[-1][1]:
            spans[-1][1] = max(spans[-1][1], hi)
        else:
            spans.append([lo, hi])
    return [(lo, hi) for lo, hi in spans]


def touched_events(
    path: str,
    version: int,
    settings: Settings,
    ranges: Sequence[Mapping[str, Any]],
    users: Sequence[str],
    limits: RunLimits,
) -> list[dict[str, Any]] | None:
    """gap mode's read of the touched sessions' events (`GapMode.touched`'s `read`) by the
    driver: the prepared rows of filtered_events at `version` inside a read range of their user,
    with its PART, their session timestamp at or before the upper limit. None when the table
    needs a reader feature, a column is not of the type these functions read, the files the
    Delta log leaves hold more than TOUCHED_SCAN_ROWS rows or more than TOUCHED_ROWS rows match
    (Spark reads them then)."""
    if not ranges:
        return []
    table = delta_table(path, version)
    if table is None or table.protocol().min_reader_version > 1:
        return None
    columns = driver_columns(table, settings)
    if columns is None:
        return None
    spans = _spans(ranges)
    pruning = timestamp_spans_pruning(
        "derived_tstamp", [(gap_rows.from_micros(lo), gap_rows.from_micros(hi)) for lo, hi in spans]
    )
    stamp = pc.field("derived_tstamp")
    inside = None
    for lo, hi in spans:
        term = (stamp >= pa.scalar(gap_rows.from_micros(lo), UTC_MICROS)) & (
            stamp <= pa.scalar(gap_rows.from_micros(hi), UTC_MICROS)
        )
        inside = term if inside is None else inside | term
    wanted = pa.array(sorted(set(users)), pa.string())
    theirs = None
    for column in settings.user_identifier:
        term = pc.field(column).isin(wanted)
        theirs = term if theirs is None else theirs | term
    data = scan_pruned(
        table,
        pruning,
        columns,
        inside & theirs,
        scan_limit=TOUCHED_SCAN_ROWS,
        keep_limit=TOUCHED_ROWS,
    )
    if data is None:
        return None
    prepared = gap_rows.prepare(gap_rows.plain_rows(data), settings)
    return gap_rows.in_read_range(prepared, ranges, limits.upper_limit)


def _side_rows(
    table_path: TablePath,
    settings: Settings,
    computed: Sequence[Mapping[str, Any]],
    old_lifecycle: Sequence[Mapping[str, Any]],
    now: dt.datetime,
) -> pa.Table | None:
    """gap mode's side rows (`write_side_tables`' `side`): quarantined pieces not listed before,
    listed pieces no longer quarantined, and the superseded ids not recorded before; None when
    the stored rows of those keys cannot be read by the driver."""
    quarantined_now = [c for c in computed if c["is_quarantined"]]
    was = [o for o in old_lifecycle if o["is_quarantined"]]
    listed = _rows_of(
        table_path(QUARANTINED_SESSIONS),
        QUARANTINED_SCHEMA,
        {"session_identifier": [q["session_identifier"] for q in quarantined_now]},
    )
    if listed is None:
        return None
    was_ids = {o["session_identifier"] for o in was}
    listed_ids = {q["session_identifier"] for q in listed}
    now_ids = {q["session_identifier"] for q in quarantined_now}
    cap = dt.timedelta(days=settings.max_session_days)
    side: list[dict[str, Any]] = [
        {
            "session_identifier": q["session_identifier"],
            "user_identifier": q["user_identifier"],
            "start_tstamp": q[core.LC_START],
            "capped_at": q[core.LC_START] + cap,
            "quarantined_at": now,
            "_delete": False,
            "_table": QUARANTINED_SESSIONS,
            "_superseded": None,
            "_reason": None,
        }
        for q in quarantined_now
        if q["session_identifier"] not in was_ids and q["session_identifier"] not in listed_ids
    ]
    side += [
        {
            "session_identifier": o["session_identifier"],
            "user_identifier": None,
            "start_tstamp": None,
            "capped_at": None,
            "quarantined_at": None,
            "_delete": True,
            "_table": QUARANTINED_SESSIONS,
            "_superseded": None,
            "_reason": None,
        }
        for o in was
        if o["session_identifier"] not in now_ids
    ]
    superseded = gap_rows.superseded(old_lifecycle, computed)
    known = _rows_of(
        table_path(SUPERSEDED_SESSIONS),
        SUPERSEDED_SCHEMA,
        {"superseded_session_identifier": [s["superseded_session_identifier"] for s in superseded]},
    )
    if known is None:
        return None
    recorded = {(k["superseded_session_identifier"], k["session_identifier"]) for k in known}
    side += [
        {
            "session_identifier": s["session_identifier"],
            "user_identifier": s["user_identifier"],
            "start_tstamp": None,
            "capped_at": None,
            "quarantined_at": now,
            "_delete": False,
            "_table": SUPERSEDED_SESSIONS,
            "_superseded": s["superseded_session_identifier"],
            "_reason": s["reason"],
        }
        for s in superseded
        if (s["superseded_session_identifier"], s["session_identifier"]) not in recorded
    ]
    return pa.Table.from_pylist(side, schema=SIDE_SCHEMA)


def _lifecycle_source(
    computed: Sequence[Mapping[str, Any]],
    replaced: Sequence[str],
    old_lifecycle: Sequence[Mapping[str, Any]],
) -> pa.Table:
    """gap mode's lifecycle MERGE source (`GapMode.lifecycle_update` through `without_unchanged`):
    every recomputed session's row that differs from its stored one (null-safe on every column)
    or has none, and a removal of each stored replaced id no longer computed."""
    names = [c for c, _ in schema_pairs(LIFECYCLE_SCHEMA)]
    stored: dict[str, list[Mapping[str, Any]]] = {}
    for o in old_lifecycle:
        stored.setdefault(o["session_identifier"], []).append(o)
    rows = []
    for c in computed:
        row = {
            "session_identifier": c["session_identifier"],
            "user_identifier": c["user_identifier"],
            "start_tstamp": c[core.LC_START],
            "end_tstamp": c[core.LC_END],
            "is_quarantined": c["is_quarantined"],
        }
        if not any(
            all(row[k] == s[k] for k in names) for s in stored.get(row["session_identifier"], [])
        ):
            rows.append({**row, "_delete": False})
    ids = {c["session_identifier"] for c in computed}
    rows += [
        {"session_identifier": r, **{k: None for k in names[1:]}, "_delete": True}
        for r in replaced
        if r not in ids and r in stored
    ]
    return pa.Table.from_pylist(rows, schema=LIFECYCLE_SOURCE)
