"""Generic Delta Lake reads and writes, shared by every branch.

- delta-rs (no Spark) for the Delta log and the small state tables: versions, file statistics,
  a handful of bookkeeping rows. Sensors and planners use only these.
- Spark for data: pinned-version reads, partition replacement, MERGE by key, overwrite.
- The driver for small results of Spark and small tables: a MERGE of at most DRIVER_WRITE_ROWS
  rows into a table of at most DRIVER_MERGE_TARGET_ROWS, and the steps whose output the Delta
  log shows to be that small, collect the rows as Arrow and commit them with delta-rs; tables of
  at most LOCAL_READ_ROWS rows are read with delta-rs into driver-local DataFrames (a Spark write
  or a first Spark read of a table version costs several times more for a few rows).

Nothing here knows a table of the project: callers pass locations (see `resources.tables`).
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from sessionize_assets import faults
from sessionize_assets.resources.spark import arrow_frame, fetch_arrow, temporary_conf

# --------------------------------------------------------------------- the Delta log (delta-rs)


def fresh_table(path: str, version: int | None = None):  # noqa: ANN201 - deltalake.DeltaTable
    """The delta-rs table at `path` (at `version` when given), or None when absent: opened anew,
    for a caller that writes through it or brings it up to date (which changes its version)."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        return DeltaTable(path, version=version) if version is not None else DeltaTable(path)
    except TableNotFoundError:
        return None


# Opened tables by (log folder, version), per thread: a Delta version never changes, and one
# command opens the same few tables over and over (a 5,000-event day opened 193 tables, 28 of
# them `filtered_events` at 29 ms each; docs/benchmarks.md, "Session 45"). Local tables only: the
# latest version is found by listing the log folder, and a cached version is trusted only while
# its commit file is the one seen when it was opened (a table deleted and created again at the
# same path has new commit files).
SNAPSHOT_CACHE_ENTRIES = 32
_SNAPSHOTS = threading.local()
_COMMIT_FILE = re.compile(r"^(\d{20})\.json$")


def _local_log(path: str) -> str | None:
    """The `_delta_log` folder of a table on the local file system; None for other stores."""
    if path.startswith("file:"):
        path = path[len("file:") :]
        path = "/" + path.lstrip("/") if path.startswith("//") else path
    elif "://" in path:
        return None
    return os.path.join(os.path.abspath(path), "_delta_log")


def _latest_commit(log: str) -> int | None:
    """The largest version with a commit file in `log`; None when there is none."""
    try:
        with os.scandir(log) as entries:
            versions = [int(m.group(1)) for e in entries if (m := _COMMIT_FILE.match(e.name))]
    except (FileNotFoundError, NotADirectoryError):
        return None
    return max(versions, default=None)


def _commit_marker(log: str, version: int) -> tuple[int, int, int] | None:
    """What identifies the commit file of `version`: (inode, size, modification time)."""
    try:
        stat = os.stat(os.path.join(log, f"{version:020d}.json"))
    except OSError:
        return None
    return (stat.st_ino, stat.st_size, stat.st_mtime_ns)


def delta_table(path: str, version: int | None = None):  # noqa: ANN201 - deltalake.DeltaTable
    """The delta-rs table at `path` (at `version` when given), or None when absent -- to read.

    A local table's version opened before in this thread is not opened again (the same object
    is returned: callers only read it; writers use `fresh_table`). Anything unusual -- another
    store, a version without its commit file, a cached table whose version moved -- opens anew."""
    log = _local_log(path)
    wanted = version if version is not None or log is None else _latest_commit(log)
    marker = _commit_marker(log, wanted) if log is not None and wanted is not None else None
    if marker is None:
        return fresh_table(path, version)
    cache: OrderedDict[tuple[str, int], tuple[Any, tuple[int, int, int]]] | None
    cache = getattr(_SNAPSHOTS, "tables", None)
    if cache is None:
        cache = _SNAPSHOTS.tables = OrderedDict()
    key = (log, wanted)
    hit = cache.get(key)
    if hit is not None and hit[1] == marker and hit[0].version() == wanted:
        cache.move_to_end(key)
        return hit[0]
    table = fresh_table(path, wanted)
    if table is not None and table.version() == wanted:
        cache[key] = (table, marker)
        cache.move_to_end(key)
        while len(cache) > SNAPSHOT_CACHE_ENTRIES:
            cache.popitem(last=False)
    return table


def delta_version(path: str) -> int | None:
    """The table's current version via delta-rs (no Spark), or None when absent."""
    table = delta_table(path)
    return table.version() if table is not None else None


def recent_operations(path: str, limit: int = 10) -> list[tuple[int, str]]:
    """The table's latest `limit` commits as (version, operation), newest first (delta-rs, no
    Spark); [] when absent. A commit without an operation reads as "UNKNOWN"."""
    table = delta_table(path)
    if table is None:
        return []
    return [
        (int(commit["version"]), str(commit.get("operation") or "UNKNOWN"))
        for commit in table.history(limit)
        if commit.get("version") is not None
    ]


def exists(path: str) -> bool:
    return delta_table(path) is not None


def add_actions(
    path: str, version: int | None = None, columns: Sequence[str] | None = None
) -> tuple[int | None, list[dict[str, Any]]]:
    """(version, the live files' add actions as dicts: `path`, `num_records`, `partition.<col>`,
    `min.<col>`, `max.<col>`, `null_count.<col>`). With `columns`, only those of them the log has:
    a wide table's statistics are three entries per column, and turning them all into dicts
    costs far more than reading the log (110 ms against 7 ms for 700 files of 40 columns)."""
    table = delta_table(path, version)
    if table is None:
        return None, []
    actions = pa.table(table.get_add_actions(flatten=True))
    if columns is not None:
        actions = actions.select([c for c in columns if c in actions.column_names])
    return table.version(), actions.to_pylist()


# (partition column, days): the files of those partitions of a table only (a collection: read
# twice, for the row count and for the read).
Partitions = tuple[str, Collection[dt.date]]


def _day(value: Any) -> str | None:
    """A date partition value of the Delta log (a date or its ISO text; None: null) as ISO text."""
    return None if value is None else str(value)[:10]


def live_rows(table: Any, partitions: Partitions | None = None) -> int | None:
    """The rows in the live files of the delta-rs `table` (of `partitions` only, when given),
    from the Delta log; None when a file has no row count (statistics off): the size is then
    unknown."""
    actions = pa.table(table.get_add_actions(flatten=True))
    counts = actions.column("num_records").to_pylist()
    if partitions is not None:
        column, days = partitions
        wanted = {d.isoformat() for d in days}
        values = actions.column(f"partition.{column}").to_pylist()
        counts = [n for n, v in zip(counts, values, strict=True) if _day(v) in wanted]
    return None if any(n is None for n in counts) else sum(counts)


