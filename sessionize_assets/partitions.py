"""The one daily partitions definition (load days and event days) and the lineage mapping."""

from __future__ import annotations

from dagster import DailyPartitionsDefinition, TimeWindowPartitionMapping

from sessionize_assets.settings import Settings


def daily_partitions(settings: Settings) -> DailyPartitionsDefinition:
    """UTC days from `start_date`, including the current, still-growing day (end_offset=1)."""
    return DailyPartitionsDefinition(
        start_date=settings.start_date.isoformat(), timezone="UTC", end_offset=1
    )


def late_day_lineage(settings: Settings) -> TimeWindowPartitionMapping:
    """Event day D depends on load days D … D + reprocess_days (for the UI's lineage only).

    Which late event days a load day actually triggers is data-driven and decided by
    `core.late_days`, run by a sensor: Dagster's daemons ignore custom PartitionMappings.
    """
    return TimeWindowPartitionMapping(
        start_offset=0,
        end_offset=settings.reprocess_days,
        allow_nonexistent_upstream_partitions=True,
    )
