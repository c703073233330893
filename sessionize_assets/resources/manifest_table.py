"""The processing manifest's table: its layout (bucketed by item), its errors, who holds a lock,
and the readers that need no Spark (delta-rs): `read_records`, `item_states`, `item_state`,
`last_processed_payload`. The writer is `resources/processing_manifest.py`.
"""

from __future__ import annotations

import datetime as dt
import os
import socket
import uuid
import zlib
from collections.abc import Iterable, Mapping
from typing import Any

from sessionize_assets.core.clock import utc_now
from sessionize_assets.core.manifest_state import (
    ItemState,
    ItemStatus,
    Record,
    RecordState,
    derive_item_state,
    derive_item_states,
    record_order,
)
from sessionize_assets.errors import UserError

BUCKETS = 16


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
    try:  # delta-rs: another writer took the version a compare-and-swap append wanted
        from deltalake.exceptions import CommitFailedError

        if isinstance(exc, CommitFailedError):
            return True
    except ImportError:  # pragma: no cover - deltalake is a dependency
        pass
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


def refusal(current: ItemState, consequence: str) -> str:
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


def operator_run_id() -> str:
    return f"operator-{uuid.uuid4().hex[:12]}"


def jsonable(payload: Mapping[str, Any]) -> dict[str, Any]:
    return {str(k): v for k, v in payload.items()}


def records_by_item(path_or_table: Any, items: Iterable[str]) -> dict[str, list[Record]]:
    """The records of `items` (delta-rs, reading only their buckets), grouped by item; from the
    table at `path_or_table`'s latest version, or from an opened `DeltaTable` at its version."""
    wanted = sorted(set(items))
    table = open_table(path_or_table) if isinstance(path_or_table, str) else path_or_table
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
