"""Recovery of the command line's pipeline: an interrupted `sessionize backfill` resumes at its
first unfinished window. The helpers here (a home of three load days, killing a `sessionize run`
while it holds a lock, comparing every table with an uninterrupted home) serve the fault matrix
(`test_fault_matrix.py`), which also holds the run killed from outside while locked."""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sessionize_assets.cli import main
from sessionize_assets.core.manifest_state import ItemStatus
from sessionize_assets.demo import DEMO_SETTINGS
from sessionize_assets.home import Home
from sessionize_assets.jars import jars_dir
from sessionize_assets.resources.processing_manifest import item_states
from sessionize_assets.resources.shared_reads import sharing
from sessionize_assets.resources.tables import (
    ATTRIBUTES,
    DAILY_AGGREGATE_HORIZONS,
    DAILY_AGGREGATES,
    DAYS_TO_PROCESS,
    EVENTS,
    FILTERED_EVENTS,
    INCREMENTAL_MANIFEST,
    INVALID_EVENTS,
    QUARANTINED_SESSIONS,
    SESSIONS,
    SESSIONS_LIFECYCLE_MANIFEST,
    SUPERSEDED_SESSIONS,
    USERS,
)
from sessionize_assets_tests.conftest import spark_settings_yaml

REPO = Path(__file__).resolve().parents[1]
START = dt.date(2024, 3, 1)
DAYS = 3
NOW = "2024-03-04T00:30:00"
# Every table a run writes (the processing manifest and Dagster's own records aside).
COMPARED = (
    EVENTS,
    INVALID_EVENTS,
    FILTERED_EVENTS,
    DAYS_TO_PROCESS,
    DAILY_AGGREGATE_HORIZONS,
    DAILY_AGGREGATES,
    ATTRIBUTES,
    SESSIONS,
    USERS,
    SESSIONS_LIFECYCLE_MANIFEST,
    QUARANTINED_SESSIONS,
    SUPERSEDED_SESSIONS,
    INCREMENTAL_MANIFEST,
)
# Columns that record by which load or run something was written, not what.
VOLATILE = {"_load_id", "filtered_materialization_id", "consumed_version"}
# The data is from 2024 (and `--now` too): a timestamp after this is the wall clock of a write
# (`decided_at`, `aggregated_at`, `decided_through`, ...), which differs between any two runs.
WALL_CLOCK_AFTER = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)


def _table_rows(path: str) -> tuple[list[str], list[tuple]]:
    import pyarrow as pa
    import pyarrow.compute as pc
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        table = DeltaTable(path).to_pyarrow_table()
    except TableNotFoundError:
        return [], []

    def wall_clock(name: str) -> bool:
        column = table[name]
        if not pa.types.is_timestamp(column.type) or column.null_count == len(column):
            return False
        latest = pc.max(column.cast(pa.timestamp("us", tz="UTC"))).as_py()
        return latest is not None and latest >= WALL_CLOCK_AFTER

    columns = sorted(
        c
        for c in table.column_names
        if c not in VOLATILE and not c.endswith("run_id") and not wall_clock(c)
    )
    rows = table.select(columns).to_pylist()
    return columns, sorted((tuple(repr(r[c]) for c in columns) for r in rows), key=repr)


def _cli(home: Path, *args: str) -> None:
    code = main(["--home", str(home), "--now", NOW, *args])
    assert code == 0, args


def _prepare(home: Path, landing: Path) -> None:
    home.mkdir()
    # The killed runs are processes of their own: they start the tests' JVM.
    (home / "sessionize.yaml").write_text(
        DEMO_SETTINGS + "backfill_limit_days: 30\n" + spark_settings_yaml()
    )
    for offset in range(DAYS):
        day = START + dt.timedelta(days=offset)
        _cli(home, "load", str(landing / f"load_date={day}"), "--load-tstamp-from", "load_tstamp")


