"""The sensor on new loads: new commits to `events` by any writer -> load-day runs downstream."""

from __future__ import annotations

import json

from dagster import (
    DefaultSensorStatus,
    RunRequest,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)

from sessionize_assets.backfills import wait_for_backfills
from sessionize_assets.core.planning import next_load_days
from sessionize_assets.ingest.load_days import EMPTY_FINGERPRINT
from sessionize_assets.jobs import LOAD_DAY_JOB, TIME_BASED_LANE
from sessionize_assets.resources.lake import LakeResource
from sessionize_assets.resources.manifest_lock import blocked_items
from sessionize_assets.settings import Settings
from sessionize_assets.time_based import definitions
from sessionize_assets.time_based.state import read_state
from sessionize_assets.time_based.tables import TimeBasedTables

# What this sensor requests: it waits while a backfill materializes either.
WANTED = ("filtered_events", "days_to_process")


def plan_requests(
    pending: dict, requested: dict[str, str], blocked: set[str] | frozenset[str] = frozenset()
) -> tuple[list[tuple[str, str]], dict[str, str], list[str]]:
    """Which (load day, fingerprint) to request now, the new `requested` map, and blocked days.

    A load day is requested once per fingerprint of its files: a later commit that changes the
    day's files asks again; the same files are never asked twice. Days come out ascending.
    """
    to_request = []
    skipped = []
    new_requested = dict(requested)
    for day in sorted(pending):
        key = day.isoformat()
        fingerprint = pending[day]
        if key in blocked:
            skipped.append(key)
            continue
        if requested.get(key) == fingerprint:
            continue
        to_request.append((key, fingerprint))
        new_requested[key] = fingerprint
    # Forget days that are no longer pending (processed): the map stays small.
    pending_keys = {d.isoformat() for d in pending}
    new_requested = {k: v for k, v in new_requested.items() if k in pending_keys}
    return to_request, new_requested, skipped


def build_sensors(settings: Settings) -> list[SensorDefinition]:
    """`new_loads_sensor`: polls the events table's Delta log (delta-rs, no Spark)."""

    @sensor(
        name="new_loads_sensor",
        job_name=LOAD_DAY_JOB,
        minimum_interval_seconds=30,
        default_status=DefaultSensorStatus.RUNNING,
        description=(
            "Requests filtered_events + days_to_process for the load days whose files in `events` "
            "changed since filtered_events last consumed them (new commits by any writer), "
            "planned as `sessionize run` plans them: within the load window, in order."
        ),
    )
    def new_loads_sensor(context: SensorEvaluationContext, lake: LakeResource):
        cursor = (
            json.loads(context.cursor) if context.cursor else {"version": None, "requested": {}}
        )
        refused = definitions.refusal(TimeBasedTables.at(lake.table).definitions, lake.settings)
        if refused:
            return SensorResult(skip_reason=SkipReason(refused), cursor=context.cursor)
        waiting = wait_for_backfills(context.instance, WANTED)
        if waiting:
            return SensorResult(skip_reason=waiting, cursor=context.cursor)
        state = read_state(TimeBasedTables.at(lake.table))
        if state.events_version is None:
            return SensorResult(
                skip_reason=SkipReason(
                    "The events table does not exist yet: nothing has been loaded."
                ),
                cursor=context.cursor,
            )
        now = lake.current_time()
        # The shared planner (core.planning) picks the load days, as `sessionize run` does: the
        # pending ones inside the load window, at most backfill_limit_days + 1, earlier days with
        # late rows first, none the processing manifest blocks.
        pending_days = state.pending_load_days(since=settings.start_date)
        blocked_keys = set(
            blocked_items(lake, "filtered_events", [d.isoformat() for d in pending_days])
        )
        plan, held = next_load_days(
            state.load_window(settings, now),
            pending_days,
            settings.backfill_limit_days,
            now,
            blocked={d for d in pending_days if d.isoformat() in blocked_keys},
        )
        consumed = {d: a.events_fingerprint for d, a in state.accounting.items()}
        planned = {
            d: f"{state.events_fingerprints.get(d, EMPTY_FINGERPRINT)}/{consumed.get(d, '-')}"
            for d in plan.load_days
        }
        to_request, requested, _ = plan_requests(planned, cursor.get("requested", {}))
        skipped = [d.isoformat() for d in held]
        version = state.events_version
        new_cursor = json.dumps({"version": version, "requested": requested}, sort_keys=True)
        for key in skipped:
            context.log.warning(
                f"Load day {key} is fail-locked or skipped in the processing manifest; resolve it with "
                f"`sessionize manifest resolve filtered_events/{key} --reason ...` to process it."
            )
        if not to_request:
            return SensorResult(
                skip_reason=SkipReason(
                    f"events at version {version}: no new load-day changes"
                    + (f" ({len(skipped)} blocked by the processing manifest)" if skipped else "")
                ),
                cursor=new_cursor,
            )
        return SensorResult(
            run_requests=[
                RunRequest(run_key=f"{key}:{token}", partition_key=key, tags=dict(TIME_BASED_LANE))
                for key, token in to_request
            ],
            cursor=new_cursor,
        )

    return [new_loads_sensor]
