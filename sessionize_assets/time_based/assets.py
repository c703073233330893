"""The time-based branch's assets (SPEC section 5): filtered_events -> days_to_process ->
daily_aggregates -> attributes, plus the daily_aggregation_manifest. Declarations only: each asset
takes the processing-manifest lock on its partitions (`guarded`) and calls its step
(`time_based.steps`).
"""

import datetime as dt
import json
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from typing import Any

from dagster import (
    AssetDep,
    AssetExecutionContext,
    AssetsDefinition,
    BackfillPolicy,
    Config,
    MaterializeResult,
    MetadataValue,
    asset,
)

from sessionize_assets import faults
from sessionize_assets.backfills import backfill_assets
from sessionize_assets.core import backfills
from sessionize_assets.jobs import REQUESTED_BY_TAG
from sessionize_assets.metadata import partition_figures, partition_metadata, schema_metadata
from sessionize_assets.partitions import daily_partitions, late_day_lineage
from sessionize_assets.resources.lake import LakeResource
from sessionize_assets.resources.manifest_lock import partition_locks
from sessionize_assets.resources.spark_resource import SparkDeltaResource
from sessionize_assets.settings import Settings
from sessionize_assets.time_based import definitions
from sessionize_assets.time_based.steps import (
    LATENESS_TABLE,
    StepResult,
    attributes_step,
    daily_aggregates_step,
    days_to_process_step,
    filtered_events_step,
    manifest_step,
)
from sessionize_assets.time_based.tables import TimeBasedTables

GROUP = "time_based"


class DailyAggregatesConfig(Config):
    """`all_loaded_rows`: recompute with every row loaded so far (keyhole repair). Default: only
    for runs of a Dagster backfill of daily_aggregates itself."""

    all_loaded_rows: bool | None = None


def defined(
    context: AssetExecutionContext,
    tables: TimeBasedTables,
    settings: Settings,
    model: str,
    materialize: Callable[[], list[Any]],
) -> list[Any]:
    """Materialize a time-based model unless its settings changed since it was built: then the
    run fails with one sentence before it takes any lock or writes anything. The definition is
    recorded after a first build. The runs of a `sessionize refresh` neither refuse nor record:
    the command records the new definitions once every load day is rebuilt, so an interrupted
    refresh still refuses runs."""
    if definitions.refreshing(context.run.tags):
        return materialize()
    missing = definitions.refuse_changed(tables.definitions, settings, [model])
    result = materialize()
    definitions.record(tables.definitions, settings, missing)
    return result


def guarded(
    context: AssetExecutionContext,
    asset_name: str,
    keys: Sequence[str],
    body: Callable[[], StepResult],
) -> list[Any]:
    """The one place every partitioned materialization of this branch runs through: the
    processing-manifest lock on items `<asset>/<partition>` wraps `body` here. The events to
    yield: the run's materialization, then (a run of several partitions) each partition's own
    figures (`metadata.partition_figures`)."""
    with partition_locks(context, asset_name, keys) as payloads, faults.step_of(asset_name):
        result = body()
        for payload in payloads:
            payload.update({"run_keys": list(keys), **_payload_facts(result.metadata)})
    context.log.info(
        f"{asset_name} {', '.join(keys)}: {json.dumps(result.metadata, default=str)[:2000]}"
    )
    return [
        MaterializeResult(metadata=partition_metadata(result.metadata, keys, result.per_partition)),
        *partition_figures(asset_name, result.per_partition, keys),
    ]


