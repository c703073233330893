"""The weekly table maintenance from Dagster: off by default, and its job does what `sessionize
maintain` does (run in-process on a real home)."""

from __future__ import annotations

import shutil
from pathlib import Path

from dagster import DagsterInstance, DefaultScheduleStatus

from sessionize_assets.commands.maintenance import files_on_disk
from sessionize_assets.definitions import build_definitions
from sessionize_assets.home import Home
from sessionize_assets.schedules import MAINTENANCE_CRON, TABLE_MAINTENANCE_JOB


def test_the_maintenance_schedule_is_weekly_and_off_until_turned_on(tmp_path):
    defs = build_definitions(tmp_path / "home")
    schedule = defs.resolve_schedule_def("table_maintenance_schedule")
    assert schedule.default_status == DefaultScheduleStatus.STOPPED
    assert schedule.cron_schedule == MAINTENANCE_CRON
    assert schedule.job_name == TABLE_MAINTENANCE_JOB


def test_the_maintenance_job_compacts_and_vacuums_a_home(two_days, tmp_path):
    home = tmp_path / "home"
    shutil.copytree(two_days[0], home)
    warehouse = Path(Home(home).warehouse)
    before = sum(files_on_disk(t) for t in warehouse.iterdir())
    defs = build_definitions(home)
    result = defs.get_job_def(TABLE_MAINTENANCE_JOB).execute_in_process(
        run_config={"ops": {"maintain_tables": {"config": {"vacuum_hours": 0}}}},
        instance=DagsterInstance.ephemeral(),
    )
    assert result.success
    lines = result.output_for_node("maintain_tables")
    assert any(
        line.startswith("filtered_events: ") and "clustered by user" in line for line in lines
    )
    assert any("unreferenced file(s)" in line for line in lines)
    assert sum(files_on_disk(t) for t in warehouse.iterdir()) < before


def test_a_maintenance_run_is_refused_while_a_command_holds_the_home(two_days, tmp_path):
    from sessionize_assets.resources.command_lock import command_lock

    home = tmp_path / "home"
    shutil.copytree(two_days[0], home)
    defs = build_definitions(home)
    with command_lock(home, "run"):
        result = defs.get_job_def(TABLE_MAINTENANCE_JOB).execute_in_process(
            instance=DagsterInstance.ephemeral(), raise_on_error=False
        )
    assert not result.success
    failure = result.failure_data_for_node("maintain_tables")
    assert failure is not None
    assert "This home is busy" in failure.error.message, failure.error.message  # one sentence
