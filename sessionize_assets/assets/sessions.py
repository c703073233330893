"""The session-based branch (SPEC section 6): `sessions`, `users` and their bookkeeping tables.

One Dagster multi-asset, `session_models`, materializes every enabled session model in one run,
as Snowplow's package does: the run limits (core.run_limits) are computed once from the
`incremental_manifest`, every model that is not already past the window processes it, and each
model's `last_success` / consumed `filtered_events` version move only when it succeeded.

Assets (all unpartitioned Delta tables, all written by this one op):

- `sessions`, `users` and, when listed in `session_models`, `user_session_stats`: the models;
- `sessions_lifecycle_manifest`: one row per session (id, user, start, end on the mode's
  timestamp, quarantined) -- the index that finds the sessions new events touch;
- `quarantined_sessions`: sessions capped at `max_session_days`;
- `superseded_sessions`: gap mode, ids that stopped existing (old id -> new id, reason);
- `incremental_manifest`: per model `last_success`, consumed version, processed-through limit.

What one run reads (minimal; see docs/sessions.md): the rows of `filtered_events` in the window
(session timestamp in [lower, upper]) plus the rows changed since the model's consumed version
(Delta change data feed: inserts up to the upper limit, every delete/update pre-image), the
lifecycle rows of the sessions those touch, and the events of those sessions only. It replaces
only those sessions (one MERGE) and renumbers the touched users' later sessions.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

from dagster import (
    AssetExecutionContext,
    AssetsDefinition,
    AssetSpec,
    MaterializeResult,
    MetadataValue,
    multi_asset,
)
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from sessionize_assets.core import sessionize as core
from sessionize_assets.core.run_limits import (
    NO_DATA_WARNING,
    RunLimits,
    as_utc,
    next_last_success,
    run_limits,
    skips_window,
    start_of_day,
)
from sessionize_assets.resources import shared_reads
from sessionize_assets.resources.delta import delta_version, read_small_table
from sessionize_assets.resources.lake import LakeResource
from sessionize_assets.resources.spark import SparkDeltaResource
from sessionize_assets.resources.tables import (
    FILTERED_EVENTS,
    INCREMENTAL_MANIFEST,
    QUARANTINED_SESSIONS,
    SESSIONS,
    SESSIONS_LIFECYCLE_MANIFEST,
    SUPERSEDED_SESSIONS,
    USERS,
)
from sessionize_assets.settings import Settings

GROUP = "session_based"
USER_SESSION_STATS = "user_session_stats"
MODEL_ORDER: tuple[str, ...] = (SESSIONS, USERS, USER_SESSION_STATS)
ASSET_NAME = "session_models"

SESSIONS_SCHEMA = (
    "session_identifier string, user_identifier string, start_tstamp timestamp, end_tstamp timestamp, "
    "total_events long, page_views long, duration_s double, first_page_url string, "
    "last_page_url string, session_number long, is_quarantined boolean"
)
LIFECYCLE_SCHEMA = (
    "session_identifier string, user_identifier string, start_tstamp timestamp, "
    "end_tstamp timestamp, is_quarantined boolean"
)
QUARANTINED_SCHEMA = (
    "session_identifier string, user_identifier string, start_tstamp timestamp, "
    "capped_at timestamp, quarantined_at timestamp"
)
SUPERSEDED_SCHEMA = (
    "superseded_session_identifier string, session_identifier string, user_identifier string, "
    "reason string, superseded_at timestamp"
)
USERS_SCHEMA = (
    "user_identifier string, first_session_start_tstamp timestamp, last_session_end_tstamp timestamp, "
    "sessions long, total_events long, page_views long"
)
USER_SESSION_STATS_SCHEMA = (
    "user_identifier string, sessions long, total_duration_s double, mean_duration_s double, "
    "median_duration_s double, min_duration_s double, max_duration_s double"
)
MANIFEST_SCHEMA = (
    "model string, last_success timestamp, consumed_version long, processed_through timestamp, "
    "updated_at timestamp"
)
USER_MODEL_SCHEMAS = {USERS: USERS_SCHEMA, USER_SESSION_STATS: USER_SESSION_STATS_SCHEMA}

# Errors reading the change data feed that mean "the feed no longer covers that version".
_FEED_GONE_MARKERS = (
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

TablePath = Callable[[str], str]
LockFactory = Callable[[AssetExecutionContext, str], AbstractContextManager]


def enabled_models(settings: Settings) -> tuple[str, ...]:
    """The session models this configuration runs, in dependency order (`sessions` always: the
    other models are built from it)."""
    models = [m for m in MODEL_ORDER if m in settings.session_models]
    if SESSIONS not in models:
        models.insert(0, SESSIONS)
    return tuple(models)


# --- Manifest -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelState:
    """One incremental_manifest row."""

    model: str
    last_success: dt.datetime | None
    consumed_version: int | None
    processed_through: dt.datetime | None
    updated_at: dt.datetime | None = None


def read_manifest(table_path: TablePath) -> dict[str, ModelState]:
    """The incremental manifest via delta-rs (no Spark): model -> state."""
    rows = read_small_table(table_path(INCREMENTAL_MANIFEST))

    def ts(value: Any) -> dt.datetime | None:
        return as_utc(value) if value is not None else None

    return {
        r["model"]: ModelState(
            model=r["model"],
            last_success=ts(r.get("last_success")),
            consumed_version=int(r["consumed_version"])
            if r.get("consumed_version") is not None
            else None,
            processed_through=ts(r.get("processed_through")),
            updated_at=ts(r.get("updated_at")),
        )
        for r in rows
    }


def current_limits(settings: Settings, table_path: TablePath, now: dt.datetime) -> RunLimits:
    """The state and window the next run would use."""
    manifest = read_manifest(table_path)
    return run_limits(
        {m: s.last_success for m, s in manifest.items()},
        enabled_models(settings),
        settings.start_date,
        settings.backfill_limit_days,
        settings.lookback_window_hours,
        now,
    )


def _write_manifest(path: str, states: dict[str, ModelState]) -> None:
    """Overwrite the (tiny) incremental manifest with delta-rs: no Spark job for a few rows."""
    import pyarrow as pa
    from deltalake import write_deltalake

    ordered = sorted(states.values(), key=lambda s: s.model)
    ts = pa.timestamp("us", tz="UTC")
    table = pa.table(
        {
            "model": pa.array([s.model for s in ordered], pa.string()),
            "last_success": pa.array([s.last_success for s in ordered], ts),
            "consumed_version": pa.array([s.consumed_version for s in ordered], pa.int64()),
            "processed_through": pa.array([s.processed_through for s in ordered], ts),
            "updated_at": pa.array([s.updated_at for s in ordered], ts),
        }
    )
    write_deltalake(path, table, mode="overwrite")


# --- Outcomes -----------------------------------------------------------------------------------


@dataclass
class ModelOutcome:
    """What one model did in one run (its materialization metadata)."""

    model: str
    ran: bool = False
    skipped_reason: str | None = None
    no_data: bool = False
    failed: str | None = None
    full_rebuild_reason: str | None = None
    rows_read: dict[str, int] = field(default_factory=dict)
    rows_written: dict[str, int] = field(default_factory=dict)
    touched: int = 0
    excluded: dict[str, int] = field(default_factory=dict)
    last_success_before: dt.datetime | None = None
    last_success_after: dt.datetime | None = None
    consumed_version_before: int | None = None
    consumed_version_after: int | None = None
    seconds: float = 0.0

    @property
    def total_rows_read(self) -> int:
        return sum(self.rows_read.values())

    @property
    def total_rows_written(self) -> int:
        return sum(self.rows_written.values())

    def metadata(self) -> dict[str, Any]:
        md: dict[str, Any] = {
            "ran": self.ran,
            "rows read": self.total_rows_read,
            "rows written": self.total_rows_written,
            ("sessions touched" if self.model == SESSIONS else "users touched"): self.touched,
            "last_success": _iso(self.last_success_after),
            "last_success before": _iso(self.last_success_before),
            "consumed filtered_events version": self.consumed_version_after,
            "seconds": round(self.seconds, 3),
        }
        if self.skipped_reason:
            md["skipped"] = self.skipped_reason
        if self.no_data:
            md["no data"] = True
        if self.failed:
            md["failed"] = self.failed
        if self.full_rebuild_reason:
            md["full rebuild"] = self.full_rebuild_reason
        for name, value in self.rows_read.items():
            md[f"rows read: {name}"] = value
        for name, value in self.rows_written.items():
            md[f"rows written: {name}"] = value
        for name, value in self.excluded.items():
            md[name if name.startswith("new rows left out: ") else f"events left out: {name}"] = (
                value
            )
        return md


@dataclass
class SessionRunOutcome:
    """What one run of the session models did."""

    limits: RunLimits
    snapshot_version: int | None
    models: dict[str, ModelOutcome]
    warnings: list[str] = field(default_factory=list)
    manifest: dict[str, ModelState] = field(default_factory=dict)

    @property
    def failed(self) -> list[str]:
        return [m for m, o in self.models.items() if o.failed]

    @property
    def moved(self) -> bool:
        """True when some model's last_success or consumed version moved."""
        return any(
            o.last_success_after != o.last_success_before
            or o.consumed_version_after != o.consumed_version_before
            for o in self.models.values()
        )

    def run_metadata(self) -> dict[str, Any]:
        md = {k: v for k, v in self.limits.as_metadata().items()}
        md["filtered_events version"] = self.snapshot_version
        if self.warnings:
            md["warnings"] = "\n".join(self.warnings)
        return md


