"""The exit-status contract (README, core/outcomes.py) with real faults: a corrupted commit file,
a lock held by a live run, a bad setting, a difference planted in a table. Each asserts the
status, the summary line and that the other branch's results are kept."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from sessionize_assets.cli import main
from sessionize_assets.home import Home
from sessionize_assets.jars import jars_dir
from sessionize_assets.resources.tables import EVENTS, FILTERED_EVENTS, SESSIONS
from sessionize_assets_tests.conftest import cli_load, cli_now

_now = cli_now
_load = cli_load
# `two_days` (conftest.py, one per session): load days 1 and 2 processed, day 3 in the landing.


def _last_line(text: str) -> str:
    return text.strip().splitlines()[-1]


def _console(home: Path, *args: str) -> subprocess.CompletedProcess:
    """The command as a user runs it: its own process, its own console."""
    return subprocess.run(
        [sys.executable, "-m", "sessionize_assets.cli", "--home", str(home), *args],
        capture_output=True,
        text=True,
        env={**os.environ, "SESSIONIZE_JARS_DIR": str(jars_dir())},
        timeout=600,
    )


def test_a_corrupt_sessions_log_fails_the_run_and_keeps_the_time_based_branch(two_days, tmp_path):
    home = tmp_path / "home"
    shutil.copytree(two_days[0], home)
    _load(home, two_days[1], 3)
    log = sorted((Path(Home(home).table(SESSIONS)) / "_delta_log").glob("*.json"))[-1]
    log.write_text('{"garbage')
    result = _console(home, *_now(4), "run")
    summary = _last_line(result.stdout)
    assert result.returncode == 4, (result.stdout, result.stderr)
    assert summary.startswith("Summary: time-based branch: succeeded; session-based branch: failed")
    assert "what the time-based branch wrote is kept" in summary
    assert "engine.log" in summary
    assert "Traceback" not in result.stdout + result.stderr, result.stderr
    actions = pa.table(DeltaTable(Home(home).table(FILTERED_EVENTS)).get_add_actions(flatten=True))
    days = {str(d) for d in actions.to_pydict()["partition.load_date"]}
    assert "2024-03-03" in days  # the time-based branch moved on

    result = _console(home, *_now(4), "status")
    assert result.returncode == 0, (result.stdout, result.stderr)
    branch = result.stdout.split("session-based branch:", 1)[1].splitlines()[1]
    assert branch.strip().startswith("FAILED: the last 1 run(s) of this branch failed, since "), (
        result.stdout
    )

    result = _console(home, *_now(4), "verify")
    assert result.returncode == 4, (result.stdout, result.stderr)
    error = _last_line(result.stderr)
    assert error.startswith("error: verify could not read the session-based branch"), error
    assert "Traceback" not in result.stderr and "clone3" not in result.stderr, result.stderr


def test_load_with_run_processes_what_it_loaded_in_the_same_command(two_days, tmp_path, capsys):
    """`load --run`: the load's lines, then the run's, and the run's exit status; not with
    --json, whose document describes a load alone."""
    home = tmp_path / "home"
    shutil.copytree(two_days[0], home)
    folder = str(two_days[1] / "load_date=2024-03-03")
    args = ["--home", str(home), *_now(4), "load", folder, "--load-tstamp-from", "load_tstamp"]
    refused = main([*args, "--run", "--json"])
    captured = capsys.readouterr()
    assert refused == 2 and "--run cannot be combined with --json" in captured.err
    events = pa.table(DeltaTable(Home(home).table(EVENTS)).get_add_actions(flatten=True))
    assert "2024-03-03" not in {str(d) for d in events.to_pydict()["partition.load_date"]}

    code = main([*args, "--run"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert out.index(f"loaded {folder}") < out.index("total: read") < out.index("Summary:")
    assert _last_line(out) == (
        "Summary: time-based branch: succeeded; session-based branch: succeeded"
    )
    actions = pa.table(DeltaTable(Home(home).table(FILTERED_EVENTS)).get_add_actions(flatten=True))
    assert "2024-03-03" in {str(d) for d in actions.to_pydict()["partition.load_date"]}


def test_a_planted_difference_makes_verify_exit_1(two_days, tmp_path, capsys):
    home = tmp_path / "home"
    shutil.copytree(two_days[0], home)
    path = Home(home).table(SESSIONS)
    table = DeltaTable(path).to_pyarrow_table()
    write_deltalake(path, table.slice(1), mode="overwrite")  # one session deleted
    capsys.readouterr()
    assert main(["--home", str(home), *_now(3), "verify"]) == 1
    assert "difference" in _last_line(capsys.readouterr().out)


def test_a_lock_held_by_a_live_run_blocks_with_status_3(two_days, tmp_path, capsys, spark):
    from sessionize_assets.resources.processing_manifest import ProcessingManifest

    home = tmp_path / "home"
    shutil.copytree(two_days[0], home)
    _load(home, two_days[1], 3)
    manifest = ProcessingManifest(spark, Home(home).table("processing_manifest"))
    manifest.lock("session_models", "someone", "live-run")  # held by this (live) process
    capsys.readouterr()
    code = main(["--home", str(home), *_now(4), "run"])
    summary = _last_line(capsys.readouterr().out)
    assert code == 3, summary
    assert "time-based branch: succeeded" in summary
    assert "session-based branch: blocked" in summary and "live-run" in summary


def test_a_bad_setting_is_status_2(tmp_path, capsys):
    home = tmp_path / "home"
    home.mkdir()
    (home / "sessionize.yaml").write_text("reprocess_days: many\n")
    config = str(home / "sessionize.yaml")
    assert main(["--home", str(home), "--config", config, "run"]) == 2
    assert "`reprocess_days`" in capsys.readouterr().err


def test_status_lateness_reads_the_delta_log_of_filtered_events(two_days, capsys):
    """`status --lateness` (issue 16): per load day the late share and percentiles, and the
    matrix, from filtered_events' own row counts -- read only, status 0."""
    from sessionize_assets.core.lateness import lateness_by_load_day
    from sessionize_assets.time_based.state import partition_counts

    home = two_days[0]
    capsys.readouterr()
    assert main(["--home", str(home), *_now(3), "status", "--lateness"]) == 0
    out = capsys.readouterr().out
    _, counts = partition_counts(Home(home).table(FILTERED_EVENTS))
    expected = lateness_by_load_day(counts)
    assert [s.load_day.isoformat() for s in expected] == ["2024-03-01", "2024-03-02"]
    for s in expected:
        summary = next(
            line
            for line in out.splitlines()
            if line.split()[:2] == [s.load_day.isoformat(), str(s.rows)]
        )
        assert f"{s.late_share:.1%}" in summary
    assert sum(s.rows for s in expected) == sum(counts.values()) > 0
    assert "rows by days late:" in out


def test_a_spark_option_the_engine_refuses_at_start_up_is_one_sentence_naming_it(tmp_path):
    """No static rule knows spark.memory.fraction's range: Spark's own refusal at start-up is
    turned into the sentence (status 2), naming the key."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "sessionize.yaml").write_text("spark:\n  spark.memory.fraction: 5\n")
    done = _console(home, "verify")
    assert done.returncode == 2, done.stderr
    assert _last_line(done.stderr) == (
        "error: Spark refused the setting `spark.spark.memory.fraction`: spark.memory.fraction "
        "should be between 0 and 1 (was '5.0'). (fix or remove it in the `spark` settings)."
    )
    assert "Traceback" not in done.stderr
