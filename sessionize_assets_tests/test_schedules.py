"""Table maintenance: `sessionize maintain` and the weekly maintenance job from Dagster (off by
default; its job does what the command does), run in-process on a real home."""

from __future__ import annotations

import datetime as dt
import shutil
from pathlib import Path

import pyarrow as pa
from dagster import DagsterInstance, DefaultScheduleStatus
from deltalake import DeltaTable, write_deltalake

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


def test_maintenance_keeps_what_is_still_read_then_compacts_and_vacuums_a_home(
    spark, two_days, tmp_path, capsys
):
    """`sessionize maintain` and the maintenance job (issue 18), on one home:

    1. refused (status 2, one sentence, nothing changed) while a session model still has to read
       filtered_events' change feed from an old version;
    2. with the models caught up and the default retention, compacted while time travel to the
       version they consumed and the change feed from it still read; the next load day (landed
       as two files) then runs incrementally;
    3. the job with no retention: every table compacted (filtered_events keeps its clustered
       layout), old files deleted, `events` compacted with its consumed fingerprints carried, so
       the next run redoes nothing and `verify` is clean."""
    from sessionize_assets.core.schema import STATISTICS_PROPERTY
    from sessionize_assets.resources.tables import FILTERED_EVENTS, INCREMENTAL_MANIFEST

    home = tmp_path / "home"
    shutil.copytree(two_days[0], home)
    warehouse = Path(Home(home).warehouse)
    manifest_path = Home(home).table(INCREMENTAL_MANIFEST)
    caught_up = DeltaTable(manifest_path).to_pyarrow_table()
    # 1. A model one version behind: it will read the change feed from the latest version.
    filtered = Home(home).table(FILTERED_EVENTS)
    latest = DeltaTable(filtered).version()
    behind = caught_up.set_column(
        caught_up.schema.get_field_index("consumed_version"),
        "consumed_version",
        pa.array([latest - 1] * caught_up.num_rows, pa.int64()),
    )
    write_deltalake(manifest_path, behind, mode="overwrite")
    before = {t.name: files_on_disk(t) for t in warehouse.iterdir()}
    capsys.readouterr()
    assert main(["--home", str(home), "maintain", "--vacuum-hours", "0"]) == 2
    err = capsys.readouterr().err
    assert f"change data feed from version {latest}" in err and "--vacuum-hours" in err, err
    assert {t.name: files_on_disk(t) for t in warehouse.iterdir()} == before

    # 2. Caught up; the default retention (168 hours) keeps time travel and the change feed.
    write_deltalake(manifest_path, caught_up, mode="overwrite")

    def at(version: int) -> list[tuple]:
        read = spark.read.format("delta").option("versionAsOf", version).load(filtered)
        return sorted(tuple(r) for r in read.select("load_date", "event_id").collect())

    held = at(latest)
    feed = spark.read.format("delta").option("readChangeFeed", "true")
    inserted = (
        feed.option("startingVersion", latest)
        .load(filtered)
        .filter("_commit_version = " + str(latest))
    )
    inserted_before = inserted.count()
    assert held and inserted_before > 0
    # The loader and the filtering step create their tables with statistics on key columns
    # only; tables made before that (the property unset here): maintain sets it.
    created = {}
    for name in ("events", FILTERED_EVENTS):
        config = DeltaTable(Home(home).table(name)).metadata().configuration
        created[name] = config[STATISTICS_PROPERTY]
        assert "derived_tstamp" in created[name] and "page_url" not in created[name], created
        spark.sql(
            f"ALTER TABLE delta.`{Home(home).table(name)}` UNSET TBLPROPERTIES "
            f"('{STATISTICS_PROPERTY}')"
        )
    capsys.readouterr()
    assert main(["--home", str(home), "maintain"]) == 0
    out = capsys.readouterr().out
    for name in ("events", FILTERED_EVENTS):
        limited = DeltaTable(Home(home).table(name)).metadata().configuration[STATISTICS_PROPERTY]
        assert limited == created[name]  # what the table was created with
        assert f"file statistics limited to {limited}" in out, out
    assert at(latest) == held
    assert inserted.count() == inserted_before
    # Load day 3 lands as two files (two loads' files in one load day, which a compaction
    # merges), and the next run consumes it.
    (landing,) = (two_days[1] / f"load_date={TWO_DAYS_START + dt.timedelta(days=2)}").iterdir()
    header, *lines = landing.read_text().splitlines(keepends=True)
    halves = tmp_path / "landing"
    halves.mkdir()
    for n, part in enumerate((lines[: len(lines) // 2], lines[len(lines) // 2 :])):
        (halves / f"part{n}{landing.suffix}").write_text(header + "".join(part))
    # Two loads: the driver appends a small batch as one file per load day.
    for n in range(2):
        load = [str(halves / f"part{n}{landing.suffix}"), "--load-tstamp-from", "load_tstamp"]
        assert main(["--home", str(home), *cli_now(4), "load", *load]) == 0
    assert main(["--home", str(home), *cli_now(4), "run"]) == 0

    # 3. The maintenance job, no retention.
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
        line.startswith("filtered_events: ") and "files kept as written (clustered by user)" in line
        for line in lines
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
