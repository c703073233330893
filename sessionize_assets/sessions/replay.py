"""id mode's lifecycle memory replayed from the recorded session runs (for `sessionize verify`).

Each session run records in its processing-manifest lock what it read (`core/run_history.py`).
A replay starts from an empty memory, or from the last refresh (which forgets it), and repeats
every recorded run oldest first: the run's `filtered_events` version (Delta time travel), every
session with an event up to the run's upper limit decided from the memory so far
(`core.compute_sessions`, the id-mode rule of `core/lifecycle.py`), the memory rebuilt as the run
rebuilt it. It reads no incremental state: not the lifecycle manifest, not the sessions.

A replay is possible while the records say what every run wrote (`core.run_history.replay_of`)
and every version it needs is still readable. Three things end that, each named in one sentence:
a VACUUM that deleted files of `filtered_events` after the first version replayed (old versions
may have lost their files), any `sessionize forget` (old versions still hold the forgotten rows,
which the memory no longer may), and a Delta log that no longer reaches that version.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession

from sessionize_assets.core import sessionize as core
from sessionize_assets.core.run_history import RUN_ITEM, Replay, replay_of
from sessionize_assets.resources.delta import delta_table, live_rows, read_pinned, read_small_table
from sessionize_assets.resources.manifest_table import read_records
from sessionize_assets.resources.spark import small_query_conf
from sessionize_assets.resources.tables import FILTERED_EVENTS, FORGET_LOG, PROCESSING_MANIFEST
from sessionize_assets.sessions.frames import small_run
from sessionize_assets.sessions.modes import mode_for
from sessionize_assets.sessions.tables import LIFECYCLE_SCHEMA, TablePath
from sessionize_assets.settings import Settings

VACUUM_END = "VACUUM END"


def replay_plan(table_path: TablePath, lifecycle_rows: int, versions: bool = True) -> Replay:
    """The runs to replay from the home's records (delta-rs only), or why it cannot be done;
    without `versions`, from the records alone (whether the versions are still readable, and
    whether a forget ran, not checked)."""
    replay = replay_of(read_records(table_path(PROCESSING_MANIFEST), item=RUN_ITEM))
    if not replay.possible or not versions:
        return replay
    runs = replay.runs  # from the last refresh on, when there was one
    if not runs:
        if lifecycle_rows:
            return Replay(
                refusal="the lifecycle manifest has rows but no session run recorded its window "
                "(it was written by runs that took no lock, or by a version before runs did)"
            )
        return Replay()
    first = runs[0].filtered_events_version
    history = _history(table_path(FILTERED_EVENTS))
    if first < min((v for v, _ in history), default=0):
        return Replay(
            refusal=f"filtered_events' Delta log no longer reaches version {first}, which the "
            "first recorded run read"
        )
    for version, commit in history:
        if version > first and commit.get("operation") == VACUUM_END and _deleted(commit):
            return Replay(
                refusal=f"VACUUM deleted files of filtered_events at version {version}, after "
                f"version {first} that the first recorded run read"
            )
    if read_small_table(table_path(FORGET_LOG), ["request_id"]):
        return Replay(
            refusal="`sessionize forget` removed rows that earlier versions of filtered_events, "
            "and so a replay, still hold"
        )
    return Replay(runs=runs)


def _history(path: str) -> list[tuple[int, dict]]:
    table = delta_table(path)
    if table is None:
        return []
    return [(int(c["version"]), c) for c in table.history() if c.get("version") is not None]


def _deleted(commit: dict) -> bool:
    metrics = commit.get("operationMetrics") or {}
    try:
        return int(metrics.get("numDeletedFiles", 1)) > 0
    except (TypeError, ValueError):
        return True


def replayed_lifecycle(
    spark: SparkSession, table_path: TablePath, settings: Settings, replay: Replay
) -> DataFrame:
    """The lifecycle manifest the recorded runs build from nothing (id mode)."""
    mode = mode_for(settings)
    path = table_path(FILTERED_EVENTS)
    memory: DataFrame = spark.createDataFrame([], LIFECYCLE_SCHEMA)
    columns = core.shared_columns(settings)
    for run in replay.runs:
        known = None if run.forgets_memory else memory
        # Driver-local when small (delta-rs), else Spark's read of that version.
        snapshot = read_pinned(spark, path, run.filtered_events_version, columns)
        rows = live_rows(delta_table(path, run.filtered_events_version))
        small = rows is not None and small_run(rows)
        with small_query_conf(spark, small):
            computed = core.compute_sessions(snapshot, settings, known, run.upper_limit).sessions
            rebuilt = mode.rebuilt_lifecycle(core.lifecycle_rows(computed), known)
            # Each run's memory computed once: the next run's plan starts from its rows, not
            # from every earlier run's plan.
            memory = rebuilt.localCheckpoint(eager=True)
    return memory
