"""Reading one input file into raw rows: CSV (header row), newline-delimited JSON (a line may hold
an array of objects) and Parquet. Each row keeps its raw text (`_raw_text`) and the reader's
reason when it could not be parsed (`core.validate.REASON`); CSV and JSON are read from the UTF-8
text `ingest.decode` prepared, so an undecodable line is a rejected row, not altered text.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from sessionize_assets.core import validate
from sessionize_assets.errors import UserError
from sessionize_assets.ingest.decode import UNDECODABLE, DecodedFile, header_text
from sessionize_assets.ingest.decode import reason as decode_reason

FORMATS = {
    ".csv": "csv",
    ".json": "json",
    ".jsonl": "json",
    ".ndjson": "json",
    ".parquet": "parquet",
}


REPEATED_HEADER = "repeated CSV header line (files joined with cat?)"
"""The `invalid_events` reason of a later line equal to the file's header line."""


def unreadable_header_reason(decoded: DecodedFile) -> str | None:
    """Why a CSV file's first line cannot be its header (binary data, the wrong encoding), as the
    `invalid_events` reason of every line of the file; None when it is text."""
    first = header_text(decoded)
    if first is None:
        why = f"not valid {decoded.encoding} text; set input_encoding if the file uses another"
    elif any((ord(c) < 32 and c != "\t") or ord(c) == 127 for c in first):
        why = "it holds control characters: binary data?"
    else:
        return None
    return f"unreadable CSV header ({why}): no line of the file can be read as a row"


def _csv_header(decoded: DecodedFile) -> tuple[str, list[str]]:
    """(the header line, its column names); a header naming no usable columns is a UserError."""
    path = decoded.source
    first = header_text(decoded)
    assert first is not None  # `unreadable_header_reason` was None
    header = next(csv.reader(io.StringIO(first)), [])
    if not header or any(not h.strip() for h in header):
        raise UserError(f"{path} has no usable CSV header row (a named column per field).")
    if len(set(header)) != len(header):
        raise UserError(f"{path} names a column twice in its header row.")
    return first, [h.strip() for h in header]


def _text_lines(spark: SparkSession, decoded: DecodedFile) -> DataFrame:
    """The file's non-blank lines as `value`, with `_undecodable` set on lines whose bytes did not
    decode (their `value` is the line with the bad bytes escaped; see `ingest.decode`)."""
    lines = spark.read.text(str(decoded.readable.resolve())).where(F.trim("value") != "")
    marked = F.col("value").startswith(UNDECODABLE)
    return lines.select(
        F.when(marked, F.substring("value", len(UNDECODABLE) + 1, 1 << 30))
        .otherwise(F.col("value"))
        .alias("value"),
        marked.alias("_undecodable"),
    )


