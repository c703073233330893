"""The Dagster instance's backfills, read for the sensors and daily_aggregates (the rules are in
`core/backfills.py`)."""

from __future__ import annotations

from collections.abc import Collection

from dagster import DagsterInstance, SkipReason

from sessionize_assets.core.backfills import Backfill, backfill_in_the_way, waiting_reason

# Statuses of a backfill whose runs may still be launched or running.
_IN_PROGRESS = ("REQUESTED", "CANCELING", "FAILING")


def _names(selection) -> frozenset[str]:  # noqa: ANN001 - Sequence[AssetKey] | None
    return frozenset(key.to_user_string() for key in selection or ())


def in_progress_backfills(instance: DagsterInstance) -> list[Backfill]:
    """The instance's backfills still in progress, with the assets each selects."""
    from dagster._core.execution.backfill import BulkActionsFilter, BulkActionStatus

    statuses = [BulkActionStatus(s) for s in _IN_PROGRESS]
    found = instance.get_backfills(filters=BulkActionsFilter(statuses=statuses))
    return [Backfill(b.backfill_id, _names(b.asset_selection)) for b in found]


def backfill_assets(instance: DagsterInstance, backfill_id: str | None) -> frozenset[str] | None:
    """The assets backfill `backfill_id` selects (None when there is no such backfill)."""
    if not backfill_id:
        return None
    backfill = instance.get_backfill(backfill_id)
    return None if backfill is None else _names(backfill.asset_selection)


def wait_for_backfills(instance: DagsterInstance, wanted: Collection[str]) -> SkipReason | None:
    """A skip reason while an in-progress backfill selects any of `wanted`, else None."""
    busy = backfill_in_the_way(in_progress_backfills(instance), wanted)
    return None if busy is None else SkipReason(waiting_reason(busy, wanted))
