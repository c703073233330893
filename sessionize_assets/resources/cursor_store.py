"""Cursor checkpoints (`cursor_state`): one row per checkpoint of a named cursor, so an interrupted
backfill or folder load resumes at its first unfinished window. Written with Spark MERGE (retried on
commit conflicts), read with delta-rs.
"""

from __future__ import annotations

import datetime as dt
import json
import random
import time
from collections.abc import Callable
from typing import Any

from sessionize_assets.core.clock import to_micros, utc_now
from sessionize_assets.core.cursor import CursorState
from sessionize_assets.errors import UserError
from sessionize_assets.resources.delta import create_table, exists, merge_into, quoted
from sessionize_assets.resources.processing_manifest import (
    MAX_ATTEMPTS,
    is_commit_conflict,
    open_table,
)

CURSOR_STATE = "cursor_state"
"""Table name of the cursor checkpoint store (`lake.table(CURSOR_STATE)`)."""


class CursorConflictError(UserError):
    """Another run checkpointed the same cursor since this run loaded it."""


def cursor_schema():  # noqa: ANN202
    from pyspark.sql import types as T

    return T.StructType(
        [
            T.StructField("cursor_name", T.StringType(), False),
            T.StructField("sequence", T.LongType(), False),
            T.StructField("state", T.StringType(), False),
            T.StructField("run_id", T.StringType(), True),
            T.StructField("checkpoint_time", T.TimestampType(), False),
        ]
    )


class CursorCheckpointStore:
    """Cursor state (`core.cursor.CursorState`) checkpoints in an append-only Delta table.

    One row per checkpoint: `cursor_name, sequence, state (JSON, the seed's shape), run_id,
    checkpoint_time`; the latest sequence of a name is its state, older rows are history. A save
    is an insert-only MERGE conditioned on "no row of this cursor with this sequence or later",
    so a run that loaded a stale state cannot move the cursor (CursorConflictError); commit
    conflicts caused by other cursors are retried.
    """

    def __init__(
        self,
        spark: Any,
        path: str,
        *,
        clock: Callable[[], dt.datetime] = utc_now,
        max_attempts: int = MAX_ATTEMPTS,
    ) -> None:
        self.spark = spark
        self.path = path
        self.clock = clock
        self.max_attempts = max_attempts
        self._sequence: dict[str, int] = {}
        self._ready = False

    def ensure_table(self) -> None:
        if self._ready:
            return
        for attempt in range(self.max_attempts):
            if exists(self.path):
                break
            try:
                create_table(
                    self.spark,
                    self.path,
                    cursor_schema(),
                    properties={
                        "delta.appendOnly": "true",
                        "delta.enableDeletionVectors": "false",
                    },
                    comment="sessionize cursor checkpoints (seed 004)",
                )
                break
            except Exception:
                if attempt + 1 >= self.max_attempts:
                    raise
                time.sleep(0.05 + random.random() * 0.2)
        self._ready = True

    def load(self, name: str) -> CursorState:
        """The cursor's latest checkpointed state (empty when never saved)."""
        row = _latest_cursor_row(self.path, name)
        self._sequence[name] = row["sequence"] if row else 0
        return CursorState.from_dict(json.loads(row["state"]) if row else None)

    def save(self, name: str, state: CursorState, run_id: str | None = None) -> int:
        """Checkpoint `state` as the cursor's next sequence; returns that sequence."""
        self.ensure_table()
        if name not in self._sequence:
            self.load(name)
        expected = self._sequence[name]
        sequence = expected + 1
        payload = json.dumps(state.to_dict(), sort_keys=True)
        for attempt in range(self.max_attempts):
            source = self.spark.createDataFrame(
                [(name, sequence, payload, run_id, to_micros(self.clock()))],
                "cursor_name string, sequence long, state string, run_id string, micros long",
            )
            try:
                result = merge_into(
                    self.spark,
                    self.path,
                    source,
                    f"ON t.cursor_name = {quoted(name)} AND t.sequence >= s.sequence "
                    "WHEN NOT MATCHED THEN INSERT "
                    "(cursor_name, sequence, state, run_id, checkpoint_time) "
                    "VALUES (s.cursor_name, s.sequence, s.state, s.run_id, "
                    "timestamp_micros(s.micros))",
                )
            except Exception as exc:
                if not is_commit_conflict(exc) or attempt + 1 >= self.max_attempts:
                    raise
                time.sleep(min(1.0, 0.02 * 2 ** min(attempt, 5)) * (0.5 + random.random()))
                continue
            if result["num_inserted_rows"] == 1:
                self._sequence[name] = sequence
                return sequence
            break
        latest = _latest_cursor_row(self.path, name)
        raise CursorConflictError(
            f"Cursor {name} was checkpointed by run {latest['run_id'] if latest else '?'} "
            f"(sequence {latest['sequence'] if latest else '?'}) after this run loaded "
            f"sequence {expected}; load it again before continuing."
        )

    def checkpointer(self, name: str, run_id: str | None = None) -> Callable[[CursorState], int]:
        """A checkpoint callback for `core.cursor.run_slices`."""
        if name not in self._sequence:
            self.load(name)
        return lambda state: self.save(name, state, run_id)


def _latest_cursor_row(path: str, name: str) -> dict[str, Any] | None:
    table = open_table(path)
    if table is None:
        return None
    rows = [r for r in table.to_pyarrow_table().to_pylist() if r["cursor_name"] == name]
    return max(rows, key=lambda r: r["sequence"]) if rows else None


def read_cursor_state(path: str, name: str) -> CursorState:
    """A cursor's latest state via delta-rs (no Spark; for sensors and status)."""
    row = _latest_cursor_row(path, name)
    return CursorState.from_dict(json.loads(row["state"]) if row else None)


def read_cursor_states(path: str) -> dict[str, tuple[CursorState, dict[str, Any]]]:
    """Every cursor's latest state and checkpoint row (`sequence, run_id, checkpoint_time`), by
    name, via delta-rs ({} when the table does not exist)."""
    table = open_table(path)
    if table is None:
        return {}
    latest: dict[str, dict[str, Any]] = {}
    for row in table.to_pyarrow_table().to_pylist():
        kept = latest.get(row["cursor_name"])
        if kept is None or row["sequence"] > kept["sequence"]:
            latest[row["cursor_name"]] = row
    return {
        name: (CursorState.from_dict(json.loads(row["state"])), row)
        for name, row in sorted(latest.items())
    }


def read_cursor_history(path: str, name: str) -> list[dict[str, Any]]:
    """Every checkpoint of a cursor, oldest first (`sequence, state, run_id, checkpoint_time`)."""
    table = open_table(path)
    if table is None:
        return []
    rows = [r for r in table.to_pyarrow_table().to_pylist() if r["cursor_name"] == name]
    return sorted(rows, key=lambda r: r["sequence"])