def _iso(value: dt.datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


# --- Spark helpers ------------------------------------------------------------------------------


def _from_micros(value: int | None) -> dt.datetime | None:
    if value is None:
        return None
    return dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(microseconds=int(value))


def _read(spark: SparkSession, path: str, version: int | None = None) -> DataFrame:
    reader = spark.read.format("delta")
    if version is not None:
        reader = reader.option("versionAsOf", version)
    return reader.load(path)


# Intermediate results up to this many rows become driver-local DataFrames (collected through
# Arrow): later plans stay small and never recompute their lineage. Bigger ones are persisted.
LOCAL_ROWS = 20_000


def _localize(spark: SparkSession, df: DataFrame, limit: int = LOCAL_ROWS) -> DataFrame:
    """`df` computed once: a local DataFrame when small, else persisted (unpersist when done)."""
    table = df.limit(limit + 1).toArrow()
    if table.num_rows <= limit:
        return spark.createDataFrame(table, schema=df.schema)
    return df.persist()


def _ensure_table(spark: SparkSession, path: str, schema: str) -> None:
    if delta_version(path) is None:
        spark.createDataFrame([], schema).write.format("delta").mode("ignore").save(path)


def _table_or_empty(spark: SparkSession, path: str, schema: str) -> DataFrame:
    """The table at its current version, pinned: Spark re-caches DataFrames of a path after a
    write to it, and a pinned version keeps "the rows before this run's write" what they were."""
    version = delta_version(path)
    if version is None:
        return spark.createDataFrame([], schema)
    return _read(spark, path, version)


def _nulls_for(schema: str, key: str) -> list[Any]:
    return [F.lit(None).cast(t).alias(c) for c, t in _schema_pairs(schema) if c != key]


def _schema_pairs(schema: str) -> list[tuple[str, str]]:
    pairs = []
    for part in schema.split(","):
        name, kind = part.strip().split(" ", 1)
        pairs.append((name, kind.strip()))
    return pairs


def _merge(spark: SparkSession, path: str, source: DataFrame, key: str, schema: str) -> None:
    """Upsert `source` rows by `key`; rows with `_delete` set remove the target row. The first
    write of a table is a plain write."""
    from delta.tables import DeltaTable

    columns = [c for c, _ in _schema_pairs(schema)]
    if delta_version(path) is None:
        source.filter(~F.col("_delete")).select(*columns).write.format("delta").mode("append").save(
            path
        )
        return
    values = {c: f"s.`{c}`" for c in columns}
    (
        DeltaTable.forPath(spark, path)
        .alias("t")
        .merge(source.alias("s"), f"t.`{key}` = s.`{key}`")
        .whenMatchedDelete(condition="s._delete")
        .whenMatchedUpdate(set=values)
        .whenNotMatchedInsert(condition="NOT s._delete", values=values)
        .execute()
    )


def _overwrite(df: DataFrame, path: str) -> None:
    df.write.format("delta").mode("overwrite").save(path)


def _window_filter(settings: Settings, lower: dt.datetime, upper: dt.datetime) -> Any:
    """Session timestamp in [lower, upper], written so Delta can skip files on the raw column."""
    ts = F.col(settings.session_timestamp)
    return ts.between(F.lit(lower), F.lit(upper)) | (
        ts.isNull() & F.col("load_tstamp").between(F.lit(lower), F.lit(upper))
    )


def _reason_counts(condition: Any = None) -> list[Any]:
    """Aggregate columns counting rows per exclusion rule (named `rule:<rule>`)."""
    base = F.col(core.REASON)
    cond = condition if condition is not None else F.lit(True)
    return [
        F.sum(F.when(cond & (base == F.lit(rule)), 1).otherwise(0)).alias(f"rule:{rule}")
        for rule in core.EXCLUSION_RULES
    ]


def _reasons_from(row: Any, prefix: str = "") -> dict[str, int]:
    out = {}
    for rule in core.EXCLUSION_RULES:
        n = int(row[f"rule:{rule}"] or 0)
        if n:
            out[f"{prefix}{rule}"] = n
    return out


def _add_counts(target: dict[str, int], more: dict[str, int]) -> None:
    for k, v in more.items():
        target[k] = target.get(k, 0) + v


# Runs that take on at most this many rows use a small-query configuration: adaptive execution
# submits every shuffle stage as its own job, which costs more than it saves on small inputs.
SMALL_RUN_ROWS = 2_000_000


@contextmanager
def small_query_conf(spark: SparkSession, enabled: bool) -> Iterator[None]:
    """Turn adaptive execution off and use one shuffle partition per core while `enabled`,
    restoring the session's settings afterwards."""
    if not enabled:
        yield
        return
    wanted = {
        "spark.sql.adaptive.enabled": "false",
        "spark.sql.shuffle.partitions": str(max(1, spark.sparkContext.defaultParallelism)),
    }
    before = {k: spark.conf.get(k, None) for k in wanted}
    for k, v in wanted.items():
        spark.conf.set(k, v)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                spark.conf.unset(k)
            else:
                spark.conf.set(k, v)


# --- Changes: what a run takes on ---------------------------------------------------------------


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
        snapshot.filter(_window_filter(settings, lower, upper)).select(*columns), settings
    )
    rows = window.filter(F.col(core.SESSION_TS).between(F.lit(lower), F.lit(upper))).select(
        *core.PREPARED_COLUMNS,
        F.lit(1).alias("_sign"),
        F.lit(1).alias("_window"),
        F.lit(0).cast("long").alias("_feed"),
    )
    try:
        if consumed_version is not None and version > consumed_version:
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
        rows = core.with_reason(rows, settings).persist()
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
            *_reason_counts(F.col("_sign") > 0),
        ).collect()[0]
    except Exception as exc:  # noqa: BLE001 - the feed is read lazily: classify the failure
        rows.unpersist()
        if any(marker in str(exc) for marker in _FEED_GONE_MARKERS):
            raise FeedGone(str(exc).strip().splitlines()[0][:300]) from exc
        raise
    return Changes(
        rows=rows,
        usable=rows.filter(F.col(core.REASON).isNull() & (F.col("_sign") != 0)).select(
            *core.PREPARED_COLUMNS, "_sign"
        ),
        window_rows=int(stats["window"] or 0),
        feed_rows=int(stats["feed"] or 0),
        processed_max=_from_micros(stats["processed"]),
        min_usable=_from_micros(stats["min_usable"]),
        excluded=_reasons_from(stats, prefix="new rows left out: "),
    )


