"""Run limits of the time-based branch: the spec's cases and the planning of load days."""

from __future__ import annotations

import datetime as dt

import pytest

from sessionize_assets.core.load_windows import (
    RunState,
    backfill_cursor,
    backfill_cursor_name,
    backfill_windows,
    last_processed_load_times,
    load_days_between,
    load_window,
    plan_load_days,
)

UTC = dt.UTC


def t(value: str) -> dt.datetime:
    return dt.datetime.fromisoformat(value).replace(tzinfo=UTC)


def d(value: str) -> dt.date:
    return dt.date.fromisoformat(value)


START = d("2021-01-01")
LATER = t("2022-01-01T00:00:00")


@pytest.mark.parametrize(
    ("last_success", "now", "state", "start", "end"),
    [
        # The spec's cases (start 2021-01-01, B = 30).
        (
            {"filtered_events": None, "days_to_process": None},
            LATER,
            RunState.FIRST_RUN,
            "2021-01-01",
            "2021-01-31",
        ),
        (
            {
                "filtered_events": t("2021-03-03T00:00:00"),
                "days_to_process": t("2021-03-01T00:00:00"),
            },
            LATER,
            RunState.OUT_OF_SYNC,
            "2021-03-01",
            "2021-03-03",
        ),
        (
            {
                "filtered_events": t("2021-03-01T18:00:00"),
                "days_to_process": t("2021-03-01T18:00:00"),
            },
            LATER,
            RunState.STANDARD,
            "2021-03-01",
            "2021-04-01",
        ),
        # Now caps every window: the current day is partial.
        (
            {"a": None},
            t("2021-01-05T10:30:00"),
            RunState.FIRST_RUN,
            "2021-01-01",
            "2021-01-05T10:30:00",
        ),
        (
            {"a": t("2021-03-01T18:00:00")},
            t("2021-03-04T06:00:00"),
            RunState.STANDARD,
            "2021-03-01",
            "2021-03-04T06:00:00",
        ),
        # Out of sync is capped by B + 1 days from the model behind.
        (
            {"a": t("2021-01-02T05:00:00"), "b": t("2021-06-01T00:00:00")},
            LATER,
            RunState.OUT_OF_SYNC,
            "2021-01-02",
            "2021-02-02",
        ),
        # A model that never ran catches up from start_date, B days, like a first run.
        (
            {"a": None, "b": t("2021-06-01T00:00:00")},
            LATER,
            RunState.OUT_OF_SYNC,
            "2021-01-01",
            "2021-01-31",
        ),
        (
            {"a": None, "b": t("2021-01-10T12:00:00")},
            LATER,
            RunState.OUT_OF_SYNC,
            "2021-01-01",
            "2021-01-10T12:00:00",
        ),
        # A last load time exactly at midnight starts at that day (nothing subtracted).
        ({"a": t("2021-03-02T00:00:00")}, LATER, RunState.STANDARD, "2021-03-02", "2021-04-02"),
        # A run before start_date's first instant has an empty window.
        ({"a": None}, t("2021-01-01T00:00:00"), RunState.FIRST_RUN, "2021-01-01", "2021-01-01"),
    ],
)
def test_run_limits(last_success, now, state, start, end) -> None:
    limits = load_window(START, 30, now, last_success)
    assert limits.state == state
    assert limits.start == t(start if "T" in start else start + "T00:00:00")
    assert limits.end == t(end if "T" in end else end + "T00:00:00")
    assert limits.state.sentence in limits.describe()


def test_run_limits_window_load_days() -> None:
    limits = load_window(START, 30, LATER, {"a": None})
    assert limits.load_days[0] == START and limits.load_days[-1] == d("2021-01-30")
    assert len(limits.load_days) == 30
    standard = load_window(START, 30, LATER, {"a": t("2021-03-01T18:00:00")})
    assert len(standard.load_days) == 31  # the last day again + B further


def test_run_limits_rejects_zero_limit() -> None:
    with pytest.raises(ValueError):
        load_window(START, 0, LATER, {})


@pytest.mark.parametrize(
    ("start", "end", "days"),
    [
        ("2021-01-01T00:00:00", "2021-01-01T00:00:00", []),
        ("2021-01-01T00:00:00", "2021-01-01T00:00:00.001000", ["2021-01-01"]),
        ("2021-01-01T23:59:59.412000", "2021-01-02T00:00:00", ["2021-01-01"]),
        ("2021-01-01T00:00:00", "2021-01-03T00:00:00", ["2021-01-01", "2021-01-02"]),
        ("2021-01-01T12:00:00", "2021-01-03T00:00:01", ["2021-01-01", "2021-01-02", "2021-01-03"]),
        ("2021-01-03T00:00:00", "2021-01-01T00:00:00", []),
    ],
)
def test_load_days_between(start, end, days) -> None:
    assert load_days_between(t(start), t(end)) == [d(x) for x in days]


def days(*values: str) -> tuple[dt.date, ...]:
    return tuple(d(v) for v in values)


STANDARD = load_window(START, 3, LATER, {"a": t("2021-03-01T18:00:00")})  # [03-01, 03-05)


