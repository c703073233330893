"""Raw events as they were landed: `events` and `invalid_events` (written by the loader)."""

from __future__ import annotations

import datetime as dt

from dagster import AssetMaterialization, AssetSpec, DagsterInstance, MetadataValue

from sessionize_assets.ingest.loader import LoadReport
from sessionize_assets.metadata import schema_metadata
from sessionize_assets.partitions import daily_partitions
from sessionize_assets.settings import Settings

GROUP = "ingest"


def build_assets(settings: Settings) -> list[AssetSpec]:
    """`events` and `invalid_events`: load-day partitioned Delta tables written by `sessionize load`
    (or any other writer of the `events` table; the new-loads sensor sees their commits too)."""
    partitions = daily_partitions(settings)
    return [
        AssetSpec(
            "events",
            partitions_def=partitions,
            group_name=GROUP,
            description="Raw events, one row per loaded event, partitioned by load day (UTC date of load_tstamp).",
            metadata={
                "partition column": "load_date",
                "written by": "sessionize load, or any Delta writer",
                **schema_metadata("events"),
            },
            kinds={"spark", "delta"},
        ),
        AssetSpec(
            "invalid_events",
            partitions_def=partitions,
            group_name=GROUP,
            description="Rows that could not be used, with their load day, the reason and the raw text.",
            metadata=schema_metadata("invalid_events"),
            kinds={"spark", "delta"},
        ),
    ]


def record_load(instance: DagsterInstance, report: LoadReport, started: dt.datetime) -> None:
    """Report what a load wrote as materializations of `events` / `invalid_events` partitions."""
    elapsed = (dt.datetime.now(dt.UTC) - started).total_seconds()
    per_day: dict[dt.date, int] = {}
    files_per_day: dict[dt.date, list[str]] = {}
    for f in report.loaded:
        for day, rows in f.rows_by_load_day.items():
            per_day[day] = per_day.get(day, 0) + rows
            files_per_day.setdefault(day, []).append(f.path)
    for day, rows in sorted(per_day.items()):
        instance.report_runless_asset_event(
            AssetMaterialization(
                asset_key="events",
                partition=day.isoformat(),
                metadata={
                    "rows written": MetadataValue.int(rows),
                    "files": MetadataValue.text("\n".join(files_per_day[day])),
                    "rows read (this load, all days)": MetadataValue.int(report.rows_read),
                    "rows rejected (this load, all days)": MetadataValue.int(report.rows_invalid),
                    "time taken (s)": MetadataValue.float(round(elapsed, 3)),
                },
            )
        )
