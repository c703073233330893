"""The fault-injection matrix: a `sessionize load` or `run` killed (SIGKILL to its process group:
Python and its Spark JVM) at a named fail point around a Delta commit (`sessionize_assets.faults`),
then the same command again with no manual step, gives every table of a process that was never
killed, and `verify` passes.

CI runs the points in `CI_POINTS` (one per kind of damage: a load cut between its tables, the
time-based branch cut between its tables, the session branch cut before its manifest, the
processing manifest cut right after a lock; session 16 left out the session branch cut between
its tables and the session step killed with its lock held, to keep CI within its time: they stay
in `ALL_POINTS`). `SESSIONIZE_FAULT_MATRIX=all` runs
every point in `ALL_POINTS` (for the benchmark machine). Each point prints how long the healing
command took (`pytest -s` shows it). The last test kills a run from outside, at no fail point, while
it holds a lock, and checks that the next run abandons that lock by itself.
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
import signal
import time
from pathlib import Path

import pytest

from sessionize_assets.cli import main
from sessionize_assets.faults import FAIL_AT, FAIL_REPORT
from sessionize_assets.generator import generate
from sessionize_assets.home import Home
from sessionize_assets.resources.processing_manifest import read_records
from sessionize_assets.resources.tables import EVENTS, INVALID_EVENTS, LOAD_LOG, SESSIONS
from sessionize_assets_tests.conftest import preserved_environment
from sessionize_assets_tests.test_pipeline_recovery import (
    COMPARED,
    DAYS,
    NOW,
    START,
    _kill_while_locked,
    _locked,
    _prepare,
    _table_rows,
    spawn_cli,
)

LOADED = (EVENTS, INVALID_EVENTS, LOAD_LOG)

# (command, fail point)
CI_POINTS = [
    ("load", "after-commit:events"),
    ("run", "after-commit:filtered_events"),
    ("run", "before-commit:incremental_manifest"),
    ("run", "after-commit:processing_manifest"),
]
# Every step boundary (faults.step_of) of the run's assets, both sides.
STEP_POINTS = [
    ("run", f"{side}:{asset}")
    for asset in (
        "filtered_events",
        "days_to_process",
        "daily_aggregates",
        "daily_aggregation_manifest",
        "attributes",
        "session_models",
    )
    for side in ("step-start", "step-end")
]
ALL_POINTS = (
    CI_POINTS
    + [p for p in STEP_POINTS if p not in CI_POINTS]
    + [
        ("run", "after-commit:sessions"),
        ("load", "after-commit:invalid_events"),
        ("load", "before-commit:load_log"),
        ("run", "after-commit:days_to_process"),
        ("run", "after-commit:filtered_events_accounting"),
        ("run", "after-commit:daily_aggregate_horizons"),
        ("run", "before-commit:daily_aggregates"),
        ("run", "after-commit:daily_aggregates"),
        ("run", "after-commit:attributes"),
        ("run", "after-commit:sessions_lifecycle_manifest"),
        ("run", "after-commit:users"),
        ("run", "before-commit:filtered_events"),
        ("run", "after-commit:daily_aggregation_manifest"),
        ("run", "before-commit:sessions"),
        ("run", "after-commit:incremental_manifest"),
    ]
)
POINTS = ALL_POINTS if os.environ.get("SESSIONIZE_FAULT_MATRIX") == "all" else CI_POINTS


def _cli(home: Path, *args: str) -> int:
    return main(["--home", str(home), "--now", NOW, *args])


@pytest.fixture(scope="module")
def homes(spark, tmp_path_factory) -> dict[str, Path]:
    """A landing folder; `two`: a home with two load days loaded; `loaded`: all three loaded;
    `reference`: all three loaded and run, never interrupted."""
    del spark  # the in-process commands share the session's Spark
    root = tmp_path_factory.mktemp("faults")
    landing = root / "landing"
    generate(landing, start_date=START, days=DAYS, events_per_day=250, seed=7)
    with preserved_environment():
        _prepare(root / "loaded", landing)
        shutil.copytree(root / "loaded", root / "reference")
        assert _cli(root / "reference", "run") == 0
        two = root / "two"
        two.mkdir()
        (two / "sessionize.yaml").write_text((root / "loaded" / "sessionize.yaml").read_text())
        for offset in range(DAYS - 1):
            day = START + dt.timedelta(days=offset)
            assert (
                _cli(
                    two,
                    "load",
                    str(landing / f"load_date={day}"),
                    "--load-tstamp-from",
                    "load_tstamp",
                )
                == 0
            )
    return {
        "landing": landing,
        "two": two,
        "loaded": root / "loaded",
        "reference": root / "reference",
    }


def _killed_at(home: Path, point: str, args: list[str], log: Path) -> None:
    """Run the command in its own process group with the fail point set; it must die by SIGKILL."""
    report = log.with_suffix(".point")
    process = spawn_cli(home, args, log, {FAIL_AT: point, FAIL_REPORT: str(report)})
    try:
        code = process.wait(timeout=900)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    text = log.read_text()
    assert report.exists() and f"fail point {point}:" in report.read_text(), (
        f"the command never reached {point} (exit {code}):\n{text[-3000:]}"
    )
    assert code == -signal.SIGKILL, text[-3000:]


def _assert_tables_equal(home: Path, reference: Path, names: tuple[str, ...]) -> None:
    for name in names:
        want = _table_rows(Home(reference).table(name))
        got = _table_rows(Home(home).table(name))
        assert want[0], f"the uninterrupted home has no {name} table"  # missing on both: not equal
        assert got == want, f"{name} differs from the uninterrupted home after healing"


@pytest.mark.parametrize(("command", "point"), POINTS, ids=[f"{c}-{p}" for c, p in POINTS])
def test_killed_at_a_fail_point_then_run_again_gives_the_uninterrupted_tables(
    homes, tmp_path, command, point
):
    home = tmp_path / "home"
    if command == "load":
        shutil.copytree(homes["two"], home)
        last = START + dt.timedelta(days=DAYS - 1)
        args = [
            "load",
            str(homes["landing"] / f"load_date={last}"),
            "--load-tstamp-from",
            "load_tstamp",
        ]
        reference, compared = homes["loaded"], LOADED
    else:
        shutil.copytree(homes["loaded"], home)
        args = ["run"]
        reference, compared = homes["reference"], COMPARED

    _killed_at(home, point, args, tmp_path / "killed.log")

    started = time.monotonic()
    assert _cli(home, *args) == 0, f"{command} did not heal after a kill at {point}"
    print(
        f"\nfault matrix: {command} killed at {point}: healed in {time.monotonic() - started:.1f} s"
    )
    _assert_tables_equal(home, reference, compared)
    if command == "run":
        assert _cli(home, "verify") == 0


def test_a_run_killed_from_outside_heals_itself_and_gives_the_uninterrupted_tables(
    homes, tmp_path, capsys
):
    """Not at a fail point: SIGKILL from outside while the run holds a lock on an aggregate
    (filtered_events and days_to_process are committed, an aggregate is not). `status` shows the
    lock; the next run abandons it by itself (its process is gone, recorded in the manifest's
    history), redoes the work, and gives the uninterrupted home's tables."""
    killed = tmp_path / "killed"
    shutil.copytree(homes["loaded"], killed)
    manifest = Home(killed).table("processing_manifest")
    locked = _kill_while_locked(killed, tmp_path / "killed-run.log", ("daily_aggregates/",))
    assert locked, "the killed run left no lock"

    capsys.readouterr()
    assert _cli(killed, "status") == 0
    status = capsys.readouterr().out
    for item in locked:
        assert any(item in line and "locked" in line for line in status.splitlines()), status
    assert _cli(killed, "run") == 0
    history = read_records(manifest)
    for item in locked:
        reasons = [str((r.payload or {}).get("reason", "")) for r in history if r.item_id == item]
        assert any(r.startswith("lock abandoned automatically: its process") for r in reasons), (
            item,
            reasons,
        )
    assert not _locked(manifest)
    _assert_tables_equal(killed, homes["reference"], COMPARED)
    assert _table_rows(Home(homes["reference"]).table(SESSIONS))[1], "the reference has no sessions"
    assert _cli(killed, "verify") == 0
