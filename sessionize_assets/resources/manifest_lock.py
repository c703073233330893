"""Every partitioned materialization and every file load goes through the processing manifest.

`manifest_lock(context, lake, spark, item)` takes the item's lock (a Processing record), yields a
payload dict the caller fills, and closes it Processed -- or Failed with the error, which then
fail-locks the item until an operator resolves it (`sessionize manifest resolve`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from sessionize_assets.resources.lake import LakeResource
from sessionize_assets.resources.processing_manifest import (
    ProcessingManifest,
    asset_item,
    item_states,
)
from sessionize_assets.resources.tables import PROCESSING_MANIFEST


def partition_item(asset: str, partition_key: str) -> str:
    """The manifest item of an asset partition, e.g. `filtered_events/2024-03-01`."""
    return asset_item(asset, partition_key)


def file_item(sha256: str) -> str:
    """The manifest item of a landed file (by content, so a renamed copy is the same item)."""
    return f"file/{sha256}"


def dagster_run_status(context) -> Callable[[str], str | None]:  # noqa: ANN001
    """The status of a Dagster run by id on the run's instance (None when unknown), so a lock
    held by a run that failed or was canceled is seen as abandoned."""
    instance = getattr(context, "instance", None)

    def status(run_id: str) -> str | None:
        if instance is None:
            return None
        try:
            run = instance.get_run_by_id(run_id)
        except Exception:  # noqa: BLE001 - not a Dagster run id (a load, an operator)
            return None
        return run.status.value if run is not None else None

    return status


@contextmanager
def manifest_lock(context, lake: LakeResource, spark, item: str) -> Iterator[dict[str, Any]]:  # noqa: ANN001
    """Hold the item's lock for the body; the run id recorded is Dagster's."""
    manifest = ProcessingManifest(
        spark, lake.table(PROCESSING_MANIFEST), run_status=dagster_run_status(context)
    )
    application = f"dagster:{getattr(context, 'job_name', None) or 'run'}"
    run_id = getattr(context, "run_id", None) or "unknown-run"
    with manifest.processing(item, application, run_id) as payload:
        yield payload


@contextmanager
def partition_locks(
    context, asset: str, partition_keys: Sequence[str]
) -> Iterator[list[dict[str, Any]]]:  # noqa: ANN001
    """Lock `<asset>/<key>` for every partition of the run (ascending), for the body's duration.

    All the locks are taken in one Delta commit, or none (the first item refused is named), and
    released in one commit: a run over 20 event days writes 2 manifest commits, not 40. Uses the
    run's `lake` resource and the process's Spark session (started if needed).
    """
    from sessionize_assets.resources.spark import get_spark

    lake: LakeResource = context.resources.lake
    manifest = ProcessingManifest(
        get_spark(lake.settings.spark),
        lake.table(PROCESSING_MANIFEST),
        run_status=dagster_run_status(context),
    )
    application = f"dagster:{getattr(context, 'job_name', None) or 'run'}"
    run_id = getattr(context, "run_id", None) or "unknown-run"
    items = [partition_item(asset, key) for key in sorted(partition_keys)]
    with manifest.processing_many(items, application, run_id) as payloads:
        yield payloads


def session_lock(context, item: str):  # noqa: ANN001, ANN201 - the session models' LockFactory
    """The session models' run lock (item `session_models`)."""
    from sessionize_assets.resources.spark import get_spark

    lake: LakeResource = context.resources.lake
    return manifest_lock(context, lake, get_spark(lake.settings.spark), item)


def blocked_items(lake: LakeResource, asset: str, partition_keys: list[str]) -> list[str]:
    """Partition keys whose manifest item is fail-locked or skipped (sensors leave them alone).

    Read with delta-rs: no Spark in sensors.
    """
    if not partition_keys:
        return []
    from sessionize_assets.core.manifest_state import ItemStatus

    states = item_states(lake.table(PROCESSING_MANIFEST), prefix=f"{asset}/")
    wanted = set(partition_keys)
    return sorted(
        item.split("/", 1)[1]
        for item, state in states.items()
        if item.split("/", 1)[1] in wanted
        and state.status in (ItemStatus.FAIL_LOCKED, ItemStatus.SKIPPED)
    )