# Small tables read by version: a Delta version never changes, so the rows of (table id,
# version, columns) are read once per process. The planner reads the same state tables several
# times in one command (each Dagster step plans again), each read a scan of all their files.
_SMALL_READS: dict[tuple[str, str, int, tuple[str, ...] | None], pa.Table] = {}
_SMALL_READS_LOCK = threading.Lock()  # a daemon may evaluate sensors in threads
SMALL_READ_CACHE_ROWS = 50_000
SMALL_READ_CACHE_ENTRIES = 64


def read_small_table(path: str, columns: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """A small state table's rows as dicts via delta-rs (for sensors: no Spark). [] when absent.
    A version read before in this process (the same table: its id, which a table created anew
    at the same path does not share) is not scanned again."""
    table = delta_table(path)
    if table is None:
        return []
    wanted = list(columns) if columns else None
    key = (table.table_uri, table.metadata().id, table.version(), tuple(wanted) if wanted else None)
    with _SMALL_READS_LOCK:
        data = _SMALL_READS.get(key)
    if data is None:
        data = table.to_pyarrow_table(columns=wanted)
        if data.num_rows <= SMALL_READ_CACHE_ROWS:
            with _SMALL_READS_LOCK:
                if len(_SMALL_READS) >= SMALL_READ_CACHE_ENTRIES:
                    del _SMALL_READS[next(iter(_SMALL_READS))]  # the oldest entry
                _SMALL_READS[key] = data
    return data.to_pylist()


def newest_value(path: str, column: str, for_nulls: str | None = None) -> Any:
    """The largest value of `column` in a Delta table, from the Delta log's file statistics (no
    data read), rounded up by 1 ms for timestamps (Delta keeps millisecond statistics). Files
    with nulls in `column` count with their largest `for_nulls` value. None when the table is
    absent or empty, or a statistic is missing (the caller must then assume anything)."""
    wanted = ["num_records", f"null_count.{column}", f"max.{column}"]
    _, actions = add_actions(path, columns=[*wanted, f"max.{for_nulls}"] if for_nulls else wanted)
    if not actions:
        return None
    newest = None
    for file in actions:
        nulls = file.get(f"null_count.{column}")
        if nulls is None or file.get("num_records") is None:
            return None
        candidates = []
        if nulls < file["num_records"]:
            candidates.append(file.get(f"max.{column}"))
        if nulls > 0:
            if for_nulls is None:
                return None
            candidates.append(file.get(f"max.{for_nulls}"))
        if any(c is None for c in candidates):
            return None
        for value in candidates:
            newest = value if newest is None else max(newest, value)
    if isinstance(newest, dt.datetime):
        newest += dt.timedelta(milliseconds=1)
    return newest


# --------------------------------------------------------------------------- reads (Spark)


def table_exists(spark: SparkSession, path: str) -> bool:
    """True if a Delta table is at `path`."""
    del spark  # the Delta log says so without a Spark job
    return exists(path)


def read_table(spark: SparkSession, path: str) -> DataFrame | None:
    """The table as a DataFrame, or None when it does not exist yet."""
    if not exists(path):
        return None
    return spark.read.format("delta").load(path)


def read_version(spark: SparkSession, path: str, version: int | None = None) -> DataFrame:
    """The table at `version` (the current one when None)."""
    reader = spark.read.format("delta")
    if version is not None:
        reader = reader.option("versionAsOf", version)
    return reader.load(path)


def schema_pairs(schema: str) -> list[tuple[str, str]]:
    """`"a string, b long, m map<string,bigint>"` -> [("a", "string"), ("b", "long"), ("m",
    "map<string,bigint>")]."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(schema):  # split at commas outside <...> and (...) (decimal(10,2))
        depth += {"<": 1, "(": 1, ">": -1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(schema[start:i])
            start = i + 1
    parts.append(schema[start:])
    pairs = []
    for part in parts:
        name, kind = part.strip().split(" ", 1)
        pairs.append((name, kind.strip()))
    return pairs


def nulls_for(schema: str, key: str) -> list[Any]:
    """Null columns of `schema` except `key` (the tombstone rows of a MERGE source)."""
    return [F.lit(None).cast(t).alias(c) for c, t in schema_pairs(schema) if c != key]


def ensure_table(spark: SparkSession, path: str, schema: str) -> None:
    """Create an empty table with `schema` when none is at `path`."""
    if delta_version(path) is None:
        spark.createDataFrame([], schema).write.format("delta").mode("ignore").save(path)


# Tables of at most this many rows (their Delta log says so) are read by the driver with delta-rs
# into a driver-local DataFrame: Spark's plan of a Delta scan (the snapshot of a new version, the
# file listing) costs more than the rows (docs/benchmarks.md, "Session 24").
LOCAL_READ_ROWS = 20_000


def table_or_empty(spark: SparkSession, path: str, schema: str) -> DataFrame:
    """The table at its current version, pinned: Spark re-caches DataFrames of a path after a
    write to it, and a pinned version keeps "the rows before this run's write" what they were.
    Up to LOCAL_READ_ROWS rows, the columns of `schema` read with delta-rs (`local_table`)."""
    table = delta_table(path)
    if table is None:
        return spark.createDataFrame([], schema)
    local = local_table(spark, table, schema)
    return local if local is not None else read_version(spark, path, table.version())


def read_pinned(
    spark: SparkSession,
    path: str,
    version: int,
    columns: Iterable[str] | None = None,
    partitions: Partitions | None = None,
) -> DataFrame:
    """The table at `version` (which must exist), its `columns` (None: all) in the table's order,
    the rows of `partitions` (None: all): driver-local when those rows are at most
    LOCAL_READ_ROWS (`local_table`); else Spark's pinned read (every column, every row: the
    caller filters and selects)."""
    local = local_table(spark, delta_table(path, version), columns=columns, partitions=partitions)
    return local if local is not None else read_version(spark, path, version)


def local_arrow(
    table: Any,
    schema: str | None = None,
    *,
    columns: Iterable[str] | None = None,
    partitions: Partitions | None = None,
) -> pa.Table | None:
    """The delta-rs `table`'s columns of `schema` (else those of `columns` it has, else all, in
    the table's order), the rows of `partitions` only when given, read by the driver as Arrow when
    those rows are at most LOCAL_READ_ROWS by the Delta log (None otherwise, when a file has no
    row count, when a column of `schema` is missing, or when delta-rs cannot read the table)."""
    rows = live_rows(table, partitions)
    if rows is None or rows > LOCAL_READ_ROWS:
        return None
    available = pa.schema(table.schema().to_arrow()).names
    if schema is not None:
        names = [c for c, _ in schema_pairs(schema)]
        if not set(names) <= set(available):
            return None
    else:
        wanted = set(available if columns is None else columns)
        names = [c for c in available if c in wanted]
    filters = None
    if partitions is not None:
        filters = _partition_filters(partitions)
        if not filters[0][2]:
            return None  # no partition named: nothing to read locally (the caller's own case)
    try:
        return table.to_pyarrow_table(columns=names, partitions=filters)
    except Exception:  # noqa: BLE001 - a feature delta-rs cannot read: Spark reads the table
        return None


def _partition_filters(partitions: Partitions) -> list[tuple[str, str, list[str]]]:
    """delta-rs' tuple filter for the files of `partitions` (a date column's ISO values)."""
    column, days = partitions
    return [(column, "in", sorted({d.isoformat() for d in days}))]


def local_table(
    spark: SparkSession,
    table: Any,
    schema: str | None = None,
    *,
    columns: Iterable[str] | None = None,
    partitions: Partitions | None = None,
) -> DataFrame | None:
    """`local_arrow`'s rows as a driver-local DataFrame (the types follow from Arrow's, which
    are Spark's for this project's tables; a `timestamp_ntz` would read as `timestamp`); None when
    `local_arrow` reads nothing or Spark refuses a column of another type than `schema` says:
    Spark reads the table then (its own columns and types)."""
    data = local_arrow(table, schema, columns=columns, partitions=partitions)
    return None if data is None else local_frame(spark, data, schema)


def local_frame(spark: SparkSession, data: pa.Table, schema: str | None = None) -> DataFrame | None:
    """Driver-read rows as a driver-local DataFrame (`arrow_frame`), or None when Spark refuses
    a column of another type than `schema` says: the caller has Spark read the table then."""
    try:
        return arrow_frame(spark, data, schema=schema)
    except Exception:  # noqa: BLE001 - see the docstring
        return None


def local_changes(
    spark: SparkSession,
    path: str,
    starting_version: int,
    ending_version: int,
    columns: Sequence[str],
    limit: int | None = None,
) -> DataFrame | None:
    """The change data feed of versions `starting_version`..`ending_version` (`columns` and
    `_change_type`) read by delta-rs into a driver-local DataFrame, when it holds at most
    `limit` rows (default LOCAL_READ_ROWS). None otherwise, and on any error (a version no longer
    in the log, a file vacuumed, a feature delta-rs cannot read): Spark's read then says what is
    wrong."""
    data = local_changes_arrow(path, starting_version, ending_version, columns, limit)
    return None if data is None else arrow_frame(spark, data)


def local_changes_arrow(
    path: str,
    starting_version: int,
    ending_version: int,
    columns: Sequence[str],
    limit: int | None = None,
) -> pa.Table | None:
    """`local_changes`' rows as Arrow (strings as plain strings)."""
    limit = LOCAL_READ_ROWS if limit is None else limit
    table = delta_table(path)
    if table is None or limit < 0:
        return None
    try:
        stream = pa.RecordBatchReader.from_stream(
            table.load_cdf(
                starting_version=starting_version,
                ending_version=ending_version,
                columns=[*columns, "_change_type"],
            )
        )
        batches, rows = [], 0
        for batch in stream:
            rows += batch.num_rows
            if rows > limit:
                return None
            batches.append(batch)
        data = pa.Table.from_batches(batches, schema=stream.schema)
        return data.cast(_without_views(data.schema))
    except Exception:  # noqa: BLE001 - Spark reads the feed and classifies the failure
        return None


