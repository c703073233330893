"""One Definitions object: assets, checks, jobs, schedules, sensors and resources, from the resolved
settings.

The settings come from the same place for the CLI, `dagster dev` and run processes:
`$SESSIONIZE_HOME` / `$SESSIONIZE_CONFIG` (the CLI exports both), `$SESSIONIZE_NOW` for replays.
"""

from __future__ import annotations

import os
from pathlib import Path

from dagster import Definitions, in_process_executor

from sessionize_assets import checks as time_based_checks
from sessionize_assets.home import Home
from sessionize_assets.ingest import assets as ingest
from sessionize_assets.jobs import build_jobs
from sessionize_assets.refresh_job import refresh_job
from sessionize_assets.resources.lake import LakeResource
from sessionize_assets.resources.manifest_lock import session_lock
from sessionize_assets.resources.spark_resource import SparkDeltaResource
from sessionize_assets.schedules import build_schedules, table_maintenance_job
from sessionize_assets.sensors import late_days, new_loads, session_models
from sessionize_assets.sessions import assets as sessions
from sessionize_assets.settings import Settings, settings_file
from sessionize_assets.time_based import assets as time_based


def build_assets(settings: Settings) -> list:
    """Every asset of the project (ingest, time-based, session-based), for Definitions and for the
    command line's runs."""
    return [
        *ingest.build_assets(settings),
        *time_based.build_assets(settings),
        *sessions.build_assets(settings, lock=session_lock),
    ]


def build_definitions(
    home: Path | None = None, config: str | None = None, now: str | None = None
) -> Definitions:
    """Everything Dagster needs, bound to one home folder and one settings file."""
    home = (home or Home.from_env().root).resolve()
    resolved = settings_file(home, config)
    lake = LakeResource(
        home=str(home),
        config_file=str(resolved) if resolved else None,
        now=now if now is not None else os.environ.get("SESSIONIZE_NOW") or None,
    )
    settings = lake.settings
    assets = build_assets(settings)
    checks = [*time_based_checks.build_checks(settings)]
    sensors = [
        *new_loads.build_sensors(settings),
        *late_days.build_sensors(settings),
        *session_models.build_sensors(settings),
    ]
    jobs = [*build_jobs(settings), table_maintenance_job, refresh_job]
    return Definitions(
        assets=assets,
        asset_checks=checks,
        jobs=jobs,
        schedules=build_schedules(table_maintenance_job),
        sensors=sensors,
        # Every run's steps in the run's own process, one after another: they share one Spark
        # session (with the embedded engine, one JVM per run instead of one per step; the steps
        # are Spark jobs on the same cores, so running them side by side gained nothing).
        executor=in_process_executor,
        resources={"lake": lake, "spark": SparkDeltaResource(spark_config=dict(settings.spark))},
    )


defs = build_definitions()
