"""The weekly table maintenance from Dagster: off by default, and its job does what `sessionize
maintain` does (run in-process on a real home)."""

from __future__ import annotations

import datetime as dt
import shutil
from pathlib import Path

from dagster import DagsterInstance, DefaultScheduleStatus
from deltalake import DeltaTable

from sessionize_assets.cli import main
from sessionize_assets.commands.maintenance import files_on_disk
from sessionize_assets.core.maintenance import NO_DATA_OPERATIONS
from sessionize_assets.definitions import build_definitions
from sessionize_assets.home import Home
from sessionize_assets.ingest.load_days import events_fingerprints
from sessionize_assets.schedules import MAINTENANCE_CRON, TABLE_MAINTENANCE_JOB
from sessionize_assets.time_based.state import read_state
from sessionize_assets.time_based.tables import TimeBasedTables
from sessionize_assets_tests.conftest import TWO_DAYS_START, cli_now


def test_the_maintenance_schedule_is_weekly_and_off_until_turned_on(tmp_path):
    defs = build_definitions(tmp_path / "home")
    schedule = defs.resolve_schedule_def("table_maintenance_schedule")
    assert schedule.default_status == DefaultScheduleStatus.STOPPED
    assert schedule.cron_schedule == MAINTENANCE_CRON
    assert schedule.job_name == TABLE_MAINTENANCE_JOB


def test_the_maintenance_job_compacts_and_vacuums_a_home(two_days, tmp_path, capsys):
    home = tmp_path / "home"
    shutil.copytree(two_days[0], home)
    # Load day 3 lands as two files (two loads' worth of files in one load day, which a
    # compaction merges), and the next run consumes it.
    (landing,) = (two_days[1] / f"load_date={TWO_DAYS_START + dt.timedelta(days=2)}").iterdir()
    header, *lines = landing.read_text().splitlines(keepends=True)
    halves = tmp_path / "landing"
    halves.mkdir()
    for n, part in enumerate((lines[: len(lines) // 2], lines[len(lines) // 2 :])):
        (halves / f"part{n}{landing.suffix}").write_text(header + "".join(part))
    load = [str(halves), "--load-tstamp-from", "load_tstamp"]
    assert main(["--home", str(home), *cli_now(4), "load", *load]) == 0
    assert main(["--home", str(home), *cli_now(4), "run"]) == 0
    warehouse = Path(Home(home).warehouse)
    before = sum(files_on_disk(t) for t in warehouse.iterdir())
    tables = TimeBasedTables.at(Home(home).table)
    assert read_state(tables).pending_load_days() == []
    _, fingerprints = events_fingerprints(tables.events)
    filtered_version = DeltaTable(tables.filtered_events).version()
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
    # `events` is compacted: load day 3's two files are one, so its fingerprint (the hash of its
    # files) changed, and the fingerprint filtered_events consumed was carried across: nothing
    # looks new to the next run, which redoes no load day.
    day3 = TWO_DAYS_START + dt.timedelta(days=2)
    after = events_fingerprints(tables.events)[1]
    assert after[day3] != fingerprints[day3]
    assert any(
        line.startswith("events: ") and "1 consumed load-day fingerprint(s) carried" in line
        for line in lines
    ), lines
    assert read_state(tables).pending_load_days() == []
    assert main(["--home", str(home), *cli_now(4), "run"]) == 0
    # Its only commits since are VACUUM's (no data changed).
    commits = DeltaTable(tables.filtered_events).history()
    assert {
        c["operation"] for c in commits if c["version"] > filtered_version
    } <= NO_DATA_OPERATIONS, commits
    # verify passes without a session run: VACUUM's commits to filtered_events left no row to
    # consume.
    capsys.readouterr()
    assert main(["--home", str(home), *cli_now(4), "verify"]) == 0, capsys.readouterr().out[-2000:]


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
