"""Real races on a real Delta table: two OS processes with their own Spark sessions, and a killed run.

Run as a script, this file is the worker those tests start (`python THIS_FILE race|hold ...`).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# Short-lived worker JVMs: C1-only JIT and serial GC halve their CPU time (measured: 15 locks
# took 30 CPU-s instead of 53, start-up 8 instead of 17), which matters on a 2-core CI machine.
WORKER_SPARK = {
    "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -XX:ReservedCodeCacheSize=256m",
    "spark.master": "local[1]",
    "spark.driver.memory": "512m",
    "spark.sql.shuffle.partitions": "1",
    "spark.databricks.delta.snapshotPartitions": "1",
}
ITEMS = [f"race/item-{i:02d}" for i in range(20)]


# ------------------------------------------------------------------------------ the workers


def _wait_for(path: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear")
        time.sleep(0.02)


def race_worker(args: argparse.Namespace) -> None:
    """Lock every item once, as soon as the parent says go; report wins and losses as JSON."""
    from sessionize_assets.errors import ItemLockedError
    from sessionize_assets.resources.processing_manifest import ProcessingManifest
    from sessionize_assets.resources.spark import get_spark

    spark = get_spark(WORKER_SPARK)
    manifest = ProcessingManifest(spark, args.path)
    manifest.ensure_table()
    # Warm the write path up on an item of its own, so both contenders start hot.
    manifest.lock(f"warmup/{args.run_id}", "race", args.run_id)
    Path(args.ready).touch()
    _wait_for(Path(args.go), timeout=300)
    outcome: dict[str, object] = {"run_id": args.run_id, "won": [], "lost": {}}
    started = time.monotonic()
    for item in ITEMS:
        try:
            manifest.lock(item, "race", args.run_id)
            outcome["won"].append(item)
        except ItemLockedError as error:
            outcome["lost"][item] = str(error)
    outcome["seconds"] = time.monotonic() - started
    outcome["conflicts"] = manifest.conflicts
    outcome["cpu_seconds"] = _cpu_seconds()
    Path(args.out).write_text(json.dumps(outcome))
    # Stay alive (holding the locks won) until both contenders are done: a holder that exits is
    # gone, and the other contender would rightly heal its locks (see `heal`).
    _wait_for(Path(args.go).with_name("done"), timeout=300)


def _cpu_seconds() -> float | None:
    """CPU time of this worker and its JVM so far (load-independent cost), if psutil is there."""
    try:
        import psutil
    except ImportError:
        return None
    me = psutil.Process()
    processes = [me, *me.children(recursive=True)]
    return round(sum(sum(p.cpu_times()[:2]) for p in processes), 1)


def hold_worker(args: argparse.Namespace) -> None:
    """Take a lock, say so, and work "forever" (the test SIGKILLs this process)."""
    from sessionize_assets.resources.processing_manifest import ProcessingManifest
    from sessionize_assets.resources.spark import get_spark

    spark = get_spark(WORKER_SPARK)
    manifest = ProcessingManifest(spark, args.path)
    with manifest.processing(args.item, "killed", args.run_id) as payload:
        payload["started"] = True
        Path(args.ready).touch()
        time.sleep(600)


def _spawn(log: Path, *args: str) -> subprocess.Popen:
    """Start this file as a worker; its stderr goes to `log` (a pipe could fill and block it)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYSPARK_PYTHON": sys.executable}
    with log.open("w") as stderr:
        process = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), *args],
            cwd=REPO,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
    process.log = log  # type: ignore[attr-defined]
    return process


def _tail(process: subprocess.Popen) -> str:
    return process.log.read_text()[-3000:]  # type: ignore[attr-defined]


