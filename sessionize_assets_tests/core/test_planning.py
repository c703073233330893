"""The time-based planner (core.planning): tables of cases, no Spark."""

import datetime as dt

import pytest

from sessionize_assets.core.load_windows import load_window
from sessionize_assets.core.planning import (
    DECIDE_ONLY,
    FILTER_AND_DECIDE,
    LoadDayRun,
    finish_due,
    last_started_day,
    load_day_runs,
    next_load_days,
    reached_load_days,
    ready_event_days,
    redo_cascade,
)

START = dt.date(2024, 3, 1)


def d(n: int) -> dt.date:
    return dt.date(2024, 3, n)


def t(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text).replace(tzinfo=dt.UTC)


@pytest.mark.parametrize(
    ("days", "refilter", "max_days", "expected"),
    [
        ([], [], 3, []),
        ([d(1)], [d(1)], 3, [LoadDayRun(d(1), d(1), FILTER_AND_DECIDE)]),
        # contiguous, all refiltered, capped at max_days partitions per run
        (
            [d(1), d(2), d(3), d(4)],
            [d(1), d(2), d(3), d(4)],
            3,
            [LoadDayRun(d(1), d(3), FILTER_AND_DECIDE), LoadDayRun(d(4), d(4), FILTER_AND_DECIDE)],
        ),
        # split where the need changes: d(2) only needs its decisions redone
        (
            [d(1), d(2), d(3)],
            [d(1), d(3)],
            5,
            [
                LoadDayRun(d(1), d(1), FILTER_AND_DECIDE),
                LoadDayRun(d(2), d(2), DECIDE_ONLY),
                LoadDayRun(d(3), d(3), FILTER_AND_DECIDE),
            ],
        ),
        # a gap splits runs; input order does not matter
        (
            [d(5), d(1), d(2)],
            [],
            5,
            [LoadDayRun(d(1), d(2), DECIDE_ONLY), LoadDayRun(d(5), d(5), DECIDE_ONLY)],
        ),
    ],
)
def test_load_day_runs(days, refilter, max_days, expected) -> None:
    assert load_day_runs(days, refilter, max_days) == expected


@pytest.mark.parametrize(
    ("pending", "blocked", "expected_days", "expected_held"),
    [
        # first run: the window starts at start_date; B = 2 -> at most 3 load days
        ([d(1), d(2), d(3), d(4)], [], [d(1), d(2)], []),
        # a blocked day is left out and does not hold the window back
        ([d(1), d(2)], [d(1)], [d(2)], [d(1)]),
        # nothing pending
        ([], [], [], []),
        # days not started by now are never planned
        ([d(9)], [], [], []),
    ],
)
def test_next_load_days(pending, blocked, expected_days, expected_held) -> None:
    now = t("2024-03-05T12:00:00")
    window = load_window(START, 2, now, {"filtered_events": None, "days_to_process": None})
    plan, held = next_load_days(window, pending, 2, now, blocked)
    assert list(plan.load_days) == expected_days
    assert held == expected_held


@pytest.mark.parametrize(
    ("pending", "processed", "known", "lookback", "latest", "expected"),
    [
        # later load days that became pending within the look-back are reached
        ([d(3), d(4), d(6)], [d(1), d(2)], [], 2, d(10), [d(3), d(4)]),
        # days already pending before the run are not "reached"
        ([d(3), d(4)], [d(1), d(2)], [d(3)], 2, d(10), [d(4)]),
        # not after the last started day
        ([d(3), d(4)], [d(1), d(2)], [], 2, d(3), [d(3)]),
        # nothing processed: nothing reached
        ([d(3)], [], [], 2, d(10), []),
        # days before the first processed day are not reached by it
        ([d(1)], [d(2)], [], 2, d(10), []),
    ],
)
def test_reached_load_days(pending, processed, known, lookback, latest, expected) -> None:
    assert reached_load_days(pending, processed, known, lookback, latest) == expected


@pytest.mark.parametrize(
    ("now", "expected"),
    [
        (t("2024-03-05T00:00:00"), d(4)),  # at midnight the day has not started yet
        (t("2024-03-05T00:00:01"), d(5)),
        (t("2024-03-05T23:59:59"), d(5)),
    ],
)
def test_last_started_day(now, expected) -> None:
    assert last_started_day(now) == expected


def test_ready_event_days_splits_at_today() -> None:
    stamp = t("2024-03-05T01:00:00")
    assert ready_event_days({d(6): stamp, d(2): stamp, d(5): stamp}, d(5)) == (
        [d(2), d(5)],
        [d(6)],
    )
    assert ready_event_days([], d(5)) == ([], [])


@pytest.mark.parametrize(
    ("has_aggregates", "changed", "stale", "expected"),
    [
        (False, True, True, False),  # nothing to compute attributes from
        (True, False, False, False),  # nothing changed, attributes current
        (True, True, False, True),
        (True, False, True, True),
    ],
)
def test_finish_due(has_aggregates, changed, stale, expected) -> None:
    assert finish_due(has_aggregates, changed, stale) is expected


class _Marks:
    """A plain-Python stand-in for the processing manifest's pending load days: redoing a day
    clears it and marks the later days its duplicates reach (`reaches`)."""

    def __init__(self, pending: set[dt.date], reaches: dict[dt.date, list[dt.date]]) -> None:
        self.pending, self.reaches, self.redone = set(pending), reaches, []

    def redo(self, days: list[dt.date]) -> None:
        for day in days:
            self.redone.append(day)
            self.pending.discard(day)
            self.pending |= set(self.reaches.get(day, []))


def test_redo_cascade_redoes_a_day_again_when_a_later_redo_reaches_it() -> None:
    # Found by a random history: the run processed 4, 6 and 7; 4's new rows reached 5, and
    # redoing 5 reached 6 again (6 had been processed before 5). Both must be redone.
    marks = _Marks({d(5)}, {d(5): [d(6)]})
    redone = redo_cascade(lambda: marks.pending, marks.redo, [d(4), d(6), d(7)], set(), 2, d(8))
    assert redone == [d(5), d(6)] and marks.pending == set()


def test_redo_cascade_leaves_days_left_for_later_and_days_past_latest() -> None:
    marks = _Marks({d(5), d(6)}, {d(5): [d(9)]})
    redone = redo_cascade(lambda: marks.pending, marks.redo, [d(4)], {d(6)}, 5, d(8))
    assert redone == [d(5)] and marks.pending == {d(6), d(9)}


def test_redo_cascade_stops_with_a_sentence_when_redos_do_not_settle() -> None:
    # A redo that marks its own day again would loop for ever; the bound turns it into an error.
    marks = _Marks({d(5)}, {d(5): [d(5)]})
    with pytest.raises(RuntimeError, match="did not settle"):
        redo_cascade(lambda: marks.pending, marks.redo, [d(4)], set(), 2, d(8))
