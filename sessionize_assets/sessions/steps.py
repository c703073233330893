"""The session models' steps, callable without Dagster (Spark): recompute the sessions a run's
changes touch and replace them (`process_sessions`, `replace_sessions`), keep the lifecycle
manifest and the side tables (`quarantined_sessions`, `superseded_sessions`), recompute the
user-level models of the touched users (`process_user_model`), and rebuild a model in full when it
cannot continue incrementally. What differs between id and gap mode is asked of the mode
(`sessions.modes`); the DataFrame transforms are `core.sessionize`.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from sessionize_assets import faults
from sessionize_assets.core import renumbering, user_models
from sessionize_assets.core import sessionize as core
from sessionize_assets.core.clock import as_utc, from_micros
from sessionize_assets.core.run_limits import RunLimits
from sessionize_assets.resources.delta import (
    append_from_driver,
    delta_table,
    delta_version,
    distinct_values,
    ensure_table,
    merge,
    merge_rows,
    naive_rows,
    newest_value,
    nulls_for,
    overwrite,
    read_pinned,
    rows_by_key,
    same_types,
    schema_pairs,
    table_or_empty,
)
from sessionize_assets.resources.spark import arrow_frame, fetch_arrow
from sessionize_assets.resources.tables import (
    FILTERED_EVENTS,
    QUARANTINED_SESSIONS,
    SESSIONS,
    SESSIONS_LIFECYCLE_MANIFEST,
    SUPERSEDED_SESSIONS,
    USERS,
)
from sessionize_assets.sessions.changes import Changes
from sessionize_assets.sessions.frames import (
    KEYED_ROWS,
    add_counts,
    computed_once,
    key_values,
    keyed_read,
    keyed_rows,
    localize,
    localized,
    reason_counts,
    reasons_from,
    without_unchanged,
)
from sessionize_assets.sessions.modes import SessionMode, side_part
from sessionize_assets.sessions.outcome import ModelOutcome
from sessionize_assets.sessions.tables import (
    LIFECYCLE_SCHEMA,
    QUARANTINED_SCHEMA,
    SESSIONS_SCHEMA,
    SUPERSEDED_SCHEMA,
    USER_MODEL_SCHEMAS,
    TablePath,
)
from sessionize_assets.settings import Settings

# --- The sessions model -------------------------------------------------------------------------

# In a small run the touched sessions' events are driver-local up to this many rows
# (`computed_once`): a few thousand on the 30-day benchmark home.
TOUCHED_EVENTS_ROWS = 100_000


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
    computed_by: str = "spark"  # or "driver" (`core.renumbering`)
    user_names: list[str] | None = None  # `users`' names, when the driver holds them


def replace_sessions(
    spark: SparkSession,
    path: str,
    new_sessions: DataFrame,
    replaced_ids: DataFrame,
    new_rows: pa.Table | None = None,
    replaced_rows: pa.Table | None = None,
) -> SessionsWrite:
    """Replace the sessions `replaced_ids` by `new_sessions` (not numbered) in one MERGE, and
    renumber the touched users' later sessions.

    Only the touched users' sessions starting at or after the earliest replaced or new session
    are read and renumbered; earlier ones keep their numbers (their count is the largest of them).

    `new_rows`: `new_sessions` as the driver holds them, when it does; the replacement is then
    computed in plain Python (`core.renumbering`) when the driver also reads the stored rows it
    needs (`_replace_on_driver`), else by Spark. `replaced_rows`: rows whose
    `session_identifier` are `replaced_ids`, when the driver holds them (else they are fetched)."""
    if new_rows is not None:
        replaced = replaced_rows if replaced_rows is not None else replaced_ids
        done = _replace_on_driver(spark, path, new_rows, replaced)
        if done is not None:
            return done
    replaced = replaced_ids.select("session_identifier").distinct()
    new = new_sessions.select(*[c for c in core.SESSION_COLUMNS if c != "session_number"])
    target = stored_sessions_of(spark, path, replaced, new)
    old = target.join(replaced, "session_identifier", "left_semi").select(
        "user_identifier", "start_tstamp"
    )
    users = (
        old.unionByName(new.select("user_identifier", "start_tstamp"))
        .filter(F.col("user_identifier").isNotNull())
        .groupBy("user_identifier")
        .agg(F.min("start_tstamp").alias("_from"))
    )
    users = localize(spark, users)
    # The recomputed sessions replace their stored rows whatever the replaced ids say: after a run
    # killed between its sessions and lifecycle commits, the table already holds some of them.
    recomputed = replaced.unionByName(new.select("session_identifier"))
    user_rows = target.join(users, "user_identifier", "inner").join(
        recomputed, "session_identifier", "left_anti"
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
            *nulls_for(SESSIONS_SCHEMA, "session_identifier"),
            F.lit(True).alias("_delete"),
            F.lit(False).alias("_fresh"),
            F.lit(False).alias("_same"),
            F.lit(True).alias("_changed"),
            F.lit(False).alias("_has_before"),
        )
    )
    source = localize(spark, source)
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
        merge(
            spark,
            path,
            source.filter(F.col("_changed")).select(*core.SESSION_COLUMNS, "_delete"),
            "session_identifier",
            SESSIONS_SCHEMA,
            rows=written + deleted,
        )
    elif delta_version(path) is None:
        ensure_table(spark, path, SESSIONS_SCHEMA)
    source.unpersist()
    return SessionsWrite(
        users=users,
        written=written,
        fresh=int(counts["fresh"] or 0),
        content_changed=int(counts["content_changed"] or 0),
        deleted=deleted,
        rows_read=int(counts["later"] or 0) + int(counts["users_before"] or 0),
    )


USERS_FROM_SCHEMA = "user_identifier string, _from timestamp"


def count_replacement(outcome: ModelOutcome, write: SessionsWrite) -> None:
    """The sessions model's counts of a replacement (`replace_sessions`' or the driver's)."""
    outcome.rows_read["sessions renumbered or counted"] = write.rows_read
    outcome.computed_by = write.computed_by
    outcome.rows_written["sessions written"] = write.written
    outcome.rows_written["sessions deleted"] = write.deleted
    outcome.rows_written["sessions renumbered only"] = write.written - write.content_changed
    outcome.touched = write.content_changed + write.deleted