def _wait_ready(process: subprocess.Popen, ready: Path, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not ready.exists():
        if process.poll() is not None:
            raise AssertionError(f"worker exited early: {_tail(process)}")
        if time.monotonic() > deadline:
            process.kill()
            raise AssertionError(f"worker did not get ready in time: {_tail(process)}")
        time.sleep(0.05)


# -------------------------------------------------------------------------------- the tests


def test_two_processes_racing_for_the_same_items_exactly_one_wins_each(tmp_path):
    from sessionize_assets.core.manifest_state import ItemStatus, RecordState
    from sessionize_assets.resources.processing_manifest import item_states, read_records

    path = str(tmp_path / "processing_manifest")
    go = tmp_path / "go"
    runs = ["run-a", "run-b"]
    workers = []
    for run_id in runs:
        ready, out = tmp_path / f"{run_id}.ready", tmp_path / f"{run_id}.json"
        process = _spawn(
            tmp_path / f"{run_id}.log",
            "race", "--path", path, "--run-id", run_id, "--ready", str(ready),
            "--go", str(go), "--out", str(out),
        )  # fmt: skip
        workers.append((process, ready, out))
    try:
        for process, ready, _ in workers:
            _wait_ready(process, ready)
        go.touch()
        deadline = time.monotonic() + 240
        for process, _, out in workers:
            while not out.exists():
                assert process.poll() is None, _tail(process)
                assert time.monotonic() < deadline, "a contender did not finish in time"
                time.sleep(0.1)
        (tmp_path / "done").touch()
        for process, _, _ in workers:
            assert process.wait(timeout=60) == 0, _tail(process)
    finally:
        for process, _, _ in workers:
            if process.poll() is None:
                process.kill()
    outcomes = [json.loads(out.read_text()) for _, _, out in workers]

    states = item_states(path, prefix="race/")
    assert sorted(states) == ITEMS
    for item in ITEMS:
        winners = [o["run_id"] for o in outcomes if item in o["won"]]
        losers = [o["run_id"] for o in outcomes if item in o["lost"]]
        assert len(winners) == 1, (item, outcomes)
        assert len(losers) == 1 and losers != winners
        message = next(o["lost"][item] for o in outcomes if item in o["lost"])
        assert item in message and winners[0] in message
        state = states[item]
        assert state.status is ItemStatus.LOCKED, state.describe()
        assert state.holder_run_id == winners[0]
        assert [r.state for r in state.records] == [RecordState.PROCESSING]
    # Every item in the table, warm-up items included, is valid.
    every = item_states(path)
    assert all(s.status is not ItemStatus.INVALID for s in every.values())
    assert len(read_records(path)) == len(ITEMS) + len(runs)
    print(
        "race:",
        {
            o["run_id"]: {
                "won": len(o["won"]),
                "conflicts": o["conflicts"],
                "race_seconds": round(o["seconds"], 1),
                "cpu_seconds": o["cpu_seconds"],
            }
            for o in outcomes
        },
    )


def test_a_killed_run_leaves_a_visible_lock_that_the_next_run_heals(tmp_path, spark):
    from sessionize_assets.core.manifest_state import ItemStatus
    from sessionize_assets.errors import ItemLockedError
    from sessionize_assets.resources.processing_manifest import ProcessingManifest, item_state

    path = str(tmp_path / "processing_manifest")
    item = "filtered_events/2024-03-01"
    ready = tmp_path / "held"
    process = _spawn(
        tmp_path / "hold.log",
        "hold",
        "--path",
        path,
        "--item",
        item,
        "--run-id",
        "doomed",
        "--ready",
        str(ready),
    )
    try:
        _wait_ready(process, ready)
        os.kill(process.pid, signal.SIGKILL)
        assert process.wait(timeout=60) == -signal.SIGKILL
    finally:
        if process.poll() is None:
            process.kill()

    later = dt.datetime.now(dt.UTC) + dt.timedelta(hours=2)
    state = item_state(path, item, now=later)
    assert state.status is ItemStatus.LOCKED
    assert state.holder_run_id == "doomed" and state.holder_application == "killed"
    assert dt.timedelta(hours=2) <= state.lock_age < dt.timedelta(hours=3)

    assert state.lock.payload["holder"]["pid"] == process.pid

    # The next run sees the holder's process is gone: it abandons the lock (Failed, with the
    # reason), releases it (Resolved) and takes it, with no operator step.
    manifest = ProcessingManifest(spark, path)
    with manifest.processing(item, "rerun", "rerun-1") as payload:
        payload["rows"] = 1
    final = item_state(path, item)
    assert final.status is ItemStatus.PROCESSED
    assert final.last_processed.run_id == "rerun-1"
    states = [(r.state.value, r.run_id) for r in final.records]
    assert states[-4:] == [
        ("Failed", "rerun-1"),
        ("Resolved", "rerun-1"),
        ("Processing", "rerun-1"),
        ("Processed", "rerun-1"),
    ]
    abandoned = final.records[-4]
    assert abandoned.payload["abandoned_run_id"] == "doomed"
    assert abandoned.payload["reason"] == (
        f"lock abandoned automatically: its process {process.pid} on {socket.gethostname()} is gone"
    )

    # A lock whose holder is alive (this process) is not touched: refused, naming the holder.
    manifest.lock("filtered_events/2024-03-02", "alive", "alive-run")
    with pytest.raises(ItemLockedError, match="alive-run"):
        manifest.lock("filtered_events/2024-03-02", "rerun", "rerun-2")


# --------------------------------------------------------------------------------- entry point


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    commands = parser.add_subparsers(dest="command", required=True)
    race = commands.add_parser("race")
    for name in ("--path", "--run-id", "--ready", "--go", "--out"):
        race.add_argument(name, required=True)
    hold = commands.add_parser("hold")
    for name in ("--path", "--item", "--run-id", "--ready"):
        hold.add_argument(name, required=True)
    args = parser.parse_args(argv)
    (race_worker if args.command == "race" else hold_worker)(args)


if __name__ == "__main__":
    from sessionize_assets.cli import leave

    main(sys.argv[1:])
    # Leave as the `sessionize` command does: the interpreter's native teardown can abort with
    # -6 on delta-rs' and pyarrow's worker threads after the work is done (seen in CI).
    leave(0)
