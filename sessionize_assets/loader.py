"""Landing raw files into the `events` Delta table (imperative shell around core.validate).

Every row read is accounted for: kept in `events`, or sent to `invalid_events` with its reason and
raw text. A file already loaded (same content, by SHA-256) is skipped with a warning.
"""

from __future__ import annotations

import csv
import datetime as dt
import hashlib
import io
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from sessionize_assets.core import validate
from sessionize_assets.core.schema import (
    LOAD_DATE,
    LOAD_ID,
    REQUIRED_COLUMNS,
    ROW_HASH,
    SOURCE_FILE,
    TIMESTAMP_COLUMNS,
)
from sessionize_assets.errors import UserError
from sessionize_assets.resources.tables import (
    EVENTS,
    INVALID_EVENTS,
    LOAD_LOG,
    read_small_table,
    table_exists,
)
from sessionize_assets.settings import Settings

FORMATS = {
    ".csv": "csv",
    ".json": "json",
    ".jsonl": "json",
    ".ndjson": "json",
    ".parquet": "parquet",
}

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


def _csv_header(path: Path) -> list[str]:
    with path.open(newline="", encoding="utf-8") as handle:
        first = handle.readline()
    header = next(csv.reader(io.StringIO(first)), [])
    if not header or any(not h.strip() for h in header):
        raise UserError(f"{path} has no usable CSV header row (a named column per field).")
    if len(set(header)) != len(header):
        raise UserError(f"{path} names a column twice in its header row.")
    return [h.strip() for h in header]


