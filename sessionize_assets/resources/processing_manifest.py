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
import os
import random
import socket
import time
import uuid
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from sessionize_assets.core.clock import to_micros, utc_now
from sessionize_assets.core.manifest_state import (
    LOCKABLE,
    SKIPPABLE,
    ItemState,
    ItemStatus,
    Record,
    RecordState,
    derive_item_state,
    derive_item_states,
    holder_gone,
    record_order,
)
from sessionize_assets.errors import ItemLockedError, UserError

log = logging.getLogger(__name__)

BUCKETS = 16
"""Partitions of the manifest table (fixed at creation; stored as `sessionize.manifest.buckets`)."""

COLUMNS = (
    "record_id",
    "item_id",
    "application",
    "state",
    "run_id",
    "previous_record_id",
    "payload",
    "time",
    "item_bucket",
)
OPERATOR = "operator"
MAX_ATTEMPTS = 40
_ONE_MICROSECOND = dt.timedelta(microseconds=1)


class ManifestStateError(UserError):
    """The record asked for is not legal in the item's current state (nothing to resolve, ...)."""


class LockLostError(ManifestStateError):
    """A run tried to close a lock that is no longer open (an operator abandoned it)."""


class ManifestConflictError(UserError):
    """Writers kept conflicting on the same partition of the manifest past the retry limit."""


def item_bucket(item_id: str) -> int:
    """The partition of an item: crc32 of its id modulo BUCKETS (same in Spark and delta-rs)."""
    return zlib.crc32(item_id.encode("utf-8")) % BUCKETS


def asset_item(asset: str, partition_key: str | None = None) -> str:
    """The item id of an asset partition, `filtered_events/2024-03-01` (unpartitioned: the name)."""
    return asset if partition_key is None else f"{asset}/{partition_key}"


def is_commit_conflict(exc: BaseException) -> bool:
    """True for Delta's optimistic-concurrency failures (a retry may succeed)."""
    try:
        from delta import exceptions as delta_errors

        kinds: tuple[type[BaseException], ...] = (
            delta_errors.ConcurrentAppendException,
            delta_errors.ConcurrentDeleteReadException,
            delta_errors.ConcurrentWriteException,
            delta_errors.DeltaConcurrentModificationException,
            delta_errors.MetadataChangedException,
            delta_errors.ProtocolChangedException,
        )
    except ImportError:  # pragma: no cover - delta-spark is a dependency
        kinds = ()
    if isinstance(exc, kinds):
        return True
    text = str(exc)
    return any(
        marker in text
        for marker in (
            "DELTA_CONCURRENT",
            "ConcurrentAppendException",
            "ConcurrentDeleteReadException",
            "ConcurrentWriteException",
            "ProtocolChangedException",
            "MetadataChangedException",
            "DELTA_METADATA_CHANGED",
            "DELTA_PROTOCOL_CHANGED",
        )
    )


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


