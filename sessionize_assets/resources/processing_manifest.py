"""The processing manifest: an append-only Delta table of records, with locks that are real.

Writers add records through one path, `_append_many` (`_append` for one item): open the table at
its latest version V and read the items' records there (delta-rs), derive each item's state
(`core.manifest_state`), build its next record (or refuse), then append them all as version
V + 1 -- and only as V + 1 (`resources.delta.append_at_version`: delta-rs with no commit
retry, so the put-if-absent of V + 1's log file is the compare-and-swap). When any writer
(another run, an operator, Spark's OPTIMIZE) committed first, the append fails, and the writer
reads again, derives the states again and either retries (the other commit did not change what
it may do) or fails with `ItemLockedError` naming the item and the holder's run. There is no
check followed by a blind append anywhere.

The swap is on the whole table, not on an item's partition: simpler and stricter than a MERGE
whose condition reads the item's records (sessions 1-7 did that with Spark: 3.5 s and ~7 Spark
jobs per record commit, 43% of an incremental run's Spark time; delta-rs does it in
milliseconds without Spark). Writers of unrelated items retry more often, but a manifest commit
is milliseconds long and a run makes a handful of them.

The table is partitioned by `item_bucket` (crc32 of the item id modulo `BUCKETS`): readers of
one item (delta-rs or Spark) prune to one bucket. `delta.appendOnly` is on; no
deletion vectors or other features delta-rs cannot read.

Readers without Spark (sensors, `sessionize status`): `read_records`, `item_states`,
`item_state`, `last_processed_payload`.
"""

from __future__ import annotations

import datetime as dt
import logging
import random
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import pyarrow as pa

from sessionize_assets.core.clock import utc_now
from sessionize_assets.core.manifest_state import (
    LOCKABLE,
    ItemState,
    Record,
    RecordState,
    derive_item_state,
)
from sessionize_assets.errors import ItemLockedError
from sessionize_assets.resources.delta import (
    append_at_version,
    checkpoint_on_interval,
    compact_when_fragmented,
    create_table,
    exists,
)
from sessionize_assets.resources.manifest_operator import OperatorActions
from sessionize_assets.resources.manifest_table import (  # the manifest's public names, here too
    BUCKETS,
    COLUMNS,
    MAX_ATTEMPTS,
    OPERATOR,
    LockLostError,
    ManifestConflictError,
    ManifestStateError,
    asset_item,
    is_commit_conflict,
    item_bucket,
    item_state,
    item_states,
    jsonable,
    last_processed_payload,
    open_table,
    operator_run_id,
    pid_alive,
    read_records,
    refusal,
    this_holder,
)
from sessionize_assets.resources.manifest_table import records_by_item as _records_by_item

__all__ = [
    "BUCKETS",
    "COLUMNS",
    "MAX_ATTEMPTS",
    "OPERATOR",
    "LockLostError",
    "ManifestConflictError",
    "ManifestStateError",
    "ProcessingManifest",
    "asset_item",
    "is_commit_conflict",
    "item_bucket",
    "item_state",
    "item_states",
    "last_processed_payload",
    "open_table",
    "operator_run_id",
    "pid_alive",
    "read_records",
    "this_holder",
]

log = logging.getLogger(__name__)

"""Partitions of the manifest table (fixed at creation; stored as `sessionize.manifest.buckets`)."""

_ONE_MICROSECOND = dt.timedelta(microseconds=1)


# The table's columns: (name, type, nullable), the one list both schemas below come from.
_FIELDS = (
    ("record_id", "string", False),
    ("item_id", "string", False),
    ("application", "string", False),
    ("state", "string", False),
    ("run_id", "string", False),
    ("previous_record_id", "string", True),
    ("payload", "string", True),
    ("time", "timestamp", False),
    ("item_bucket", "int", False),
)


def spark_schema():  # noqa: ANN202 - pyspark types are imported lazily
    from pyspark.sql import types as T

    kinds = {"string": T.StringType(), "timestamp": T.TimestampType(), "int": T.IntegerType()}
    return T.StructType([T.StructField(n, kinds[k], nullable) for n, k, nullable in _FIELDS])


