"""The session-models sensor: runs the incremental session models when `filtered_events` has
changed since they last consumed it, or while they are still catching up to now.

What has been processed is read from the lake on every tick (delta-rs, no Spark): the
`filtered_events` version, its newest session timestamp from the Delta log, and each model's
`incremental_manifest` row. A tick where the models are caught up
(`core.run_limits.caught_up`: every model in sync, consumed the current version and processed past
the newest row) is skipped. Otherwise a request's run key is the pair (filtered_events version,
manifest state), so the same situation is never requested twice; after a run moves the manifest,
the state differs and the next window is requested, until the models are caught up or a run finds
nothing to move.
"""

from __future__ import annotations

import hashlib
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
from sessionize_assets.core.run_limits import caught_up
from sessionize_assets.jobs import SESSION_MODELS_JOB, SESSIONS_LANE
from sessionize_assets.resources.lake import LakeResource
from sessionize_assets.resources.tables import FILTERED_EVENTS, INCREMENTAL_MANIFEST
from sessionize_assets.sessions.state import (
    enabled_models,
    lake_state,
    read_manifest,
    settings_refusal,
)
from sessionize_assets.settings import Settings

SENSOR_NAME = "session_models_sensor"


def session_request_key(version: int, manifest_rows: list[tuple]) -> str:
    """A stable key for (filtered_events version, manifest state)."""
    digest = hashlib.sha256(json.dumps(sorted(manifest_rows), default=str).encode()).hexdigest()[
        :16
    ]
    return f"session_models:v{version}:{digest}"


def build_sensors(settings: Settings) -> list[SensorDefinition]:
    """`session_models_sensor` (reads the lake with delta-rs)."""
    models = enabled_models(settings)
    # It waits while a backfill materializes the load days or the session models themselves.
    wanted = (FILTERED_EVENTS, INCREMENTAL_MANIFEST, *models)

    @sensor(
        name=SENSOR_NAME,
        job_name=SESSION_MODELS_JOB,
        minimum_interval_seconds=60,
        default_status=DefaultSensorStatus.RUNNING,
        description=(
            "Runs the incremental session models when filtered_events changed since they consumed it, "
            "or while they are catching up (a run that moves nothing ends the catch-up)."
        ),
    )
    def session_models_sensor(context: SensorEvaluationContext, lake: LakeResource):
        seen = lake_state(settings, lake.table)
        version = seen.version
        if version is None:
            return SensorResult(
                skip_reason=SkipReason("filtered_events does not exist yet."), cursor=context.cursor
            )
        refused = settings_refusal(settings, read_manifest(lake.table))
        if refused:
            return SensorResult(skip_reason=SkipReason(refused), cursor=context.cursor)
        busy = wait_for_backfills(context.instance, wanted)
        if busy:
            return SensorResult(skip_reason=busy, cursor=context.cursor)
        verdict = caught_up(lake.current_time(), seen)
        if verdict.caught_up:
            return SensorResult(skip_reason=SkipReason(verdict.message), cursor=context.cursor)
        rows = [
            (m, str(s.last_success), s.consumed_version, str(s.processed_through))
            for m, s in seen.states.items()
            if m in models
        ]
        key = session_request_key(version, rows)
        if context.cursor == key:
            return SensorResult(
                skip_reason=SkipReason(
                    f"Nothing new for the session models (filtered_events v{version})."
                ),
                cursor=context.cursor,
            )
        return SensorResult(
            run_requests=[RunRequest(run_key=key, tags=dict(SESSIONS_LANE))],
            cursor=key,
        )

    return [session_models_sensor]