def _payload_facts(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """The scalar facts of a materialization, for the Processed record's payload."""
    return {str(k): v for k, v in metadata.items() if isinstance(v, int | float | str | bool)}


def _keys_as_days(context: AssetExecutionContext) -> list[dt.date]:
    return [dt.date.fromisoformat(k) for k in context.partition_keys]


def is_keyhole_run(
    tags: Mapping[str, str], configured: bool | None, backfill_assets: Collection[str] | None = None
) -> bool:
    """A run of daily_aggregates is a keyhole repair when configured so, or (by default) when it is
    part of a Dagster backfill of daily_aggregates without the load-day assets, not launched by
    the late-days sensor (`core.backfills.is_keyhole_run`)."""
    return backfills.is_keyhole_run(tags, configured, backfill_assets, REQUESTED_BY_TAG)


def build_assets(settings: Settings) -> list[AssetsDefinition]:
    """filtered_events, days_to_process, daily_aggregates, daily_aggregation_manifest, attributes."""
    daily = daily_partitions(settings)
    lineage = late_day_lineage(settings)
    # A Dagster backfill (from the UI) materializes its range in one run: load days are decided
    # in ascending order inside a run, and the runs of a backfill carry no run lane, so ranges cut
    # into several runs could be decided side by side and out of order (docs/time_based.md).
    policy = BackfillPolicy.single_run()

    @asset(
        name="filtered_events",
        metadata=schema_metadata("filtered_events", settings),
        partitions_def=daily,
        deps=[AssetDep("events")],
        backfill_policy=policy,
        group_name=GROUP,
        kinds={"spark", "delta"},
        description=(
            "Rows of `events` of a load day, filtered (app_ids, event_names, start_date), with "
            "event_date, deduplicated on event_id within the day and against the previous "
            "dedupe_lookback_days load days. Partitioned by load_date and event_date."
        ),
    )
    def filtered_events(
        context: AssetExecutionContext, lake: LakeResource, spark: SparkDeltaResource
    ) -> Iterator[Any]:
        days, tables = _keys_as_days(context), TimeBasedTables.at(lake.table)
        yield from defined(
            context,
            tables,
            lake.settings,
            "filtered_events",
            lambda: guarded(
                context,
                "filtered_events",
                context.partition_keys,
                lambda: filtered_events_step(
                    spark.get_session(), tables, lake.settings, days, lake.current_time()
                ),
            ),
        )

    @asset(
        name="days_to_process",
        metadata=schema_metadata("days_to_process"),
        partitions_def=daily,
        deps=[AssetDep("filtered_events")],
        backfill_policy=policy,
        group_name=GROUP,
        kinds={"delta"},
        description=(
            "For each event day a load day touches: rows, lateness, pending rows and the decision "
            "to (re)aggregate it or skip it (reprocess_days, min_rows_to_process)."
        ),
    )
    def days_to_process(context: AssetExecutionContext, lake: LakeResource) -> Iterator[Any]:
        days = _keys_as_days(context)
        yield from guarded(
            context,
            "days_to_process",
            context.partition_keys,
            lambda: days_to_process_step(
                TimeBasedTables.at(lake.table), lake.settings, days, lake.current_time()
            ),
        )

    @asset(
        name="daily_aggregates",
        metadata=schema_metadata("daily_aggregates", settings),
        partitions_def=daily,
        deps=[
            AssetDep("filtered_events", partition_mapping=lineage),
            AssetDep("days_to_process", partition_mapping=lineage),
        ],
        backfill_policy=policy,
        group_name=GROUP,
        kinds={"spark", "delta"},
        description=(
            "One row per (user, event day), recomputed in full from the rows of the day up to its "
            "horizon. A Dagster backfill of this asset alone is a keyhole repair (every row loaded so "
            "far); a backfill of the load days and what lies downstream aggregates up to their "
            "decisions."
        ),
    )
    def daily_aggregates(
        context: AssetExecutionContext,
        config: DailyAggregatesConfig,
        lake: LakeResource,
        spark: SparkDeltaResource,
    ) -> Iterator[Any]:
        days = _keys_as_days(context)
        tags = context.run.tags
        keyhole = is_keyhole_run(
            tags,
            config.all_loaded_rows,
            backfill_assets(context.instance, tags.get(backfills.BACKFILL_TAG)),
        )
        tables = TimeBasedTables.at(lake.table)
        yield from defined(
            context,
            tables,
            lake.settings,
            "daily_aggregates",
            lambda: guarded(
                context,
                "daily_aggregates",
                context.partition_keys,
                lambda: daily_aggregates_step(
                    spark.get_session(), tables, lake.settings, days, keyhole
                ),
            ),
        )

    @asset(
        name="daily_aggregation_manifest",
        metadata=schema_metadata("daily_aggregation_manifest"),
        deps=[AssetDep("days_to_process"), AssetDep("daily_aggregates")],
        group_name=GROUP,
        kinds={"delta"},
        description="Per event day: rows aggregated, pending, skipped so far, horizon, last processed at.",
    )
    def daily_aggregation_manifest(lake: LakeResource) -> MaterializeResult:
        with faults.step_of("daily_aggregation_manifest"):
            result = manifest_step(TimeBasedTables.at(lake.table))
        metadata = dict(result.metadata)
        metadata[LATENESS_TABLE] = MetadataValue.md(metadata[LATENESS_TABLE])
        return MaterializeResult(metadata=partition_metadata(metadata, []))

    @asset(
        name="attributes",
        metadata=schema_metadata("attributes", settings),
        deps=[AssetDep("daily_aggregates")],
        group_name=GROUP,
        kinds={"spark", "delta"},
        description="Per user: lifetime and last-N-days metrics and configured attributes, replaced whole; only the users whose rows can differ are aggregated again.",
    )
    def attributes(lake: LakeResource, spark: SparkDeltaResource) -> MaterializeResult:
        as_of = lake.current_time().date()
        with faults.step_of("attributes"):
            result = attributes_step(
                spark.get_session(), TimeBasedTables.at(lake.table), lake.settings, as_of
            )
        return MaterializeResult(metadata=partition_metadata(result.metadata, []))

    return [
        filtered_events,
        days_to_process,
        daily_aggregates,
        daily_aggregation_manifest,
        attributes,
    ]
