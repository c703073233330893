"""The home's command lock: a second writer learns who holds it at once, before Spark starts."""

import subprocess
import sys
import time

import pytest

from sessionize_assets.errors import ItemLockedError
from sessionize_assets.resources.command_lock import command_lock

HOLDER = """
import sys, time
from pathlib import Path
from sessionize_assets.resources.command_lock import command_lock
with command_lock(Path(sys.argv[1]), "run"):
    Path(sys.argv[2]).touch()
    time.sleep(float(sys.argv[3]))
"""


def _hold(tmp_path, seconds: float) -> subprocess.Popen:
    ready = tmp_path / f"ready-{time.monotonic_ns()}"
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tmp_path / "home"), str(ready), str(seconds)]
    )
    deadline = time.monotonic() + 60
    while not ready.exists():
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.05)
    return proc


def test_a_second_command_is_refused_at_once_naming_the_holder(tmp_path) -> None:
    proc = _hold(tmp_path, 30)
    try:
        started = time.monotonic()
        with pytest.raises(ItemLockedError) as refused:
            with command_lock(tmp_path / "home", "backfill"):
                pass
        assert time.monotonic() - started < 2
        assert f"process {proc.pid}" in str(refused.value)
        assert "`sessionize run`" in str(refused.value) and "--wait" in str(refused.value)
    finally:
        proc.kill()
        proc.wait()


def test_a_killed_holder_leaves_nothing_behind_and_wait_waits(tmp_path) -> None:
    proc = _hold(tmp_path, 2)
    started = time.monotonic()
    with command_lock(tmp_path / "home", "run", wait_s=60):  # waits for the holder to end
        assert time.monotonic() - started >= 0.5  # it did wait: the holder still had it
    assert proc.wait(timeout=30) == 0
    proc = _hold(tmp_path, 60)
    proc.kill()  # SIGKILL: the kernel releases the lock
    proc.wait()
    with command_lock(tmp_path / "home", "run"):
        pass


def test_a_second_run_from_the_command_line_exits_blocked_before_starting_spark(tmp_path) -> None:
    """Two `sessionize run`s together: the second learns it is blocked from the lock alone, exits
    with status 3 naming the holder, and never starts a JVM (no Spark child process)."""
    import psutil

    proc = _hold(tmp_path, 120)
    try:
        second = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "sessionize_assets.cli",
                "--home",
                str(tmp_path / "home"),
                "run",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        started_java = False
        while second.poll() is None:
            try:
                children = psutil.Process(second.pid).children(recursive=True)
                started_java |= any("java" in c.name() for c in children)
            except psutil.Error:
                pass
            time.sleep(0.05)
        _, err = second.communicate(timeout=60)
        assert second.returncode == 3, err
        assert f"process {proc.pid}" in err and "--wait" in err
        assert not started_java
    finally:
        proc.kill()
        proc.wait()