# --- The sessions model -------------------------------------------------------------------------


@dataclass
class SessionsWrite:
    """What replacing sessions did."""

    users: (
        DataFrame  # distinct user_identifier whose sessions changed (old or new owner), persisted
    )
    written: int  # sessions inserted or updated (new, changed or renumbered)
    fresh: int  # recomputed sessions
    content_changed: int  # recomputed sessions that are new or differ from the table's row
    deleted: int
    rows_read: int  # later sessions renumbered + one per user for the count of earlier ones


def replace_sessions(
    spark: SparkSession, path: str, new_sessions: DataFrame, replaced_ids: DataFrame
) -> SessionsWrite:
    """Replace the sessions `replaced_ids` by `new_sessions` (not numbered) in one MERGE, and
    renumber the touched users' later sessions.

    Only the touched users' sessions starting at or after the earliest replaced or new session
    are read and renumbered; earlier ones keep their numbers (their count is the largest of them).
    """
    target = _table_or_empty(spark, path, SESSIONS_SCHEMA)
    replaced = replaced_ids.select("session_identifier").distinct()
    new = new_sessions.select(*[c for c in core.SESSION_COLUMNS if c != "session_number"])
    old = target.join(replaced, "session_identifier", "left_semi").select(
        "user_identifier", "start_tstamp"
    )
    users = (
        old.unionByName(new.select("user_identifier", "start_tstamp"))
        .filter(F.col("user_identifier").isNotNull())
        .groupBy("user_identifier")
        .agg(F.min("start_tstamp").alias("_from"))
    )
    users = _localize(spark, users)
    user_rows = target.join(users, "user_identifier", "inner").join(
        replaced, "session_identifier", "left_anti"
    )
    earlier = (
        user_rows.filter(F.col("start_tstamp") < F.col("_from"))
        .groupBy("user_identifier")
        .agg(F.max("session_number").alias("_before"))
    )
    kept = (
        user_rows.filter(F.col("start_tstamp") >= F.col("_from"))
        .select(*core.SESSION_COLUMNS)
        .withColumn("_old_number", F.col("session_number"))
        .withColumn("_fresh", F.lit(False))
        .withColumn("_same", F.lit(True))
    )
    content = [c for c in core.SESSION_COLUMNS if c not in ("session_identifier", "session_number")]
    existing = target.join(
        new.select("session_identifier"), "session_identifier", "left_semi"
    ).select(
        "session_identifier",
        F.struct(*content).alias("_old_content"),
        F.col("session_number").alias("_old_number"),
    )
    fresh = (
        new.withColumn("session_number", F.lit(None).cast("long"))
        .join(existing, "session_identifier", "left")
        .withColumn("_fresh", F.lit(True))
        .withColumn(
            "_same", F.coalesce(F.col("_old_content").eqNullSafe(F.struct(*content)), F.lit(False))
        )
        .select(*core.SESSION_COLUMNS, "_old_number", "_fresh", "_same")
    )
    numbered = core.number_sessions(kept.unionByName(fresh)).join(
        earlier, "user_identifier", "left"
    )
    numbered = numbered.withColumn(
        "session_number",
        F.when(
            F.col("user_identifier").isNotNull(),
            F.col("session_number") + F.coalesce(F.col("_before"), F.lit(0)),
        ).cast("long"),
    )
    changed = ~F.col("_same") | ~F.col("_old_number").eqNullSafe(F.col("session_number"))
    deletes = replaced.join(new.select("session_identifier"), "session_identifier", "left_anti")
    source = numbered.select(
        *core.SESSION_COLUMNS,
        F.lit(False).alias("_delete"),
        F.col("_fresh"),
        F.col("_same"),
        changed.alias("_changed"),
        F.col("_before").isNotNull().alias("_has_before"),
    ).unionByName(
        deletes.select(
            "session_identifier",
            *_nulls_for(SESSIONS_SCHEMA, "session_identifier"),
            F.lit(True).alias("_delete"),
            F.lit(False).alias("_fresh"),
            F.lit(False).alias("_same"),
            F.lit(True).alias("_changed"),
            F.lit(False).alias("_has_before"),
        )
    )
    source = _localize(spark, source)
    counts = source.agg(
        F.sum(F.when(F.col("_delete"), 1).otherwise(0)).alias("deleted"),
        F.sum(F.when(~F.col("_delete") & F.col("_changed"), 1).otherwise(0)).alias("written"),
        F.sum(F.when(F.col("_fresh"), 1).otherwise(0)).alias("fresh"),
        F.sum(F.when(F.col("_fresh") & ~F.col("_same"), 1).otherwise(0)).alias("content_changed"),
        F.sum(F.when(~F.col("_delete") & ~F.col("_fresh"), 1).otherwise(0)).alias("later"),
        F.countDistinct(F.when(F.col("_has_before"), F.col("user_identifier"))).alias(
            "users_before"
        ),
    ).collect()[0]
    written, deleted = int(counts["written"] or 0), int(counts["deleted"] or 0)
    if written or deleted:
        _merge(
            spark,
            path,
            source.filter(F.col("_changed")).select(*core.SESSION_COLUMNS, "_delete"),
            "session_identifier",
            SESSIONS_SCHEMA,
        )
    elif delta_version(path) is None:
        _ensure_table(spark, path, SESSIONS_SCHEMA)
    source.unpersist()
    return SessionsWrite(
        users=users,
        written=written,
        fresh=int(counts["fresh"] or 0),
        content_changed=int(counts["content_changed"] or 0),
        deleted=deleted,
        rows_read=int(counts["later"] or 0) + int(counts["users_before"] or 0),
    )