def _locked(manifest: str) -> dict[str, object]:
    from deltalake.exceptions import DeltaError

    try:
        states = item_states(manifest)
    except (DeltaError, OSError):  # the table may be mid-creation: look again (nothing else)
        return {}
    return {k: s for k, s in states.items() if s.status is ItemStatus.LOCKED}


def spawn_cli(
    home: Path, args: list[str], log: Path, env: dict[str, str] | None = None
) -> subprocess.Popen:
    """`sessionize --home HOME --now NOW ARGS` in its own process group (so a SIGKILL reaches its
    Spark JVM too), output to `log`."""
    child_env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "PYSPARK_PYTHON": sys.executable,
        "SESSIONIZE_JARS_DIR": str(jars_dir()),
        **(env or {}),
    }
    with log.open("w") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "sessionize_assets.cli", "--home", str(home), "--now", NOW]
            + args,
            cwd=REPO,
            env=child_env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _kill_while_locked(home: Path, log: Path, prefixes: tuple[str, ...]) -> list[str]:
    """Start `sessionize run` in its own process group; SIGKILL it once it holds a lock on a
    partition whose item starts with one of `prefixes`; the items left locked."""
    manifest = Home(home).table("processing_manifest")
    process = spawn_cli(home, ["run"], log)
    try:
        deadline = time.monotonic() + 600
        while True:
            locked = _locked(manifest)
            if any(item.startswith(prefixes) for item in locked):
                os.killpg(process.pid, signal.SIGKILL)
                break
            if process.poll() is not None:
                pytest.fail(
                    f"the run finished before it could be killed:\n{log.read_text()[-3000:]}"
                )
            if time.monotonic() > deadline:
                pytest.fail(f"no lock seen in time:\n{log.read_text()[-3000:]}")
            time.sleep(0.1)
        assert process.wait(timeout=60) == -signal.SIGKILL
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    return sorted(_locked(manifest))


