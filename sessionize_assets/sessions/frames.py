"""Spark plumbing the session steps share: keeping small intermediate results small (driver-local
DataFrames, a small-query configuration), the run window's file-skipping filter, and the counts of
events left out per named rule.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import pyarrow as pa
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from sessionize_assets.core import sessionize as core
from sessionize_assets.resources.delta import (
    delta_table,
    distinct_values,
    rows_by_key,
    schema_pairs,
    table_or_empty,
)
from sessionize_assets.resources.spark import (
    arrow_frame,
    fetch_arrow,
    persist_compact,
)
from sessionize_assets.settings import Settings

# Intermediate results up to this many rows become driver-local DataFrames (collected through
# Arrow): later plans stay small and never recompute their lineage. Bigger ones are persisted.
LOCAL_ROWS = 20_000

# Runs that take on at most this many rows (window and change feed) use a small-query
# configuration: adaptive execution submits every shuffle stage as its own job, which costs more
# than it saves on small inputs.
SMALL_RUN_ROWS = 2_000_000


def small_run(taken_rows: int) -> bool:
    """Whether a session run uses the small-query configuration: it takes on at most
    SMALL_RUN_ROWS rows (window and change feed), whatever the size of filtered_events.

    Until session 35 the table had to be that small too, so that the reads of the touched
    sessions' events, which scan filtered_events with a large filter, kept whole-stage code
    generation on a large history (one pair in session 25, within noise). Measured again on the
    30-day benchmark home (6.2 M rows), every session run benefits: two alternating pairs of
    warmed 5,000-event days took 10.5-10.9 s against 13.3-13.8 s in the session models, with 92
    Spark jobs a day against 122, and a pair of warmed 200,000-event days 24.5 s against 26.5 s
    (docs/benchmarks.md, "Session 35")."""
    return taken_rows <= SMALL_RUN_ROWS


# Inside `small_results(True)` (a small run), `localize` fetches a result before persisting it.
_FETCH_FIRST: ContextVar[bool] = ContextVar("fetch_first", default=False)


@contextmanager
def small_results(enabled: bool) -> Iterator[None]:
    """While `enabled`, `localize` expects small results: it fetches a result's first rows
    without persisting it first, and persists (and computes again) only a result over its limit.

    A small run's intermediate results are almost all driver-local, and over Spark Connect a
    persist is a round trip of its own that plans the query (its Delta scans' file listing
    included) before the fetch plans it again, and the unpersist another."""
    token = _FETCH_FIRST.set(enabled)
    try:
        yield
    finally:
        _FETCH_FIRST.reset(token)


def localize(spark: SparkSession, df: DataFrame, limit: int | None = None) -> DataFrame:
    """`localized`'s DataFrame."""
    return localized(spark, df, limit)[0]


def localized(
    spark: SparkSession, df: DataFrame, limit: int | None = None
) -> tuple[DataFrame, pa.Table | None]:
    """`df` computed once: a local DataFrame when it holds at most `limit` rows (default
    LOCAL_ROWS), else persisted (unpersist when done) in at most one partition per core.

    `df` is persisted before its first `limit + 1` rows are fetched, so a large result is not
    computed a second time on its first use: that fetch fills the cache. A persisted plan keeps
    its shuffle partitions (adaptive execution does not coalesce a cached plan's), so the result
    is coalesced to the default parallelism first, or every later read of it would be 64 tiny
    tasks. On 30 days of history, where the changed users' lifecycle rows are such a result,
    the session models' tasks used 4-5 s less CPU in two pairs of 200,000-event days
    (docs/benchmarks.md, "Session 30"); a small result costs the encoding of its few rows into
    the cache, dropped at once.

    Inside `small_results(True)` the order is the other way round: the rows are fetched first
    (no persist, no unpersist), and only a result over `limit` is persisted, and computed again
    on its first use.

    With the DataFrame, the Arrow rows it was made of when it is driver-local (None: persisted)."""
    limit = LOCAL_ROWS if limit is None else limit
    if _FETCH_FIRST.get():
        return _once(spark, df, limit, True)
    kept = persist_compact(spark, df)
    table, schema = fetch_arrow(kept.limit(limit + 1))
    if table.num_rows <= limit:
        kept.unpersist()
        return arrow_frame(spark, table, schema=schema), table
    return kept, None


def computed_once(
    spark: SparkSession, df: DataFrame, limit: int | None = None, fetch_first: bool | None = None
) -> DataFrame:
    """`df` computed once for several later reads. With `fetch_first` (default: inside
    `small_results(True)`), its first `limit` + 1 rows (default LOCAL_ROWS) are fetched, and
    when that is all of them they become a driver-local DataFrame (no persist, no unpersist);
    otherwise, and when it is larger, `df` is persisted (unpersist when done) and computed again
    on its first use. Without, it is persisted and nothing is fetched: the caller expects a
    large result."""
    return computed_once_rows(spark, df, limit, fetch_first)[0]


def computed_once_rows(
    spark: SparkSession, df: DataFrame, limit: int | None = None, fetch_first: bool | None = None
) -> tuple[DataFrame, pa.Table | None]:
    """`computed_once`, with the Arrow rows the DataFrame was made of when it is driver-local
    (None: persisted)."""
    limit = LOCAL_ROWS if limit is None else limit
    fetch_first = _FETCH_FIRST.get() if fetch_first is None else fetch_first
    return _once(spark, df, limit, fetch_first)