def _arrow_records(records: Iterable[Record]) -> pa.Table:
    """Records as rows of the table (the schema Spark created it with)."""
    kinds = {"string": pa.string(), "timestamp": pa.timestamp("us", tz="UTC"), "int": pa.int32()}
    schema = pa.schema([pa.field(n, kinds[k], nullable) for n, k, nullable in _FIELDS])
    return pa.Table.from_pylist(
        [
            {
                "record_id": r.record_id,
                "item_id": r.item_id,
                "application": r.application,
                "state": r.state.value,
                "run_id": r.run_id,
                "previous_record_id": r.previous_record_id,
                "payload": r.payload_json,
                "time": r.time,
                "item_bucket": item_bucket(r.item_id),
            }
            for r in records
        ],
        schema=schema,
    )


class ProcessingManifest(OperatorActions):
    """Writes to the processing manifest at `path` with Spark; see the module docstring.

    `clock` gives record times (inject it for replays); `application` and `run_id` of operator
    actions default to "operator" and a fresh id.
    """

    def __init__(
        self,
        spark: Any,
        path: str,
        *,
        clock: Callable[[], dt.datetime] = utc_now,
        max_attempts: int = MAX_ATTEMPTS,
        run_status: Callable[[str], str | None] | None = None,
    ) -> None:
        self.spark = spark
        self.path = path
        self.clock = clock
        # The status of a Dagster run by id (None when unknown): lets `heal` see dead holders.
        self.run_status = run_status or (lambda _run_id: None)
        self.max_attempts = max_attempts
        self.conflicts = 0  # commits another writer beat so far (retried)
        self._ready = False

    # ------------------------------------------------------------------ table

    def ensure_table(self) -> None:
        """Create the table if absent (concurrent creators: one wins, the others see it)."""
        if self._ready:
            return
        for attempt in range(self.max_attempts):
            if exists(self.path):
                self._ready = True
                return
            try:
                create_table(
                    self.spark,
                    self.path,
                    spark_schema(),
                    partitioned_by=["item_bucket"],
                    properties={
                        "delta.appendOnly": "true",
                        "delta.enableDeletionVectors": "false",
                        "sessionize.manifest.buckets": str(BUCKETS),
                    },
                    comment="sessionize processing manifest: append-only records (seed 003)",
                )
            except Exception as exc:  # a concurrent creator won: look again
                if attempt + 1 >= self.max_attempts:
                    raise
                log.debug("manifest creation raced (%s); retrying", exc)
            else:
                # `IF NOT EXISTS` also returns when a concurrent creator has begun the table but
                # not committed its first version yet: ready only once a version is visible.
                if exists(self.path):
                    self._ready = True
                    return
                log.debug("manifest created by another process, not visible yet; looking again")
            time.sleep(0.05 + random.random() * 0.2)
        if not exists(self.path):
            raise RuntimeError(
                f"the processing manifest at {self.path} could not be created or read after "
                f"{self.max_attempts} attempts."
            )
        self._ready = True

    def records(self, item: str) -> list[Record]:
        """The item's records at the table's latest version (read with delta-rs: fast, no job).

        The snapshot may lag the one the MERGE reads; the MERGE's condition catches that.
        """
        self.ensure_table()
        return read_records(self.path, item=item)

    def state(self, item: str, now: dt.datetime | None = None) -> ItemState:
        """The item's derived state, read now (delta-rs)."""
        return derive_item_state(self.records(item), now or self.clock(), item_id=item)

    # ------------------------------------------------------------------ the one write path

    def _snapshot(self, items: Iterable[str]) -> tuple[Any, dict[str, list[Record]]]:
        """The table at its latest version (delta-rs) and the records of `items` in it, by item.
        A write built from them is committed as the very next version or not at all."""
        self.ensure_table()
        table = open_table(self.path)
        if table is None:  # created by another process whose first commit is not visible yet
            self._ready = False
            self.ensure_table()
            table = open_table(self.path)
        return table, _records_by_item(table, items)

    def _read_items(self, items: Iterable[str]) -> dict[str, list[Record]]:
        """The records of `items` (delta-rs, one read of their buckets), by item."""
        return self._snapshot(items)[1]

    def records_of(self, items: Iterable[str]) -> dict[str, list[Record]]:
        """The records of `items` (delta-rs), by item; items without records are left out."""
        return {item: records for item, records in self._read_items(items).items() if records}

    def _append(self, item: str, build: Callable[[ItemState], Record | None]) -> Record | None:
        """Derive the item's state, build the next record from it and commit it conditionally.

        `build` raises when the record is illegal in that state, or returns None when there is
        nothing to write. Retries when another writer committed first, re-deriving each time.
        """
        return self._append_many({item: build}).get(item)

    def _append_many(
        self, builds: Mapping[str, Callable[[ItemState], Record | None]]
    ) -> dict[str, Record]:
        """The one write path: records for one or more items in one Delta commit.

        Every record is built from one snapshot of the items' records (`build` returns None when
        there is nothing to write for its item); a refusal (`build` raising) writes nothing. The
        records are appended as the version right after that snapshot's, or not at all: when
        any writer committed in between, the items are read again, built again and retried with
        back-off. Returns the records written, by item.
        """
        for attempt in range(self.max_attempts):
            table, seen_by_item = self._snapshot(builds)
            now = self.clock()
            records: dict[str, Record] = {}
            for item, build in builds.items():
                seen = seen_by_item.get(item, [])
                record = build(derive_item_state(seen, now, item_id=item))
                if record is None:  # nothing to write for this item
                    continue
                # Keep times strictly increasing per item: the fold's order is commit order.
                latest = max((r.time for r in seen), default=None)
                if latest is not None and record.time <= latest:
                    record = Record(**{**record.__dict__, "time": latest + _ONE_MICROSECOND})
                records[item] = record
            if not records:
                return {}
            try:
                append_at_version(table, _arrow_records(records.values()))
            except Exception as exc:
                if not is_commit_conflict(exc):
                    raise
                self.conflicts += 1
                log.debug(
                    "manifest conflict on %d items (attempt %d): %s", len(records), attempt + 1, exc
                )
                time.sleep(min(1.0, 0.02 * 2 ** min(attempt, 5)) * (0.5 + random.random()))
                continue
            # Every record is a file in its bucket: keep the log short and the buckets few files.
            checkpoint_on_interval(table)
            compact_when_fragmented(table)
            return records
        raise ManifestConflictError(
            f"Could not write a record for item(s) {', '.join(sorted(builds))} after "
            f"{self.max_attempts} attempts: other writers kept committing to the manifest first."
        )

    def _new_record(
        self,
        item: str,
        state: RecordState,
        application: str,
        run_id: str,
        previous: Record | None = None,
        payload: Mapping[str, Any] | None = None,
    ) -> Record:
        if state is RecordState.PROCESSING:  # who holds the lock, so a dead holder can be seen
            payload = {**(payload or {}), "holder": this_holder()}
        return Record(
            record_id=uuid.uuid4().hex,
            item_id=item,
            application=application,
            state=state,
            run_id=run_id,
            previous_record_id=previous.record_id if previous else None,
            payload=dict(payload) if payload else None,
            time=self.clock(),
        )

    # ------------------------------------------------------------------ records

    def lock(
        self, item: str, application: str, run_id: str, payload: Mapping[str, Any] | None = None
    ) -> Record:
        """Add Processing (take the lock) unless the item is locked, fail-locked, skipped or invalid.

        Raises ItemLockedError (one sentence naming the item and the holder's run) otherwise. A
        refusal by a lock whose holder is gone heals it (`heal`) and tries once more.
        """
        try:
            return self._lock(item, application, run_id, payload)
        except ItemLockedError:
            if not self.heal([item], run_id):
                raise
        return self._lock(item, application, run_id, payload)

    def _lock(
        self, item: str, application: str, run_id: str, payload: Mapping[str, Any] | None = None
    ) -> Record:

        def build(current: ItemState) -> Record:
            if current.status not in LOCKABLE:
                raise ItemLockedError(refusal(current, f"run {run_id} cannot lock it"))
            return self._new_record(
                item, RecordState.PROCESSING, application, run_id, payload=payload
            )

        record = self._append(item, build)
        assert record is not None
        return record

    def _close(
        self, lock_record: Record, state: RecordState, payload: Mapping[str, Any] | None
    ) -> Record:
        def build(current: ItemState) -> Record:
            if current.lock is None or current.lock.record_id != lock_record.record_id:
                raise LockLostError(
                    f"Run {lock_record.run_id} no longer holds the lock on item "
                    f"{lock_record.item_id} ({current.describe()}), so it cannot be marked "
                    f"{state.value}."
                )
            return self._new_record(
                lock_record.item_id,
                state,
                lock_record.application,
                lock_record.run_id,
                previous=lock_record,
                payload=payload,
            )

        record = self._append(lock_record.item_id, build)
        assert record is not None
        return record

    def complete(self, lock_record: Record, payload: Mapping[str, Any] | None = None) -> Record:
        """Add Processed referring to the lock (releases it)."""
        return self._close(lock_record, RecordState.PROCESSED, payload)

    def fail(
        self, lock_record: Record, reason: str, payload: Mapping[str, Any] | None = None
    ) -> Record:
        """Add Failed referring to the lock: the item stays fail-locked until resolved."""
        return self._close(lock_record, RecordState.FAILED, {**(payload or {}), "reason": reason})

    @contextmanager
    def processing(
        self,
        item: str,
        application: str,
        run_id: str,
        payload: Mapping[str, Any] | None = None,
    ) -> Iterator[dict[str, Any]]:
        """Lock the item, yield a payload dict to fill, then complete (or fail with the error).

        The Processed record carries the dict; a Failed one carries it plus `reason`
        (`<ExceptionType>: <message>`), and the exception propagates.
        """
        lock_record = self.lock(item, application, run_id, payload)
        result: dict[str, Any] = {}
        try:
            yield result
        except BaseException as exc:
            reason = f"{type(exc).__name__}: {exc}".strip()
            try:
                self.fail(lock_record, reason[:2000], payload=jsonable(result))
            except Exception as failure:  # keep the original error; say the manifest is stuck
                exc.add_note(
                    f"Recording the failure of {item} in the processing manifest failed: {failure}"
                )
            raise
        self.complete(lock_record, payload=jsonable(result))

    def lock_many(self, items: Sequence[str], application: str, run_id: str) -> dict[str, Record]:
        """Take the locks of all `items` in one commit, or none: raises ItemLockedError (naming
        the first item refused and its holder's run) without writing when any is not lockable.
        A refusal by a lock whose holder is gone heals it (`heal`) and tries once more."""
        try:
            return self._lock_many(items, application, run_id)
        except ItemLockedError:
            if not self.heal(items, run_id):
                raise
        return self._lock_many(items, application, run_id)

    def _lock_many(self, items: Sequence[str], application: str, run_id: str) -> dict[str, Record]:

        def build_for(item: str) -> Callable[[ItemState], Record]:
            def build(current: ItemState) -> Record:
                if current.status not in LOCKABLE:
                    raise ItemLockedError(refusal(current, f"run {run_id} cannot lock it"))
                return self._new_record(item, RecordState.PROCESSING, application, run_id)

            return build

        return self._append_many({item: build_for(item) for item in items})

    def close_many(
        self,
        locks: Mapping[str, Record],
        state: RecordState,
        payloads: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> dict[str, Record]:
        """Processed or Failed records referring to each lock, in one commit (LockLostError when
        a lock is no longer held, e.g. an operator abandoned it)."""

        def build_for(lock_record: Record) -> Callable[[ItemState], Record]:
            def build(current: ItemState) -> Record:
                if current.lock is None or current.lock.record_id != lock_record.record_id:
                    raise LockLostError(
                        f"Run {lock_record.run_id} no longer holds the lock on item "
                        f"{lock_record.item_id} ({current.describe()}), so it cannot be marked "
                        f"{state.value}."
                    )
                return self._new_record(
                    lock_record.item_id,
                    state,
                    lock_record.application,
                    lock_record.run_id,
                    previous=lock_record,
                    payload=(payloads or {}).get(lock_record.item_id),
                )

            return build

        return self._append_many({item: build_for(r) for item, r in locks.items()})

    @contextmanager
    def processing_many(
        self, items: Sequence[str], application: str, run_id: str
    ) -> Iterator[list[dict[str, Any]]]:
        """`processing` for several items: all locks in one commit, a payload dict per item
        (in the order given), then all Processed (or all Failed with the error) in one commit."""
        locks = self.lock_many(items, application, run_id)
        results: list[dict[str, Any]] = [{} for _ in items]
        try:
            yield results
        except BaseException as exc:
            reason = f"{type(exc).__name__}: {exc}".strip()[:2000]
            payloads = {
                item: {**jsonable(result), "reason": reason}
                for item, result in zip(items, results, strict=True)
            }
            try:
                self.close_many(locks, RecordState.FAILED, payloads)
            except Exception as failure:
                exc.add_note(
                    f"Recording the failure of {', '.join(items)} in the processing manifest "
                    f"failed: {failure}"
                )
            raise
        self.close_many(
            locks,
            RecordState.PROCESSED,
            {item: jsonable(result) for item, result in zip(items, results, strict=True)},
        )


# ---------------------------------------------------------------------- readers (delta-rs)
