"""A run whose process was killed is marked failed by the next command, not left STARTED."""

import subprocess
import sys
import uuid

from dagster import DagsterInstance, DagsterRunStatus
from dagster._core.storage.dagster_run import DagsterRun

from sessionize_assets.resources.dead_runs import HOST_TAG, PID_TAG, mark_dead_runs_failed, run_tags


def _started_run(instance, tags) -> str:
    run = DagsterRun(
        job_name="__ASSET_JOB", run_id=str(uuid.uuid4()), status=DagsterRunStatus.STARTED, tags=tags
    )
    instance.add_run(run)
    return run.run_id


def test_only_runs_of_dead_processes_on_this_host_are_marked_failed() -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with DagsterInstance.ephemeral() as instance:
            here = run_tags()
            dead = _started_run(instance, {**here, PID_TAG: str(gone.pid)})
            running = _started_run(instance, {**here, PID_TAG: str(alive.pid)})
            elsewhere = _started_run(instance, {HOST_TAG: "another-host", PID_TAG: str(gone.pid)})
            untagged = _started_run(instance, {})
            assert mark_dead_runs_failed(instance) == [dead]
            status = {
                r: instance.get_run_by_id(r).status for r in (dead, running, elsewhere, untagged)
            }
            assert status[dead] is DagsterRunStatus.FAILURE
            assert {status[r] for r in (running, elsewhere, untagged)} == {DagsterRunStatus.STARTED}
            assert mark_dead_runs_failed(instance) == []  # nothing twice
    finally:
        alive.kill()
        alive.wait()