def replace_session_rows(
    spark: SparkSession, path: str, new_rows: pa.Table, replaced_ids: list[str]
) -> SessionsWrite:
    """`replace_sessions` of sessions and replaced ids the driver holds: in plain Python when
    the driver reads the stored rows it needs, else by Spark on driver-local DataFrames."""
    ids = pa.table({"session_identifier": pa.array(replaced_ids, pa.string())})
    done = _replace_on_driver(spark, path, new_rows, ids)
    if done is not None:
        return done
    return replace_sessions(spark, path, arrow_frame(spark, new_rows), arrow_frame(spark, ids))


def _replace_on_driver(
    spark: SparkSession, path: str, new_rows: pa.Table, replaced_ids: DataFrame | pa.Table
) -> SessionsWrite | None:
    """`replace_sessions` in plain Python (`core.renumbering.replacement`) over the stored rows
    of the replaced and new ids and of their users, read by delta-rs; the changed rows written
    through the driver when it can (`merge_rows`). None, having written nothing, when the table
    is absent or delta-rs cannot read those rows (Spark replaces them then). `replaced_ids`:
    a DataFrame, or the ids as the driver holds them (a `session_identifier` column)."""
    table = delta_table(path)
    if table is None:
        return None
    if isinstance(replaced_ids, pa.Table):
        replaced = replaced_ids.select(["session_identifier"])
    else:
        replaced, _ = fetch_arrow(replaced_ids.select("session_identifier").limit(KEYED_ROWS + 1))
    if replaced.num_rows > KEYED_ROWS:
        return None
    ids = distinct_values(
        replaced.column(0).cast(pa.string()),
        new_rows.column("session_identifier").cast(pa.string()),
    )
    owners = rows_by_key(
        table, {"session_identifier": ids}, columns=["user_identifier"], limit=KEYED_ROWS
    )
    if owners is None:
        return None
    users = distinct_values(
        new_rows.column("user_identifier").cast(pa.string()),
        owners.column("user_identifier").cast(pa.string()),
    )
    names = [c for c, _ in schema_pairs(SESSIONS_SCHEMA)]
    stored = rows_by_key(
        table,
        {"session_identifier": ids, "user_identifier": users},
        columns=names,
        limit=KEYED_ROWS,
    )
    if stored is None or not same_types(stored.schema, renumbering.sessions_schema()):
        return None
    plan = renumbering.replacement(
        naive_rows(new_rows), replaced.column(0).to_pylist(), naive_rows(stored)
    )
    if plan.source:
        source = pa.Table.from_pylist(plan.source, schema=renumbering.sessions_schema(True))
        merge_rows(spark, path, source, "session_identifier", SESSIONS_SCHEMA)
    touched = arrow_frame(
        spark,
        pa.table(
            {
                "user_identifier": pa.array(list(plan.users), pa.string()),
                "_from": pa.array(list(plan.users.values()), pa.timestamp("us", tz="UTC")),
            }
        ),
        schema=USERS_FROM_SCHEMA,
    )
    return SessionsWrite(
        users=touched,
        written=plan.written,
        fresh=plan.fresh,
        content_changed=plan.content_changed,
        deleted=plan.deleted,
        rows_read=plan.rows_read,
        computed_by="driver",
        user_names=list(plan.users),
    )