def process_sessions(
    spark: SparkSession,
    table_path: TablePath,
    settings: Settings,
    limits: RunLimits,
    snapshot: DataFrame,
    changes: Changes,
    now: dt.datetime,
    outcome: ModelOutcome,
) -> DataFrame:
    """Recompute the sessions the changes touch and replace them. Returns the touched users
    (persisted; the caller unpersists)."""
    columns = core.source_columns(settings, snapshot.columns)
    upper = limits.upper_limit
    changed = changes.usable
    lifecycle = _table_or_empty(spark, table_path(SESSIONS_LIFECYCLE_MANIFEST), LIFECYCLE_SCHEMA)
    if settings.session_mode == "id":
        earliest = min(limits.lower_limit, changes.min_usable or limits.lower_limit)
        bound = earliest - dt.timedelta(days=settings.session_lookback_days)
        keys = changed.select(F.col(core.SESSION_KEY).alias("session_identifier")).distinct()
        old_lifecycle = _localize(
            spark,
            lifecycle.filter(F.col("start_tstamp") >= F.lit(bound)).join(
                keys, "session_identifier", "left_semi"
            ),
        )
        ranges = _localize(spark, core.id_read_ranges(changed, old_lifecycle, settings))
        stats = ranges.agg(
            F.min(core._micros("_read_lo")).alias("lo"),
            F.max(core._micros("_read_hi")).alias("hi"),
            F.sum(F.col("_is_known").cast("int")).alias("known"),
        ).collect()[0]
        lo, hi = _from_micros(stats["lo"]), _from_micros(stats["hi"])
        outcome.rows_read["lifecycle rows"] = int(stats["known"] or 0)
        read = None
        if lo is not None:
            events = core.prepare_events(
                snapshot.filter(_window_filter(settings, lo, min(hi, upper))).select(*columns),
                settings,
            )
            read = (
                events.join(ranges, core.SESSION_KEY, "inner")
                .filter(F.col(core.SESSION_TS).between(F.col("_read_lo"), F.col("_read_hi")))
                .filter(F.col(core.SESSION_TS) <= F.lit(upper))
                .select(*core.PREPARED_COLUMNS)
            )
        replaced_ids = ranges.select(F.col(core.SESSION_KEY).alias("session_identifier"))
        known = old_lifecycle
    else:
        ranges = _localize(spark, core.gap_change_ranges(changed, settings))
        user_ranges = ranges.withColumnRenamed(core.USER_KEY, "user_identifier")
        old_lifecycle = _localize(
            spark, core.overlapping(lifecycle, user_ranges, on=["user_identifier"])
        )
        stats = ranges.agg(
            F.min(core._micros("_read_lo")).alias("lo"), F.max(core._micros("_read_hi")).alias("hi")
        ).collect()[0]
        lo, hi = _from_micros(stats["lo"]), _from_micros(stats["hi"])
        outcome.rows_read["lifecycle rows"] = old_lifecycle.count()
        read = None
        if lo is not None:
            events = core.prepare_events(
                snapshot.filter(F.col("derived_tstamp").between(F.lit(lo), F.lit(hi))).select(
                    *columns
                ),
                settings,
            )
            read = (
                events.join(ranges, core.USER_KEY, "inner")
                .filter(F.col("derived_tstamp").between(F.col("_read_lo"), F.col("_read_hi")))
                .filter(F.col(core.SESSION_TS) <= F.lit(upper))
                .select(*core.PREPARED_COLUMNS, core.PART)
            )
        replaced_ids = old_lifecycle.select("session_identifier")
        known = None

    if read is None:  # nothing usable changed
        read = changed.select(*core.PREPARED_COLUMNS).limit(0)
        if settings.session_mode == "gap":
            read = read.withColumn(core.PART, F.lit(0).cast("long"))
    read = core.with_reason(read, settings).persist()
    read_stats = read.agg(F.count(F.lit(1)).alias("n"), *_reason_counts()).collect()[0]
    outcome.rows_read["events of touched sessions"] = int(read_stats["n"] or 0)
    _add_counts(outcome.excluded, _reasons_from(read_stats))
    result = core.sessionize(
        read.filter(F.col(core.REASON).isNull()).drop(core.REASON), settings, known
    )
    computed = result.sessions
    if settings.session_mode == "gap":
        computed = core.overlapping(computed, user_ranges, on=["user_identifier", core.PART])
    computed = _localize(spark, computed)
    excluded_stats = result.excluded.agg(*_reason_counts()).collect()[0]
    _add_counts(outcome.excluded, _reasons_from(excluded_stats))

    write = replace_sessions(spark, table_path(SESSIONS), computed, replaced_ids)
    outcome.rows_read["sessions renumbered or counted"] = write.rows_read
    outcome.rows_written["sessions written"] = write.written
    outcome.rows_written["sessions deleted"] = write.deleted
    outcome.rows_written["sessions renumbered only"] = write.written - write.content_changed
    outcome.touched = write.content_changed + write.deleted

    # Lifecycle manifest: id mode keeps every session it has seen (first-seen user, frozen
    # quarantine); gap mode mirrors the sessions (replaced ids that no longer exist go).
    lc_source = core.lifecycle_rows(computed).withColumn("_delete", F.lit(False))
    lc_rows = write.fresh
    if settings.session_mode == "gap":
        gone = replaced_ids.join(
            computed.select("session_identifier"), "session_identifier", "left_anti"
        )
        lc_source = lc_source.unionByName(
            gone.select(
                "session_identifier", *_nulls_for(LIFECYCLE_SCHEMA, "session_identifier")
            ).withColumn("_delete", F.lit(True))
        )
        lc_rows += write.deleted
    lc_path = table_path(SESSIONS_LIFECYCLE_MANIFEST)
    if lc_rows:
        _merge(spark, lc_path, lc_source, "session_identifier", LIFECYCLE_SCHEMA)
    else:
        _ensure_table(spark, lc_path, LIFECYCLE_SCHEMA)
    outcome.rows_written["lifecycle rows"] = lc_rows

    _write_side_tables(spark, table_path, settings, computed, old_lifecycle, now, outcome)
    computed.unpersist()
    read.unpersist()
    ranges.unpersist()
    old_lifecycle.unpersist()
    return write.users