class ProcessingManifest:
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
        from delta.tables import DeltaTable

        for attempt in range(self.max_attempts):
            if DeltaTable.isDeltaTable(self.spark, self.path):
                self._ready = True
                return
            try:
                (
                    DeltaTable.createIfNotExists(self.spark)
                    .location(self.path)
                    .addColumns(_spark_schema())
                    .partitionedBy("item_bucket")
                    .property("delta.appendOnly", "true")
                    .property("delta.enableDeletionVectors", "false")
                    .property("sessionize.manifest.buckets", str(BUCKETS))
                    .comment("sessionize processing manifest: append-only records (seed 003)")
                    .execute()
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
        from delta.tables import DeltaTable

        self.ensure_table()
        for attempt in range(self.max_attempts):
            try:
                DeltaTable.forPath(self.spark, self.path).optimize().executeCompaction()
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
        from delta.tables import DeltaTable
        from pyspark.sql import functions as F
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
            condition = (
                F.col("t.item_bucket").isin(buckets)
                & F.col("t.item_id").isin(sorted(records))
                & (F.col("t.item_bucket") == F.col("s.item_bucket"))
                & (F.col("t.item_id") == F.col("s.item_id"))
                & ~F.array_contains(F.col("s.seen"), F.col("t.record_id"))
            )
            values = {c: F.col(f"s.{c}") for c in COLUMNS if c != "time"}
            values["time"] = F.timestamp_micros(F.col("s.micros"))
            try:
                result = (
                    DeltaTable.forPath(self.spark, self.path)
                    .alias("t")
                    .merge(source.alias("s"), condition)
                    .whenNotMatchedInsert(values=values)
                    .execute()
                )
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
            inserted = result.first()["num_inserted_rows"]
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

    def discover(
        self, item: str, application: str, run_id: str, payload: Mapping[str, Any] | None = None
    ) -> Record | None:
        """Add New if the item has no records yet (else nothing: returns None)."""

        def build(current: ItemState) -> Record | None:
            if current.records:
                return None
            return self._new_record(item, RecordState.NEW, application, run_id, payload=payload)

        return self._append(item, build)

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
                raise ItemLockedError(_refusal(current, f"run {run_id} cannot lock it"))
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

    def abandon(
        self,
        item: str,
        reason: str = "abandoned",
        *,
        application: str = OPERATOR,
        run_id: str | None = None,
        holder_run_id: str | None = None,
    ) -> Record:
        """Fail the open lock of a crashed run (Failed referring to its Processing record).

        With `holder_run_id`, only that run's lock is abandoned. Resolve the item afterwards.
        """
        operator_run = run_id or _operator_run_id()

        def build(current: ItemState) -> Record:
            if current.status is not ItemStatus.LOCKED or current.lock is None:
                raise ManifestStateError(
                    f"Item {item} has no lock to abandon ({current.describe()})."
                )
            if holder_run_id is not None and current.lock.run_id != holder_run_id:
                raise ManifestStateError(
                    f"Item {item} is locked by run {current.lock.run_id}, not {holder_run_id}."
                )
            return self._new_record(
                item,
                RecordState.FAILED,
                application,
                operator_run,
                previous=current.lock,
                payload={"reason": reason, "abandoned_run_id": current.lock.run_id},
            )

        record = self._append(item, build)
        assert record is not None
        return record

    def resolve(
        self, item: str, reason: str, *, application: str = OPERATOR, run_id: str | None = None
    ) -> Record:
        """Add Resolved referring to the open Failed record: the item may be locked again."""
        operator_run = run_id or _operator_run_id()

        def build(current: ItemState) -> Record:
            if current.status is not ItemStatus.FAIL_LOCKED or current.failure is None:
                raise ManifestStateError(
                    f"Item {item} has no failure to resolve ({current.describe()})."
                )
            return self._new_record(
                item,
                RecordState.RESOLVED,
                application,
                operator_run,
                previous=current.failure,
                payload={"reason": reason},
            )

        record = self._append(item, build)
        assert record is not None
        return record

    def resolve_run(self, run: str, reason: str) -> dict[str, str]:
        """Release every item run `run` holds or left fail-locked: its locks are abandoned
        (Failed), then every failure of it is Resolved, in two commits. {item: what was done}."""
        operator_run = _operator_run_id()
        states = item_states(self.path, now=self.clock()) if open_table(self.path) else {}
        held = {
            item: s.lock
            for item, s in states.items()
            if s.status is ItemStatus.LOCKED and s.lock is not None and s.lock.run_id == run
        }

        def abandon_for(lock: Record) -> Callable[[ItemState], Record | None]:
            def build(current: ItemState) -> Record | None:
                if current.lock is None or current.lock.record_id != lock.record_id:
                    return None
                return self._new_record(
                    lock.item_id,
                    RecordState.FAILED,
                    OPERATOR,
                    operator_run,
                    previous=lock,
                    payload={"reason": f"abandoned: {reason}", "abandoned_run_id": run},
                )

            return build

        abandoned = self._append_many({i: abandon_for(r) for i, r in held.items()}) if held else {}
        states = item_states(self.path, now=self.clock())

        def of_run(state: ItemState) -> bool:
            failure = state.failure
            return failure is not None and (
                failure.run_id == run or (failure.payload or {}).get("abandoned_run_id") == run
            )

        failed = {
            item: s.failure
            for item, s in states.items()
            if s.status is ItemStatus.FAIL_LOCKED and s.failure is not None and of_run(s)
        }

        def resolve_for(failure: Record) -> Callable[[ItemState], Record | None]:
            def build(current: ItemState) -> Record | None:
                if current.failure is None or current.failure.record_id != failure.record_id:
                    return None
                return self._new_record(
                    failure.item_id,
                    RecordState.RESOLVED,
                    OPERATOR,
                    operator_run,
                    previous=failure,
                    payload={"reason": reason},
                )

            return build

        resolved = (
            self._append_many({i: resolve_for(r) for i, r in failed.items()}) if failed else {}
        )
        return {
            item: ("lock abandoned and resolved" if item in abandoned else "failure resolved")
            for item in resolved
        }

    def skip(
        self, item: str, reason: str, *, application: str = OPERATOR, run_id: str | None = None
    ) -> Record:
        """Add Skipped: no application touches the item again (not while it is locked)."""
        operator_run = run_id or _operator_run_id()

        def build(current: ItemState) -> Record:
            if current.status not in SKIPPABLE:
                raise ItemLockedError(_refusal(current, "it cannot be skipped"))
            return self._new_record(
                item, RecordState.SKIPPED, application, operator_run, payload={"reason": reason}
            )

        record = self._append(item, build)
        assert record is not None
        return record

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
                self.fail(lock_record, reason[:2000], payload=_jsonable(result))
            except Exception as failure:  # keep the original error; say the manifest is stuck
                exc.add_note(
                    f"Recording the failure of {item} in the processing manifest failed: {failure}"
                )
            raise
        self.complete(lock_record, payload=_jsonable(result))

    def heal(self, items: Iterable[str], run_id: str) -> dict[str, str]:
        """Abandon and release the locks among `items` whose holder is gone (`holder_gone`: its
        process died on this host, its Dagster run ended, or the lease ran out), recording why
        in the manifest's history (Failed, then Resolved, by `run_id`). Returns {item: reason}.
        Costs one delta-rs read; two commits only when there is something to heal."""
        now = self.clock()
        host = socket.gethostname()
        gone: dict[str, tuple[Record, str]] = {}
        for item, records in _records_by_item(self.path, items).items():
            current = derive_item_state(records, now, item_id=item)
            if current.status is ItemStatus.LOCKED and current.lock is not None:
                why = holder_gone(current.lock, now, host, pid_alive, self.run_status)
                if why is not None:
                    gone[item] = (current.lock, why)
        if not gone:
            return {}

        def abandon_for(item: str, lock: Record, why: str) -> Callable[[ItemState], Record | None]:
            def build(current: ItemState) -> Record | None:
                if current.lock is None or current.lock.record_id != lock.record_id:
                    return None  # someone else moved it meanwhile: leave it alone
                return self._new_record(
                    item,
                    RecordState.FAILED,
                    "sessionize (self-healing)",
                    run_id,
                    previous=lock,
                    payload={
                        "reason": f"lock abandoned automatically: {why}",
                        "abandoned_run_id": lock.run_id,
                    },
                )

            return build

        failed = self._append_many(
            {item: abandon_for(item, lock, why) for item, (lock, why) in gone.items()}
        )

        def resolve_for(failure: Record) -> Callable[[ItemState], Record | None]:
            def build(current: ItemState) -> Record | None:
                if current.failure is None or current.failure.record_id != failure.record_id:
                    return None
                return self._new_record(
                    failure.item_id,
                    RecordState.RESOLVED,
                    "sessionize (self-healing)",
                    run_id,
                    previous=failure,
                    payload={"reason": "abandoned lock released; the item is processed again"},
                )

            return build

        self._append_many({item: resolve_for(record) for item, record in failed.items()})
        healed = {item: gone[item][1] for item in failed}
        for item, why in healed.items():
            log.warning("processing manifest: %s: lock abandoned automatically (%s)", item, why)
        return healed

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
                    raise ItemLockedError(_refusal(current, f"run {run_id} cannot lock it"))
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
                item: {**_jsonable(result), "reason": reason}
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
            {item: _jsonable(result) for item, result in zip(items, results, strict=True)},
        )


