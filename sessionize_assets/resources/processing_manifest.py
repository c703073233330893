"""The processing manifest: an append-only Delta table of records, with locks that are real.

Writers (Spark) add records through one path, `_append_many` (`_append` for one item): read the
items' records, derive each item's state (`core.manifest_state`), build its next record (or
refuse), then commit them all with one **insert-only MERGE** whose condition reads the items'
records:

    MERGE INTO manifest t USING (the new records + the ids of the records each was built on) s
    ON t.item_bucket IN (<buckets>) AND t.item_id IN (<items>)
       AND t.item_bucket = s.item_bucket AND t.item_id = s.item_id
       AND NOT array_contains(s.seen, t.record_id)
    WHEN NOT MATCHED THEN INSERT ...

The insert happens only if the item has no record the writer did not see (a compare-and-swap on
the item's history), and because the MERGE *reads* the item's partition, Delta's optimistic
concurrency rejects it (ConcurrentAppendException) when another writer committed a record to
that partition after our snapshot. On a conflict or a missed swap the writer re-reads, derives
the state again and either retries (the other record was for another item, or did not change
what we may do) or fails with `ItemLockedError` naming the item and the holder's run. There is
no check followed by a blind append anywhere.

The table is partitioned by `item_bucket` (crc32 of the item id modulo `BUCKETS`): Delta's
conflict detection works on partitions, so writers of items in different buckets never conflict,
and readers of one item (delta-rs or Spark) prune to one bucket. `delta.appendOnly` is on; no
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

from sessionize_assets.core.clock import to_micros, utc_now
from sessionize_assets.core.manifest_state import (
    LOCKABLE,
    ItemState,
    Record,
    RecordState,
    derive_item_state,
)
from sessionize_assets.errors import ItemLockedError
from sessionize_assets.resources.delta import create_table, exists, merge_into, optimize, quoted
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
    "PartialAppendError",
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


def _spark_schema():  # noqa: ANN202 - pyspark types are imported lazily
    from pyspark.sql import types as T

    return T.StructType(
        [
            T.StructField("record_id", T.StringType(), False),
            T.StructField("item_id", T.StringType(), False),
            T.StructField("application", T.StringType(), False),
            T.StructField("state", T.StringType(), False),
            T.StructField("run_id", T.StringType(), False),
            T.StructField("previous_record_id", T.StringType(), True),
            T.StructField("payload", T.StringType(), True),
            T.StructField("time", T.TimestampType(), False),
            T.StructField("item_bucket", T.IntegerType(), False),
        ]
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
        self.conflicts = 0  # Delta commit conflicts met so far (retried)
        self.missed_swaps = 0  # MERGEs that inserted nothing because the item had changed
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
                    _spark_schema(),
                    partitioned_by=["item_bucket"],
                    properties={
                        "delta.appendOnly": "true",
                        "delta.enableDeletionVectors": "false",
                        "sessionize.manifest.buckets": str(BUCKETS),
                    },
                    comment="sessionize processing manifest: append-only records (seed 003)",
                )
                self._ready = True
                return
            except Exception as exc:  # a concurrent creator won: look again
                if attempt + 1 >= self.max_attempts:
                    raise
                log.debug("manifest creation raced (%s); retrying", exc)
                time.sleep(0.05 + random.random() * 0.2)

    def records(self, item: str) -> list[Record]:
        """The item's records at the table's latest version (read with delta-rs: fast, no job).

        The snapshot may lag the one the MERGE reads; the MERGE's condition catches that.
        """
        self.ensure_table()
        return read_records(self.path, item=item)

    def state(self, item: str, now: dt.datetime | None = None) -> ItemState:
        """The item's derived state, read now (delta-rs)."""
        return derive_item_state(self.records(item), now or self.clock(), item_id=item)

    def compact(self) -> None:
        """Bin-pack the small files the records leave (one per record); retried on conflicts."""
        self.ensure_table()
        for attempt in range(self.max_attempts):
            try:
                optimize(self.spark, self.path)
                return
            except Exception as exc:
                if not is_commit_conflict(exc) or attempt + 1 >= self.max_attempts:
                    raise
                self.conflicts += 1
                time.sleep(0.05 + random.random() * 0.2)

    # ------------------------------------------------------------------ the one write path

    def _read_items(self, items: Iterable[str]) -> dict[str, list[Record]]:
        """The records of `items` (delta-rs), by item: one item through `records`, several
        through one read of their buckets."""
        wanted = sorted(set(items))
        if len(wanted) == 1:
            return {wanted[0]: self.records(wanted[0])}
        self.ensure_table()
        return _records_by_item(self.path, wanted)

    def records_of(self, items: Iterable[str]) -> dict[str, list[Record]]:
        """The records of `items` (delta-rs), by item; items without records are left out."""
        return {item: records for item, records in self._read_items(items).items() if records}

    def _append(self, item: str, build: Callable[[ItemState], Record | None]) -> Record | None:
        """Derive the item's state, build the next record from it and commit it conditionally.

        `build` raises when the record is illegal in that state, or returns None when there is
        nothing to write. Retries on Delta conflicts and on missed swaps, re-deriving each time.
        """
        return self._append_many({item: build}).get(item)

    def _append_many(
        self, builds: Mapping[str, Callable[[ItemState], Record | None]]
    ) -> dict[str, Record]:
        """The one write path: records for one or more items in one MERGE (one Delta commit).

        Every record is built from one read of the items' records (`build` returns None when
        there is nothing to write for its item); a refusal (`build` raising) writes nothing. The
        MERGE inserts a record only where its item has no record the writer did not see; items
        whose swap missed are built again from a fresh read and retried, and Delta conflicts are
        retried with back-off. When a retry is refused after some records were written,
        `PartialAppendError` carries them. Returns the records written, by item.
        """
        from pyspark.sql import types as T

        self.ensure_table()
        written: dict[str, Record] = {}
        pending = dict(builds)
        for attempt in range(self.max_attempts):
            if not pending:
                return written
            seen_by_item = self._read_items(pending)
            now = self.clock()
            records: dict[str, Record] = {}
            try:
                for item, build in list(pending.items()):
                    seen = seen_by_item.get(item, [])
                    record = build(derive_item_state(seen, now, item_id=item))
                    if record is None:  # nothing to write for this item
                        pending.pop(item)
                        continue
                    # Keep times strictly increasing per item: the fold's order is commit order.
                    latest = max((r.time for r in seen), default=None)
                    if latest is not None and record.time <= latest:
                        record = Record(**{**record.__dict__, "time": latest + _ONE_MICROSECOND})
                    records[item] = record
            except Exception as exc:
                if written:
                    raise PartialAppendError(written, exc) from exc
                raise
            if not records:
                return written
            source_schema = T.StructType(
                [f for f in _spark_schema().fields if f.name != "time"]
                + [
                    T.StructField("micros", T.LongType(), False),
                    T.StructField("seen", T.ArrayType(T.StringType(), False), False),
                ]
            )
            source = self.spark.createDataFrame(
                [
                    (
                        r.record_id,
                        r.item_id,
                        r.application,
                        r.state.value,
                        r.run_id,
                        r.previous_record_id,
                        r.payload_json,
                        item_bucket(item),
                        to_micros(r.time),
                        [x.record_id for x in seen_by_item.get(item, [])],
                    )
                    for item, r in records.items()
                ],
                source_schema,
            )
            buckets = sorted({item_bucket(item) for item in records})
            insert_columns = [c for c in COLUMNS if c != "time"]
            statement = (
                f"ON t.item_bucket IN ({', '.join(str(b) for b in buckets)}) "
                f"AND t.item_id IN ({', '.join(quoted(i) for i in sorted(records))}) "
                "AND t.item_bucket = s.item_bucket AND t.item_id = s.item_id "
                "AND NOT array_contains(s.seen, t.record_id) "
                f"WHEN NOT MATCHED THEN INSERT ({', '.join(insert_columns)}, time) "
                f"VALUES ({', '.join(f's.{c}' for c in insert_columns)}, "
                "timestamp_micros(s.micros))"
            )
            try:
                result = merge_into(self.spark, self.path, source, statement)
            except Exception as exc:
                if not is_commit_conflict(exc):
                    if written:
                        raise PartialAppendError(written, exc) from exc
                    raise
                self.conflicts += 1
                log.debug(
                    "manifest conflict on %d items (attempt %d): %s", len(records), attempt + 1, exc
                )
                time.sleep(min(1.0, 0.02 * 2 ** min(attempt, 5)) * (0.5 + random.random()))
                continue
            inserted = result["num_inserted_rows"]
            if inserted == len(records):
                written.update(records)
                return written
            # Some items gained a record between our read and the MERGE's snapshot: keep the
            # records that landed, build the others again.
            self.missed_swaps += len(records) - inserted
            if inserted == 0:
                continue
            landed = self._read_items(records)
            for item, record in records.items():
                if any(r.record_id == record.record_id for r in landed.get(item, [])):
                    written[item] = record
                    pending.pop(item)
        error = ManifestConflictError(
            f"Could not write a record for item(s) {', '.join(sorted(pending))} after "
            f"{self.max_attempts} attempts: other writers kept changing their manifest partitions."
        )
        if written:
            raise PartialAppendError(written, error) from error
        raise error

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

        try:
            return self._append_many({item: build_for(item) for item in items})
        except PartialAppendError as partial:
            # A concurrent writer took one of the items between our read and a retry. Nothing was
            # processed: release what we hold (Failed with the reason, then Resolved by this run)
            # so the items are free again, and refuse like a lock that was never taken.
            reason = f"released unprocessed: {type(partial.error).__name__}: {partial.error}"
            failed = self.close_many(
                partial.written,
                RecordState.FAILED,
                {i: {"reason": reason} for i in partial.written},
            )
            self._append_many(
                {
                    item: (
                        lambda _current, f=record: self._new_record(
                            f.item_id,
                            RecordState.RESOLVED,
                            application,
                            run_id,
                            previous=f,
                            payload={"reason": reason},
                        )
                    )
                    for item, record in failed.items()
                }
            )
            raise partial.error from None

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

        try:
            return self._append_many({item: build_for(r) for item, r in locks.items()})
        except PartialAppendError as partial:
            raise partial.error from None

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


class PartialAppendError(Exception):
    """A batched append wrote the records in `written`, then failed with `error`."""

    def __init__(self, written: dict[str, Record], error: BaseException) -> None:
        super().__init__(str(error))
        self.written = written
        self.error = error


# ---------------------------------------------------------------------- readers (delta-rs)
