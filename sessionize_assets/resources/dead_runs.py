"""Dagster runs whose process was killed stay `STARTED` in the instance forever: the process that
would have reported their end is gone. Runs the command line launches carry their host and process
id as tags (`run_tags`); every command that opens the instance marks such runs failed when their
process no longer exists on this host (`mark_dead_runs_failed`). Runs launched by Dagster's daemon
are watched by Dagster's own run monitoring (`run_monitoring` in dagster.yaml).
"""

from __future__ import annotations

import os
import socket

from sessionize_assets.resources.processing_manifest import pid_alive

HOST_TAG = "sessionize/host"
PID_TAG = "sessionize/pid"


def run_tags() -> dict[str, str]:
    """The tags that name this process as a run's executor."""
    return {HOST_TAG: socket.gethostname(), PID_TAG: str(os.getpid())}


def mark_dead_runs_failed(instance) -> list[str]:  # noqa: ANN001 - DagsterInstance
    """Mark failed the started runs of this host whose process is gone; their ids."""
    from dagster import DagsterRunStatus, RunsFilter

    host = socket.gethostname()
    dead = []
    runs = instance.get_runs(
        filters=RunsFilter(
            statuses=[DagsterRunStatus.STARTED, DagsterRunStatus.STARTING],
            tags={HOST_TAG: host},
        ),
        limit=500,
    )
    for run in runs:
        pid = run.tags.get(PID_TAG, "")
        if not pid.isdigit() or int(pid) == os.getpid() or pid_alive(int(pid)):
            continue
        instance.report_run_failed(
            run, message=f"The process {pid} running this run on {host} is gone (killed)."
        )
        dead.append(run.run_id)
    return dead