# Tables of at most this many rows (by the Delta log) may be scanned whole by the driver for the
# rows of some keys (`rows_by_key`): 0.4 s for the 407,669 rows of the 30-day benchmark home's
# sessions, where each Spark scan of them in a small run took 0.5-1.8 s (docs/benchmarks.md,
# "Session 33"). The scan keeps only the matching rows, but holds a few batches of every column
# at a time (pyarrow's read-ahead).
DRIVER_SCAN_ROWS = 2_000_000


def naive_rows(table: pa.Table) -> list[dict[str, Any]]:
    """`table`'s rows as dicts, each time-zone-aware timestamp as a naive datetime of its UTC
    wall time: a third of the time of aware datetimes (Python builds those through the time
    zone), which the driver's plain-Python steps spent on every session row they read. Arrow
    takes such naive values back as UTC (`pa.array`, `Table.from_pylist`). The rows' datetimes
    compare only with each other: mixed with aware ones, a comparison raises."""
    columns = [
        column.cast(pa.timestamp(field.type.unit))
        if pa.types.is_timestamp(field.type) and field.type.tz is not None
        else column
        for field, column in zip(table.schema, table.columns, strict=True)
    ]
    return pa.Table.from_arrays(columns, names=table.column_names).to_pylist()


def distinct_values(*columns: pa.Array | pa.ChunkedArray) -> pa.Array:
    """The distinct non-null values of one or more Arrow columns of one type (the keys
    `rows_by_key` takes). The columns' chunks are joined as they are: a column with no chunk
    (an empty table's) adds nothing and does not change the type."""
    import pyarrow.compute as pc

    chunks = [
        chunk
        for column in columns
        for chunk in (column.chunks if isinstance(column, pa.ChunkedArray) else [column])
    ]
    joined = pa.chunked_array(chunks, type=columns[0].type).combine_chunks()
    return pc.unique(pc.drop_null(joined))


def rows_by_key(
    table: Any,
    keys: Mapping[str, pa.Array],
    *,
    keep: bool = True,
    columns: Sequence[str] | None = None,
    limit: int | None = None,
    partitions: Partitions | None = None,
) -> pa.Table | None:
    """The rows of the delta-rs `table` (of `partitions` only, when given) where any column of
    `keys` holds one of its values
    (`keep=False`: every other row; a null never matches), with `columns` in that order (None:
    every column, in the table's), read by delta-rs batch by batch and filtered in memory. No
    filter is pushed into the scan: pyarrow compares it with each file's statistics in the
    file's own Arrow type, and delta-rs's MERGE writes strings as string_view (see
    `append_if_new`).

    None when the table is absent, needs a reader feature (deletion vectors, column mapping),
    holds more than DRIVER_SCAN_ROWS rows (in `partitions`) by its Delta log (or a file has no
    row count), lacks a column, more than `limit` rows match, or delta-rs fails to read it (logged
    as a warning): the caller reads with Spark then."""
    import pyarrow.compute as pc
    from deltalake.exceptions import DeltaError

    if table is None or not keys or table.protocol().min_reader_version > 1:
        return None
    stored = live_rows(table, partitions)
    if stored is None or stored > DRIVER_SCAN_ROWS:
        return None
    try:
        pruning = None if partitions is None else _partition_filters(partitions)
        if pruning is not None and not pruning[0][2]:  # no partition: no file, no row
            schema = pa.schema(table.schema().to_arrow())
            names = list(schema.names if columns is None else columns)
            if not {*names, *keys} <= set(schema.names):
                return None
            empty = pa.schema([schema.field(c) for c in names]).empty_table()
            return empty.cast(_without_views(empty.schema))
        dataset = table.to_pyarrow_dataset(file_pruning_predicate=pruning)
        names = list(dataset.schema.names if columns is None else columns)
        if not {*names, *keys} <= set(dataset.schema.names):
            return None
        wanted = {c: v.cast(dataset.schema.field(c).type) for c, v in keys.items()}
        parts, matched = [], 0
        for batch in dataset.to_batches(columns=list(dict.fromkeys([*names, *keys]))):
            hits = [pc.is_in(batch.column(c), value_set=v) for c, v in wanted.items()]
            hit = hits[0]
            for more in hits[1:]:
                hit = pc.or_(hit, more)
            part = batch.filter(hit if keep else pc.invert(hit)).select(names)
            matched += part.num_rows
            if limit is not None and matched > limit:
                return None
            if part.num_rows:
                parts.append(part)
        schema = pa.schema([dataset.schema.field(c) for c in names])
        data = pa.Table.from_batches(parts, schema=schema)
        return data.cast(_without_views(data.schema))
    except (OSError, pa.ArrowException, ValueError, DeltaError) as error:
        logging.getLogger(__name__).warning(
            "delta-rs could not read %s by key (%s); Spark reads it", table.table_uri, error
        )
        return None


