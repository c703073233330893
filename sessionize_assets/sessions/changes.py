"""What a run of the session models takes on: the rows of `filtered_events` in the run window plus
the net change data feed after a model's consumed version (`read_changes`), with the counts of
new rows left out. A feed that no longer covers the consumed version raises `FeedGone` (the
caller rebuilds the model in full).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from sessionize_assets.core import sessionize as core
from sessionize_assets.core.clock import from_micros
from sessionize_assets.core.run_limits import RunLimits
from sessionize_assets.resources.delta import local_changes
from sessionize_assets.sessions.frames import (
    computed_once,
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
    expired)."""
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
        rows = computed_once(spark, core.with_reason(rows, settings), fetch_first=small_feed)
        new = (F.col("_sign") > 0) & F.col(core.REASON).isNull()
        stats = rows.agg(
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
    )