def stored_sessions_of(
    spark: SparkSession, path: str, replaced: DataFrame, new: DataFrame
) -> DataFrame:
    """At least the stored sessions of the `replaced` and `new` ids and every session of their
    users (the stored rows' and the new rows'), which is all `replace_sessions` joins with:
    driver-local when delta-rs reads them (`frames.keyed_rows`: the ids' users first, from two
    columns), else the whole table at its current version."""
    table = delta_table(path)
    if table is None:
        return table_or_empty(spark, path, SESSIONS_SCHEMA)
    ids = replaced.select(
        "session_identifier", F.lit(None).cast("string").alias("user_identifier")
    ).unionByName(new.select("session_identifier", "user_identifier"))
    data, _ = fetch_arrow(ids.limit(KEYED_ROWS + 1))
    if data.num_rows > KEYED_ROWS:
        return table_or_empty(spark, path, SESSIONS_SCHEMA)
    keys = distinct_values(data.column("session_identifier"))
    theirs = rows_by_key(
        table, {"session_identifier": keys}, columns=["user_identifier"], limit=KEYED_ROWS
    )
    if theirs is None:
        return table_or_empty(spark, path, SESSIONS_SCHEMA)
    users = distinct_values(
        data.column("user_identifier").cast(pa.string()),
        theirs.column("user_identifier").cast(pa.string()),
    )
    return keyed_rows(
        spark,
        path,
        SESSIONS_SCHEMA,
        {"session_identifier": keys, "user_identifier": users},
        version=table.version(),  # the version the users were read from
    )


