"""The processing manifest's actions beyond a run's own locks: an operator's (abandon, resolve,
resolve a whole run, skip), discovery, and healing the locks of holders that are gone. A mixin of
`ProcessingManifest`: every action goes through its one write path (`_append_many`).
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from sessionize_assets.core.manifest_state import (
    SKIPPABLE,
    ItemState,
    ItemStatus,
    Record,
    RecordState,
    derive_item_state,
    holder_gone,
)
from sessionize_assets.errors import ItemLockedError
from sessionize_assets.resources import manifest_table
from sessionize_assets.resources.manifest_table import (
    OPERATOR,
    ManifestStateError,
    item_states,
    open_table,
    operator_run_id,
    pid_alive,
    refusal,
)

log = logging.getLogger("sessionize_assets.resources.processing_manifest")


class OperatorActions:
    """Discover, abandon, resolve, resolve_run, skip and heal (see the module docstring)."""

    path: str
    clock: Callable[[], Any]
    run_status: Callable[[str], str | None]

    def discover(
        self, item: str, application: str, run_id: str, payload: Mapping[str, Any] | None = None
    ) -> Record | None:
        """Add New if the item has no records yet (else nothing: returns None)."""

        def build(current: ItemState) -> Record | None:
            if current.records:
                return None
            return self._new_record(item, RecordState.NEW, application, run_id, payload=payload)

        return self._append(item, build)

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
        operator_run = run_id or operator_run_id()

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
        operator_run = run_id or operator_run_id()

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
        operator_run = operator_run_id()
        states = item_states(self.path, now=self.clock()) if open_table(self.path) else {}
        held = {
            item: s.lock
            for item, s in states.items()
            if s.status is ItemStatus.LOCKED and s.lock is not None and s.lock.run_id == run
        }

        abandoned = self._abandon_locks(
            held, OPERATOR, operator_run, lambda _lock: {"reason": f"abandoned: {reason}"}
        )
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

        resolved = self._resolve_failures(failed, OPERATOR, operator_run, reason)
        return {
            item: ("lock abandoned and resolved" if item in abandoned else "failure resolved")
            for item in resolved
        }

    def skip(
        self, item: str, reason: str, *, application: str = OPERATOR, run_id: str | None = None
    ) -> Record:
        """Add Skipped: no application touches the item again (not while it is locked)."""
        operator_run = run_id or operator_run_id()

        def build(current: ItemState) -> Record:
            if current.status not in SKIPPABLE:
                raise ItemLockedError(refusal(current, "it cannot be skipped"))
            return self._new_record(
                item, RecordState.SKIPPED, application, operator_run, payload={"reason": reason}
            )

        record = self._append(item, build)
        assert record is not None
        return record

    def heal(self, items: Iterable[str], run_id: str) -> dict[str, str]:
        """Abandon and release the locks among `items` whose holder is gone (`holder_gone`: its
        process died on this host, its Dagster run ended, or the lease ran out), recording why
        in the manifest's history (Failed, then Resolved, by `run_id`). Returns {item: reason}.
        Costs one delta-rs read; two commits only when there is something to heal."""
        now = self.clock()
        host = socket.gethostname()
        gone: dict[str, tuple[Record, str]] = {}
        for item, records in manifest_table.records_by_item(self.path, items).items():
            current = derive_item_state(records, now, item_id=item)
            if current.status is ItemStatus.LOCKED and current.lock is not None:
                why = holder_gone(current.lock, now, host, pid_alive, self.run_status)
                if why is not None:
                    gone[item] = (current.lock, why)
        if not gone:
            return {}

        healing = "sessionize (self-healing)"
        failed = self._abandon_locks(
            {item: lock for item, (lock, _why) in gone.items()},
            healing,
            run_id,
            lambda lock: {"reason": f"lock abandoned automatically: {gone[lock.item_id][1]}"},
        )
        self._resolve_failures(
            failed, healing, run_id, "abandoned lock released; the item is processed again"
        )
        healed = {item: gone[item][1] for item in failed}
        for item, why in healed.items():
            log.warning("processing manifest: %s: lock abandoned automatically (%s)", item, why)
        return healed

    def _abandon_locks(
        self,
        locks: Mapping[str, Record],
        application: str,
        run_id: str,
        payload_for: Callable[[Record], dict[str, Any]],
    ) -> dict[str, Record]:
        """Failed records referring to each lock (with `abandoned_run_id`), in one commit; an
        item whose lock moved meanwhile is left alone. The Failed records written, by item."""

        def build_for(lock: Record) -> Callable[[ItemState], Record | None]:
            def build(current: ItemState) -> Record | None:
                if current.lock is None or current.lock.record_id != lock.record_id:
                    return None  # someone else moved it meanwhile: leave it alone
                return self._new_record(
                    lock.item_id,
                    RecordState.FAILED,
                    application,
                    run_id,
                    previous=lock,
                    payload={**payload_for(lock), "abandoned_run_id": lock.run_id},
                )

            return build

        return self._append_many({i: build_for(r) for i, r in locks.items()}) if locks else {}

    def _resolve_failures(
        self, failures: Mapping[str, Record], application: str, run_id: str, reason: str
    ) -> dict[str, Record]:
        """Resolved records referring to each open failure, in one commit (an item whose
        failure moved meanwhile is left alone). The Resolved records written, by item."""

        def build_for(failure: Record) -> Callable[[ItemState], Record | None]:
            def build(current: ItemState) -> Record | None:
                if current.failure is None or current.failure.record_id != failure.record_id:
                    return None
                return self._new_record(
                    failure.item_id,
                    RecordState.RESOLVED,
                    application,
                    run_id,
                    previous=failure,
                    payload={"reason": reason},
                )

            return build

        return self._append_many({i: build_for(r) for i, r in failures.items()}) if failures else {}
