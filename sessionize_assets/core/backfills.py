"""Dagster backfills as the pipeline sees them, in plain Python: which backfill the sensors wait
for, and when a backfill of `daily_aggregates` is a keyhole repair.

A range backfill launched from the UI on `filtered_events` and everything downstream of it is one
cascade: Dagster maps the load days to the event days they may decide
(`partitions.late_day_lineage`), then runs the unpartitioned assets once. While it is in
progress, a sensor that would request the same assets waits (a skip that names the backfill), so
nothing it materializes is materialized a second time; when it ends, the sensors find nothing
left to do, or only work the backfill did not select.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

# The load-day assets: a backfill that selects one of them decides event days itself, so its
# daily_aggregates runs aggregate up to those decisions (not every row loaded so far).
LOAD_DAY_ASSETS = frozenset({"filtered_events", "days_to_process"})
BACKFILL_TAG = "dagster/backfill"


@dataclass(frozen=True)
class Backfill:
    """An in-progress Dagster backfill: its id and the asset names it selects."""

    backfill_id: str
    assets: frozenset[str]


def backfill_in_the_way(backfills: Iterable[Backfill], wanted: Collection[str]) -> Backfill | None:
    """The first in-progress backfill that selects any of the assets a sensor would request."""
    for backfill in backfills:
        if backfill.assets & set(wanted):
            return backfill
    return None


def waiting_reason(backfill: Backfill, wanted: Collection[str]) -> str:
    """The sensor's skip reason while `backfill` materializes assets it would request."""
    names = ", ".join(sorted(backfill.assets & set(wanted)))
    return (
        f"Backfill {backfill.backfill_id} is materializing {names}: this sensor waits until it "
        "ends, so nothing the backfill does is done twice."
    )


def is_keyhole_run(
    tags: Mapping[str, str],
    configured: bool | None,
    backfill_assets: Collection[str] | None,
    requested_by_tag: str,
) -> bool:
    """A run of daily_aggregates is a keyhole repair (every row loaded so far) when configured
    so, or by default when it belongs to a Dagster backfill that selects daily_aggregates without
    the load-day assets and that no sensor launched. A cascade backfill (load days and what lies
    downstream) aggregates up to the decisions its own load days made, as a sensor's run does."""
    if configured is not None:
        return configured
    if BACKFILL_TAG not in tags or requested_by_tag in tags:
        return False
    return not (set(backfill_assets or ()) & LOAD_DAY_ASSETS)
