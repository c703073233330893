"""Jobs the sensors and the CLI launch. One run lane per branch keeps load days in order."""

from __future__ import annotations

from dagster import AssetSelection, define_asset_job

from sessionize_assets.settings import Settings

# Runs with the same lane tag are dequeued one at a time, in submission order (see dagster.yaml's
# tag_concurrency_limits), so load days are decided in ascending order even when a sensor
# requests several at once.
LANE_TAG = "sessionize/lane"
TIME_BASED_LANE = {LANE_TAG: "time_based"}
SESSIONS_LANE = {LANE_TAG: "sessions"}
# Runs launched by the late-days sensor carry this tag: they are never keyhole repairs.
REQUESTED_BY_TAG = "sessionize/requested_by"

LOAD_DAY_JOB = "load_day_job"
SESSION_MODELS_JOB = "session_models_job"


def build_jobs(settings: Settings) -> list:
    """`load_day_job`: filtered_events + days_to_process for one load day; `session_models_job`:
    one incremental run of every enabled session model."""
    return [
        define_asset_job(
            LOAD_DAY_JOB,
            selection=AssetSelection.assets("filtered_events", "days_to_process"),
            tags=TIME_BASED_LANE,
            description="Filter, deduplicate and decide the event days of one load day.",
        ),
        define_asset_job(
            SESSION_MODELS_JOB,
            selection=AssetSelection.groups("session_based"),
            tags=SESSIONS_LANE,
            description="One incremental run of the session models (Snowplow run limits).",
        ),
    ]