def process_sessions(
    spark: SparkSession,
    table_path: TablePath,
    settings: Settings,
    mode: SessionMode,
    limits: RunLimits,
    snapshot: DataFrame,
    changes: Changes,
    now: dt.datetime,
    outcome: ModelOutcome,
    version: int | None = None,
) -> SessionsWrite:
    """Recompute the sessions the changes touch and replace them. Returns the replacement,
    whose `users` are the touched users (persisted; the caller unpersists). With the `version` of filtered_events the snapshot is,
    a small gap-mode run is taken by the driver when it can (`sessions/driver_run.py`)."""
    if version is not None:
        from sessionize_assets.sessions.driver_run import process_sessions_on_driver

        done = process_sessions_on_driver(
            spark, table_path, settings, limits, version, changes, now, outcome
        )
        if done is not None:
            return done
    lc_path = table_path(SESSIONS_LIFECYCLE_MANIFEST)
    touched = mode.touched(spark, snapshot, lc_path, changes, limits)
    outcome.rows_read["lifecycle rows"] = touched.lifecycle_rows
    # They hold about every row the run takes on: a run that takes on more than their limit has
    # them persisted at once (fetched first, they would be read twice: on the 30-day benchmark
    # home a 200,000-event day read 15 % more event rows).
    taken = changes.window_rows + changes.feed_rows
    read = computed_once(
        spark,
        core.with_reason(touched.read, settings),
        TOUCHED_EVENTS_ROWS,
        fetch_first=None if taken <= TOUCHED_EVENTS_ROWS else False,
    )
    read_stats = read.agg(F.count(F.lit(1)).alias("n"), *reason_counts()).collect()[0]
    outcome.rows_read["events of touched sessions"] = int(read_stats["n"] or 0)
    add_counts(outcome.excluded, reasons_from(read_stats))
    result = mode.sessionize(read.filter(F.col(core.REASON).isNull()).drop(core.REASON), touched)
    computed, computed_rows = localized(spark, mode.in_scope(result.sessions, touched))
    excluded_stats = result.excluded.agg(*reason_counts()).collect()[0]
    add_counts(outcome.excluded, reasons_from(excluded_stats))

    write = replace_sessions(
        spark,
        table_path(SESSIONS),
        computed,
        touched.replaced_ids,
        computed_rows,
        touched.replaced_table,
    )
    count_replacement(outcome, write)
    if mode.name == "gap" and computed_rows is not None and touched.old_lifecycle_table is not None:
        from sessionize_assets.sessions.driver_run import bookkeep_on_driver

        if bookkeep_on_driver(
            spark,
            table_path,
            settings,
            computed_rows,
            touched.old_lifecycle_table,
            write,
            now,
            outcome,
        ):
            computed.unpersist()
            read.unpersist()
            touched.unpersist()
            return write

    # The side tables are derived from the difference between the stored lifecycle rows and the
    # recomputed ones, so they are written first: a run stopped after the lifecycle commit would
    # leave the next run no difference to derive them from. Written again after a stop before the
    # lifecycle commit, they add nothing twice (`write_side_tables`).
    write_side_tables(
        spark, table_path, settings, mode, computed, touched.old_lifecycle, now, outcome
    )

    # Lifecycle manifest (core.lifecycle.action): id mode keeps every session it has seen
    # (first-seen user, frozen quarantine); gap mode mirrors the sessions. Only the rows that
    # differ from the stored ones (`frames.without_unchanged`).
    update = mode.lifecycle_update(computed, touched.replaced_ids, write.fresh, write.deleted)
    lifecycle_source = None
    lifecycle_rows = None  # the source as the driver holds it, when it does
    lifecycle_written = 0
    if update.rows:
        lifecycle_source, lifecycle_rows = localized(
            spark,
            without_unchanged(
                update.source,
                touched.old_lifecycle,
                "session_identifier",
                [c for c, _ in schema_pairs(LIFECYCLE_SCHEMA)],
            ),
        )
        lifecycle_written = (
            lifecycle_rows.num_rows if lifecycle_rows is not None else lifecycle_source.count()
        )
    if lifecycle_written and lifecycle_rows is not None:
        merge_rows(spark, lc_path, lifecycle_rows, "session_identifier", LIFECYCLE_SCHEMA)
    elif lifecycle_written:
        merge(
            spark,
            lc_path,
            lifecycle_source,
            "session_identifier",
            LIFECYCLE_SCHEMA,
            rows=lifecycle_written,
        )
    else:
        ensure_table(spark, lc_path, LIFECYCLE_SCHEMA)
    if lifecycle_source is not None:
        lifecycle_source.unpersist()
    outcome.rows_written["lifecycle rows"] = lifecycle_written
    computed.unpersist()
    read.unpersist()
    touched.unpersist()
    return write