@pytest.mark.parametrize(
    ("pending", "load_days", "earlier", "deferred", "passed_over"),
    [
        # Empty run: nothing pending is success, with nothing to do.
        ((), (), (), (), None),
        # Pending days in the window, ascending, whatever order they came in.
        (("2021-03-03", "2021-03-01"), days("2021-03-01", "2021-03-03"), (), (), None),
        # Over the window: the rest waits for the next run.
        (("2021-03-02", "2021-03-06"), days("2021-03-02"), (), days("2021-03-06"), None),
        # Rows loaded late into an already-processed day go first.
        (
            ("2021-02-10", "2021-03-02"),
            days("2021-02-10", "2021-03-02"),
            days("2021-02-10"),
            (),
            None,
        ),
        # The cap counts earlier days too: at most B + 1 load days per run.
        (
            ("2021-02-01", "2021-02-02", "2021-03-01", "2021-03-02", "2021-03-03"),
            days("2021-02-01", "2021-02-02", "2021-03-01", "2021-03-02"),
            days("2021-02-01", "2021-02-02"),
            days("2021-03-03"),
            None,
        ),
        # Nothing pending in the window but later: the window moves over the days without data.
        (
            ("2021-03-20", "2021-03-22", "2021-03-30"),
            days("2021-03-20", "2021-03-22"),
            (),
            days("2021-03-30"),
            days("2021-03-01", "2021-03-19"),
        ),
    ],
)
def test_plan_load_days(pending, load_days, earlier, deferred, passed_over) -> None:
    plan = plan_load_days(STANDARD, [d(p) for p in pending], 3, LATER)
    assert plan.load_days == load_days
    assert plan.earlier == earlier
    assert plan.deferred == deferred
    assert plan.passed_over == passed_over
    assert plan.nothing_to_do == (not load_days)
    text = "\n".join(plan.lines())
    assert ("Nothing to do" in text) == (not load_days)
    for day in load_days:
        assert day.isoformat() in text


def test_plan_ignores_load_days_in_the_future() -> None:
    plan = plan_load_days(STANDARD, [d("2021-03-02"), d("2021-03-04")], 3, t("2021-03-03T10:00:00"))
    assert plan.load_days == days("2021-03-02")
    assert plan.deferred == ()


def test_moved_window_is_capped_by_now() -> None:
    plan = plan_load_days(STANDARD, [d("2021-03-10")], 3, t("2021-03-10T08:00:00"))
    assert plan.window.start == t("2021-03-10T00:00:00")
    assert plan.window.end == t("2021-03-10T08:00:00")
    assert plan.load_days == days("2021-03-10")


def test_last_processed_load_times() -> None:
    out = last_processed_load_times(
        {
            "filtered_events": [t("2021-01-02T00:00:00"), None, t("2021-01-03T05:00:00")],
            "days_to_process": [None],
        }
    )
    assert out == {"filtered_events": t("2021-01-03T05:00:00"), "days_to_process": None}


# ------------------------------------------------------------------------------- backfills


def test_a_backfill_is_cursor_windows_of_at_most_backfill_limit_days() -> None:
    config = backfill_cursor(d("2024-03-01"), d("2024-03-07"), 3)
    assert (config.start, config.end) == (t("2024-03-01T00:00:00"), t("2024-03-08T00:00:00"))
    planned = backfill_windows(config, None, t("2024-04-01T00:00:00"))
    assert [tuple(days_) for _, days_ in planned] == [
        days("2024-03-01", "2024-03-02", "2024-03-03"),
        days("2024-03-04", "2024-03-05", "2024-03-06"),
        days("2024-03-07"),
    ]
    assert all(w.end - w.start <= dt.timedelta(days=3) for w, _ in planned)


def test_a_resumed_backfill_starts_at_its_first_unfinished_window_with_the_same_cuts() -> None:
    config = backfill_cursor(d("2024-03-01"), d("2024-03-07"), 3)
    first, *_ = backfill_windows(config, None, t("2024-04-01T00:00:00"))
    resumed = backfill_windows(config, first[0].end, t("2024-04-01T00:00:00"))
    assert [tuple(days_) for _, days_ in resumed] == [
        days("2024-03-04", "2024-03-05", "2024-03-06"),
        days("2024-03-07"),
    ]
    # a checkpoint in the middle of a window (e.g. an older step) realigns to the start's grid
    odd = backfill_windows(config, t("2024-03-02T00:00:00"), t("2024-04-01T00:00:00"))
    assert [tuple(days_) for _, days_ in odd][0] == days("2024-03-02", "2024-03-03")
    assert backfill_windows(config, config.end, t("2024-04-01T00:00:00")) == []


def test_a_backfill_stops_at_now_and_names_its_checkpoint() -> None:
    config = backfill_cursor(d("2024-03-01"), d("2024-03-07"), 5)
    planned = backfill_windows(config, None, t("2024-03-03T08:00:00"))
    assert [tuple(days_) for _, days_ in planned] == [
        days("2024-03-01", "2024-03-02", "2024-03-03")
    ]
    assert (
        backfill_cursor_name(d("2024-03-01"), d("2024-03-07")) == "backfill/2024-03-01/2024-03-07"
    )
    with pytest.raises(ValueError, match="before start"):
        backfill_cursor(d("2024-03-07"), d("2024-03-01"), 3)