def scan_pruned(
    table: Any,
    pruning: list[list[tuple[str, str, Any]]],
    columns: Sequence[str],
    row_filter: Any,
    *,
    scan_limit: int,
    keep_limit: int,
) -> pa.Table | None:
    """The rows of the delta-rs `table` matching `row_filter` (a pyarrow dataset expression),
    `columns` of them, read from the files the Delta log's statistics leave for `pruning` (tuple
    filters in disjunctive normal form; a superset of the files holding matching rows). None
    when the table needs a reader feature, a chosen file has no row count, the chosen files
    hold more than `scan_limit` rows by the log, more than `keep_limit` rows match, or delta-rs
    fails: the caller reads with Spark then."""
    if table is None or table.protocol().min_reader_version > 1:
        return None
    try:
        chosen = table.file_uris(file_pruning_predicate=pruning)
        actions = pa.table(table.get_add_actions(flatten=True))
        paths = actions.column("path").to_pylist()
        records = (
            actions.column("num_records").to_pylist()
            if "num_records" in actions.column_names
            else [None] * len(paths)
        )
        # Spark's and delta-rs's file names are unique (a UUID each): row counts by name.
        counts = {str(p).rsplit("/", 1)[-1]: n for p, n in zip(paths, records, strict=True)}
        scanned = 0
        for uri in chosen:
            count = counts.get(uri.rsplit("/", 1)[-1])
            if count is None:
                return None
            scanned += int(count)
        if scanned > scan_limit:
            return None
        dataset = table.to_pyarrow_dataset(file_pruning_predicate=pruning)
        scanner = dataset.scanner(columns=list(columns), filter=row_filter)
        batches, kept = [], 0
        # Batch by batch, so a read that passes `keep_limit` stops there.
        for batch in scanner.to_batches():
            kept += batch.num_rows
            if kept > keep_limit:
                return None
            batches.append(batch)
        data = pa.Table.from_batches(batches, schema=scanner.projected_schema)
    except Exception as error:  # noqa: BLE001 - any failure: Spark reads the rows
        logging.getLogger(__name__).warning(
            "delta-rs could not read %s (%s); Spark reads it", table.table_uri, error
        )
        return None
    return data.cast(_without_views(data.schema))


def rows_surely_within(table: Any, column: str, lo: dt.datetime, hi: dt.datetime) -> int:
    """A lower bound of the rows of the delta-rs `table` whose timestamp `column` lies in
    [lo, hi]: the rows of the files whose Delta-log statistics put every row there (no null,
    minimum at or after `lo`, maximum at or before `hi` by STATS_SLACK, as the statistics are
    truncated to milliseconds); 0 when the statistics cannot say."""
    try:
        actions = pa.table(table.get_add_actions(flatten=True))
        names = (f"min.{column}", f"max.{column}", f"null_count.{column}", "num_records")
        if not all(n in actions.column_names for n in names):
            return 0
        total = 0
        for low, high, nulls, rows in zip(
            *(actions.column(n).to_pylist() for n in names), strict=True
        ):
            if None in (low, high, nulls, rows) or nulls:
                continue
            if low >= lo and high + STATS_SLACK <= hi:
                total += int(rows)
        return total
    except Exception:  # noqa: BLE001 - a hint only
        return 0


# Delta's file statistics keep timestamps to the millisecond: a pruning filter on a timestamp
# is widened by this much (rows are filtered exactly after the read).
STATS_SLACK = dt.timedelta(seconds=1)


def timestamp_spans_pruning(
    column: str, spans: Iterable[tuple[dt.datetime, dt.datetime]]
) -> list[list[tuple[str, str, Any]]]:
    """Tuple filters (disjunctive normal form) for the files that may hold rows of `column` in
    any of the [lo, hi] `spans`, widened by STATS_SLACK."""
    return [
        [(column, ">=", lo - STATS_SLACK), (column, "<=", hi + STATS_SLACK)] for lo, hi in spans
    ]


def _without_views(schema: pa.Schema) -> pa.Schema:
    """`schema` with Arrow's view types (delta-rs's feed reads strings as `string_view`, which
    Spark does not take) as their plain types."""

    def plain(kind: pa.DataType) -> pa.DataType:
        if pa.types.is_string_view(kind):
            return pa.string()
        if pa.types.is_binary_view(kind):
            return pa.binary()
        if pa.types.is_list(kind) or pa.types.is_large_list(kind):
            return pa.list_(kind.value_field.with_type(plain(kind.value_type)))
        if pa.types.is_map(kind):
            return pa.map_(
                kind.key_field.with_type(plain(kind.key_type)),
                kind.item_field.with_type(plain(kind.item_type)),
            )
        if pa.types.is_struct(kind):
            return pa.struct([f.with_type(plain(f.type)) for f in kind.fields])
        return kind

    return pa.schema([f.with_type(plain(f.type)) for f in schema])


# -------------------------------------------------------------------------- writes (Spark)


def in_list(column: str, days: Iterable[dt.date]) -> str:
    """A SQL predicate `column IN (DATE'…', …)`."""
    values = ", ".join(f"DATE'{d.isoformat()}'" for d in sorted(set(days)))
    return f"{column} IN ({values})"


DATA_SKIPPING = "spark.databricks.delta.stats.skipping"

# Delta's data skipping (its per-file min/max statistics) plans every scan with a Spark job over
# the table's file list. On tables of a few files that job costs more than reading the files it
# could skip (about a quarter of a second per scan, measured on the small-run history:
# docs/benchmarks.md, "Session 20"). Partition pruning does not need it.
SKIPPING_MIN_FILES = 64


def skipping_pays(file_counts: Iterable[int | None], min_files: int | None = None) -> bool:
    """True when some table holds more than `min_files` (default SKIPPING_MIN_FILES) live files
    (absent tables: None), the only case where skipping files by their statistics can save more
    than it costs."""
    limit = SKIPPING_MIN_FILES if min_files is None else min_files
    return any(count is not None and count > limit for count in file_counts)