def write_side_tables(
    spark: SparkSession,
    table_path: TablePath,
    settings: Settings,
    mode: SessionMode,
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
    q_path = table_path(QUARANTINED_SESSIONS)
    listed = table_or_empty(spark, q_path, QUARANTINED_SCHEMA).select("session_identifier")
    added = (
        quarantined_now.join(was, "session_identifier", "left_anti")
        .join(listed, "session_identifier", "left_anti")  # listed by a run stopped after it
        .select(
            "session_identifier",
            "user_identifier",
            F.col(core.LC_START).alias("start_tstamp"),
            cap.alias("capped_at"),
            F.lit(now).alias("quarantined_at"),
            F.lit(False).alias("_delete"),
        )
    )
    side = side_part(added, QUARANTINED_SESSIONS)
    extras = mode.side_rows(quarantined_now, was, old_lifecycle, computed, now)
    for extra in extras:
        side = side.unionByName(extra)
    sup_path = table_path(SUPERSEDED_SESSIONS)
    if extras:  # superseded ids recorded by a run stopped after it are not recorded twice
        known = table_or_empty(spark, sup_path, SUPERSEDED_SCHEMA).select(
            F.col("superseded_session_identifier").alias("_known_superseded"),
            F.col("session_identifier").alias("_known_successor"),
        )
        side = side.join(
            known,
            (F.col("_superseded") == F.col("_known_superseded"))
            & F.col("session_identifier").eqNullSafe(F.col("_known_successor")),
            "left_anti",
        )
    side, side_rows = localized(spark, side)
    write_side_rows(spark, table_path, side, side_rows, outcome)


def write_side_rows(
    spark: SparkSession,
    table_path: TablePath,
    side: DataFrame,
    side_rows: pa.Table | None,
    outcome: ModelOutcome,
) -> None:
    """Write `write_side_tables`' side rows (`side_rows`: the same rows as the driver holds
    them, when it does) and count them into the outcome."""
    q_path = table_path(QUARANTINED_SESSIONS)
    sup_path = table_path(SUPERSEDED_SESSIONS)
    if side_rows is not None:  # driver-local: counted by the driver
        counts: dict[tuple[str, bool], int] = {}
        for key in zip(
            side_rows.column("_table").to_pylist(),
            side_rows.column("_delete").to_pylist(),
            strict=True,
        ):
            counts[key] = counts.get(key, 0) + 1
    else:
        counts = {
            (r["_table"], r["_delete"]): int(r["n"])
            for r in side.groupBy("_table", "_delete").agg(F.count(F.lit(1)).alias("n")).collect()
        }
    added_n = counts.get((QUARANTINED_SESSIONS, False), 0)
    removed_n = counts.get((QUARANTINED_SESSIONS, True), 0)
    quarantine = side.filter(F.col("_table") == QUARANTINED_SESSIONS)
    q_columns = [c for c, _ in schema_pairs(QUARANTINED_SCHEMA)]
    if removed_n and side_rows is not None:
        import pyarrow.compute as pc

        rows = side_rows.filter(pc.equal(side_rows.column("_table"), QUARANTINED_SESSIONS))
        merge_rows(
            spark,
            q_path,
            rows.select([*q_columns, "_delete"]),
            "session_identifier",
            QUARANTINED_SCHEMA,
        )
    elif removed_n:
        merge(
            spark,
            q_path,
            quarantine.select(*q_columns, "_delete"),
            "session_identifier",
            QUARANTINED_SCHEMA,
            rows=added_n + removed_n,
        )
    elif added_n:
        rows = _side_rows(side_rows, QUARANTINED_SESSIONS, {c: c for c in q_columns})
        if rows is None or not append_from_driver(q_path, rows):
            with faults.commit_of(q_path):
                quarantine.select(*q_columns).write.format("delta").mode("append").save(q_path)
    else:
        ensure_table(spark, q_path, QUARANTINED_SCHEMA)
    outcome.rows_written["quarantined sessions added"] = added_n
    outcome.rows_written["quarantined sessions removed"] = removed_n
    sup_n = counts.get((SUPERSEDED_SESSIONS, False), 0)
    if sup_n:
        renamed = {
            "superseded_session_identifier": "_superseded",
            "session_identifier": "session_identifier",
            "user_identifier": "user_identifier",
            "reason": "_reason",
            "superseded_at": "quarantined_at",
        }
        rows = _side_rows(side_rows, SUPERSEDED_SESSIONS, renamed)
        if rows is None or not append_from_driver(sup_path, rows):
            with faults.commit_of(sup_path):
                side.filter(F.col("_table") == SUPERSEDED_SESSIONS).select(
                    *[F.col(source).alias(name) for name, source in renamed.items()]
                ).write.format("delta").mode("append").save(sup_path)
    else:
        ensure_table(spark, sup_path, SUPERSEDED_SCHEMA)
    outcome.rows_written["superseded ids"] = sup_n
    side.unpersist()


def _side_rows(side: pa.Table | None, table: str, columns: dict[str, str]) -> pa.Table | None:
    """The driver-local side rows added to `table` (not removals), as its `columns` (name: side
    column), for the driver's append; None when the side rows are not driver-local. The driver
    appends them when the table exists with those columns and types (`append_from_driver`),
    else Spark does: a Spark append of a few rows cost about 1 s per table a run writes."""
    if side is None:
        return None
    import pyarrow.compute as pc

    added = side.filter(pc.and_(pc.equal(side.column("_table"), table), pc.invert(side["_delete"])))
    return pa.table({name: added.column(source) for name, source in columns.items()})


# --- User-level models (users, user_session_stats) ------------------------------------------------


def user_model_rows(model: str, sessions: DataFrame) -> DataFrame:
    """A user-level model's rows from sessions."""
    if model == USERS:
        return core.users_from_sessions(sessions)
    return core.user_session_stats_from_sessions(sessions)


@dataclass
class TouchedUsers:
    """The users whose user-model rows a run recomputes, with their rows of `sessions`: read
    once per change set and shared by every user model (`touched_users`)."""

    users: DataFrame  # user_identifier, distinct
    keys: dict[str, pa.Array | None]  # their ids, for the models' keyed reads
    sessions: DataFrame  # their rows of sessions
    session_rows: pa.Table | None = None  # the same rows as the driver read them (None: Spark)

    def unpersist(self) -> None:
        self.users.unpersist()


def touched_users(spark: SparkSession, table_path: TablePath, users: DataFrame) -> TouchedUsers:
    """`users` computed once, and their rows of sessions, read by the driver when it can
    (`keyed_rows`; else each user model's plan scans `sessions` again, as before)."""
    users = localize(spark, users)
    try:
        keys = {"user_identifier": key_values(users, "user_identifier")}
        sessions, rows = keyed_read(spark, table_path(SESSIONS), SESSIONS_SCHEMA, keys)
    except Exception:
        users.unpersist()
        raise
    return TouchedUsers(users, keys, sessions.join(users, "user_identifier", "left_semi"), rows)


def changed_user_names(
    mode: SessionMode, changes: Changes, sessions_write: SessionsWrite | None
) -> list[str] | None:
    """gap mode's `affected_users` and the users whose sessions the run replaced, as names,
    when the driver holds both (the change set's rows and the replacement's users); None
    otherwise (Spark takes them from the DataFrames)."""
    if mode.name != "gap" or changes.rows_table is None:
        return None
    if sessions_write is not None and sessions_write.user_names is None:
        return None
    rows = changes.rows_table
    names = {
        user
        for user, reason, sign in zip(
            rows.column(core.USER_KEY).to_pylist(),
            rows.column(core.REASON).to_pylist(),
            rows.column("_sign").to_pylist(),
            strict=True,
        )
        if user is not None and reason is None and sign != 0
    }
    if sessions_write is not None:
        names.update(u for u in sessions_write.user_names or () if u is not None)
    return sorted(names)


def touched_users_named(
    spark: SparkSession, table_path: TablePath, names: list[str]
) -> TouchedUsers:
    """`touched_users` of users the driver names: the same rows without a Spark statement for
    the names."""
    users = pa.table({"user_identifier": pa.array(names, pa.string())})
    keys = {"user_identifier": users.column(0).combine_chunks()}
    frame = arrow_frame(spark, users, schema="user_identifier string")
    sessions, rows = keyed_read(spark, table_path(SESSIONS), SESSIONS_SCHEMA, keys)
    return TouchedUsers(frame, keys, sessions.join(frame, "user_identifier", "left_semi"), rows)


def process_user_model(
    spark: SparkSession,
    table_path: TablePath,
    model: str,
    touched: TouchedUsers,
    outcome: ModelOutcome,
) -> None:
    """Recompute the model's rows of the touched users from their sessions; users left without
    sessions go. `touched` is the caller's to unpersist. On the driver when it read the users'
    sessions and the model's stored rows of them in the model's types (`_user_model_on_driver`),
    else in Spark."""
    if _user_model_on_driver(spark, table_path(model), model, touched, outcome):
        outcome.computed_by = "driver"
        return
    outcome.computed_by = "spark"
    users, keys = touched.users, touched.keys
    # Computed once: the source's rows and the users left without any both use them.
    rows = localize(spark, user_model_rows(model, touched.sessions))
    schema = USER_MODEL_SCHEMAS[model]
    gone = users.join(rows.select("user_identifier"), "user_identifier", "left_anti")
    source = rows.withColumn("_delete", F.lit(False)).unionByName(
        gone.select("user_identifier", *nulls_for(schema, "user_identifier")).withColumn(
            "_delete", F.lit(True)
        )
    )
    source = localize(spark, source)
    counts = source.agg(
        F.count(F.lit(1)).alias("n"),
        F.sum(F.when(~F.col("_delete"), F.col("sessions")).otherwise(0)).alias("sessions"),
    ).collect()[0]
    outcome.rows_read["sessions of touched users"] = int(counts["sessions"] or 0)
    outcome.touched = int(counts["n"] or 0)
    # Only the rows that differ from the stored ones (`frames.without_unchanged`).
    stored = keyed_rows(spark, table_path(model), schema, keys).join(
        users, "user_identifier", "left_semi"
    )
    changed = localize(
        spark,
        without_unchanged(source, stored, "user_identifier", [c for c, _ in schema_pairs(schema)]),
    )
    counts = changed.agg(
        F.sum(F.when(F.col("_delete"), 1).otherwise(0)).alias("deleted"),
        F.count(F.lit(1)).alias("n"),
    ).collect()[0]
    n, deleted = int(counts["n"] or 0), int(counts["deleted"] or 0)
    if n:
        merge(spark, table_path(model), changed, "user_identifier", schema, rows=n)
    else:
        ensure_table(spark, table_path(model), schema)
    outcome.rows_written[f"{model} rows written"] = n - deleted
    outcome.rows_written[f"{model} rows deleted"] = deleted
    changed.unpersist()
    source.unpersist()
    rows.unpersist()


def _user_model_on_driver(
    spark: SparkSession, path: str, model: str, touched: TouchedUsers, outcome: ModelOutcome
) -> bool:
    """`process_user_model` in plain Python (`core.user_models`) when the driver holds the
    touched users' sessions and reads the model's stored rows of them, of the model's own types
    (Spark's values and writer otherwise); the changed rows are written through the driver when
    it can (`merge`). False, having written nothing, when it cannot."""
    users = touched.keys.get("user_identifier")
    table = delta_table(path)
    if touched.session_rows is None or users is None or table is None:
        return False
    columns = list(user_models.MODEL_COLUMNS[model])
    stored = rows_by_key(table, {"user_identifier": users}, columns=columns, limit=KEYED_ROWS)
    schema = user_models.source_schema(model)
    if stored is None or not same_types(stored.schema, pa.schema(list(schema)[:-1])):
        return False
    rows = user_models.user_rows(model, naive_rows(touched.session_rows))
    changed, source_rows = user_models.changed_rows(
        rows, users.to_pylist(), naive_rows(stored), columns
    )
    outcome.rows_read["sessions of touched users"] = sum(r["sessions"] for r in rows)
    outcome.touched = source_rows
    deleted = sum(r["_delete"] for r in changed)
    if changed:
        data = pa.Table.from_pylist(changed, schema=schema)
        merge_rows(spark, path, data, "user_identifier", USER_MODEL_SCHEMAS[model])
    outcome.rows_written[f"{model} rows written"] = len(changed) - deleted
    outcome.rows_written[f"{model} rows deleted"] = deleted
    return True


# --- Full rebuilds ------------------------------------------------------------------------------


def rebuild_sessions(
    spark: SparkSession,
    table_path: TablePath,
    settings: Settings,
    mode: SessionMode,
    snapshot: DataFrame,
    upper: dt.datetime,
    now: dt.datetime,
    outcome: ModelOutcome,
    forget_lifecycle: bool = False,
) -> None:
    """Recompute every session from filtered_events up to the upper limit (id mode: the lifecycle
    manifest as given, unless `forget_lifecycle`: a refresh starts without its memory) and
    overwrite sessions, the lifecycle manifest and the quarantine."""
    lc_path = table_path(SESSIONS_LIFECYCLE_MANIFEST)
    lifecycle = None if forget_lifecycle else mode.known_lifecycle(spark, lc_path)
    if lifecycle is not None:
        lifecycle = lifecycle.persist()
    result = core.compute_sessions(snapshot, settings, lifecycle, upper)
    computed = result.sessions.persist()
    stats = result.excluded.agg(*reason_counts()).collect()[0]
    add_counts(outcome.excluded, reasons_from(stats))
    outcome.rows_read["events (full rebuild)"] = snapshot.count()
    overwrite(core.session_rows(computed), table_path(SESSIONS))
    new_lifecycle = mode.rebuilt_lifecycle(core.lifecycle_rows(computed), lifecycle).persist()
    overwrite(new_lifecycle, lc_path)
    cap = core._plus_micros("start_tstamp", settings.max_session_days * core.MICROS_PER_DAY)
    quarantined = new_lifecycle.filter(F.col("is_quarantined")).select(
        "session_identifier",
        "user_identifier",
        "start_tstamp",
        cap.alias("capped_at"),
        F.lit(now).alias("quarantined_at"),
    )
    overwrite(quarantined, table_path(QUARANTINED_SESSIONS))
    ensure_table(spark, table_path(SUPERSEDED_SESSIONS), SUPERSEDED_SCHEMA)
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
    """Recompute a user-level model from every session and overwrite it."""
    sessions = table_or_empty(spark, table_path(SESSIONS), SESSIONS_SCHEMA).persist()
    outcome.rows_read["sessions (full rebuild)"] = sessions.count()
    rows = user_model_rows(model, sessions).persist()
    n = rows.count()
    overwrite(rows, table_path(model))
    outcome.rows_written[f"{model} rows (full rebuild)"] = n
    outcome.touched = n
    rows.unpersist()
    sessions.unpersist()


def max_session_ts(
    snapshot: DataFrame, settings: Settings, limits: RunLimits
) -> dt.datetime | None:
    """The greatest usable session timestamp up to the upper limit (a full rebuild's last_success)."""
    prepared = core.usable(core.prepare_events(snapshot, settings), settings)
    value = (
        prepared.filter(F.col(core.SESSION_TS) <= F.lit(limits.upper_limit))
        .agg(F.max(core._micros(core.SESSION_TS)))
        .collect()[0][0]
    )
    return from_micros(value)


def next_data_after(
    spark: SparkSession, table_path: TablePath, settings: Settings, upper: dt.datetime
) -> dt.datetime | None:
    """The earliest usable session timestamp after `upper` in the current filtered_events (None:
    none): where the data resumes after a window that had none. When the Delta log's file
    statistics bound every session timestamp (the session timestamp, else load_tstamp, as
    `core.sessionize.prepare_events` takes it) at or before `upper`, none lies after it: no
    Spark query."""
    path = table_path(FILTERED_EVENTS)
    version = delta_version(path)
    if version is None:
        return None
    newest = newest_value(path, settings.session_timestamp, for_nulls="load_tstamp")
    if isinstance(newest, dt.datetime) and as_utc(newest) <= as_utc(upper):
        return None
    events = read_pinned(spark, path, version, core.shared_columns(settings))
    prepared = core.usable(core.prepare_events(events, settings), settings)
    value = (
        prepared.filter(F.col(core.SESSION_TS) > F.lit(upper))
        .agg(F.min(core._micros(core.SESSION_TS)))
        .collect()[0][0]
    )
    return from_micros(value)
