"""Processing-manifest records and the state of an item derived from them (SPEC section 7, seed 003).

The manifest is an append-only log of records. An item (a landed file, an asset partition such as
`filtered_events/2024-03-01`, a cursor) has no stored state: its state is a fold over its own
records, in time order.

Legal records (everything else makes the item *invalid*, with the reason reported):

| record     | refers to (previous_record_id)              | allowed when the item is   |
|------------|---------------------------------------------|----------------------------|
| New        | nothing; only as the item's first record    | without records            |
| Processing | nothing                                     | free or processed          |
| Processed  | the open Processing record (releases it)    | locked by that record      |
| Failed     | the open Processing record (fail-locks)     | locked by that record      |
| Resolved   | the open Failed record (releases the fail)  | fail-locked by that record |
| Skipped    | nothing                                     | free, processed, fail-locked |

After Skipped no record is legal: a skipped item is left alone.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from sessionize_assets.core.clock import as_utc


class RecordState(StrEnum):
    """The state a record declares (seed 003's names)."""

    NEW = "New"
    PROCESSING = "Processing"
    PROCESSED = "Processed"
    FAILED = "Failed"
    RESOLVED = "Resolved"
    SKIPPED = "Skipped"


class ItemStatus(StrEnum):
    """What an item's records add up to."""

    FREE = "free"  # no records, only New, or the last failure was resolved: may be locked
    LOCKED = "locked"  # a Processing record without its Processed/Failed: someone holds it
    FAIL_LOCKED = "fail-locked"  # a Failed record without Resolved: an operator must resolve it
    SKIPPED = "skipped"  # left alone for good
    PROCESSED = "processed"  # the last lock ended Processed: may be locked again (reprocessing)
    INVALID = "invalid"  # a record breaks the rules above (manual edits, lost races)


LOCKABLE = frozenset({ItemStatus.FREE, ItemStatus.PROCESSED})
"""Statuses in which a new Processing record is legal."""

SKIPPABLE = frozenset({ItemStatus.FREE, ItemStatus.PROCESSED, ItemStatus.FAIL_LOCKED})
"""Statuses in which a Skipped record is legal."""


def parse_payload(value: Mapping[str, Any] | str | None) -> dict[str, Any] | None:
    """A payload as a dict: JSON text is parsed, None and "" stay None."""
    if value is None or value == "":
        return None
    if isinstance(value, str):
        parsed = json.loads(value)
        return parsed if isinstance(parsed, dict) else {"value": parsed}
    return dict(value)


@dataclass(frozen=True)
class Record:
    """One row of the processing manifest."""

    record_id: str
    item_id: str
    application: str
    state: RecordState
    run_id: str
    previous_record_id: str | None
    payload: dict[str, Any] | None
    time: dt.datetime

    def __post_init__(self) -> None:
        object.__setattr__(self, "state", RecordState(self.state))
        object.__setattr__(self, "payload", parse_payload(self.payload))
        object.__setattr__(self, "time", as_utc(self.time))
        if self.previous_record_id == "":
            object.__setattr__(self, "previous_record_id", None)

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Record:
        """A record from a table row (payload as JSON text or dict; extra columns ignored)."""
        return cls(
            record_id=row["record_id"],
            item_id=row["item_id"],
            application=row["application"],
            state=RecordState(row["state"]),
            run_id=row["run_id"],
            previous_record_id=row.get("previous_record_id"),
            payload=row.get("payload"),
            time=row["time"],
        )

    @property
    def payload_json(self) -> str | None:
        """The payload as JSON text (keys sorted), as stored in the table."""
        if self.payload is None:
            return None
        return json.dumps(self.payload, sort_keys=True, default=str)

    @property
    def reason(self) -> str | None:
        """The payload's `reason` (Failed, Resolved, Skipped records carry one)."""
        if self.payload is None:
            return None
        value = self.payload.get("reason")
        return None if value is None else str(value)


def record_order(record: Record) -> tuple[dt.datetime, str]:
    """The order records are folded in: time, then record id (writers keep times increasing)."""
    return (record.time, record.record_id)


@dataclass(frozen=True)
class ItemState:
    """An item's state, derived from its records alone."""

    item_id: str
    status: ItemStatus
    records: tuple[Record, ...] = ()
    lock: Record | None = None  # the open Processing record (locked)
    failure: Record | None = None  # the open Failed record (fail-locked)
    skip: Record | None = None  # the Skipped record (skipped)
    last_processed: Record | None = None  # the latest Processed record, whatever came after
    problems: tuple[str, ...] = ()  # why the item is invalid
    now: dt.datetime | None = field(default=None, compare=False)

    @property
    def can_lock(self) -> bool:
        """True if a new Processing record would be legal."""
        return self.status in LOCKABLE

    @property
    def holder_run_id(self) -> str | None:
        """The run holding the lock (locked), or the run that failed (fail-locked)."""
        record = self.lock or self.failure
        return record.run_id if record else None

    @property
    def holder_application(self) -> str | None:
        record = self.lock or self.failure
        return record.application if record else None

    @property
    def lock_age(self) -> dt.timedelta | None:
        """How long the lock has been held (or the failure has been open), given `now`."""
        record = self.lock or self.failure
        if record is None or self.now is None:
            return None
        return self.now - record.time

    @property
    def last_record(self) -> Record | None:
        return self.records[-1] if self.records else None

    @property
    def reason(self) -> str | None:
        """One sentence on why the item is not free: the failure, skip or rule it breaks."""
        if self.status is ItemStatus.INVALID:
            return "; ".join(self.problems)
        if self.status is ItemStatus.LOCKED and self.lock is not None:
            return f"locked by run {self.lock.run_id} ({self.lock.application})"
        if self.status is ItemStatus.FAIL_LOCKED and self.failure is not None:
            return self.failure.reason or "failed"
        if self.status is ItemStatus.SKIPPED and self.skip is not None:
            return self.skip.reason or "skipped"
        return None

    def describe(self) -> str:
        """One sentence for messages and the command line."""
        age = self.lock_age
        age_text = f" for {format_age(age)}" if age is not None else ""
        if self.status is ItemStatus.LOCKED and self.lock is not None:
            return (
                f"item {self.item_id} is locked by run {self.lock.run_id} "
                f"({self.lock.application}){age_text}"
            )
        if self.status is ItemStatus.FAIL_LOCKED and self.failure is not None:
            return (
                f"item {self.item_id} is fail-locked since run {self.failure.run_id} "
                f"({self.failure.application}) failed{age_text}: {self.reason}"
            )
        if self.status is ItemStatus.SKIPPED:
            return f"item {self.item_id} is skipped: {self.reason}"
        if self.status is ItemStatus.INVALID:
            return f"item {self.item_id} is invalid: {self.reason}"
        return f"item {self.item_id} is {self.status.value}"


def format_age(age: dt.timedelta) -> str:
    """A lock age for people: `2d 3h`, `3h 12m`, `4m 5s`, `12s`."""
    seconds = max(0, int(age.total_seconds()))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h"
    if hours:
        return f"{hours}h {minutes}m"
    if minutes:
        return f"{minutes}m {secs}s"
    return f"{secs}s"


def derive_item_state(
    records: Iterable[Record], now: dt.datetime | None = None, item_id: str | None = None
) -> ItemState:
    """Fold an item's records (any order; sorted by time here) into its state.

    `now` only serves the lock age. Records of other items are a programming error.
    """
    ordered = tuple(sorted(records, key=record_order))
    ids = {r.item_id for r in ordered}
    if len(ids) > 1:
        raise ValueError(f"records of several items given: {sorted(ids)}")
    item = ordered[0].item_id if ordered else (item_id or "")
    when = as_utc(now) if now is not None else None

    by_id: dict[str, Record] = {}
    problems: list[str] = []
    all_ids = {r.record_id for r in ordered}
    lock: Record | None = None
    failure: Record | None = None
    skip: Record | None = None
    last_processed: Record | None = None
    outcome: RecordState | None = None  # the last Processed / Failed / Resolved

    def problem(text: str) -> None:
        problems.append(text)

    for record in ordered:
        name = f"{record.state.value} record {record.record_id}"
        if record.record_id in by_id:
            problem(f"record id {record.record_id} appears twice")
            continue
        previous_id = record.previous_record_id
        previous = by_id.get(previous_id) if previous_id else None
        by_id[record.record_id] = record
        if previous_id is not None and previous is None:
            where = "a later record" if previous_id in all_ids else "a missing record"
            problem(f"{name} refers to {where} {previous_id}")
            continue
        if skip is not None:
            problem(f"{name} comes after the item was skipped by {skip.record_id}")
            continue
        state = record.state
        if state in (RecordState.NEW, RecordState.PROCESSING, RecordState.SKIPPED):
            if previous is not None:
                problem(
                    f"{name} refers to {previous.state.value} record {previous.record_id} "
                    "(it must refer to no record)"
                )
                continue
        if state is RecordState.NEW:
            if len(by_id) > 1:
                problem(f"{name} is not the item's first record")
        elif state is RecordState.PROCESSING:
            if lock is not None:
                problem(f"{name} takes a lock while Processing record {lock.record_id} holds it")
            elif failure is not None:
                problem(
                    f"{name} takes a lock while Failed record {failure.record_id} is unresolved"
                )
            else:
                lock = record
        elif state in (RecordState.PROCESSED, RecordState.FAILED):
            if previous is None:
                problem(f"{name} refers to no record (it must refer to a Processing record)")
            elif previous.state is not RecordState.PROCESSING:
                problem(
                    f"{name} refers to {previous.state.value} record {previous.record_id} "
                    "(it must refer to a Processing record)"
                )
            elif lock is None or lock.record_id != previous.record_id:
                problem(
                    f"{name} refers to Processing record {previous.record_id}, which is not open"
                )
            else:
                lock = None
                outcome = state
                if state is RecordState.PROCESSED:
                    last_processed = record
                else:
                    failure = record
        elif state is RecordState.RESOLVED:
            if previous is None:
                problem(f"{name} refers to no record (it must refer to a Failed record)")
            elif previous.state is not RecordState.FAILED:
                problem(
                    f"{name} refers to {previous.state.value} record {previous.record_id} "
                    "(it must refer to a Failed record)"
                )
            elif failure is None or failure.record_id != previous.record_id:
                problem(f"{name} refers to Failed record {previous.record_id}, which is not open")
            else:
                failure = None
                outcome = state
        elif state is RecordState.SKIPPED:
            if lock is not None:
                problem(f"{name} skips the item while Processing record {lock.record_id} holds it")
            else:
                skip = record
                failure = None

    if problems:
        status = ItemStatus.INVALID
    elif lock is not None:
        status = ItemStatus.LOCKED
    elif failure is not None:
        status = ItemStatus.FAIL_LOCKED
    elif skip is not None:
        status = ItemStatus.SKIPPED
    elif outcome is RecordState.PROCESSED:
        status = ItemStatus.PROCESSED
    else:
        status = ItemStatus.FREE
    return ItemState(
        item_id=item,
        status=status,
        records=ordered,
        lock=lock if status is ItemStatus.LOCKED else None,
        failure=failure if status is ItemStatus.FAIL_LOCKED else None,
        skip=skip if status is ItemStatus.SKIPPED else None,
        last_processed=last_processed,
        problems=tuple(problems),
        now=when,
    )


def derive_item_states(
    records: Iterable[Record], now: dt.datetime | None = None
) -> dict[str, ItemState]:
    """Every item's state, keyed and ordered by item id."""
    grouped: dict[str, list[Record]] = {}
    for record in records:
        grouped.setdefault(record.item_id, []).append(record)
    return {item: derive_item_state(grouped[item], now) for item in sorted(grouped)}


# ------------------------------------------------------------------------ self-healing locks

LOCK_LEASE = dt.timedelta(hours=24)
"""A lock older than this is abandoned by the next run whatever its holder (no run takes that
long at this project's scale; a holder on another host cannot be checked otherwise)."""

DEAD_RUN_STATUSES = frozenset({"FAILURE", "CANCELED", "SUCCESS"})
"""Dagster run statuses after which a run holds nothing any more."""


def holder_of(lock: Record) -> dict[str, Any]:
    """The holder a Processing record names in its payload (`holder`: host, pid), or {}."""
    holder = (lock.payload or {}).get("holder")
    return dict(holder) if isinstance(holder, Mapping) else {}


def holder_gone(
    lock: Record,
    now: dt.datetime,
    this_host: str,
    pid_alive: Callable[[int], bool],
    run_status: Callable[[str], str | None] = lambda _run_id: None,
    lease: dt.timedelta = LOCK_LEASE,
) -> str | None:
    """Why the run holding `lock` is gone (so the next run may abandon the lock), or None while
    it may still be working. In order: its process on this host is dead; its Dagster run ended
    (`run_status` gives the run's status, None when unknown); the lock outlived the lease."""
    holder = holder_of(lock)
    pid = holder.get("pid")
    if holder.get("host") == this_host and isinstance(pid, int) and not pid_alive(pid):
        return f"its process {pid} on {this_host} is gone"
    status = run_status(lock.run_id)
    if status in DEAD_RUN_STATUSES:
        return f"its Dagster run {lock.run_id} ended ({status})"
    if now - lock.time > lease:
        return f"it is older than the lease ({format_age(lease)})"
    return None
