"""What a run of the session models takes on: the rows of `filtered_events` in the run window plus
the net change data feed after a model's consumed version (`read_changes`), with the counts of
new rows left out. A feed that no longer covers the consumed version raises `FeedGone` (the
caller rebuilds the model in full).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from sessionize_assets.core import sessionize as core
from sessionize_assets.core.clock import from_micros
from sessionize_assets.core.run_limits import RunLimits
from sessionize_assets.resources.delta import (
    DRIVER_SCAN_ROWS,
    delta_table,
    local_changes,
    local_changes_arrow,
    rows_surely_within,
    scan_pruned,
    timestamp_spans_pruning,
)
from sessionize_assets.resources.spark import arrow_frame
from sessionize_assets.sessions.frames import (
    computed_once_rows,
    reason_counts,
    reasons_from,
    window_filter,
)
from sessionize_assets.settings import Settings

# Errors reading the change data feed that mean "the feed no longer covers that version".
FEED_GONE_MARKERS = (
    "FILE_NOT_EXIST",
    "FileNotFoundException",
    "DELTA_CHANGE_DATA_FILE_NOT_FOUND",
    "DELTA_MISSING_CHANGE_DATA",
    "VersionNotFound",
    "DELTA_VERSION_NOT_FOUND",
    "change data was not recorded",
    "DELTA_TIMESTAMP_GREATER_THAN_COMMIT",
    "DELTA_CDC_NOT_ALLOWED_IN_THIS_VERSION",
)


class FeedGone(Exception):
    """The change data feed no longer covers the consumed version."""


@dataclass
class Changes:
    """Prepared rows a model takes on this run, with `_sign` (+1 new/changed, -1 removed).

    `rows` holds window rows and net changes from the feed (inserts up to the upper limit,
    every delete); `usable` the rows that can be in a session."""

    rows: DataFrame
    usable: DataFrame
    window_rows: int
    feed_rows: int
    processed_max: dt.datetime | None
    min_usable: dt.datetime | None
    excluded: dict[str, int]
    # `rows` as the driver holds them (with REASON, `_sign`, `_window`, `_feed`), when it does
    rows_table: pa.Table | None = None

    @property
    def found_data(self) -> bool:
        return self.window_rows > 0 or self.feed_rows > 0

    def unpersist(self) -> None:
        self.rows.unpersist()


def read_changes(
    spark: SparkSession,
    path: str,
    snapshot: DataFrame,
    settings: Settings,
    limits: RunLimits,
    version: int,
    consumed_version: int | None,
) -> Changes:
    """The window's rows of the snapshot plus the net change feed after `consumed_version`.

    Feed rows are netted per content (a load day re-materialized with the same rows changes
    nothing); inserts beyond the upper limit wait for the window to reach them, removals are taken
    at once. Raises FeedGone when the feed cannot be read from `consumed_version` (vacuumed, log
    expired).

    Read, prepared and netted by the driver when the window's files (chosen by the Delta log's
    statistics) and the feed are small enough (`driver_changes`)."""
    driver = driver_changes(spark, path, settings, limits, version, consumed_version)
    if driver is not None:
        return driver
    lower, upper = limits.lower_limit, limits.upper_limit
    columns = core.source_columns(settings, snapshot.columns)
    window = core.prepare_events(
        snapshot.filter(window_filter(settings, lower, upper)).select(*columns), settings
    )
    rows = window.filter(F.col(core.SESSION_TS).between(F.lit(lower), F.lit(upper))).select(
        *core.PREPARED_COLUMNS,
        F.lit(1).alias("_sign"),
        F.lit(1).alias("_window"),
        F.lit(0).cast("long").alias("_feed"),
    )
    small_feed = True  # no change feed read by Spark
    try:
        if consumed_version is not None and version > consumed_version:
            # A small feed is read by the driver (delta-rs); Spark reads the rest.
            feed = local_changes(spark, path, consumed_version + 1, version, columns)
            if feed is None:
                small_feed = False
                feed = (
                    spark.read.format("delta")
                    .option("readChangeFeed", "true")
                    .option("startingVersion", consumed_version + 1)
                    .option("endingVersion", version)
                    .load(path)
                )
            sign = F.when(F.col("_change_type").isin("insert", "update_postimage"), 1).otherwise(-1)
            signed = core.prepare_events(
                feed.select(*columns, sign.alias("_sign")), settings, keep=["_sign"]
            )
            net = signed.groupBy(*core.PREPARED_COLUMNS).agg(
                F.sum("_sign").alias("_net"), F.count(F.lit(1)).alias("_feed")
            )
            # Net zero rows stay (sign 0) so the feed's row count is known from one pass.
            net = net.withColumn("_sign", F.signum("_net").cast("int"))
            net = net.filter((F.col("_sign") <= 0) | (F.col(core.SESSION_TS) <= F.lit(upper)))
            rows = rows.unionByName(
                net.select(*core.PREPARED_COLUMNS, "_sign", F.lit(0).alias("_window"), "_feed")
            )
        # Driver-local when small. Only when no part of it is a change feed Spark reads: its net
        # counts are a shuffle the fetch would compute in full, and the persist again; the run
        # window's rows are read and prepared without one, so the fetch of a large window stops
        # after LOCAL_ROWS + 1 of them. A persist is a round trip of its own over Spark Connect
        # that plans the whole read, and the unpersist another (0.7 s in a small run on the
        # 30-day benchmark home).
        rows, table = computed_once_rows(
            spark, core.with_reason(rows, settings), fetch_first=small_feed
        )
        stats = change_stats(table) if table is not None else _spark_stats(rows)
    except Exception as exc:  # noqa: BLE001 - the feed is read lazily: classify the failure
        rows.unpersist()
        if any(marker in str(exc) for marker in FEED_GONE_MARKERS):
            raise FeedGone(str(exc).strip().splitlines()[0][:300]) from exc
        raise
    return Changes(
        rows=rows,
        usable=rows.filter(F.col(core.REASON).isNull() & (F.col("_sign") != 0)).select(
            *core.PREPARED_COLUMNS, "_sign"
        ),
        window_rows=int(stats["window"] or 0),
        feed_rows=int(stats["feed"] or 0),
        processed_max=from_micros(stats["processed"]),
        min_usable=from_micros(stats["min_usable"]),
        excluded=reasons_from(stats, prefix="new rows left out: "),
        rows_table=table,
    )


def _spark_stats(rows: DataFrame) -> Any:
    """The change set's counts (`change_stats`' keys) computed by Spark."""
    new = (F.col("_sign") > 0) & F.col(core.REASON).isNull()
    return rows.agg(
        F.sum("_window").alias("window"),
        F.sum("_feed").alias("feed"),
        F.max(F.when(new, core._micros(core.SESSION_TS))).alias("processed"),
        F.min(
            F.when(
                F.col(core.REASON).isNull() & (F.col("_sign") != 0),
                core._micros(core.SESSION_TS),
            )
        ).alias("min_usable"),
        *reason_counts(F.col("_sign") > 0),
    ).collect()[0]


def change_stats(table: pa.Table) -> dict[str, Any]:
    """The change set's counts from the rows the driver holds, as `_spark_stats` gives them:
    window and feed rows, the latest new usable session timestamp and the earliest usable one
    (microseconds; null when none), and per rule (`rule:<rule>`) the new rows left out."""
    import pyarrow.compute as pc

    stats: dict[str, Any] = {f"rule:{rule}": 0 for rule in core.EXCLUSION_RULES}
    sign, reason = table.column("_sign"), table.column(core.REASON)
    stamp = table.column(core.SESSION_TS).cast(pa.timestamp("us", tz="UTC")).cast(pa.int64())
    usable = pc.and_(pc.and_(pc.is_null(reason), pc.is_valid(sign)), pc.is_valid(stamp))
    new = pc.and_(usable, pc.greater(sign, 0))
    moved = pc.and_(usable, pc.not_equal(sign, 0))
    left_out = pc.and_(pc.greater(sign, 0), pc.is_valid(reason))
    for entry in pc.value_counts(pc.filter(reason, left_out)).to_pylist():
        if f"rule:{entry['values']}" in stats:
            stats[f"rule:{entry['values']}"] += entry["counts"]
    stats.update(
        window=pc.sum(table.column("_window")).as_py(),  # null without a value, as Spark's sum
        feed=pc.sum(table.column("_feed")).as_py(),
        processed=pc.max(pc.filter(stamp, new)).as_py(),
        min_usable=pc.min(pc.filter(stamp, moved)).as_py(),
    )
    return stats


# A change set of at most this many rows (window and feed) is read, prepared and netted by the
# driver (`driver_changes`), from window files of at most DRIVER_SCAN_ROWS rows by the Delta log.
# Its plain Python costs about 8 us a row on the benchmark machine (80 us with Arrow's datetimes,
# before `gap_rows.plain_rows`: at 200,000 rows then, a first small day on the 30-day home, whose
# window held far more rows than the day, took 8 s longer in its session models than Spark's
# change set; docs/benchmarks.md, "Session 37").
DRIVER_CHANGE_ROWS = 100_000
CHANGE_ROWS = DRIVER_CHANGE_ROWS  # the default (tests move DRIVER_CHANGE_ROWS)

# The change set's columns as the Spark steps give them (`read_changes` after `with_reason`).
CHANGE_SCHEMA = pa.schema(
    [
        ("event_id", pa.string()),
        ("event_name", pa.string()),
        ("page_url", pa.string()),
        ("derived_tstamp", pa.timestamp("us", tz="UTC")),
        ("dvce_created_tstamp", pa.timestamp("us", tz="UTC")),
        (core.SESSION_KEY, pa.string()),
        (core.USER_KEY, pa.string()),
        (core.SESSION_TS, pa.timestamp("us", tz="UTC")),
        (core.SENT_LATE, pa.bool_()),
        ("_sign", pa.int32()),
        ("_window", pa.int32()),
        ("_feed", pa.int64()),
        (core.REASON, pa.string()),
    ]
)
CHANGE_DDL = (
    "event_id string, event_name string, page_url string, derived_tstamp timestamp, "
    f"dvce_created_tstamp timestamp, {core.SESSION_KEY} string, {core.USER_KEY} string, "
    f"{core.SESSION_TS} timestamp, {core.SENT_LATE} boolean, "
    f"_sign int, _window int, _feed bigint, {core.REASON} string"
)
_TIMES = ("derived_tstamp", "dvce_created_tstamp", core.SESSION_TS)


def driver_columns(table: Any, settings: Settings) -> list[str] | None:
    """The filtered_events columns the session branch reads (`core.source_columns`), when the
    driver's steps read them as Spark does: text columns of strings, timestamp columns of
    timestamps; None otherwise (Spark reads the table then)."""
    schema = pa.schema(table.schema().to_arrow())
    columns = core.source_columns(settings, schema.names)
    text = ["event_id", "event_name", "page_url", *settings.session_identifier]
    text += list(settings.user_identifier)
    times = ["derived_tstamp", "dvce_created_tstamp", "dvce_sent_tstamp", "load_tstamp"]
    times.append(settings.session_timestamp)
    if not all(pa.types.is_string(schema.field(c).type) for c in text):
        return None
    if not all(pa.types.is_timestamp(schema.field(c).type) for c in times):
        return None
    return columns


def driver_changes(
    spark: SparkSession,
    path: str,
    settings: Settings,
    limits: RunLimits,
    version: int,
    consumed_version: int | None,
) -> Changes | None:
    """`read_changes` by the driver: the window's rows of filtered_events at `version` (files
    chosen by the Delta log's statistics on the session timestamp and `load_tstamp`, rows
    filtered by pyarrow) and the net change feed read by delta-rs, prepared and netted in plain
    Python (`core.gap_rows.prepare`, `reason`). None when delta-rs cannot read them, the window's
    files hold more than DRIVER_SCAN_ROWS rows, or the change set more than DRIVER_CHANGE_ROWS
    (Spark reads it then)."""
    import pyarrow.compute as pc

    from sessionize_assets.core import gap_rows

    if DRIVER_CHANGE_ROWS < 0:
        return None
    table = delta_table(path, version)
    if table is None:
        return None
    columns = driver_columns(table, settings)
    if columns is None:
        return None
    lower, upper = limits.lower_limit, limits.upper_limit
    # Files wholly inside the window that hold more rows than the limit: Spark's run, unread.
    if rows_surely_within(table, settings.session_timestamp, lower, upper) > DRIVER_CHANGE_ROWS:
        return None
    ts, loaded = pc.field(settings.session_timestamp), pc.field("load_tstamp")
    low, high = (
        pa.scalar(lower, CHANGE_SCHEMA.field("derived_tstamp").type),
        pa.scalar(upper, CHANGE_SCHEMA.field("derived_tstamp").type),
    )
    inside = ((ts >= low) & (ts <= high)) | (ts.is_null() & (loaded >= low) & (loaded <= high))
    pruning = [
        *timestamp_spans_pruning(settings.session_timestamp, [(lower, upper)]),
        *timestamp_spans_pruning("load_tstamp", [(lower, upper)]),
    ]
    window = scan_pruned(
        table,
        pruning,
        columns,
        inside,
        scan_limit=DRIVER_SCAN_ROWS,
        keep_limit=DRIVER_CHANGE_ROWS,
    )
    if window is None:
        return None
    rows = [
        {**r, "_sign": 1, "_window": 1, "_feed": 0}
        for r in gap_rows.prepare(gap_rows.plain_rows(window), settings)
    ]
    if consumed_version is not None and version > consumed_version:
        feed = local_changes_arrow(
            path, consumed_version + 1, version, columns, limit=DRIVER_CHANGE_ROWS - len(rows)
        )
        if feed is None:
            return None
        signed = [
            {**r, "_sign": 1 if r["_change_type"] in ("insert", "update_postimage") else -1}
            for r in gap_rows.plain_rows(feed)
        ]
        net: dict[tuple, list[int]] = {}
        for r in gap_rows.prepare(signed, settings):
            key = tuple(r[c] for c in core.PREPARED_COLUMNS)
            total = net.setdefault(key, [0, 0])
            total[0] += r["_sign"]
            total[1] += 1
        limit = gap_rows.micros(upper)
        for key, (total, count) in net.items():
            row = dict(zip(core.PREPARED_COLUMNS, key, strict=True))
            sign = (total > 0) - (total < 0)
            stamp = row[core.SESSION_TS]
            if sign <= 0 or (stamp is not None and stamp <= limit):
                rows.append({**row, "_sign": sign, "_window": 0, "_feed": count})
    for r in rows:
        r[core.REASON] = gap_rows.reason(r, settings)
    data = _change_table(rows)
    frame = arrow_frame(spark, data, schema=CHANGE_DDL)
    stats = change_stats(data)
    return Changes(
        rows=frame,
        usable=frame.filter(F.col(core.REASON).isNull() & (F.col("_sign") != 0)).select(
            *core.PREPARED_COLUMNS, "_sign"
        ),
        window_rows=int(stats["window"] or 0),
        feed_rows=int(stats["feed"] or 0),
        processed_max=from_micros(stats["processed"]),
        min_usable=from_micros(stats["min_usable"]),
        excluded=reasons_from(stats, prefix="new rows left out: "),
        rows_table=data,
    )


def _change_table(rows: list[dict[str, Any]]) -> pa.Table:
    """Prepared change rows (timestamps in microseconds) as Arrow in CHANGE_SCHEMA."""
    arrays = []
    for field in CHANGE_SCHEMA:
        values = [r[field.name] for r in rows]
        if field.name in _TIMES:
            arrays.append(pa.array(values, pa.int64()).cast(field.type))
        else:
            arrays.append(pa.array(values, field.type))
    return pa.Table.from_arrays(arrays, schema=CHANGE_SCHEMA)