def live_files(path: str) -> int | None:
    """The number of live files of the table at `path` (delta-rs, no Spark); None when absent or
    unreadable (only a hint for planning: the step that reads the table reports its error)."""
    try:
        table = delta_table(path)
        return len(table.file_uris()) if table is not None else None
    except Exception:  # noqa: BLE001 - a corrupt log is the reading step's error to report
        return None


@contextmanager
def data_skipping_when_it_pays(
    spark: SparkSession, paths: Iterable[str], configured: Mapping[str, str] | None = None
) -> Iterator[None]:
    """Delta's data skipping off for the block when none of the tables at `paths` (the largest a
    step reads) has more than SKIPPING_MIN_FILES files. A `spark` setting of the user's naming
    `spark.databricks.delta.stats.skipping` is left alone. Results never change: skipping
    only decides which files a scan opens, and the filters still apply to their rows."""
    if DATA_SKIPPING in (configured or {}) or skipping_pays(live_files(p) for p in paths):
        yield
        return
    with temporary_conf(spark, {DATA_SKIPPING: "false"}):
        yield


def replace_partitions(
    spark: SparkSession,
    df: DataFrame,
    path: str,
    column: str,
    days: Iterable[dt.date],
    partition_by: Sequence[str],
    properties: Mapping[str, str] | None = None,
    parquet: Mapping[str, str] | None = None,
) -> None:
    """Replace exactly the rows of `days` (in partition column `column`) with `df` (Spark).
    `parquet`: Parquet writer settings for this write's files (`temporary_conf`)."""
    writer = df.write.format("delta").option("mergeSchema", "true")
    with faults.commit_of(path), temporary_conf(spark, parquet or {}):
        if not exists(path):
            for key, value in (properties or {}).items():
                writer = writer.option(key, value)
            writer.mode("append").partitionBy(*partition_by).save(path)
            return
        (
            writer.mode("overwrite")
            .option("partitionOverwriteMode", "static")
            .option("replaceWhere", in_list(column, days))
            .save(path)
        )


def merge(
    spark: SparkSession,
    path: str,
    source: DataFrame,
    key: str,
    schema: str,
    rows: int | None = None,
) -> None:
    """Upsert `source` rows by `key`; rows with `_delete` set remove the target row. The first
    write of a table is a plain write. (Delta SQL: works over Spark Connect too.)

    A source of at most DRIVER_WRITE_ROWS rows is collected once, as Arrow, for the driver's
    writers: an append when the MERGE would only insert (`append_if_new`, any table size), else a
    delta-rs MERGE into a table of at most DRIVER_MERGE_TARGET_ROWS rows (`merge_from_driver`).
    `rows`: the source's row count when the caller knows it; a larger source is then not
    collected."""
    columns = [c for c, _ in schema_pairs(schema)]
    table = fresh_table(path)  # an insert-only source is appended through it (`append_if_new`)
    if table is None:
        with faults.commit_of(path):
            source.filter(~F.col("_delete")).select(*columns).write.format("delta").mode(
                "append"
            ).save(path)
        return
    if plain_protocol(table) and (rows is None or rows <= DRIVER_WRITE_ROWS):
        # The callers' sources are results they keep (driver-local or persisted): a source found
        # above the limit here was computed once more for nothing, not recomputed from scratch.
        data = fetch_arrow(source.select(*columns, "_delete").limit(DRIVER_WRITE_ROWS + 1))[0]
        if data.num_rows <= DRIVER_WRITE_ROWS and _merge_from_driver(table, path, data, key):
            return
    _merge_in_spark(spark, path, source, key, columns)


def merge_rows(spark: SparkSession, path: str, data: pa.Table, key: str, schema: str) -> None:
    """`merge` of rows the driver holds (Arrow, with `_delete`): through the driver's writers
    when the table and the rows allow it, else as Spark's MERGE of a driver-local DataFrame."""
    table = fresh_table(path)  # an insert-only source is appended through it (`append_if_new`)
    if table is None:  # the first write: a plain write of the rows
        merge(spark, path, arrow_frame(spark, data), key, schema, rows=data.num_rows)
    elif not (
        plain_protocol(table)
        and data.num_rows <= DRIVER_WRITE_ROWS
        and _merge_from_driver(table, path, data, key)
    ):
        columns = [c for c, _ in schema_pairs(schema)]
        _merge_in_spark(spark, path, arrow_frame(spark, data), key, columns)


def _merge_from_driver(table: Any, path: str, data: pa.Table, key: str) -> bool:
    """The driver's writers for a MERGE source in Arrow: an append when it only inserts, else
    delta-rs' MERGE into a small table. False, without writing, when neither takes it."""
    columns = [c for c in data.column_names if c != "_delete"]
    return append_if_new(table, data, key) or merge_from_driver(path, data, key, columns)


def _merge_in_spark(
    spark: SparkSession, path: str, source: DataFrame, key: str, columns: Sequence[str]
) -> None:
    """Delta's MERGE INTO through Spark (`merge`'s clauses)."""
    names = ", ".join(f"`{c}`" for c in columns)
    values = ", ".join(f"s.`{c}`" for c in columns)
    updates = ", ".join(f"`{c}` = s.`{c}`" for c in columns)
    with faults.commit_of(path):
        merge_into(
            spark,
            path,
            source,
            f"ON t.`{key}` = s.`{key}` "
            "WHEN MATCHED AND s._delete THEN DELETE "
            f"WHEN MATCHED THEN UPDATE SET {updates} "
            f"WHEN NOT MATCHED AND NOT s._delete THEN INSERT ({names}) VALUES ({values})",
        )


def overwrite(df: DataFrame, path: str) -> None:
    with faults.commit_of(path):
        df.write.format("delta").mode("overwrite").save(path)


# ------------------------------------------------------------ small tables (delta-rs writes)
# The small bookkeeping tables (a row per day) are written with delta-rs: no Spark job for a
# handful of rows. Spark, delta-rs, DuckDB and Polars read them like any other Delta table.


def committed(write: Callable[[], None], attempts: int = 8) -> None:
    """Run a delta-rs write, again when a concurrent writer won the commit."""
    from deltalake.exceptions import CommitFailedError

    for attempt in range(attempts):
        try:
            write()
            return
        except CommitFailedError:
            if attempt == attempts - 1:
                raise
            time.sleep(0.1 * (attempt + 1))


def append_at_version(table: Any, data: pa.Table) -> None:
    """Append `data` to the delta-rs `table` as exactly the version after the one it was loaded
    at: a compare-and-swap on the whole table. Raises deltalake's `CommitFailedError` when any
    writer (delta-rs or Spark) committed since -- no retry, the caller re-reads and decides."""
    from deltalake import CommitProperties, write_deltalake

    with faults.commit_of(table.table_uri):
        write_deltalake(
            table, data, mode="append", commit_properties=CommitProperties(max_commit_retries=0)
        )


def days_predicate(column: str, days: Iterable[dt.date]) -> str:
    """delta-rs' predicate `column IN ('YYYY-MM-DD', …)` (`in_list` is Spark SQL's)."""
    values = ", ".join(f"'{d.isoformat()}'" for d in sorted(set(days)))
    return f"{column} IN ({values})"