def read_raw(
    spark: SparkSession, path: Path, decoded: DecodedFile | None = None
) -> tuple[DataFrame, list[str]]:
    """The file's rows with their raw text in `_raw_text` and the reader's reason, if any.

    Returns the DataFrame and its data columns (the file's own column names; none when no
    column could be read: every row then carries the reader's reason). `decoded` is the UTF-8
    text to read for a CSV or JSON file (`ingest.decode.decode_file`; default: the file itself,
    which must then be UTF-8).

    CSV: the first line is the header and is not a row; a later line equal to it (files joined
    with `cat`) is a row rejected as `REPEATED_HEADER`. A first line that is not text (binary
    data, another encoding) rejects every line of the file with `unreadable_header_reason`:
    the other files of the command still load.
    """
    fmt = FORMATS[path.suffix.lower()]
    if fmt in ("csv", "json") and decoded is None:
        decoded = DecodedFile(source=path, readable=path, encoding="utf-8")
    undecodable = (
        F.when(F.col("_undecodable"), F.lit(decode_reason(decoded.encoding))) if decoded else None
    )
    if fmt == "csv":
        unreadable = unreadable_header_reason(decoded)
        if unreadable is not None:
            lines = _text_lines(spark, decoded)
            return lines.select(
                F.col("value").alias("_raw_text"), F.lit(unreadable).alias(validate.REASON)
            ), []
        header_line, header = _csv_header(decoded)
        schema = ", ".join(f"`{h}` STRING" for h in header) + f", `{validate.CORRUPT}` STRING"
        # The file's first line is the first row of its first split: Spark orders one file's
        # splits by offset (equal sizes; only the last is shorter), so that row's id is 0.
        # Only that line is the header; a later copy of it is a row, rejected with a reason.
        lines = (
            _text_lines(spark, decoded)
            .withColumn("_line_id", F.monotonically_increasing_id())
            .where(~((F.col("_line_id") == 0) & (F.col("value") == header_line)))
        )
        repeated_header = F.when(
            F.col("value").isin(header_line, "\ufeff" + header_line), F.lit(REPEATED_HEADER)
        )
        parsed = lines.select(
            F.col("value").alias("_raw_text"),
            "_undecodable",
            repeated_header.alias("_repeated_header"),
            F.from_csv(
                "value",
                schema,
                {
                    "mode": "PERMISSIVE",
                    "columnNameOfCorruptRecord": validate.CORRUPT,
                    "escape": '"',
                },
            ).alias("r"),
        ).select("_raw_text", "_undecodable", "_repeated_header", "r.*")
        reason = F.coalesce(
            undecodable,
            F.col("_repeated_header"),
            F.when(
                F.col(validate.CORRUPT).isNotNull(),
                F.lit(f"wrong number of fields (expected {len(header)})"),
            ),
        )
        # Empty CSV fields are missing values; an undecodable line's fields are not read. One
        # projection for all of them: a `withColumn` per field nested a projection per column,
        # each analyzed again (about 40 for a Snowplow file).
        parsed = parsed.withColumns(
            {
                h: F.when((F.col(h) == "") | F.col("_undecodable"), F.lit(None)).otherwise(F.col(h))
                for h in header
            }
        )
        return parsed.withColumn(validate.REASON, reason).drop(
            validate.CORRUPT, "_undecodable", "_repeated_header"
        ), header
    if fmt == "json":
        uri = str(decoded.readable.resolve())
        inferred = spark.read.json(uri).schema
        fields = [f for f in inferred.fields if f.name != validate.CORRUPT]
        no_columns = not fields and decoded.undecodable_lines > 0
        if no_columns:
            # Nothing decodable to infer a schema from: every line is rejected as undecodable.
            fields = [T.StructField("event_id", T.StringType())]
        if not fields:
            raise UserError(f"{path} holds no JSON objects.")
        schema = T.StructType(fields + [T.StructField(validate.CORRUPT, T.StringType())])
        lines = _text_lines(spark, decoded)
        # A line holding a JSON array of objects is one row per element (Spark's own reader
        # does the same); each element's text is its raw value.
        elements = F.when(
            ~F.col("_undecodable") & F.trim("value").startswith("["),
            F.from_json("value", "array<string>"),
        )
        lines = lines.select(
            F.explode(
                F.when(F.size(elements) > 0, elements).otherwise(F.array(F.col("value")))
            ).alias("value"),
            "_undecodable",
        )
        parsed = lines.select(
            F.col("value").alias("_raw_text"),
            "_undecodable",
            F.from_json(
                "value",
                schema,
                {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": validate.CORRUPT},
            ).alias("r"),
        ).select("_raw_text", "_undecodable", "r.*")
        reason = F.coalesce(
            undecodable,
            F.when(
                F.try_parse_json("_raw_text").isNull() | F.col(validate.CORRUPT).isNotNull(),
                F.lit("not valid JSON"),
            ),
        )
        data = [f.name for f in fields]
        parsed = parsed.withColumns(
            {
                name: F.when(F.col("_undecodable"), F.lit(None)).otherwise(F.col(name))
                for name in data
            }
        )
        return parsed.withColumn(validate.REASON, reason).drop(
            validate.CORRUPT, "_undecodable"
        ), [] if no_columns else data
    uri = str(path.resolve())
    frame = spark.read.parquet(uri)
    columns = list(frame.columns)
    raw = F.to_json(F.struct(*[F.col(c) for c in columns]))
    return frame.withColumn("_raw_text", raw).withColumn(
        validate.REASON, F.lit(None).cast("string")
    ), columns
