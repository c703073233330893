"""The exit-status contract (core.outcomes): a table of cases."""

import pytest

from sessionize_assets.core.outcomes import (
    BranchOutcome,
    BranchStatus,
    ExitStatus,
    exit_status,
    summary_line,
)
from sessionize_assets.errors import one_sentence, root_cause

OK = BranchOutcome("time-based branch", BranchStatus.SUCCEEDED)
IDLE = BranchOutcome("time-based branch", BranchStatus.NOTHING_TO_DO)
FAILED = BranchOutcome("session-based branch", BranchStatus.FAILED, "the sessions log is corrupt")
BLOCKED = BranchOutcome("session-based branch", BranchStatus.BLOCKED, "locked by run r1")


@pytest.mark.parametrize(
    ("outcomes", "expected"),
    [
        ([], ExitStatus.OK),
        ([OK, IDLE], ExitStatus.OK),
        ([OK, FAILED], ExitStatus.FAILED),  # one branch failed: never 0
        ([OK, BLOCKED], ExitStatus.BLOCKED),
        ([FAILED, BLOCKED], ExitStatus.FAILED),  # the most serious wins
    ],
)
def test_exit_status(outcomes, expected) -> None:
    assert exit_status(outcomes) is expected


def test_summary_line_names_each_branch_and_what_is_kept() -> None:
    line = summary_line([OK, FAILED])
    assert line.startswith("Summary: time-based branch: succeeded; session-based branch: failed")
    assert "the sessions log is corrupt" in line
    assert "what the time-based branch wrote is kept" in line
    assert "kept" not in summary_line([OK, IDLE])


def test_one_sentence_reaches_the_root_cause() -> None:
    try:
        try:
            raise ValueError("[DELTA_LOG_CORRUPT] commit 3 is not JSON\n\tat org.apache...")
        except ValueError as inner:
            raise RuntimeError("step failed") from inner
    except RuntimeError as exc:
        assert isinstance(root_cause(exc), ValueError)
        assert one_sentence(exc) == "ValueError: [DELTA_LOG_CORRUPT] commit 3 is not JSON"