def replace_small(
    path: str,
    rows: Sequence[Mapping[str, Any]],
    schema: pa.Schema,
    column: str | None = None,
    days: Iterable[dt.date] = (),
    partition_by: Sequence[str] | None = None,
) -> None:
    """Replace the rows of `days` (or the whole table when `column` is None) with `rows`."""
    from deltalake import write_deltalake

    data = pa.Table.from_pylist([dict(r) for r in rows], schema=schema)
    predicate = days_predicate(column, days) if column is not None else None

    def write() -> None:
        if not exists(path):
            write_deltalake(
                path, data, mode="append", partition_by=list(partition_by) if partition_by else None
            )
        elif predicate is None:
            write_deltalake(path, data, mode="overwrite", schema_mode="overwrite")
        else:
            write_deltalake(path, data, mode="overwrite", predicate=predicate)

    with faults.commit_of(path):
        committed(write)


def upsert_small(
    path: str,
    rows: Sequence[Mapping[str, Any]],
    schema: pa.Schema,
    key: str,
    compact: bool = False,
) -> None:
    """MERGE rows by `key` into a small table (created when absent); `compact`: a state table
    that gains a file a commit, compacted when fragmented (`compact_when_fragmented`)."""
    from deltalake import DeltaTable, write_deltalake

    data = pa.Table.from_pylist([dict(r) for r in rows], schema=schema)

    def write() -> None:
        if not exists(path):
            write_deltalake(path, data, mode="append")
            return
        (
            DeltaTable(path)
            .merge(data, predicate=f"t.{key} = s.{key}", source_alias="s", target_alias="t")
            .when_matched_update_all()
            .when_not_matched_insert_all()
            .execute()
        )

    _driver_commit(path, write, compact=compact)


# ------------------------------------------------ small Spark results written from the driver
# A Spark write plans and commits through Delta's transaction: about 1.5 s for a few rows on
# this project's machines, against 0.2-0.4 s to collect the same rows as Arrow and commit them
# with delta-rs (docs/benchmarks.md, "Session 24"). Steps whose output is known to be small (from
# the Delta log's row counts, before any Spark job) write through the driver.
DRIVER_WRITE_ROWS = 200_000

# A MERGE's target may be larger than its source: delta-rs rewrites a table of 400,000 rows in
# well under a second where Spark's MERGE INTO takes seconds (the 30 x 200,000 benchmark's
# `sessions`, 420,719 rows, with 15,145 source rows touching every file: 0.23-0.42 s against
# 2.9-3.6 s on a warmed Spark; docs/benchmarks.md, "Session 51"). Its memory grows with the
# table (about +200 MB on the driver at 420,000 rows in row groups of MERGE_ROW_GROUP_ROWS,
# +770 MB at 2.1 M rows): above this, Spark merges.
DRIVER_MERGE_TARGET_ROWS = 1_000_000
# Row groups of a driver MERGE's files: delta-rs holds a whole row group in memory until it
# flushes it (its default, about a million rows, took +357 MB for that `sessions` rewrite).
MERGE_ROW_GROUP_ROWS = 32_768

# At most this many full-width rows (a load batch's kept rows, a run's filtered_events rows) are
# fetched to the driver for a delta-rs write: about 25 MB of Arrow at the benchmark's 40 columns.
# More are written by Spark.
DRIVER_FETCH_ROWS = 50_000


# Spark's Delta checkpoints a table every 10 commits, delta-rs every 100 by default: the data
# tables the driver now commits to keep Spark's rhythm, so reading their log stays short.
CHECKPOINT_INTERVAL = 10


def checkpoint_on_interval(path: Any) -> None:
    """A checkpoint of the table at `path` (or of a delta-rs table at the version just written)
    when its version is a multiple of CHECKPOINT_INTERVAL (after a driver commit; Spark's own
    commits checkpoint themselves). Best effort: the data is committed, a failure is logged and
    readers replay the log from the previous checkpoint."""
    try:
        table = delta_table(path) if isinstance(path, str) else path
        if table is not None and table.version() > 0 and table.version() % CHECKPOINT_INTERVAL == 0:
            table.create_checkpoint()
    except Exception as error:  # noqa: BLE001 - the data is committed; the next interval retries
        logging.getLogger(__name__).warning("checkpoint of %s not written: %s", path, error)


def compact_when_fragmented(path_or_table: Any) -> bool:
    """After a commit to a small state table: bin-pack its files with delta-rs when it has become
    `fragmented` (core/maintenance.py), then checkpoint on the interval. The OPTIMIZE commit
    changes no row (its files are added with dataChange false: readers of changes, and
    `last_data_change`, skip it). Best effort: the data is committed, a failure (a concurrent
    writer's commit delta-rs will not reconcile with it) is logged and the next commit tries
    again; a manifest append that loses its version to it re-reads and retries, as it does
    for any other writer. `path_or_table`: the table's location, or its delta-rs table at the
    version just written. True when it compacted."""
    from sessionize_assets.core.maintenance import fragmented

    try:
        table = fresh_table(path_or_table) if isinstance(path_or_table, str) else path_or_table
        if table is None:
            return False
        actions = pa.table(table.get_add_actions(flatten=True))
        keys = [c for c in actions.column_names if c.startswith("partition.")]
        values = [actions.column(k).to_pylist() for k in keys]
        partitions = list(zip(*values, strict=True)) if keys else [()] * actions.num_rows
        if not fragmented(partitions):
            return False
        table.optimize.compact()
        checkpoint_on_interval(table)
        return True
    except Exception as error:  # noqa: BLE001 - the data is committed; the next commit retries
        logging.getLogger(__name__).warning("compaction of %s not done: %s", path_or_table, error)
        return False


def _driver_commit(
    path: str, write: Callable[[], None], attempts: int = 8, compact: bool = False
) -> None:
    """One delta-rs commit of the driver's to the table at `path`: inside its fail points,
    retried as `committed` does, then a checkpoint on Spark's interval; `compact`: a small
    state table, compacted when fragmented."""
    with faults.commit_of(path):
        committed(write, attempts=attempts)
    try:  # the version just written, opened once for the checkpoint and the compaction
        table = fresh_table(path)
    except Exception as error:  # noqa: BLE001 - the data is committed; both are best effort
        logging.getLogger(__name__).warning("%s not reopened after a commit: %s", path, error)
        return
    checkpoint_on_interval(table)
    if compact:
        compact_when_fragmented(table)


def _matching(
    data: pa.Table, table: Any, features: frozenset[str] = frozenset()
) -> pa.Table | None:
    """`data` in the column order of the delta-rs `table`, cast to its nullability, or None when
    the table is absent, needs a writer feature beyond `features` (`plain_protocol`), or its
    columns or their types differ (a schema change, or a conversion of values, is the Spark
    writers' to make or refuse)."""
    if table is None or not plain_protocol(table, features):
        return None
    target = pa.schema(table.schema().to_arrow())
    if sorted(data.column_names) != sorted(target.names):
        return None
    data = data.select(target.names)
    if not all(_same_type(a.type, b.type) for a, b in zip(data.schema, target, strict=True)):
        return None
    try:
        return data.cast(target)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return None