class PartialAppendError(Exception):
    """A batched append wrote the records in `written`, then failed with `error`."""

    def __init__(self, written: dict[str, Record], error: BaseException) -> None:
        super().__init__(str(error))
        self.written = written
        self.error = error


def _records_by_item(path: str, items: Iterable[str]) -> dict[str, list[Record]]:
    """The records of `items` (delta-rs, reading only their buckets), grouped by item."""
    wanted = sorted(set(items))
    table = open_table(path)
    if table is None or not wanted:
        return {}
    buckets = sorted({str(item_bucket(i)) for i in wanted})
    columns = [c for c in COLUMNS if c != "item_bucket"]
    rows = table.to_pyarrow_table(
        partitions=[("item_bucket", "in", buckets)],
        columns=columns,
        filters=[("item_id", "in", wanted)],
    ).to_pylist()
    grouped: dict[str, list[Record]] = {}
    keep = set(wanted)
    for row in rows:
        record = Record.from_row(row)
        if record.item_id in keep:
            grouped.setdefault(record.item_id, []).append(record)
    return {item: sorted(rs, key=record_order) for item, rs in grouped.items()}


def _jsonable(payload: Mapping[str, Any]) -> dict[str, Any]:
    return {str(k): v for k, v in payload.items()}


def _operator_run_id() -> str:
    return f"operator-{uuid.uuid4().hex[:12]}"