def test_an_interrupted_backfill_resumes_at_its_first_unfinished_window(
    spark, tmp_path, capsys, monkeypatch
):
    """`sessionize backfill` runs its load days as cursor windows checkpointed in cursor_state;
    when a window fails, running the same backfill again starts at that window, and once it is
    done the checkpoint is cleared so the next backfill of the range redoes it all."""
    from sessionize_assets.core.cursor import CursorState
    from sessionize_assets.core.load_windows import backfill_cursor_name
    from sessionize_assets.resources.cursor_store import (
        CursorCheckpointStore,
        read_cursor_history,
        read_cursor_state,
    )
    from sessionize_assets.resources.processing_manifest import ProcessingManifest
    from sessionize_assets_tests.time_based.test_steps import ROWS, append_events, make_lake

    home = tmp_path / "home"
    lake = make_lake(home, backfill_limit_days=2)
    append_events(spark, lake, ROWS)
    now = ["--home", str(home), "--now", "2024-03-08T12:00:00"]
    with sharing() as shared:  # the command's own block joins this one: its counts stay readable
        assert main([*now, "run"]) == 0
    # The session branch took the event days daily_aggregates had read from memory (the verify
    # below checks the tables against a full recompute).
    assert shared.served_reads >= 1 and shared.served_days >= 1, shared
    cursor_table = lake.table("cursor_state")
    name = backfill_cursor_name(dt.date(2024, 3, 1), dt.date(2024, 3, 5))

    # Another run holds load day 03-03: the second window (03-03, 03-04) fails.
    manifest = ProcessingManifest(spark, lake.table("processing_manifest"))
    manifest.lock("filtered_events/2024-03-03", "filtered_events", "someone-else")
    capsys.readouterr()
    backfill = [*now, "backfill", "--start", "2024-03-01", "--end", "2024-03-05"]
    assert main(backfill) == 3  # blocked by a live holder (this process): exit status 3
    captured = capsys.readouterr()
    error = captured.out.strip().splitlines()[-1]  # the summary line
    assert error.startswith("Summary: time-based branch: blocked: "), error
    assert "Traceback" not in captured.err
    assert "filtered_events/2024-03-03" in error and "someone-else" in error, error
    checkpoint = read_cursor_state(cursor_table, name)
    assert checkpoint.global_cursor == dt.datetime(2024, 3, 3, tzinfo=dt.UTC), (
        error,
        read_cursor_history(cursor_table, name),
    )
    assert main([*now, "status"]) == 0
    assert f"{name}: done before 2024-03-03T00:00:00+00:00" in capsys.readouterr().out

    manifest.abandon("filtered_events/2024-03-03", "released by the test")
    manifest.resolve("filtered_events/2024-03-03", "released by the test")
    with sharing() as shared:
        assert main(backfill) == 0
    assert shared.served_reads >= 1 and shared.served_days >= 1, shared
    out = capsys.readouterr().out
    assert "Resuming an interrupted backfill: load days before 2024-03-03" in out, out
    assert "re-materialized for 2024-03-01..2024-03-02" not in out
    assert "re-materialized for 2024-03-03..2024-03-04" in out
    assert "re-materialized for 2024-03-05" in out
    states = [
        json.loads(row["state"]).get("state", {}).get("cursor")
        for row in read_cursor_history(cursor_table, name)
    ]
    assert states == [
        "2024-03-03T00:00:00+00:00",  # the first invocation's only finished window
        "2024-03-05T00:00:00+00:00",
        "2024-03-06T00:00:00+00:00",
        None,  # done: cleared
    ]
    assert main([*now, "verify"]) == 0

    # A checkpoint left behind is ignored with --restart: every window is redone (a one-window
    # range: without --restart it would resume at 03-02 and print only that day).
    store = CursorCheckpointStore(spark, cursor_table)
    one_window = backfill_cursor_name(dt.date(2024, 3, 1), dt.date(2024, 3, 2))
    store.save(one_window, CursorState(global_cursor=dt.datetime(2024, 3, 2, tzinfo=dt.UTC)))
    capsys.readouterr()
    restart = [*now, "backfill", "--start", "2024-03-01", "--end", "2024-03-02", "--restart"]
    assert main(restart) == 0
    out = capsys.readouterr().out
    assert "Resuming" not in out
    assert "re-materialized for 2024-03-01..2024-03-02" in out, out
    assert read_cursor_state(cursor_table, one_window) == CursorState()

    # Once the runs have taken everything (backfill_limit_days 2: a few runs), a run with
    # nothing new launches no Dagster run, so it starts no Spark session and opens no Dagster
    # instance.
    from sessionize_assets.commands.context import CommandContext

    for _ in range(6):
        assert main([*now, "run"]) == 0
        out = capsys.readouterr().out
        if "Nothing to do" in out and "Session models: 0 run(s)" in out:
            break
    else:
        pytest.fail(f"the runs never caught up:\n{out}")

    def no_spark(*_args, **_kwargs):
        pytest.fail("the no-op run started Spark")

    def no_instance(*_args, **_kwargs):
        pytest.fail("the no-op run opened the Dagster instance")

    with monkeypatch.context() as patched:
        patched.setattr(CommandContext, "spark", property(no_spark))
        patched.setattr("sessionize_assets.resources.spark.get_spark", no_spark)
        patched.setattr(CommandContext, "instance", property(no_instance))
        assert main([*now, "run"]) == 0
    out = capsys.readouterr().out
    assert "Nothing to do" in out and "Session models: 0 run(s)" in out, out
    # In a process of its own, the no-op imports neither Dagster nor dagster-pyspark (about half
    # of its time): both branches plan with a `Lake`, not the Dagster resource. The probe leaves
    # as the `sessionize` command does (`cli.leave`): the interpreter's native teardown can abort
    # on delta-rs' and pyarrow's worker threads after the work is done (exit -6, seen in CI).
    probe = (
        "import sys; from sessionize_assets.cli import leave, main; status = main(sys.argv[1:]); "
        "print('loaded:', [m for m in ('dagster', 'dagster_pyspark') if m in sys.modules]); "
        "leave(status)"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, *now, "run"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "Nothing to do" in done.stdout and "loaded: []" in done.stdout, done.stdout