def _once(
    spark: SparkSession, df: DataFrame, limit: int, fetch_first: bool
) -> tuple[DataFrame, pa.Table | None]:
    if fetch_first:
        table, schema = fetch_arrow(df.limit(limit + 1))
        if table.num_rows <= limit:
            return arrow_frame(spark, table, schema=schema), table
    return persist_compact(spark, df), None


# At most this many keys are collected, and as many rows kept, for a driver read of a table's rows
# of some keys (`keyed_rows`); more, and Spark reads the table.
KEYED_ROWS = 200_000


def key_values(df: DataFrame, column: str, limit: int | None = None) -> pa.Array | None:
    """The distinct non-null values of `df`'s `column` (one round trip), or None when there
    are more than `limit` rows (default KEYED_ROWS)."""
    limit = KEYED_ROWS if limit is None else limit
    data, _ = fetch_arrow(df.select(column).limit(limit + 1))
    if data.num_rows > limit:
        return None
    return distinct_values(data.column(0))


def keyed_rows(
    spark: SparkSession,
    path: str,
    schema: str,
    keys: Mapping[str, DataFrame | pa.Array | None],
    version: int | None = None,
) -> DataFrame:
    """At least the rows of the table at `path` where any column of `keys` holds one of its
    values: read by delta-rs (at `version`, default the current one) into a driver-local
    DataFrame of the columns of `schema` when it can (`resources.delta.rows_by_key`; at most
    KEYED_ROWS keys collected from each DataFrame given, at most KEYED_ROWS rows kept), else the
    whole table at its current version as `table_or_empty` reads it. The caller still joins
    with its keys: this only spares Spark's scan of the whole table, 0.4-1.8 s per read of
    `sessions` in a small run on the 30-day benchmark home (docs/benchmarks.md, "Session 33").
    A key given as None (too many to collect) sends the read to Spark."""
    return keyed_read(spark, path, schema, keys, version)[0]


def keyed_read(
    spark: SparkSession,
    path: str,
    schema: str,
    keys: Mapping[str, DataFrame | pa.Array | None],
    version: int | None = None,
) -> tuple[DataFrame, pa.Table | None]:
    """`keyed_rows`, with the Arrow rows the driver read when the DataFrame is made of them
    (exactly the rows of the keys; None: Spark reads the table)."""
    table = delta_table(path, version)
    if table is None:
        return spark.createDataFrame([], schema), None
    arrays = {}
    for column, values in keys.items():
        if isinstance(values, DataFrame):
            values = key_values(values, column)
        if values is None:
            return table_or_empty(spark, path, schema), None
        arrays[column] = values
    names = [c for c, _ in schema_pairs(schema)]
    rows = rows_by_key(table, arrays, columns=names, limit=KEYED_ROWS)
    if rows is None:
        return table_or_empty(spark, path, schema), None
    try:
        return arrow_frame(spark, rows, schema=schema), rows
    except Exception:  # noqa: BLE001 - a stored type `schema` does not take: Spark reads the
        return table_or_empty(spark, path, schema), None  # table (its own types), as `local_table`


def without_unchanged(
    source: DataFrame, current: DataFrame, key: str, columns: list[str]
) -> DataFrame:
    """The rows of a MERGE source (`_delete` marks removals) that change the table: the removals of
    stored rows, and each row that differs (null-safe, on `columns`) from the `current` row with its `key` or
    has none. `current` holds the stored rows of the keys in question (read at the run's start).

    A row equal to the stored one changes nothing, but Delta rewrites every file holding a row the
    MERGE matches. A run recomputes all the sessions its window touches, and most come out as they
    were: on the 30-day benchmark home, one 5,000-event day updated 4,245 lifecycle rows and 4,162
    users to the values they had, and each MERGE rewrote its whole table (403,424 and 236,344 rows
    copied)."""
    stored = current.select(*[F.col(c).alias(f"_stored_{c}") for c in columns])
    same = F.col(key) == F.col(f"_stored_{key}")
    for c in columns:
        if c != key:
            same = same & F.col(c).eqNullSafe(F.col(f"_stored_{c}"))
    kept = source.filter(~F.col("_delete")).join(stored, same, "left_anti")
    removed = source.filter(F.col("_delete")).join(
        stored, F.col(key) == F.col(f"_stored_{key}"), "left_semi"
    )
    return kept.unionByName(removed)


def window_filter(settings: Settings, lower: dt.datetime, upper: dt.datetime) -> Column:
    """Session timestamp in [lower, upper], written so Delta can skip files on the raw column."""
    ts = F.col(settings.session_timestamp)
    return ts.between(F.lit(lower), F.lit(upper)) | (
        ts.isNull() & F.col("load_tstamp").between(F.lit(lower), F.lit(upper))
    )


def reason_counts(condition: Column | None = None) -> list[Column]:
    """Aggregate columns counting rows per exclusion rule (named `rule:<rule>`)."""
    base = F.col(core.REASON)
    cond = condition if condition is not None else F.lit(True)
    return [
        F.sum(F.when(cond & (base == F.lit(rule)), 1).otherwise(0)).alias(f"rule:{rule}")
        for rule in core.EXCLUSION_RULES
    ]


def reasons_from(row: Any, prefix: str = "") -> dict[str, int]:
    """The non-zero `rule:<rule>` counts of an aggregated row, keyed `<prefix><rule>`."""
    out = {}
    for rule in core.EXCLUSION_RULES:
        n = int(row[f"rule:{rule}"] or 0)
        if n:
            out[f"{prefix}{rule}"] = n
    return out


def add_counts(target: dict[str, int], more: dict[str, int]) -> None:
    for k, v in more.items():
        target[k] = target.get(k, 0) + v