def this_holder() -> dict[str, Any]:
    """This process, as a lock's holder: host and process id."""
    return {"host": socket.gethostname(), "pid": os.getpid()}


def pid_alive(pid: int) -> bool:
    """True while process `pid` exists on this host (a zombie counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(") ", 1)[1][:1] != "Z"
    except (OSError, IndexError):
        return True


def _refusal(current: ItemState, consequence: str) -> str:
    """`Item X is locked by run R (app) for 3s; run S cannot lock it. <how to recover>`"""
    text = current.describe()
    hint = recovery_hint(current)
    return f"{text[0].upper()}{text[1:]}; {consequence}" + (f"; {hint}" if hint else ".")


def recovery_hint(current: ItemState) -> str:
    """What the user can do about an item that refuses a lock, in one sentence."""
    if current.status is ItemStatus.LOCKED:
        return (
            "it is released when that run ends, or by the next run if that run died "
            f"(`sessionize manifest resolve --run {current.holder_run_id} --reason TEXT` "
            "releases it now)."
        )
    if current.status is ItemStatus.FAIL_LOCKED:
        return (
            "fix the cause, then release it with `sessionize manifest resolve "
            f"{current.item_id} --reason TEXT` (or every item of that run with --run "
            f"{current.holder_run_id})."
        )
    return ""


# ---------------------------------------------------------------------- readers (delta-rs)


def open_table(path: str):  # noqa: ANN202
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        return DeltaTable(path)
    except TableNotFoundError:
        return None


def read_records(
    path: str, item_prefix: str | None = None, item: str | None = None
) -> list[Record]:
    """Records via delta-rs (no Spark) by item and time; optionally of one item or an id prefix."""
    table = open_table(path)
    if table is None:
        return []
    partitions = [("item_bucket", "=", str(item_bucket(item)))] if item is not None else None
    filters = [("item_id", "=", item)] if item is not None else None
    columns = [c for c in COLUMNS if c != "item_bucket"]
    rows = table.to_pyarrow_table(
        partitions=partitions, columns=columns, filters=filters
    ).to_pylist()
    records = [Record.from_row(row) for row in rows]
    if item is not None:
        records = [r for r in records if r.item_id == item]
    if item_prefix:
        records = [r for r in records if r.item_id.startswith(item_prefix)]
    return sorted(records, key=lambda r: (r.item_id, *record_order(r)))


def item_states(
    path: str, prefix: str | None = None, now: dt.datetime | None = None
) -> dict[str, ItemState]:
    """Every item's derived state (delta-rs), keyed by item id; `now` defaults to the clock."""
    return derive_item_states(read_records(path, item_prefix=prefix), now or utc_now())


def item_state(path: str, item: str, now: dt.datetime | None = None) -> ItemState:
    """One item's derived state (delta-rs, reads one bucket)."""
    return derive_item_state(read_records(path, item=item), now or utc_now(), item_id=item)


def last_processed_payload(path: str, item: str) -> dict[str, Any] | None:
    """The payload of the item's latest Processed record (None if never processed)."""
    processed = [r for r in read_records(path, item=item) if r.state is RecordState.PROCESSED]
    if not processed:
        return None
    latest = max(processed, key=lambda r: (r.time, r.record_id))
    return latest.payload or {}