def read_raw(spark: SparkSession, path: Path) -> tuple[DataFrame, list[str]]:
    """The file's rows with their raw text in `_raw_text` and the reader's reason, if any.

    Returns the DataFrame and its data columns (the file's own column names).
    """
    fmt = FORMATS[path.suffix.lower()]
    uri = str(path.resolve())
    if fmt == "csv":
        header = _csv_header(path)
        schema = ", ".join(f"`{h}` STRING" for h in header) + f", `{validate.CORRUPT}` STRING"
        header_line = path.open(encoding="utf-8").readline().rstrip("\r\n")
        lines = spark.read.text(uri).where(
            (F.col("value") != header_line) & (F.trim("value") != "")
        )
        parsed = lines.select(
            F.col("value").alias("_raw_text"),
            F.from_csv(
                "value",
                schema,
                {
                    "mode": "PERMISSIVE",
                    "columnNameOfCorruptRecord": validate.CORRUPT,
                    "escape": '"',
                },
            ).alias("r"),
        ).select("_raw_text", "r.*")
        reason = F.when(
            F.col(validate.CORRUPT).isNotNull(),
            F.lit(f"wrong number of fields (expected {len(header)})"),
        )
        # Empty CSV fields are missing values.
        for h in header:
            parsed = parsed.withColumn(h, F.when(F.col(h) == "", F.lit(None)).otherwise(F.col(h)))
        return parsed.withColumn(validate.REASON, reason).drop(validate.CORRUPT), header
    if fmt == "json":
        inferred = spark.read.json(uri).schema
        fields = [f for f in inferred.fields if f.name != validate.CORRUPT]
        if not fields:
            raise UserError(f"{path} holds no JSON objects.")
        schema = T.StructType(fields + [T.StructField(validate.CORRUPT, T.StringType())])
        lines = spark.read.text(uri).where(F.trim("value") != "")
        parsed = lines.select(
            F.col("value").alias("_raw_text"),
            F.from_json(
                "value",
                schema,
                {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": validate.CORRUPT},
            ).alias("r"),
        ).select("_raw_text", "r.*")
        reason = F.when(
            F.try_parse_json("_raw_text").isNull() | F.col(validate.CORRUPT).isNotNull(),
            F.lit("not valid JSON"),
        )
        return parsed.withColumn(validate.REASON, reason).drop(validate.CORRUPT), [
            f.name for f in fields
        ]
    frame = spark.read.parquet(uri)
    columns = list(frame.columns)
    raw = F.to_json(F.struct(*[F.col(c) for c in columns]))
    return frame.withColumn("_raw_text", raw).withColumn(
        validate.REASON, F.lit(None).cast("string")
    ), columns


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


def _ordered_columns(columns: Iterable[str]) -> list[str]:
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


def load_file(
    spark: SparkSession,
    path: Path,
    sha256: str,
    settings: Settings,
    tables: dict[str, str],
    now: dt.datetime,
    load_tstamp: dt.datetime | None = None,
    load_tstamp_from: str | None = None,
) -> FileLoad:
    """Land one file: valid rows to `events`, unusable rows to `invalid_events`, a `load_log` row."""
    result = FileLoad(path=str(path), sha256=sha256, load_id=uuid.uuid4().hex)
    raw, data_columns = read_raw(spark, path)
    raw = validate.apply_column_mapping(raw, settings.column_mapping)
    data_columns = [settings.column_mapping.get(c, c) for c in data_columns]
    if load_tstamp_from is not None and load_tstamp_from not in raw.columns:
        raise UserError(
            f"--load-tstamp-from names column `{load_tstamp_from}`, which {path} does not have."
        )
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
    typed = validate.classify(typed, settings.max_clock_skew_minutes).withColumn(
        "_fallback_load_date", F.lit(fallback_day)
    )
    typed = typed.withColumn(SOURCE_FILE, F.lit(str(path.resolve()))).withColumn(
        LOAD_ID, F.lit(result.load_id)
    )
    typed = typed.persist()
    try:
        counts = (
            typed.groupBy(
                F.col(validate.REASON).alias("reason"), F.to_date("load_tstamp").alias("day")
            )
            .count()
            .collect()
        )
        for row in counts:
            result.rows_read += row["count"]
            if row["reason"] is None:
                result.rows_kept += row["count"]
                result.rows_by_load_day[row["day"]] = (
                    result.rows_by_load_day.get(row["day"], 0) + row["count"]
                )
            else:
                result.rows_invalid += row["count"]
                result.invalid_by_reason[row["reason"]] = (
                    result.invalid_by_reason.get(row["reason"], 0) + row["count"]
                )

        all_columns = [
            c
            for c in typed.columns
            if not c.startswith("_raw_")
            and c not in (validate.REASON, "_fallback_load_date", "_unreadable")
        ]
        keep = [c for c in all_columns if c not in (SOURCE_FILE, LOAD_ID)]
        valid = validate.finish_valid(
            typed.drop("_raw_text", "_fallback_load_date", "_unreadable"), keep
        )
        valid = valid.select(*_ordered_columns(valid.columns))
        events_path = tables[EVENTS]
        existing = (
            spark.read.format("delta").load(events_path).schema
            if table_exists(spark, events_path)
            else None
        )
        _check_schema(existing, valid.schema)
        txn = {"txnAppId": f"sessionize-load-{sha256}", "txnVersion": "1"}
        if result.rows_kept:
            writer = (
                valid.write.format("delta")
                .mode("append")
                .partitionBy(LOAD_DATE)
                .option("mergeSchema", "true")
            )
            if existing is None:
                writer = writer.option("delta.enableChangeDataFeed", "true")
            writer.options(**txn).save(events_path)
        if result.rows_invalid:
            invalid = validate.invalid_rows(typed, F.col("_raw_text")).select(
                LOAD_DATE,
                "reason",
                "raw",
                F.lit(str(path.resolve())).alias(SOURCE_FILE),
                F.lit(result.load_id).alias(LOAD_ID),
                F.lit(now.astimezone(dt.UTC).replace(tzinfo=None))
                .cast("timestamp")
                .alias("recorded_at"),
            )
            invalid.write.format("delta").mode("append").partitionBy(LOAD_DATE).options(**txn).save(
                tables[INVALID_EVENTS]
            )
    finally:
        typed.unpersist()
    log_row = [
        (
            result.load_id,
            str(path.resolve()),
            sha256,
            FORMATS[path.suffix.lower()],
            result.rows_read,
            result.rows_kept,
            result.rows_invalid,
            sorted(result.rows_by_load_day),
            now.astimezone(dt.UTC).replace(tzinfo=None),
        )
    ]
    spark.createDataFrame(log_row, LOAD_LOG_SCHEMA).write.format("delta").mode("append").save(
        tables[LOAD_LOG]
    )
    return result


def load_paths(
    spark: SparkSession,
    paths: Sequence[str | Path],
    settings: Settings,
    tables: dict[str, str],
    now: dt.datetime,
    load_tstamp: dt.datetime | None = None,
    load_tstamp_from: str | None = None,
    manifest_path: str | None = None,
) -> LoadReport:
    """Land files or folders into `events`; a file loaded before (same SHA-256) is skipped.

    With `manifest_path`, every file goes through the processing manifest (item `file/<sha256>`).
    """
    load_run_id = f"load-{uuid.uuid4().hex[:12]}"
    if load_tstamp is not None and load_tstamp_from is not None:
        raise UserError("Give either --load-tstamp or --load-tstamp-from, not both.")
    files = expand_paths(paths)
    seen = loaded_hashes(tables[LOAD_LOG])
    report = LoadReport()
    for path in files:
        sha = file_sha256(path)
        if sha in seen:
            report.files.append(
                FileLoad(
                    path=str(path),
                    sha256=sha,
                    skipped_reason=f"same content already loaded from {seen[sha]}",
                )
            )
            continue
        if manifest_path is None:
            result = load_file(
                spark, path, sha, settings, tables, now, load_tstamp, load_tstamp_from
            )
        else:
            # The file is an item of the processing manifest: locked while it loads, Processed
            # with its counts, or Failed (fail-locked until an operator resolves it).
            from sessionize_assets.resources.processing_manifest import ProcessingManifest

            manifest = ProcessingManifest(spark, manifest_path)
            with manifest.processing(f"file/{sha}", "sessionize load", load_run_id) as payload:
                result = load_file(
                    spark, path, sha, settings, tables, now, load_tstamp, load_tstamp_from
                )
                payload.update(
                    {
                        "path": str(path),
                        "load_id": result.load_id,
                        "rows_read": result.rows_read,
                        "rows_kept": result.rows_kept,
                        "rows_invalid": result.rows_invalid,
                    }
                )
        report.files.append(result)
        seen[sha] = str(path)
    return report
