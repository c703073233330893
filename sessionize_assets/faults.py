"""Fail points for the fault-injection tests (`sessionize_assets_tests/test_fault_matrix.py`).

With `SESSIONIZE_FAIL_AT=<point>` in its environment, a process kills itself with SIGKILL (its
whole process group when it leads one: the Python process and its embedded Spark JVM) the first
time it reaches that point, as a power cut or an out-of-memory kill would. Without the variable a
point costs one dictionary lookup. Points are named `before-commit:<table>` and
`after-commit:<table>` around every Delta commit the loader and both branches make (Spark and
delta-rs writes alike), and `step-start:<asset>` / `step-end:<asset>` at the boundaries of every
Dagster step's work (`step_of`): after its locks are taken and before they are closed.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager

FAIL_AT = "SESSIONIZE_FAIL_AT"
# A file the point's name is appended to before the kill (Dagster captures a step's stderr).
FAIL_REPORT = "SESSIONIZE_FAIL_REPORT"


def table_name(path: str) -> str:
    """A table's name: the last part of its path or URI."""
    return str(path).rstrip("/").rsplit("/", 1)[-1]


def point(name: str) -> None:
    """Die here (SIGKILL) when `SESSIONIZE_FAIL_AT` names this point."""
    if os.environ.get(FAIL_AT) != name:
        return
    message = f"fail point {name}: killing this process\n"
    report = os.environ.get(FAIL_REPORT)
    if report:
        with open(report, "a", encoding="utf-8") as out:
            out.write(message)
    sys.stderr.write(message)
    sys.stderr.flush()
    if os.getpgrp() == os.getpid():
        os.killpg(os.getpid(), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


@contextmanager
def commit_of(path: str) -> Iterator[None]:
    """The fail points around one Delta commit to the table at `path`."""
    table = table_name(path)
    point(f"before-commit:{table}")
    yield
    point(f"after-commit:{table}")


@contextmanager
def step_of(asset: str) -> Iterator[None]:
    """The fail points at the boundaries of one asset's work within its Dagster step."""
    point(f"step-start:{asset}")
    yield
    point(f"step-end:{asset}")