def _write_side_tables(
    spark: SparkSession,
    table_path: TablePath,
    settings: Settings,
    computed: DataFrame,
    old_lifecycle: DataFrame,
    now: dt.datetime,
    outcome: ModelOutcome,
) -> None:
    """`quarantined_sessions` (id mode: only ever grows; gap mode: equal to the quarantined
    pieces) and, in gap mode, `superseded_sessions` -- with one count for both."""
    cap = core._plus_micros(core.LC_START, settings.max_session_days * core.MICROS_PER_DAY)
    quarantined_now = computed.filter(F.col("is_quarantined"))
    was = old_lifecycle.filter(F.col("is_quarantined")).select("session_identifier")
    added = quarantined_now.join(was, "session_identifier", "left_anti").select(
        "session_identifier",
        "user_identifier",
        F.col(core.LC_START).alias("start_tstamp"),
        cap.alias("capped_at"),
        F.lit(now).alias("quarantined_at"),
        F.lit(False).alias("_delete"),
    )
    parts = [added.withColumn("_table", F.lit(QUARANTINED_SESSIONS))]
    if settings.session_mode == "gap":
        removed = was.join(
            quarantined_now.select("session_identifier"), "session_identifier", "left_anti"
        )
        parts.append(
            removed.select(
                "session_identifier",
                *_nulls_for(QUARANTINED_SCHEMA, "session_identifier"),
                F.lit(True).alias("_delete"),
            ).withColumn("_table", F.lit(QUARANTINED_SESSIONS))
        )
    side = parts[0]
    for extra in parts[1:]:
        side = side.unionByName(extra)
    side = side.withColumn("_superseded", F.lit(None).cast("string")).withColumn(
        "_reason", F.lit(None).cast("string")
    )
    if settings.session_mode == "gap":
        sup = core.superseded(
            old_lifecycle.select(
                "session_identifier", "user_identifier", "start_tstamp", "end_tstamp"
            ),
            computed.select(
                "session_identifier",
                "user_identifier",
                "start_tstamp",
                "end_tstamp",
                "is_quarantined",
            ),
        )
        side = side.unionByName(
            sup.select(
                F.col("session_identifier"),
                "user_identifier",
                F.lit(None).cast("timestamp").alias("start_tstamp"),
                F.lit(None).cast("timestamp").alias("capped_at"),
                F.lit(now).alias("quarantined_at"),
                F.lit(False).alias("_delete"),
                F.lit(SUPERSEDED_SESSIONS).alias("_table"),
                F.col("superseded_session_identifier").alias("_superseded"),
                F.col("reason").alias("_reason"),
            )
        )
    side = _localize(spark, side)
    counts = {
        (r["_table"], r["_delete"]): int(r["n"])
        for r in side.groupBy("_table", "_delete").agg(F.count(F.lit(1)).alias("n")).collect()
    }
    added_n = counts.get((QUARANTINED_SESSIONS, False), 0)
    removed_n = counts.get((QUARANTINED_SESSIONS, True), 0)
    q_path = table_path(QUARANTINED_SESSIONS)
    quarantine = side.filter(F.col("_table") == QUARANTINED_SESSIONS)
    if removed_n:
        _merge(
            spark,
            q_path,
            quarantine.select(*[c for c, _ in _schema_pairs(QUARANTINED_SCHEMA)], "_delete"),
            "session_identifier",
            QUARANTINED_SCHEMA,
        )
    elif added_n:
        quarantine.select(*[c for c, _ in _schema_pairs(QUARANTINED_SCHEMA)]).write.format(
            "delta"
        ).mode("append").save(q_path)
    else:
        _ensure_table(spark, q_path, QUARANTINED_SCHEMA)
    outcome.rows_written["quarantined sessions added"] = added_n
    outcome.rows_written["quarantined sessions removed"] = removed_n
    sup_n = counts.get((SUPERSEDED_SESSIONS, False), 0)
    sup_path = table_path(SUPERSEDED_SESSIONS)
    if sup_n:
        side.filter(F.col("_table") == SUPERSEDED_SESSIONS).select(
            F.col("_superseded").alias("superseded_session_identifier"),
            "session_identifier",
            "user_identifier",
            F.col("_reason").alias("reason"),
            F.col("quarantined_at").alias("superseded_at"),
        ).write.format("delta").mode("append").save(sup_path)
    else:
        _ensure_table(spark, sup_path, SUPERSEDED_SCHEMA)
    outcome.rows_written["superseded ids"] = sup_n
    side.unpersist()


