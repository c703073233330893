"""Landing raw files into the `events` Delta table (imperative shell around core.validate).

Every row read is accounted for: kept in `events`, or sent to `invalid_events` with its reason and
raw text. A file already loaded (same content, by SHA-256) is skipped with a warning.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import tempfile
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.pandas.types import to_arrow_schema

from sessionize_assets import faults
from sessionize_assets.core import validate
from sessionize_assets.core.clock import midnight
from sessionize_assets.core.schema import (
    LOAD_DATE,
    LOAD_ID,
    REQUIRED_COLUMNS,
    ROW_HASH,
    SOURCE_FILE,
    STATISTICS_PROPERTY,
    TIMESTAMP_COLUMNS,
    statistics_columns,
)
from sessionize_assets.core.trees import fold_balanced
from sessionize_assets.errors import ItemLockedError, UserError
from sessionize_assets.ingest.decode import decode_file
from sessionize_assets.ingest.readers import FORMATS, read_raw
from sessionize_assets.resources import delta
from sessionize_assets.resources.delta import (
    DRIVER_WRITE_ROWS,
    append_from_driver,
    driver_writable,
    read_small_table,
    table_exists,
)
from sessionize_assets.resources.spark import fetch_arrow, small_query_conf
from sessionize_assets.resources.tables import EVENTS, INVALID_EVENTS, LOAD_LOG
from sessionize_assets.settings import Settings

LOAD_LOG_SCHEMA = T.StructType(
    [
        T.StructField("load_id", T.StringType()),
        T.StructField("source_file", T.StringType()),
        T.StructField("sha256", T.StringType()),
        T.StructField("format", T.StringType()),
        T.StructField("rows_read", T.LongType()),
        T.StructField("rows_kept", T.LongType()),
        T.StructField("rows_invalid", T.LongType()),
        T.StructField("load_days", T.ArrayType(T.DateType())),
        T.StructField("loaded_at", T.TimestampType()),
    ]
)
# The same columns as Arrow (the driver's appends), as Spark converts them (UTC instants).
LOAD_LOG_ARROW = to_arrow_schema(LOAD_LOG_SCHEMA, timezone="UTC")


@dataclass
class FileLoad:
    """What happened to one landed file."""

    path: str
    sha256: str
    load_id: str | None = None
    rows_read: int = 0
    rows_kept: int = 0
    rows_invalid: int = 0
    rows_by_load_day: dict[dt.date, int] = field(default_factory=dict)
    invalid_by_reason: dict[str, int] = field(default_factory=dict)
    skipped_reason: str | None = None


@dataclass
class LoadReport:
    """The outcome of one `sessionize load`."""

    files: list[FileLoad] = field(default_factory=list)

    @property
    def loaded(self) -> list[FileLoad]:
        return [f for f in self.files if f.skipped_reason is None]

    @property
    def rows_read(self) -> int:
        return sum(f.rows_read for f in self.loaded)

    @property
    def rows_kept(self) -> int:
        return sum(f.rows_kept for f in self.loaded)

    @property
    def rows_invalid(self) -> int:
        return sum(f.rows_invalid for f in self.loaded)

    @property
    def load_days(self) -> list[dt.date]:
        return sorted({d for f in self.loaded for d in f.rows_by_load_day})

    def lines(self) -> list[str]:
        out = []
        for f in self.files:
            if f.skipped_reason:
                out.append(f"WARNING: skipped {f.path}: {f.skipped_reason}")
                continue
            days = ", ".join(f"{d}: {n}" for d, n in sorted(f.rows_by_load_day.items()))
            out.append(
                f"loaded {f.path}: read {f.rows_read}, kept {f.rows_kept}, "
                f"rejected {f.rows_invalid} (load days {days or 'none'})"
            )
            for reason, n in sorted(f.invalid_by_reason.items()):
                out.append(f"  rejected {n}: {reason}")
        out.append(
            f"total: read {self.rows_read} = kept {self.rows_kept} + rejected {self.rows_invalid}"
        )
        return out


def expand_paths(paths: Sequence[str | Path]) -> list[Path]:
    """Files named, and the supported files inside folders named (sorted, recursive)."""
    files: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found = sorted(
                p
                for p in path.rglob("*")
                if p.is_file() and p.suffix.lower() in FORMATS and not _hidden(p.relative_to(path))
            )
            if not found:
                raise UserError(
                    f"The folder {path} holds no .csv, .json, .ndjson or .parquet files."
                )
            files.extend(found)
        elif path.is_file():
            if path.suffix.lower() not in FORMATS:
                raise UserError(
                    f"{path} is not a supported file (use .csv, .json/.jsonl/.ndjson or .parquet)."
                )
            files.append(path)
        else:
            raise UserError(f"{path} does not exist.")
    return files


def _hidden(relative: Path) -> bool:
    """Names starting with `_` or `.` are metadata (Hadoop's convention), not data."""
    return any(part.startswith(("_", ".")) for part in relative.parts)


def partition_folder_day(path: Path) -> dt.date | None:
    """The day of a `load_date=YYYY-MM-DD` folder in the path, if any (for rows without a load time)."""
    for part in reversed(path.parts):
        if part.startswith("load_date="):
            try:
                return dt.date.fromisoformat(part.split("=", 1)[1])
            except ValueError:
                return None
    return None


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _check_schema(existing: T.StructType | None, incoming: T.StructType) -> None:
    """A column whose type would change is an error naming it (new columns are fine)."""
    if existing is None:
        return
    types = {f.name: f.dataType for f in existing.fields}
    for f in incoming.fields:
        if f.name in types and types[f.name] != f.dataType:
            raise UserError(
                f"Column `{f.name}` would change type from {types[f.name].simpleString()} "
                f"to {f.dataType.simpleString()} in the events table; cast it in the input or map it to another name."
            )


def ordered_columns(columns: Iterable[str]) -> list[str]:
    columns = list(columns)
    canonical = [c for c in REQUIRED_COLUMNS if c in columns]
    canonical += [c for c in TIMESTAMP_COLUMNS if c in columns and c not in canonical]
    lineage = [LOAD_DATE, LOAD_ID, SOURCE_FILE, ROW_HASH]
    rest = [c for c in columns if c not in canonical and c not in lineage]
    return canonical + rest + [c for c in lineage if c in columns]


def loaded_hashes(log_path: str) -> dict[str, str]:
    """sha256 -> source file of every file already loaded (delta-rs, no Spark)."""
    return {
        r["sha256"]: r["source_file"] for r in read_small_table(log_path, ["sha256", "source_file"])
    }


BATCH_MAX_FILES = 64
"""Most files landed by one Spark pass (one lock commit, one append per table, one close)."""

BATCH_MAX_BYTES = 1 << 30
"""Most input bytes landed by one Spark pass: a batch's rows stay persisted until it is written."""

SMALL_BATCH_BYTES = 32 << 20
"""Batches of at most this many input bytes on disk (about 40,000 rows of the benchmark's CSV; a
compressed format holds more rows) are landed with the small-query configuration
(`resources.spark.small_query_conf`: plans only): the parse of a few thousand rows costs less
interpreted than compiled."""


@dataclass
class PreparedFile:
    """One file's rows as lazy plans, before anything is written."""

    path: Path
    sha256: str
    load_id: str
    format: str
    size: int
    typed: DataFrame  # every row, classified: reason (null = usable), lineage, raw text
    valid: DataFrame  # the usable rows in the `events` layout
    invalid: DataFrame  # the unusable rows in the `invalid_events` layout


def file_load_id(sha256: str) -> str:
    """A landed file's `_load_id`: derived from its content, so a retry of a crashed load finds
    the rows the crashed attempt committed (the same content is never loaded twice)."""
    return sha256[:32]


def prepare_file(
    spark: SparkSession,
    path: Path,
    sha256: str,
    settings: Settings,
    now: dt.datetime,
    load_tstamp: dt.datetime | None = None,
    load_tstamp_from: str | None = None,
    work_dir: Path | None = None,
) -> PreparedFile:
    """Plan one file's load: decode (`ingest.decode`: a UTF-8 copy in `work_dir` when the file
    needs one), read, map columns, validate and classify every row (lazy, apart from the header
    or JSON schema the reader needs). Raises UserError for unusable input."""
    load_id = file_load_id(sha256)
    decoded = None
    if FORMATS[path.suffix.lower()] in ("csv", "json"):
        folder = work_dir or Path(tempfile.mkdtemp(prefix="sessionize-decoded-"))
        decoded = decode_file(path, settings.input_encoding, folder)
    raw, data_columns = read_raw(spark, path, decoded)
    raw = validate.apply_column_mapping(raw, settings.column_mapping)
    if load_tstamp_from is not None and load_tstamp_from not in raw.columns:
        if data_columns:
            raise UserError(
                f"--load-tstamp-from names column `{load_tstamp_from}`, which {path} does not have."
            )
        # No column of the file could be read (an unreadable CSV header): every row is rejected
        # with the reader's reason, none needs the column.
        raw = raw.withColumn(load_tstamp_from, F.lit(None).cast("string"))
    raw = raw.withColumn("_unreadable", F.col(validate.REASON).isNotNull())
    typed = validate.canonicalize(raw)
    typed = validate.fill_load_tstamp(typed, load_tstamp, load_tstamp_from, now)
    # Rows without a readable load time (invalid JSON, say) are filed under the load day the
    # file names (--load-tstamp, else a load_date= folder, else today).
    fallback_day = (
        load_tstamp.astimezone(dt.UTC).date()
        if load_tstamp
        else partition_folder_day(path) or now.astimezone(dt.UTC).date()
    )
    source = str(path.resolve())
    typed = (
        validate.classify(
            typed,
            settings.max_clock_skew_minutes,
            load_time_bounds=(
                midnight(settings.start_date),
                now + dt.timedelta(minutes=settings.max_load_ahead_minutes),
            ),
            max_event_age_days=settings.max_event_age_days,
        )
        .withColumn("_fallback_load_date", F.lit(fallback_day))
        .withColumn(SOURCE_FILE, F.lit(source))
        .withColumn(LOAD_ID, F.lit(load_id))
    )
    typed = kept_for_landing(typed)
    all_columns = [
        c
        for c in typed.columns
        if not c.startswith("_raw_")
        and c not in (validate.REASON, "_fallback_load_date", "_unreadable", "_implausible_load")
    ]
    keep = [c for c in all_columns if c not in (SOURCE_FILE, LOAD_ID)]
    valid = validate.finish_valid(
        typed.drop("_raw_text", "_fallback_load_date", "_unreadable"), keep
    )
    valid = valid.select(*ordered_columns(valid.columns))
    invalid = validate.invalid_rows(typed, F.col("_raw_text")).select(
        LOAD_DATE,
        "reason",
        "raw",
        F.lit(source).alias(SOURCE_FILE),
        F.lit(load_id).alias(LOAD_ID),
        F.lit(now.astimezone(dt.UTC).replace(tzinfo=None)).cast("timestamp").alias("recorded_at"),
    )
    return PreparedFile(
        path=path,
        sha256=sha256,
        load_id=load_id,
        format=FORMATS[path.suffix.lower()],
        size=path.stat().st_size,
        typed=typed,
        valid=valid,
        invalid=invalid,
    )


def kept_for_landing(typed: DataFrame) -> DataFrame:
    """The classified rows as `land_batch` keeps them while it counts and writes them: the raw text
    of rejected rows only (`invalid_events.raw`; usable rows never write theirs), and none of the
    raw field texts validation decided on: the count pass of a 200,000-row file took 0.8 CPU-s less
    (docs/benchmarks.md, "Session 52")."""
    return typed.withColumn(
        "_raw_text", F.when(F.col(validate.REASON).isNotNull(), F.col("_raw_text"))
    ).drop(*[c for c in typed.columns if c.startswith("_raw_") and c != "_raw_text"])


def _merge_schema(existing: T.StructType | None, incoming: T.StructType) -> T.StructType:
    """`existing` plus the new columns of `incoming` (after `_check_schema` allowed them)."""
    if existing is None:
        return incoming
    names = set(existing.fieldNames())
    return T.StructType(existing.fields + [f for f in incoming.fields if f.name not in names])


def plan_batches(
    sizes: Sequence[int], max_files: int = BATCH_MAX_FILES, max_bytes: int = BATCH_MAX_BYTES
) -> list[list[int]]:
    """Consecutive groups of file indexes, each at most `max_files` files and, unless one file
    alone is larger, `max_bytes` bytes (input order kept)."""
    batches: list[list[int]] = []
    current: list[int] = []
    current_bytes = 0
    for i, size in enumerate(sizes):
        if current and (len(current) >= max_files or current_bytes + size > max_bytes):
            batches.append(current)
            current, current_bytes = [], 0
        current.append(i)
        current_bytes += size
    if current:
        batches.append(current)
    return batches


def _union(frames: Sequence[DataFrame]) -> DataFrame:
    """The frames' rows together (columns in order of first appearance), nested log2(n) deep: a
    chain of 64 unions is too deep for Spark Connect's protobuf decoder (`core/trees.py`)."""
    return fold_balanced(frames, lambda a, b: a.unionByName(b, allowMissingColumns=True))


def _batch_txn(files: Sequence[PreparedFile]) -> dict[str, str]:
    """Delta's idempotent-write id of one batch: a retry of the same batch is not written twice."""
    digest = hashlib.sha256("\n".join(sorted(f.sha256 for f in files)).encode()).hexdigest()
    return {"txnAppId": f"sessionize-load-{digest}", "txnVersion": "1"}


def landed_load_ids(
    spark: SparkSession, table_path: str, days_by_load_id: Mapping[str, Iterable[dt.date]]
) -> set[str]:
    """Which load ids already have rows in the table (a crashed attempt's commit), looking only
    in the load days (partitions) their rows would be in."""
    wanted = sorted(i for i, days in days_by_load_id.items() if days)
    days = sorted({d for i in wanted for d in days_by_load_id[i]})
    if not wanted or not table_exists(spark, table_path):
        return set()
    rows = (
        spark.read.format("delta")
        .load(table_path)
        .where(F.col(LOAD_DATE).isin(days) & F.col(LOAD_ID).isin(wanted))
        .select(LOAD_ID)
        .distinct()
        .collect()
    )
    return {r[0] for r in rows}


def _append_events(
    spark: SparkSession, path: str, rows: DataFrame, kept_rows: int, txn: Mapping[str, str]
) -> None:
    """Append a batch's kept rows to `events`. A small batch's rows are appended by the driver
    (delta-rs), read from the persisted files in one Spark job: a Spark write of 5,000 rows took
    2.7 s of a warmed load (docs/benchmarks.md, "Session 39"). A new table, a new column or
    another type is Spark's to write (`append_from_driver` refuses it, writing nothing)."""
    rows = rows.select(*ordered_columns(rows.columns))
    table = driver_writable(path) if kept_rows <= delta.DRIVER_FETCH_ROWS else None
    if table is not None and append_from_driver(path, fetch_arrow(rows)[0], txn, table=table):
        return
    writer = rows.write.format("delta").mode("append").partitionBy(LOAD_DATE)
    writer = writer.option("mergeSchema", "true")
    if not table_exists(spark, path):
        writer = writer.option("delta.enableChangeDataFeed", "true").option(
            STATISTICS_PROPERTY, statistics_columns(rows.columns)
        )
    with faults.commit_of(path):
        writer.options(**txn).save(path)


def land_batch(
    spark: SparkSession,
    files: Sequence[PreparedFile],
    tables: dict[str, str],
    now: dt.datetime,
    retried: Iterable[str] = (),
) -> list[FileLoad]:
    """Land prepared files in one Spark pass: each file read once (persisted while its rows are
    counted and written), one append to `events`, one to `invalid_events`, one to `load_log`.

    `retried`: load ids of files an earlier, crashed attempt may have landed; rows of those
    already in a table are not written again (the counts still come from the file).
    """
    results = [FileLoad(path=str(f.path), sha256=f.sha256, load_id=f.load_id) for f in files]
    by_id = {r.load_id: r for r in results}
    for f in files:
        f.typed.persist(StorageLevel.DISK_ONLY)
    try:
        counts = (
            _union(
                [
                    f.typed.select(
                        LOAD_ID,
                        F.col(validate.REASON).alias("reason"),
                        # the partition a row goes to: events' load day, or invalid_events' one
                        F.when(F.col(validate.REASON).isNull(), F.to_date("load_tstamp"))
                        .otherwise(validate.invalid_load_date(f.typed))
                        .alias("day"),
                    )
                    for f in files
                ]
            )
            .groupBy(LOAD_ID, "reason", "day")
            .count()
            .collect()
        )
        invalid_days: dict[str, set[dt.date]] = {}
        for row in counts:
            result = by_id[row[LOAD_ID]]
            n = row["count"]
            result.rows_read += n
            if row["reason"] is None:
                result.rows_kept += n
                result.rows_by_load_day[row["day"]] = result.rows_by_load_day.get(row["day"], 0) + n
            else:
                result.rows_invalid += n
                result.invalid_by_reason[row["reason"]] = (
                    result.invalid_by_reason.get(row["reason"], 0) + n
                )
                invalid_days.setdefault(result.load_id, set()).add(row["day"])
        retried = set(retried)
        skip_events = landed_load_ids(
            spark, tables[EVENTS], {i: by_id[i].rows_by_load_day for i in retried}
        )
        skip_invalid = landed_load_ids(
            spark, tables[INVALID_EVENTS], {i: invalid_days.get(i, ()) for i in retried}
        )
        txn = _batch_txn(files)
        valid = [
            f.valid
            for f, r in zip(files, results, strict=True)
            if r.rows_kept and f.load_id not in skip_events
        ]
        kept_rows = sum(
            r.rows_kept for f, r in zip(files, results, strict=True) if f.load_id not in skip_events
        )
        if valid:
            _append_events(spark, tables[EVENTS], _union(valid), kept_rows, txn)
        invalid = [
            f.invalid
            for f, r in zip(files, results, strict=True)
            if r.rows_invalid and f.load_id not in skip_invalid
        ]
        invalid_rows = sum(
            r.rows_invalid
            for f, r in zip(files, results, strict=True)
            if f.load_id not in skip_invalid
        )
        # A few rejected rows are appended by the driver (delta-rs): a Spark write of a handful of
        # rows costs about a second (docs/benchmarks.md, "Session 34").
        if invalid and not (
            invalid_rows <= DRIVER_WRITE_ROWS
            and (table := driver_writable(tables[INVALID_EVENTS])) is not None
            and append_from_driver(
                tables[INVALID_EVENTS], fetch_arrow(_union(invalid))[0], txn, table=table
            )
        ):
            with faults.commit_of(tables[INVALID_EVENTS]):
                _union(invalid).write.format("delta").mode("append").partitionBy(LOAD_DATE).options(
                    **txn
                ).save(tables[INVALID_EVENTS])
    finally:
        for f in files:
            f.typed.unpersist()
    loaded_at = now.astimezone(dt.UTC).replace(tzinfo=None)
    log_rows = [
        (
            r.load_id,
            str(f.path.resolve()),
            f.sha256,
            f.format,
            r.rows_read,
            r.rows_kept,
            r.rows_invalid,
            sorted(r.rows_by_load_day),
            loaded_at,
        )
        for f, r in zip(files, results, strict=True)
    ]
    names = [f.name for f in LOAD_LOG_SCHEMA.fields]
    data = pa.Table.from_pylist(
        [dict(zip(names, row, strict=True)) for row in log_rows], schema=LOAD_LOG_ARROW
    )
    if not append_from_driver(tables[LOAD_LOG], data, compact=True):
        with faults.commit_of(tables[LOAD_LOG]):
            spark.createDataFrame(log_rows, LOAD_LOG_SCHEMA).write.format("delta").mode(
                "append"
            ).save(tables[LOAD_LOG])
    return results


def load_paths(
    spark: SparkSession,
    paths: Sequence[str | Path],
    settings: Settings,
    tables: dict[str, str],
    now: dt.datetime,
    load_tstamp: dt.datetime | None = None,
    load_tstamp_from: str | None = None,
    manifest_path: str | None = None,
    max_files: int = BATCH_MAX_FILES,
    max_bytes: int = BATCH_MAX_BYTES,
) -> LoadReport:
    """Land files or folders into `events`; a file loaded before (same SHA-256) is skipped.

    Every file is planned and checked first (a text CSV header with a blank or repeated column
    name, a missing --load-tstamp-from column, a column changing type: one UserError before
    anything is written; a header that is not text only rejects its own file's lines), then the
    files land in batches (`plan_batches`), each in one Spark pass. With `manifest_path`, every file
    is an item of the processing manifest (`file/<sha256>`): a batch's files are locked in one
    commit, all or none, and marked Processed (or Failed with the error) in one more.
    """
    load_run_id = f"load-{uuid.uuid4().hex[:12]}"
    if load_tstamp is not None and load_tstamp_from is not None:
        raise UserError("Give either --load-tstamp or --load-tstamp-from, not both.")
    files = expand_paths(paths)
    with tempfile.TemporaryDirectory(prefix="sessionize-decoded-") as work_dir:
        return _load_files(
            spark,
            files,
            settings,
            tables,
            now,
            load_tstamp,
            load_tstamp_from,
            manifest_path,
            max_files,
            max_bytes,
            load_run_id,
            Path(work_dir),
        )


def _load_files(
    spark: SparkSession,
    files: Sequence[Path],
    settings: Settings,
    tables: dict[str, str],
    now: dt.datetime,
    load_tstamp: dt.datetime | None,
    load_tstamp_from: str | None,
    manifest_path: str | None,
    max_files: int,
    max_bytes: int,
    load_run_id: str,
    work_dir: Path,
) -> LoadReport:
    """`load_paths` once the files are known; decoded copies go to `work_dir`."""
    seen = loaded_hashes(tables[LOAD_LOG])
    entries: list[FileLoad | PreparedFile] = []
    for path in files:
        sha = file_sha256(path)
        if sha in seen:
            entries.append(
                FileLoad(
                    path=str(path),
                    sha256=sha,
                    skipped_reason=f"same content already loaded from {seen[sha]}",
                )
            )
            continue
        seen[sha] = str(path)  # a second copy in this call is skipped too
        entries.append(
            prepare_file(spark, path, sha, settings, now, load_tstamp, load_tstamp_from, work_dir)
        )
    prepared = [e for e in entries if isinstance(e, PreparedFile)]
    if prepared:
        events_path = tables[EVENTS]
        schema = (
            spark.read.format("delta").load(events_path).schema
            if table_exists(spark, events_path)
            else None
        )
        for f in prepared:
            _check_schema(schema, f.valid.schema)
            schema = _merge_schema(schema, f.valid.schema)
    landed: dict[str, FileLoad] = {}
    for batch_indexes in plan_batches([f.size for f in prepared], max_files, max_bytes):
        batch = [prepared[i] for i in batch_indexes]
        with small_query_conf(spark, sum(f.size for f in batch) <= SMALL_BATCH_BYTES):
            if manifest_path is None:
                results = land_batch(spark, batch, tables, now)
            else:
                results = _land_under_manifest(
                    spark, batch, tables, now, manifest_path, load_run_id
                )
        landed.update({r.sha256: r for r in results})
    report = LoadReport()
    report.files = [e if isinstance(e, FileLoad) else landed[e.sha256] for e in entries]
    return report


def _land_under_manifest(
    spark: SparkSession,
    batch: Sequence[PreparedFile],
    tables: dict[str, str],
    now: dt.datetime,
    manifest_path: str,
    run_id: str,
) -> list[FileLoad]:
    """`land_batch` with the batch's files locked in the processing manifest: Processed with
    their counts, or Failed (fail-locked until an operator resolves them) with the error."""
    from sessionize_assets.resources.processing_manifest import ProcessingManifest

    manifest = ProcessingManifest(spark, manifest_path)
    items = [f"file/{f.sha256}" for f in batch]
    # Files with records before this run were tried before: a crashed attempt may have committed.
    history = manifest.records_of(items)
    retried = [f.load_id for f, item in zip(batch, items, strict=True) if history.get(item)]
    try:
        locks = manifest.processing_many(items, "sessionize load", run_id)
        payloads = locks.__enter__()
    except ItemLockedError as exc:
        # Name the file, not only its content hash.
        text = str(exc)
        for f in batch:
            text = text.replace(f"file/{f.sha256}", f"file/{f.sha256} ({f.path})")
        raise ItemLockedError(text) from None
    with contextlib.ExitStack() as stack:
        stack.push(locks)
        results = land_batch(spark, batch, tables, now, retried)
        for payload, result in zip(payloads, results, strict=True):
            payload.update(
                {
                    "path": result.path,
                    "load_id": result.load_id,
                    "rows_read": result.rows_read,
                    "rows_kept": result.rows_kept,
                    "rows_invalid": result.rows_invalid,
                }
            )
    return results
