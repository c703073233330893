"""The late-days sensor: after load days' days_to_process materialized, request exactly the
daily_aggregates partitions they decided to process; then attributes and the manifest.

What is outstanding is derived from the lake on every tick (delta-rs, no Spark): an event day is
outstanding when a "process" decision in `days_to_process` is newer than the latest decision the
last materialization of daily_aggregates(D) saw (`daily_aggregate_horizons`). So several load days
finishing between two ticks are all covered, and a restart or a lost cursor repeats nothing that
already ran. The cursor remembers what was requested (event day -> decision time) so a request
still queued or running is not launched twice; each request also has a run key made of the event
day and the decision time, which Dagster's daemon never launches twice either.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping

from dagster import (
    AssetKey,
    DefaultSensorStatus,
    RunRequest,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)

from sessionize_assets.backfills import wait_for_backfills
from sessionize_assets.core.planning import finish_due, ready_event_days
from sessionize_assets.jobs import REQUESTED_BY_TAG, TIME_BASED_LANE
from sessionize_assets.resources.lake import LakeResource
from sessionize_assets.settings import Settings
from sessionize_assets.time_based import definitions
from sessionize_assets.time_based.state import read_state
from sessionize_assets.time_based.tables import TimeBasedTables

SENSOR_NAME = "late_days_sensor"
# It waits while a backfill materializes what it requests, or the load days whose decisions it
# reads (those decisions change under it until the backfill ends).
WANTED = (
    "filtered_events",
    "days_to_process",
    "daily_aggregates",
    "attributes",
    "daily_aggregation_manifest",
)


def plan_late_day_requests(
    outstanding: Mapping[dt.date, dt.datetime],
    requested: Mapping[str, str],
    last_partition: dt.date,
) -> tuple[list[tuple[str, str]], dict[str, str], list[str]]:
    """(requests to make as (event day, decision time), the new `requested` map, event days
    waiting for their partition to exist).

    An event day is requested once per decision time; entries that are no longer outstanding
    (done) are forgotten so the cursor stays small.
    """
    to_request = []
    new = {}
    ready, later = ready_event_days(outstanding, last_partition)
    waiting = [d.isoformat() for d in later]
    for day in ready:
        key, stamp = day.isoformat(), outstanding[day].isoformat()
        if requested.get(key) != stamp:
            to_request.append((key, stamp))
        new[key] = stamp
    return to_request, new, waiting


def attributes_request_key(daily_aggregates_version: int, as_of: dt.date) -> str:
    return f"attributes:{daily_aggregates_version}:{as_of.isoformat()}"


def build_sensors(settings: Settings) -> list[SensorDefinition]:
    """`late_days_sensor` on days_to_process decisions (reads the lake with delta-rs)."""

    @sensor(
        name=SENSOR_NAME,
        asset_selection=["daily_aggregates", "attributes", "daily_aggregation_manifest"],
        minimum_interval_seconds=30,
        default_status=DefaultSensorStatus.RUNNING,
        description=(
            "Requests the daily_aggregates partitions that days_to_process decided to (re)aggregate, "
            "once each; then recomputes attributes and the daily aggregation manifest."
        ),
    )
    def late_days_sensor(context: SensorEvaluationContext, lake: LakeResource):
        cursor = json.loads(context.cursor) if context.cursor else {}
        refused = definitions.refusal(TimeBasedTables.at(lake.table).definitions, lake.settings)
        if refused:
            return SensorResult(skip_reason=SkipReason(refused), cursor=context.cursor)
        busy = wait_for_backfills(context.instance, WANTED)
        if busy:
            return SensorResult(skip_reason=busy, cursor=context.cursor)
        state = read_state(TimeBasedTables.at(lake.table))
        now = lake.current_time()
        to_request, requested, waiting = plan_late_day_requests(
            state.outstanding(), cursor.get("requested", {}), now.date()
        )
        runs = [
            RunRequest(
                run_key=f"daily_aggregates:{day}:{stamp}",
                partition_key=day,
                asset_selection=[AssetKey("daily_aggregates")],
                tags={**TIME_BASED_LANE, REQUESTED_BY_TAG: SENSOR_NAME},
            )
            for day, stamp in to_request
        ]
        new_cursor = {"requested": requested, "attributes": cursor.get("attributes")}
        if not requested and finish_due(
            state.daily_aggregates_version is not None, False, state.attributes_stale(now.date())
        ):
            key = attributes_request_key(state.daily_aggregates_version or 0, now.date())
            if cursor.get("attributes") != key:
                runs.append(
                    RunRequest(
                        run_key=key,
                        asset_selection=[
                            AssetKey("attributes"),
                            AssetKey("daily_aggregation_manifest"),
                        ],
                        tags={**TIME_BASED_LANE, REQUESTED_BY_TAG: SENSOR_NAME},
                    )
                )
                new_cursor["attributes"] = key
        if waiting:
            context.log.info(
                f"Event days decided but not yet partitions (clock skew): {', '.join(waiting)}"
            )
        encoded = json.dumps(new_cursor, sort_keys=True)
        if not runs:
            busy = (
                f"{len(requested)} requested and not done yet"
                if requested
                else "nothing outstanding"
            )
            return SensorResult(
                skip_reason=SkipReason(f"No new decisions to aggregate ({busy})."), cursor=encoded
            )
        return SensorResult(run_requests=runs, cursor=encoded)

    return [late_days_sensor]