def _same_type(kind: pa.DataType, other: pa.DataType) -> bool:
    """The same type apart from nullability (what a cast to the table's schema may change
    without converting a value; Spark's writer merges or refuses the rest). Arrow's equality
    already ignores the names of list and map fields."""
    return _nullable_type(kind).equals(_nullable_type(other))


def same_types(schema: pa.Schema, other: pa.Schema) -> bool:
    """The same column names, in the same order, of the same types apart from nullability."""
    return schema.names == other.names and all(
        _same_type(a.type, b.type) for a, b in zip(schema, other, strict=True)
    )


def plain_protocol(table: Any, features: frozenset[str] = frozenset()) -> bool:
    """True when the delta-rs `table` needs no writer feature beyond Delta's writer version 2
    (this project's tables: deletion vectors and row tracking are off by default), or only
    table features among `features` (writer version 7). A user's `spark` setting can turn
    features on; Spark then writes the table, not the driver."""
    protocol = table.protocol()
    if protocol.min_writer_version <= 2 and not protocol.writer_features:
        return True
    return protocol.min_writer_version == 7 and set(protocol.writer_features or ()) <= features


# The table features an append honours without doing anything of its own: an append-only
# table takes appends, a change data feed reads an append's rows from its added files (no
# change files are written), and delta-rs checks column invariants on every write. `events`
# and `filtered_events` have these three (Spark gives a table with a change data feed writer
# version 7 and lists the legacy features it implies).
APPEND_FEATURES = frozenset({"appendOnly", "invariants", "changeDataFeed"})


def replace_partitions_from_driver(
    path: str,
    data: pa.Table,
    column: str,
    days: Iterable[dt.date],
    features: frozenset[str] = frozenset(),
    page_rows: int | None = None,
    table: Any | None = None,
) -> bool:
    """`replace_partitions` through delta-rs: replace exactly the rows of `days` with `data`
    (an overwrite whose predicate names the days; delta-rs refuses rows outside it). Returns
    False without writing when the table is absent, needs a writer feature beyond `features`
    (APPEND_FEATURES: a partition column's predicate removes whole files, and a change feed
    reads their rows as deleted and the added files' as inserted, as it does of Spark's
    `replaceWhere`), is append-only, or its columns differ from `data`'s, for the caller's
    Spark write. `page_rows`: at most this many rows per Parquet page. `table`: the delta-rs
    table already opened at `path` (`driver_writable`), so its log is read once and then only
    the commits since (`_caught_up`)."""
    from deltalake import WriterProperties, write_deltalake

    table = delta_table(path) if table is None else _caught_up(table)
    matching = _matching(data, table, features)
    if matching is None or table.metadata().configuration.get("delta.appendOnly") == "true":
        return False
    predicate = days_predicate(column, days)
    properties = WriterProperties(data_page_row_count_limit=page_rows) if page_rows else None
    _driver_commit(
        path,
        lambda: write_deltalake(
            path, matching, mode="overwrite", predicate=predicate, writer_properties=properties
        ),
    )
    return True


def _caught_up(table: Any) -> Any:
    """A table `driver_writable` opened, brought to the log's latest version (only the commits
    since are read): the rows were fetched after it was opened, and a writer that changed the
    table's protocol or columns in between must send the write back to Spark, not fail it."""
    table.update_incremental()
    return table


def driver_writable(path: str, features: frozenset[str] = APPEND_FEATURES) -> Any | None:
    """The delta-rs table at `path` when the driver may write it (it exists and needs no writer
    feature beyond `features`), else None; the columns are compared when the rows are given.
    Lets a caller skip collecting rows the driver would not write, and hand the open table to
    the write (`append_from_driver`, `replace_partitions_from_driver`: one read of the log)."""
    table = fresh_table(path)
    return table if table is not None and plain_protocol(table, features) else None


def append_from_driver(
    path: str,
    data: pa.Table,
    txn: Mapping[str, str] | None = None,
    table: Any | None = None,
    compact: bool = False,
) -> bool:
    """An append of `data` through delta-rs (partitioned as the table is). `txn`: Spark's
    idempotent-write options (`txnAppId`, `txnVersion`), recorded in the commit as a Delta app
    transaction (without Spark's `lastUpdated`); an append whose application already committed
    that version is not written again, as Spark skips it (checked before every attempt).
    Returns False without writing when the table is absent or its columns differ from `data`'s,
    for the caller's Spark write. `table`: the delta-rs table already opened at `path`
    (`driver_writable`). `compact`: a small state table (`compact_when_fragmented`)."""
    from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

    table = delta_table(path) if table is None else _caught_up(table)
    matching = _matching(data, table, APPEND_FEATURES)
    if matching is None:
        return False
    properties = None
    if txn is not None:
        app_id, version = txn["txnAppId"], int(txn["txnVersion"])
        properties = CommitProperties(app_transactions=[Transaction(app_id, version)])

    def write() -> None:
        # Looked at again before every attempt: delta-rs accepts an id already committed (a
        # concurrent writer of the same batch makes this attempt fail, and the retry must see
        # that writer's commit instead of appending the rows a second time).
        if txn is not None:
            done = DeltaTable(path).transaction_version(app_id)
            if done is not None and done >= version:
                return
        write_deltalake(path, matching, mode="append", commit_properties=properties)

    _driver_commit(path, write, compact=compact)
    return True


def merge_from_driver(path: str, data: pa.Table, key: str, columns: Sequence[str]) -> bool:
    """`merge` of `data` (Arrow, with `_delete`) through delta-rs when the table holds at most
    DRIVER_MERGE_TARGET_ROWS rows (its Delta log says so): the same clauses in the same order (a
    `_delete` row removes its match; other matches are updated; the rest inserted unless
    `_delete`). Returns False without writing otherwise, or when the table's columns are not
    `columns`, for the Spark MERGE."""
    table = delta_table(path)
    if table is None or not plain_protocol(table):
        return False
    rows = live_rows(table)
    if rows is None or rows > DRIVER_MERGE_TARGET_ROWS:
        return False
    matching = _matching(data.drop_columns(["_delete"]), table)
    if matching is None:
        return False
    data = matching.append_column("_delete", data.column("_delete"))
    quoted = {c: f's."{c}"' for c in columns}

    def write() -> None:
        from deltalake import WriterProperties

        table = fresh_table(path)
        (
            table.merge(
                data,
                predicate=f't."{key}" = s."{key}"',
                source_alias="s",
                target_alias="t",
                writer_properties=WriterProperties(max_row_group_size=MERGE_ROW_GROUP_ROWS),
            )
            .when_matched_delete(predicate='s."_delete"')
            .when_matched_update(updates={f'"{c}"': v for c, v in quoted.items()})
            .when_not_matched_insert(
                updates={f'"{c}"': v for c, v in quoted.items()}, predicate='NOT s."_delete"'
            )
            .execute()
        )

    # No retry here: delta-rs itself retries a commit whose conflict check passes; one it
    # refuses may have changed the rows this source was computed from, and the error stops the
    # run, as a conflict stops Spark's MERGE.
    _driver_commit(path, write, attempts=1)
    return True