# --- User-level models (users, user_session_stats) ------------------------------------------------


def _user_model_rows(model: str, sessions: DataFrame) -> DataFrame:
    if model == USERS:
        return core.users_from_sessions(sessions)
    return core.user_session_stats_from_sessions(sessions)


def affected_users(settings: Settings, changes: Changes, lifecycle: DataFrame) -> DataFrame:
    """Users whose sessions the changes can touch: in id mode the (first-seen) users of the
    changed sessions, in gap mode the changed events' users."""
    if settings.session_mode == "id":
        keys = changes.usable.select(F.col(core.SESSION_KEY).alias("session_identifier")).distinct()
        users = lifecycle.join(keys, "session_identifier", "left_semi").select("user_identifier")
    else:
        users = changes.usable.select(F.col(core.USER_KEY).alias("user_identifier"))
    return users.filter(F.col("user_identifier").isNotNull()).distinct()


def process_user_model(
    spark: SparkSession, table_path: TablePath, model: str, users: DataFrame, outcome: ModelOutcome
) -> None:
    """Recompute the model's rows of `users` from their sessions; users left without sessions go."""
    users = _localize(spark, users)
    sessions = _table_or_empty(spark, table_path(SESSIONS), SESSIONS_SCHEMA)
    user_sessions = sessions.join(users, "user_identifier", "left_semi")
    rows = _user_model_rows(model, user_sessions)
    schema = USER_MODEL_SCHEMAS[model]
    gone = users.join(rows.select("user_identifier"), "user_identifier", "left_anti")
    source = rows.withColumn("_delete", F.lit(False)).unionByName(
        gone.select("user_identifier", *_nulls_for(schema, "user_identifier")).withColumn(
            "_delete", F.lit(True)
        )
    )
    source = _localize(spark, source)
    counts = source.agg(
        F.sum(F.when(F.col("_delete"), 1).otherwise(0)).alias("deleted"),
        F.count(F.lit(1)).alias("n"),
        F.sum(F.when(~F.col("_delete"), F.col("sessions")).otherwise(0)).alias("sessions"),
    ).collect()[0]
    n, deleted = int(counts["n"] or 0), int(counts["deleted"] or 0)
    outcome.rows_read["sessions of touched users"] = int(counts["sessions"] or 0)
    if n:
        _merge(spark, table_path(model), source, "user_identifier", schema)
    else:
        _ensure_table(spark, table_path(model), schema)
    outcome.touched = n
    outcome.rows_written[f"{model} rows written"] = n - deleted
    outcome.rows_written[f"{model} rows deleted"] = deleted
    source.unpersist()


# --- Full rebuilds ------------------------------------------------------------------------------


def rebuild_sessions(
    spark: SparkSession,
    table_path: TablePath,
    settings: Settings,
    snapshot: DataFrame,
    upper: dt.datetime,
    now: dt.datetime,
    outcome: ModelOutcome,
) -> None:
    """Recompute every session from filtered_events up to the upper limit (id mode: the lifecycle
    manifest as given) and overwrite sessions, the lifecycle manifest and the quarantine."""
    lc_path = table_path(SESSIONS_LIFECYCLE_MANIFEST)
    lifecycle = (
        _table_or_empty(spark, lc_path, LIFECYCLE_SCHEMA).persist()
        if settings.session_mode == "id"
        else None
    )
    result = core.compute_sessions(snapshot, settings, lifecycle, upper)
    computed = result.sessions.persist()
    stats = result.excluded.agg(*_reason_counts()).collect()[0]
    _add_counts(outcome.excluded, _reasons_from(stats))
    outcome.rows_read["events (full rebuild)"] = snapshot.count()
    _overwrite(core.session_rows(computed), table_path(SESSIONS))
    new_lifecycle = core.lifecycle_rows(computed)
    if lifecycle is not None:
        kept = lifecycle.join(
            new_lifecycle.select("session_identifier"), "session_identifier", "left_anti"
        )
        new_lifecycle = new_lifecycle.unionByName(kept)
    new_lifecycle = new_lifecycle.persist()
    _overwrite(new_lifecycle, lc_path)
    cap = core._plus_micros("start_tstamp", settings.max_session_days * core.MICROS_PER_DAY)
    quarantined = new_lifecycle.filter(F.col("is_quarantined")).select(
        "session_identifier",
        "user_identifier",
        "start_tstamp",
        cap.alias("capped_at"),
        F.lit(now).alias("quarantined_at"),
    )
    _overwrite(quarantined, table_path(QUARANTINED_SESSIONS))
    _ensure_table(spark, table_path(SUPERSEDED_SESSIONS), SUPERSEDED_SCHEMA)
    n = computed.count()
    outcome.rows_written["sessions (full rebuild)"] = n
    outcome.touched = n
    new_lifecycle.unpersist()
    computed.unpersist()
    if lifecycle is not None:
        lifecycle.unpersist()


def rebuild_user_model(
    spark: SparkSession, table_path: TablePath, model: str, outcome: ModelOutcome
) -> None:
    sessions = _table_or_empty(spark, table_path(SESSIONS), SESSIONS_SCHEMA).persist()
    outcome.rows_read["sessions (full rebuild)"] = sessions.count()
    rows = _user_model_rows(model, sessions).persist()
    n = rows.count()
    _overwrite(rows, table_path(model))
    outcome.rows_written[f"{model} rows (full rebuild)"] = n
    outcome.touched = n
    rows.unpersist()
    sessions.unpersist()


# --- One run ------------------------------------------------------------------------------------


