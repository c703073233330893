"""The exit-status contract of every command, and the per-branch outcome of `run` / `backfill`.

| status | meaning |
|---|---|
| 0 | everything asked for succeeded (or there was nothing to do) |
| 1 | `verify` found differences |
| 2 | a user mistake: settings, paths, arguments (one sentence names it) |
| 3 | an item is held by another live run, or fail-locked until an operator resolves it |
| 4 | a step failed (Spark, the JVM, Delta, Dagster): one sentence, the trace in the engine log |
| 130 | interrupted (Ctrl-C) |

A command that ran several branches exits with the most serious status of its branches
(failed > blocked > succeeded): a scheduler never records success while a branch failed.
Plain Python, no Spark and no Dagster.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import IntEnum, StrEnum


class ExitStatus(IntEnum):
    OK = 0
    DIFFERENCES = 1
    USER_ERROR = 2
    BLOCKED = 3
    FAILED = 4
    INTERRUPTED = 130


class BranchStatus(StrEnum):
    SUCCEEDED = "succeeded"
    NOTHING_TO_DO = "nothing to do"
    BLOCKED = "blocked"
    FAILED = "failed"


_SEVERITY = {
    BranchStatus.SUCCEEDED: ExitStatus.OK,
    BranchStatus.NOTHING_TO_DO: ExitStatus.OK,
    BranchStatus.BLOCKED: ExitStatus.BLOCKED,
    BranchStatus.FAILED: ExitStatus.FAILED,
}


@dataclass(frozen=True)
class BranchOutcome:
    """How one branch of a command ended, with the one-sentence reason when it did not succeed."""

    branch: str
    status: BranchStatus
    reason: str = ""

    def sentence(self) -> str:
        if self.status in (BranchStatus.SUCCEEDED, BranchStatus.NOTHING_TO_DO):
            return f"{self.branch}: {self.status.value}"
        return f"{self.branch}: {self.status.value}: {self.reason}"


def exit_status(outcomes: Iterable[BranchOutcome]) -> ExitStatus:
    """The most serious status among the branches (OK when there are none)."""
    return max((_SEVERITY[o.status] for o in outcomes), default=ExitStatus.OK)


def summary_line(outcomes: Iterable[BranchOutcome]) -> str:
    """The last line of `run` / `backfill`: every branch's outcome, in one line."""
    outcomes = list(outcomes)
    kept = [
        o.branch
        for o in outcomes
        if o.status is BranchStatus.SUCCEEDED
        and any(x.status in (BranchStatus.FAILED, BranchStatus.BLOCKED) for x in outcomes)
    ]
    line = "Summary: " + "; ".join(o.sentence() for o in outcomes)
    if kept:
        line += f" (what the {', '.join(kept)} wrote is kept)"
    return line
