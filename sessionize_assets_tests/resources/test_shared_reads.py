"""The event days daily_aggregates reads are served to the session branch from memory, only at the
same Delta version. (That a whole run served from memory still verifies against a full recompute
is checked in test_pipeline_recovery.py, on runs it makes anyway.)"""

from __future__ import annotations

import datetime as dt

from pyspark.sql import SparkSession

from sessionize_assets.resources import shared_reads
from sessionize_assets.resources.shared_reads import Kept, sharing, stale, usable

D1, D2, D3 = dt.date(2024, 1, 1), dt.date(2024, 1, 2), dt.date(2024, 1, 3)


def test_usable_takes_same_table_and_version_and_never_a_day_twice():
    kept = [
        Kept("/t", 3, frozenset({D1, D2})),
        Kept("/t", 2, frozenset({D3})),  # another version
        Kept("/u", 3, frozenset({D3})),  # another table
        Kept("/t", 3, frozenset({D2, D3})),  # D2 already served by the first
        Kept("/t", 3, frozenset({D3})),
        Kept("/t", 3, frozenset()),
    ]
    assert usable(kept, "/t", 3) == [0, 4]
    assert usable(kept, "/t", 4) == []
    assert stale(kept, "/t", 3) == [1]
    assert stale(kept, "/u", 3) == []


def _write(spark: SparkSession, path: str, rows: list[tuple[int, dt.date]]) -> None:
    df = spark.createDataFrame(rows, "id INT, event_date DATE")
    df.write.format("delta").mode("append").partitionBy("event_date").save(path)


def _rows(df) -> list[tuple]:  # noqa: ANN001
    return sorted(tuple(r) for r in df.collect())


def _uses_cache(df) -> bool:  # noqa: ANN001
    """Spark's own plan, with cached data substituted, scans a persisted DataFrame."""
    return "InMemoryRelation" in df._jdf.queryExecution().withCachedData().toString()


def test_table_at_serves_kept_days_from_memory_and_the_rest_from_storage(spark, tmp_path):
    path = str(tmp_path / "t")
    _write(spark, path, [(1, D1), (2, D2), (3, D3), (4, None)])  # version 0
    _write(spark, path, [(5, D2)])  # version 1

    def read(version: int):  # noqa: ANN202
        return spark.read.format("delta").option("versionAsOf", version).load(path)

    outside, kept_outside = shared_reads.event_days(read(1), path, 1, [D2])
    assert not kept_outside and not outside.is_cached  # no sharing block: nothing kept

    with sharing() as shared:
        days, kept = shared_reads.event_days(read(0), path, 0, [D1, D2])
        assert kept and days.is_cached
        assert _rows(days) == [(1, D1), (2, D2)]  # version 0's rows: (5, D2) came later
        combined = shared_reads.table_at(path, 0, lambda: read(0))
        assert combined.columns == read(0).columns
        assert _uses_cache(combined) and not _uses_cache(read(0))
        assert _rows(combined) == _rows(read(0))
        assert shared.served_reads == 1 and shared.served_days == 2
        # Another version is read from storage.
        at_1 = shared_reads.table_at(path, 1, lambda: read(1))
        assert _rows(at_1) == _rows(read(1)) and not _uses_cache(at_1)
        assert shared.served_reads == 1
        # Keeping days of a newer version drops the older one.
        newer, _ = shared_reads.event_days(read(1), path, 1, [D2])
        assert not days.is_cached and newer.is_cached
        assert _rows(shared_reads.table_at(path, 1, lambda: read(1))) == _rows(read(1))
        assert shared.served_reads == 2
        with sharing() as inner:  # nested blocks share the outer registry
            assert inner is shared
        assert newer.is_cached
    assert not newer.is_cached  # released at the end of the block
    assert shared_reads.active() is None


def test_narrow_kept_days_serve_only_reads_of_columns_they_hold(spark, tmp_path):
    path = str(tmp_path / "t")
    rows = [(1, "a", "x", D1), (2, "b", "y", D2), (3, "c", "z", None)]
    df = spark.createDataFrame(rows, "id INT, name STRING, wide STRING, event_date DATE")
    df.write.format("delta").partitionBy("event_date").save(path)

    def read():  # noqa: ANN202
        return spark.read.format("delta").option("versionAsOf", 0).load(path)

    assert usable([Kept("/t", 0, frozenset({D1}), frozenset({"id"}))], "/t", 0, ["id"]) == [0]
    assert usable([Kept("/t", 0, frozenset({D1}), frozenset({"id"}))], "/t", 0, ["wide"]) == []
    assert usable([Kept("/t", 0, frozenset({D1}), frozenset({"id"}))], "/t", 0) == []
    with sharing() as shared:
        days, kept = shared_reads.event_days(read(), path, 0, [D1, D2], ["event_date", "id"])
        assert kept and days.is_cached and days.columns == ["id", "event_date"]
        # A read of columns the kept days hold: in the table's order, from memory and storage.
        narrow = shared_reads.table_at(path, 0, read, ["event_date", "id"])
        assert narrow.columns == ["id", "event_date"] and _uses_cache(narrow)
        assert _rows(narrow) == _rows(read().select("id", "event_date"))
        # A read of a column they do not hold goes to storage, whole.
        wide = shared_reads.table_at(path, 0, read, ["id", "wide", "event_date"])
        assert wide.columns == ["id", "wide", "event_date"] and not _uses_cache(wide)
        assert _rows(wide) == _rows(read().select("id", "wide", "event_date"))
        assert shared.served_reads == 1