def run_session_models(
    spark: SparkSession,
    table_path: TablePath,
    settings: Settings,
    now: dt.datetime,
    log: logging.Logger | Any | None = None,
) -> SessionRunOutcome:
    """One run of every enabled session model over the window the manifest gives (the imperative
    shell the `session_models` asset calls)."""
    log = log or logging.getLogger(__name__)
    now = as_utc(now)
    models = enabled_models(settings)
    manifest = read_manifest(table_path)
    limits = run_limits(
        {m: s.last_success for m, s in manifest.items()},
        models,
        settings.start_date,
        settings.backfill_limit_days,
        settings.lookback_window_hours,
        now,
    )
    for line in limits.log_lines():
        log.info(line)
    fe_path = table_path(FILTERED_EVENTS)
    version = delta_version(fe_path)
    outcomes = {
        m: ModelOutcome(
            model=m,
            last_success_before=manifest[m].last_success if m in manifest else None,
            last_success_after=manifest[m].last_success if m in manifest else None,
            consumed_version_before=manifest[m].consumed_version if m in manifest else None,
            consumed_version_after=manifest[m].consumed_version if m in manifest else None,
        )
        for m in models
    }
    run = SessionRunOutcome(
        limits=limits, snapshot_version=version, models=outcomes, manifest=dict(manifest)
    )
    if version is None:
        warning = NO_DATA_WARNING.format(table=FILTERED_EVENTS)
        log.warning(warning)
        run.warnings.append(warning)
        for o in outcomes.values():
            o.no_data = True
        return run

    # The event days the time-based branch just read at this version come from memory when both
    # run in one command (resources/shared_reads.py); the rest from storage.
    snapshot = shared_reads.table_at(fe_path, version, lambda: _read(spark, fe_path, version))
    changes_by_version: dict[int | None, Changes] = {}
    sessions_users: DataFrame | None = None
    failed: str | None = None
    try:
        for model in models:
            outcome = outcomes[model]
            state = manifest.get(model)
            if skips_window(state.last_success if state else None, limits):
                outcome.skipped_reason = (
                    f"already past this window (last_success {state.last_success.isoformat()} "
                    f">= upper limit {limits.upper_limit.isoformat()})"
                )
                log.info(f"{model}: {outcome.skipped_reason}")
                continue
            if failed:
                outcome.skipped_reason = f"not run: {failed} failed"
                continue
            started = time.monotonic()
            consumed = state.consumed_version if state else None
            try:
                rebuild = _rebuild_reason(spark, table_path, model, state, version)
                if rebuild is None and model != SESSIONS and outcomes[SESSIONS].full_rebuild_reason:
                    rebuild = f"sessions were rebuilt in full; rebuilding {model} in full"
                changes = None
                if rebuild is None:
                    try:
                        if consumed not in changes_by_version:
                            changes_by_version[consumed] = read_changes(
                                spark, fe_path, snapshot, settings, limits, version, consumed
                            )
                        changes = changes_by_version[consumed]
                    except FeedGone as gone:
                        rebuild = (
                            f"the change data feed of filtered_events no longer covers version "
                            f"{consumed + 1 if consumed is not None else 0} ({gone}); rebuilding {model} in full"
                        )
                if rebuild is not None:
                    log.warning(f"{model}: {rebuild}")
                    run.warnings.append(f"{model}: {rebuild}")
                    outcome.full_rebuild_reason = rebuild
                    if model == SESSIONS:
                        rebuild_sessions(
                            spark, table_path, settings, snapshot, limits.upper_limit, now, outcome
                        )
                    else:
                        rebuild_user_model(spark, table_path, model, outcome)
                    processed = _max_session_ts(snapshot, settings, limits)
                    outcome.ran = True
                    _advance(outcome, processed, version)
                    continue
                assert changes is not None
                outcome.rows_read["window rows"] = changes.window_rows
                outcome.rows_read["change feed rows"] = changes.feed_rows
                if not changes.found_data:
                    warning = NO_DATA_WARNING.format(table=FILTERED_EVENTS)
                    log.warning(f"{model}: {warning}")
                    if warning not in run.warnings:
                        run.warnings.append(warning)
                    outcome.no_data = True
                    continue
                _add_counts(outcome.excluded, changes.excluded)
                small = changes.window_rows + changes.feed_rows <= SMALL_RUN_ROWS
                with small_query_conf(spark, small):
                    if model == SESSIONS:
                        sessions_users = process_sessions(
                            spark, table_path, settings, limits, snapshot, changes, now, outcome
                        )
                    else:
                        lifecycle = _table_or_empty(
                            spark, table_path(SESSIONS_LIFECYCLE_MANIFEST), LIFECYCLE_SCHEMA
                        )
                        users = affected_users(settings, changes, lifecycle)
                        if sessions_users is not None:
                            users = users.unionByName(
                                sessions_users.select("user_identifier")
                            ).distinct()
                        process_user_model(spark, table_path, model, users, outcome)
                outcome.ran = True
                _advance(outcome, changes.processed_max, version)
            except Exception as exc:
                outcome.failed = (
                    f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                )
                log.error(f"{model} failed: {outcome.failed}\n{traceback.format_exc()}")
                failed = model
            finally:
                outcome.seconds = time.monotonic() - started
                if outcome.ran:
                    log.info(
                        f"{model}: read {outcome.total_rows_read} rows, wrote {outcome.total_rows_written}, "
                        f"touched {outcome.touched}; last_success {_iso(outcome.last_success_after)}"
                    )
    finally:
        for changes in changes_by_version.values():
            changes.unpersist()
        if sessions_users is not None:
            sessions_users.unpersist()

    new_manifest = dict(manifest)
    for model, outcome in outcomes.items():
        if outcome.ran and outcome.last_success_after is not None:
            new_manifest[model] = ModelState(
                model=model,
                last_success=outcome.last_success_after,
                consumed_version=outcome.consumed_version_after,
                processed_through=limits.upper_limit,
                updated_at=now,
            )
    if new_manifest != manifest:
        _write_manifest(table_path(INCREMENTAL_MANIFEST), new_manifest)
    run.manifest = new_manifest
    if failed:
        raise SessionModelError(failed, outcomes[failed].failed or "", run)
    return run


class SessionModelError(RuntimeError):
    """A session model failed; the others' progress was recorded."""

    def __init__(self, model: str, reason: str, outcome: SessionRunOutcome) -> None:
        super().__init__(f"Session model {model} failed: {reason}")
        self.outcome = outcome


def _advance(outcome: ModelOutcome, processed: dt.datetime | None, version: int) -> None:
    """Move last_success forward (never back) and record the consumed version."""
    after = next_last_success(outcome.last_success_before, processed, succeeded=True)
    outcome.last_success_after = after
    if after is not None:
        outcome.consumed_version_after = version


def _rebuild_reason(
    spark: SparkSession, table_path: TablePath, model: str, state: ModelState | None, version: int
) -> str | None:
    """Why a model cannot continue incrementally (None: it can)."""
    if state is None or state.consumed_version is None:
        return None
    if delta_version(table_path(model)) is None:
        return f"{model} has a manifest row but no table; rebuilding it in full"
    if version < state.consumed_version:
        return (
            f"filtered_events is at version {version}, before the consumed version "
            f"{state.consumed_version} (table replaced?); rebuilding {model} in full"
        )
    return None