def append_if_new(table: Any, data: pa.Table, key: str) -> bool:
    """Append `data` (its `_delete` column dropped) to the delta-rs `table` when a MERGE of it by
    `key` would only insert, and commit it as exactly the version after the one `table` was
    loaded at (a compare-and-swap): no row has `_delete` true or null (a removal, or a row the
    MERGE leaves out), and no non-null key is in the table at that version (a null key matches
    nothing). False, without writing, when any of that fails, the columns or their types differ
    from the table's (`_matching`), or another writer committed since.

    An insert-only MERGE still reads the whole target to look for matches and plans and commits
    through Spark: on the 30-day benchmark home one 5,000-event day's three insert-only MERGEs
    (sessions, lifecycle manifest, users) took 4.8 s on a fresh engine and 3.0 s on a warmed one,
    while the 5,000 keys were found absent from `sessions`' 408,033 in 0.2 s (one column, read by
    delta-rs; docs/benchmarks.md, "Session 31" and "Session 32")."""
    import pyarrow.compute as pc
    from deltalake import CommitProperties, write_deltalake
    from deltalake.exceptions import CommitFailedError

    if table is None or not plain_protocol(table):
        return False
    flags = data.column("_delete")
    if flags.null_count or pc.any(flags).as_py():
        return False
    rows = _matching(data.drop_columns(["_delete"]), table)
    if rows is None:
        return False
    keys = pc.unique(pc.drop_null(rows.column(key)))
    if len(keys):
        # The stored keys batch by batch, compared in memory: a filter pushed into the scan
        # compares with each file's statistics in the file's own Arrow type, and delta-rs's
        # MERGE writes strings as string_view, which pyarrow cannot compare with a string.
        stored = table.to_pyarrow_dataset()
        try:
            wanted = keys.cast(stored.schema.field(key).type)
            for batch in stored.to_batches(columns=[key]):
                if pc.any(pc.is_in(batch.column(0), value_set=wanted)).as_py():
                    return False
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
            return False
    try:
        with faults.commit_of(table.table_uri):
            write_deltalake(
                table,
                rows,
                mode="append",
                commit_properties=CommitProperties(max_commit_retries=0),
            )
    except CommitFailedError:
        return False
    checkpoint_on_interval(table)
    return True


def _nullable_type(kind: pa.DataType) -> pa.DataType:
    if pa.types.is_struct(kind):
        return pa.struct([_nullable_field(kind.field(i)) for i in range(kind.num_fields)])
    if pa.types.is_map(kind):
        item = kind.item_field
        return pa.map_(kind.key_type, pa.field(item.name, _nullable_type(item.type), True))
    if pa.types.is_list(kind):
        value = kind.value_field
        return pa.list_(pa.field(value.name, _nullable_type(value.type), True))
    return kind


def _nullable_field(field: pa.Field) -> pa.Field:
    return pa.field(field.name, _nullable_type(field.type), True)


def overwrite_from_driver(path: str, data: pa.Table, user_metadata: str | None = None) -> bool:
    """Replace the whole (unpartitioned) table at `path` with `data` through delta-rs, schema
    included (created when absent), recording `user_metadata` in the commit as Spark's
    `userMetadata` option does. Every column, map value and array element is nullable in the
    table's schema, as in the tables Spark writes. False, without writing, when the table needs
    a writer feature (`plain_protocol`), for the Spark writer."""
    from deltalake import CommitProperties, write_deltalake

    existing = delta_table(path)
    if existing is not None and not plain_protocol(existing):
        return False
    data = data.cast(pa.schema([_nullable_field(f) for f in data.schema]))

    properties = (
        CommitProperties(custom_metadata={"userMetadata": user_metadata})
        if user_metadata is not None
        else None
    )
    _driver_commit(
        path,
        lambda: write_deltalake(
            path, data, mode="overwrite", schema_mode="overwrite", commit_properties=properties
        ),
    )
    return True


# ------------------------------------------- SQL forms (the same over Spark Connect and locally)
# delta-spark's Python `DeltaTable` needs the JVM or Delta's Connect server plugin, which Maven
# Central does not serve for this Spark; Delta's SQL (MERGE INTO, CREATE TABLE, OPTIMIZE) works
# through any session, embedded or remote, so the writers use it.


def quoted(value: object) -> str:
    """A SQL literal: numbers as they are, text single-quoted with quotes and backslashes escaped."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    text = str(value).replace("\\", "\\\\").replace("'", "\\'")
    return f"'{text}'"


def table_ref(path: str) -> str:
    """`delta.`<path>`` (backticks in the path doubled)."""
    return "delta.`" + path.replace("`", "``") + "`"


def column_ddl(schema: Any) -> str:
    """A StructType as the column list of CREATE TABLE."""
    return ", ".join(
        f"`{f.name}` {f.dataType.simpleString().upper()}{'' if f.nullable else ' NOT NULL'}"
        for f in schema.fields
    )


def create_table(
    spark: SparkSession,
    path: str,
    schema: Any,
    partitioned_by: Sequence[str] = (),
    properties: Mapping[str, str] | None = None,
    comment: str | None = None,
) -> None:
    """CREATE TABLE IF NOT EXISTS at `path` (Delta SQL)."""
    sql = f"CREATE TABLE IF NOT EXISTS {table_ref(path)} ({column_ddl(schema)}) USING DELTA"
    if partitioned_by:
        sql += f" PARTITIONED BY ({', '.join(f'`{c}`' for c in partitioned_by)})"
    if comment:
        sql += f" COMMENT {quoted(comment)}"
    if properties:
        sql += (
            " TBLPROPERTIES ("
            + ", ".join(f"{quoted(k)} = {quoted(v)}" for k, v in properties.items())
            + ")"
        )
    spark.sql(sql)


def merge_into(spark: SparkSession, path: str, source: DataFrame, statement: str) -> Any:
    """Run `MERGE INTO <table> t USING <source> s <statement>` and return its metrics row
    (num_affected_rows, num_updated_rows, num_deleted_rows, num_inserted_rows)."""
    import uuid

    view = f"sessionize_merge_{uuid.uuid4().hex}"
    source.createOrReplaceTempView(view)
    try:
        return spark.sql(f"MERGE INTO {table_ref(path)} t USING {view} s {statement}").first()
    finally:
        spark.catalog.dropTempView(view)


def optimize(spark: SparkSession, path: str) -> None:
    """Bin-pack a table's small files (Delta's OPTIMIZE)."""
    spark.sql(f"OPTIMIZE {table_ref(path)}")
