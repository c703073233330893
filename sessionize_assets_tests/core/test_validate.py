"""Timestamp text normalization: the plain spelling skips the rewrites without changing a result."""

from __future__ import annotations

import datetime as dt

from pyspark.sql import functions as F

from sessionize_assets.core.validate import (
    _rewritten,
    normalize_timestamp_text,
    parse_timestamp,
)

TEXTS = [
    "2024-01-02 10:00:00",
    "2024-01-02 10:00:00.1",
    "2024-01-02 10:00:00.123",
    "2024-01-02 10:00:00.123456",
    "2024-01-02T10:00:00.123456",
    "2024-01-02 10:00:00.1234567",  # nanoseconds: truncated
    "2024-01-02 10:00:00.123456789Z",
    "2024-01-02T10:00:00Z",
    "2024-01-02T10:00:00z",
    "2024-01-02 10:00:00 +01:00",
    "2024-01-02 10:00:00+0130",
    "2024-01-02 10:00:00-0500",
    "2024-01-02 10:00:00 Z",
    "2024-01-02 10:00:00\n",
    "2024-0102",
    "2024-01-02",
    "10:00:00",
    "not a time",
    "",
    None,
]


def test_plain_text_skips_the_rewrites_and_gets_what_they_give(spark):
    df = spark.createDataFrame([(t,) for t in TEXTS], "t string")
    rows = df.select(
        "t",
        normalize_timestamp_text(F.col("t")).alias("fast"),
        _rewritten(F.col("t")).alias("full"),
        parse_timestamp(F.col("t")).alias("ts"),
    ).collect()
    assert [(r["t"], r["fast"]) for r in rows] == [(r["t"], r["full"]) for r in rows]
    parsed = {r["t"]: r["ts"] for r in rows}
    assert parsed["2024-01-02 10:00:00.123"] == dt.datetime(2024, 1, 2, 10, 0, 0, 123000)
    assert parsed["2024-01-02 10:00:00.1234567"] == dt.datetime(2024, 1, 2, 10, 0, 0, 123456)
    assert parsed["2024-01-02 10:00:00 +01:00"] == dt.datetime(2024, 1, 2, 9, 0, 0)
    assert parsed["not a time"] is None and parsed[None] is None