def _max_session_ts(
    snapshot: DataFrame, settings: Settings, limits: RunLimits
) -> dt.datetime | None:
    """The greatest usable session timestamp up to the upper limit (a full rebuild's last_success)."""
    prepared = core.usable(core.prepare_events(snapshot, settings), settings)
    value = (
        prepared.filter(F.col(core.SESSION_TS) <= F.lit(limits.upper_limit))
        .agg(F.max(core._micros(core.SESSION_TS)))
        .collect()[0][0]
    )
    return _from_micros(value)


# --- Dagster ------------------------------------------------------------------------------------


def build_assets(settings: Settings, lock: LockFactory | None = None) -> list[AssetsDefinition]:
    """The `session_models` multi-asset: every enabled session model and its bookkeeping tables.

    `lock(context, item)` may wrap the run in a processing-manifest lock (item "session_models").
    """
    models = enabled_models(settings)
    specs = [
        AssetSpec(
            SESSIONS,
            deps=[FILTERED_EVENTS],
            group_name=GROUP,
            kinds={"spark", "delta"},
            description="One row per session (SPEC section 6), kept current incrementally.",
        ),
        AssetSpec(
            USERS,
            deps=[SESSIONS],
            group_name=GROUP,
            kinds={"spark", "delta"},
            description="One row per non-null user, from their sessions.",
        ),
    ]
    if USER_SESSION_STATS in models:
        specs.append(
            AssetSpec(
                USER_SESSION_STATS,
                deps=[SESSIONS],
                group_name=GROUP,
                kinds={"spark", "delta"},
                description="Per-user session-duration statistics (an example extra session model).",
            )
        )
    specs += [
        AssetSpec(
            SESSIONS_LIFECYCLE_MANIFEST,
            deps=[FILTERED_EVENTS],
            group_name=GROUP,
            kinds={"spark", "delta"},
            description="Per session: id, user, start and end, quarantined -- finds the sessions new events touch.",
        ),
        AssetSpec(
            QUARANTINED_SESSIONS,
            deps=[SESSIONS_LIFECYCLE_MANIFEST],
            group_name=GROUP,
            kinds={"spark", "delta"},
            description="Sessions capped at max_session_days.",
        ),
        AssetSpec(
            SUPERSEDED_SESSIONS,
            deps=[SESSIONS],
            group_name=GROUP,
            kinds={"spark", "delta"},
            description="gap mode: session ids that stopped existing (old id -> new id, reason).",
        ),
        AssetSpec(
            INCREMENTAL_MANIFEST,
            deps=[m for m in models],
            group_name=GROUP,
            kinds={"delta"},
            description="Per session model: last_success, consumed filtered_events version, processed-through limit.",
        ),
    ]

    @multi_asset(
        name=ASSET_NAME,
        specs=specs,
        can_subset=False,
        required_resource_keys={"lake", "spark"},
        description="Snowplow-style incremental run of the session models (run limits, lifecycle manifest, quarantine).",
    )
    def session_models(context):  # noqa: ANN001, ANN202 - Dagster inspects the annotation
        started = time.monotonic()
        lake: LakeResource = context.resources.lake
        spark: SparkDeltaResource = context.resources.spark
        session = spark.get_session()
        # The single place a processing-manifest lock wraps this run (item "session_models").
        guard = lock(context, ASSET_NAME) if lock is not None else nullcontext()
        with guard:
            run = run_session_models(
                session, lake.table, lake.settings, lake.current_time(), context.log
            )
        yield from materialize_results(run, time.monotonic() - started)

    return [session_models]


def materialize_results(run: SessionRunOutcome, seconds: float) -> Iterator[MaterializeResult]:
    """One MaterializeResult per asset of the multi-asset, with the run's facts as metadata."""
    base = run.run_metadata()
    for model, outcome in run.models.items():
        md = {**base, **outcome.metadata()}
        yield MaterializeResult(asset_key=model, metadata=_metadata(md))
    sessions = run.models[SESSIONS]
    written = sessions.rows_written
    yield MaterializeResult(
        asset_key=SESSIONS_LIFECYCLE_MANIFEST,
        metadata=_metadata(
            {
                **base,
                "rows read": sessions.rows_read.get("lifecycle rows", 0),
                "rows written": written.get("lifecycle rows", 0),
            }
        ),
    )
    yield MaterializeResult(
        asset_key=QUARANTINED_SESSIONS,
        metadata=_metadata(
            {
                **base,
                "rows written": written.get("quarantined sessions added", 0)
                + written.get("quarantined sessions removed", 0),
                "sessions added": written.get("quarantined sessions added", 0),
                "sessions removed": written.get("quarantined sessions removed", 0),
                "events ignored: quarantined session": sessions.excluded.get(
                    core.QUARANTINED_SESSION, 0
                ),
                "events ignored: after max_session_days": sessions.excluded.get(
                    core.AFTER_MAX_SESSION_DAYS, 0
                ),
            }
        ),
    )
    yield MaterializeResult(
        asset_key=SUPERSEDED_SESSIONS,
        metadata=_metadata({**base, "rows written": written.get("superseded ids", 0)}),
    )
    yield MaterializeResult(
        asset_key=INCREMENTAL_MANIFEST,
        metadata=_metadata(
            {
                **base,
                "rows written": len(run.manifest) if run.moved else 0,
                "seconds": round(seconds, 3),
                "manifest": MetadataValue.md(manifest_markdown(run.manifest)),
            }
        ),
    )


def manifest_markdown(manifest: dict[str, ModelState]) -> str:
    lines = ["| model | last_success | consumed version | processed through |", "|---|---|---|---|"]
    for s in sorted(manifest.values(), key=lambda s: s.model):
        lines.append(
            f"| {s.model} | {_iso(s.last_success)} | {s.consumed_version} | {_iso(s.processed_through)} |"
        )
    return "\n".join(lines)


def _metadata(values: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in values.items():
        if v is None:
            out[k] = MetadataValue.null()
        elif isinstance(v, bool):
            out[k] = MetadataValue.bool(v)
        elif isinstance(v, int):
            out[k] = MetadataValue.int(v)
        elif isinstance(v, float):
            out[k] = MetadataValue.float(v)
        elif isinstance(v, str):
            out[k] = MetadataValue.text(v)
        else:
            out[k] = v
    return out


def session_start(settings: Settings) -> dt.datetime:
    """The first instant the session branch processes (start_date at midnight UTC)."""
    return start_of_day(settings.start_date)
