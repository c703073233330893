"""Cursor windows after Airbyte's DatetimeBasedCursor: the seed's tables, checkpoints, fallback."""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sessionize_assets.core.clock import as_utc
from sessionize_assets.core.cursor import (
    CursorConfig,
    CursorState,
    Duration,
    InvalidDurationError,
    Slice,
    Window,
    advance_state,
    finish_run,
    parse_duration,
    plan_slices,
    plan_windows,
    reading_start,
    run_slices,
    run_windows,
    with_fallback,
)
from sessionize_assets.errors import UserError


def t(text: str) -> dt.datetime:
    return as_utc(text)


def spans(windows) -> list[tuple[str, str]]:
    return [(w.start.isoformat()[:19], w.end.isoformat()[:19]) for w in windows]


NOW = t("2030-01-01T00:00:00")


# ------------------------------------------------------------------------------ durations


@pytest.mark.parametrize(
    ("text", "months", "days", "time"),
    [
        ("P1D", 0, 1, dt.timedelta(0)),
        ("PT6H", 0, 0, dt.timedelta(hours=6)),
        ("P31D", 0, 31, dt.timedelta(0)),
        ("PT1S", 0, 0, dt.timedelta(seconds=1)),
        ("PT0.000001S", 0, 0, dt.timedelta(microseconds=1)),
        ("P2W", 0, 14, dt.timedelta(0)),
        ("P1M", 1, 0, dt.timedelta(0)),
        ("P1Y2M3W4DT5H6M7.5S", 14, 25, dt.timedelta(hours=5, minutes=6, seconds=7.5)),
        ("pt90m", 0, 0, dt.timedelta(minutes=90)),
        ("P0D", 0, 0, dt.timedelta(0)),
    ],
)
def test_parse_duration(text, months, days, time):
    duration = parse_duration(text)
    assert (duration.months, duration.days, duration.time) == (months, days, time)


@pytest.mark.parametrize(
    "text", ["", "P", "PT", "1D", "P1H", "PT1D", "P-1D", "P1.5D", "daily", "P1DT"]
)
def test_invalid_durations_are_user_errors(text):
    with pytest.raises(InvalidDurationError, match="ISO 8601 duration"):
        parse_duration(text)
    assert issubclass(InvalidDurationError, UserError)


def test_months_clamp_to_the_month_end_and_go_backwards():
    month = parse_duration("P1M")
    assert month.shift(t("2024-01-31")) == t("2024-02-29")
    assert month.shift(t("2024-03-31"), -1) == t("2024-02-29")
    assert parse_duration("P1Y").shift(t("2024-02-29")) == t("2025-02-28")
    assert month.shift(t("2024-01-31"), 2) == t("2024-03-31")  # from the anchor: no drift


@given(
    st.integers(min_value=0, max_value=40),
    st.integers(min_value=0, max_value=400),
    st.integers(min_value=0, max_value=86_399),
)
def test_duration_text_round_trips_through_the_parser(months, days, seconds):
    text = f"P{months}M{days}DT{seconds}S"
    duration = parse_duration(text)
    assert duration == Duration(months=months, days=days, time=dt.timedelta(seconds=seconds))


# --------------------------------------------------------------------------- the seed's tables


def test_seed_step_p1d_gives_five_half_open_windows():
    config = CursorConfig(start=t("2022-01-01T00:00:00"), end=t("2022-01-05T12:00:00"), step="P1D")
    assert spans(plan_windows(config, None, NOW)) == [
        ("2022-01-01T00:00:00", "2022-01-02T00:00:00"),
        ("2022-01-02T00:00:00", "2022-01-03T00:00:00"),
        ("2022-01-03T00:00:00", "2022-01-04T00:00:00"),
        ("2022-01-04T00:00:00", "2022-01-05T00:00:00"),
        ("2022-01-05T00:00:00", "2022-01-05T12:00:00"),
    ]


def test_seed_lookback_p31d_without_state_reads_from_start_minus_lookback():
    config = CursorConfig(
        start="2022-02-01T00:00:00+00:00",
        end="2022-03-01T00:00:00+00:00",
        step="P1D",
        lookback_window="P31D",
    )
    windows = plan_windows(config, None, NOW)
    assert windows[0].start == t("2022-01-01")
    assert windows[-1].end == t("2022-03-01")
    assert len(windows) == 31 + 28
    assert all(w.end - w.start == dt.timedelta(days=1) for w in windows)
    assert all(a.end == b.start for a, b in zip(windows, windows[1:], strict=False))


def test_lookback_is_subtracted_from_the_cursor_when_there_is_state():
    config = CursorConfig(start="2022-01-01", step="PT6H", lookback_window="PT6H")
    assert reading_start(config, t("2022-01-03T12:00")) == t("2022-01-03T06:00")
    assert reading_start(config, None) == t("2021-12-31T18:00")
    # A cursor before start never reads earlier than a fresh start would.
    assert reading_start(config, t("2021-06-01")) == t("2021-12-31T18:00")


def test_windows_stop_at_now_when_end_is_open_or_later():
    config = CursorConfig(start="2022-01-01", step="P1D")
    assert spans(plan_windows(config, t("2022-01-03"), t("2022-01-04T06:00"))) == [
        ("2022-01-03T00:00:00", "2022-01-04T00:00:00"),
        ("2022-01-04T00:00:00", "2022-01-04T06:00:00"),
    ]
    later = CursorConfig(start="2022-01-01", end="2023-01-01", step="P1D")
    assert plan_windows(later, t("2022-01-03"), t("2022-01-03T06:00")) == [
        Window(t("2022-01-03"), t("2022-01-03T06:00"))
    ]
    assert plan_windows(config, t("2022-01-05"), t("2022-01-05")) == []
    assert plan_windows(config, None, t("2021-12-31")) == []


def test_aligned_windows_end_on_the_start_grid():
    config = CursorConfig(
        start="2022-01-01", step="P1D", lookback_window="PT6H", align_to_start=True
    )
    assert spans(plan_windows(config, t("2022-01-03T10:00"), t("2022-01-05"))) == [
        ("2022-01-03T04:00:00", "2022-01-04T00:00:00"),
        ("2022-01-04T00:00:00", "2022-01-05T00:00:00"),
    ]
    unaligned = CursorConfig(start="2022-01-01", step="P1D", lookback_window="PT6H")
    assert spans(plan_windows(unaligned, t("2022-01-03T10:00"), t("2022-01-05"))) == [
        ("2022-01-03T04:00:00", "2022-01-04T04:00:00"),
        ("2022-01-04T04:00:00", "2022-01-05T00:00:00"),
    ]


def test_monthly_windows_follow_the_calendar():
    config = CursorConfig(start="2024-01-31", end="2024-05-01", step="P1M", align_to_start=True)
    assert spans(plan_windows(config, None, NOW)) == [
        ("2024-01-31T00:00:00", "2024-02-29T00:00:00"),
        ("2024-02-29T00:00:00", "2024-03-31T00:00:00"),
        ("2024-03-31T00:00:00", "2024-04-30T00:00:00"),
        ("2024-04-30T00:00:00", "2024-05-01T00:00:00"),
    ]


def test_zero_step_is_refused():
    with pytest.raises(InvalidDurationError, match="longer than zero"):
        CursorConfig(start="2022-01-01", step="P0D")


@settings(max_examples=60, deadline=None)
@given(
    st.integers(min_value=0, max_value=2000),
    st.integers(min_value=1, max_value=72),
    st.integers(min_value=0, max_value=48),
    st.booleans(),
    st.integers(min_value=0, max_value=3000),
)
def test_windows_tile_the_range_without_gaps_or_overlaps(
    start_h, step_h, lookback_h, align, cursor_h
):
    base = t("2022-01-01")
    config = CursorConfig(
        start=base + dt.timedelta(hours=start_h),
        step=f"PT{step_h}H",
        lookback_window=f"PT{lookback_h}H",
        align_to_start=align,
    )
    cursor = base + dt.timedelta(hours=cursor_h)
    now = base + dt.timedelta(hours=3000)
    windows = plan_windows(config, cursor, now)
    begin = max(config.start, cursor) - dt.timedelta(hours=lookback_h)
    if begin >= now:
        assert windows == []
        return
    assert windows[0].start == begin and windows[-1].end == now
    assert all(a.end == b.start for a, b in zip(windows, windows[1:], strict=False))
    assert all(dt.timedelta(0) < w.end - w.start <= dt.timedelta(hours=step_h) for w in windows)


# ------------------------------------------------------------------- checkpoint and resume


class Boom(RuntimeError):
    pass


def test_checkpoint_after_each_window_and_resume_at_the_first_unfinished_one():
    config = CursorConfig(start="2022-01-01T00:00:00", end="2022-01-05T12:00:00", step="P1D")
    saved: list[dt.datetime] = []
    processed: list[Window] = []

    def failing_in_third(window: Window) -> None:
        if len(processed) == 2:
            raise Boom("third window failed")
        processed.append(window)

    with pytest.raises(Boom):
        run_windows(config, None, failing_in_third, saved.append, NOW)
    assert saved == [t("2022-01-02"), t("2022-01-03")]

    resumed: list[Window] = []
    final = run_windows(config, saved[-1], resumed.append, saved.append, NOW)
    assert spans(resumed) == [
        ("2022-01-03T00:00:00", "2022-01-04T00:00:00"),
        ("2022-01-04T00:00:00", "2022-01-05T00:00:00"),
        ("2022-01-05T00:00:00", "2022-01-05T12:00:00"),
    ]
    assert final == t("2022-01-05T12:00") == saved[-1]
    # Together the two runs read every window exactly once.
    assert processed + resumed == plan_windows(config, None, NOW)
    assert run_windows(config, final, resumed.append, saved.append, NOW) == final


def test_resume_with_lookback_rereads_the_lookback_before_the_unfinished_window():
    config = CursorConfig(
        start="2022-01-01", end="2022-01-05T12:00", step="P1D", lookback_window="PT6H"
    )
    done = t("2022-01-03")
    windows = plan_windows(config, done, NOW)
    assert windows[0] == Window(t("2022-01-02T18:00"), t("2022-01-03T18:00"))
    assert windows[-1].end == t("2022-01-05T12:00")


def test_cursor_never_moves_backwards():
    state = CursorState(global_cursor=t("2022-01-05"))
    after = advance_state(state, Slice(None, Window(t("2022-01-01"), t("2022-01-02"))))
    assert after.global_cursor == t("2022-01-05")


# -------------------------------------------------------------------- per-partition state


def test_per_partition_cursors_checkpoint_and_resume_per_partition():
    config = CursorConfig(start="2022-01-01", end="2022-01-04", step="P1D")
    checkpoints: list[CursorState] = []
    seen: list[tuple[str | None, str]] = []

    def process(piece: Slice) -> None:
        if piece.partition == "web" and piece.window.start == t("2022-01-02"):
            raise Boom("web failed on 01-02")
        seen.append((piece.partition, piece.window.start.date().isoformat()))

    with pytest.raises(Boom):
        run_slices(
            config, CursorState(), process, checkpoints.append, NOW, partitions=["app", "web"]
        )
    state = checkpoints[-1]
    assert state.partitions == {"app": t("2022-01-04"), "web": t("2022-01-02")}
    assert state.global_cursor is None  # only a completed run moves the global cursor
    assert not state.use_global_cursor

    seen.clear()
    final = run_slices(
        config, state, seen.append, checkpoints.append, NOW, partitions=["app", "web"]
    )
    assert [(s.partition, s.window.start.date().isoformat()) for s in seen] == [
        ("web", "2022-01-02"),
        ("web", "2022-01-03"),
    ]
    assert final.global_cursor == t("2022-01-04")
    assert checkpoints[-1] == final


def test_per_partition_state_has_the_seed_shape_and_round_trips():
    state = CursorState(
        partitions={"partition_1": t("2021-01-15"), "partition_2": t("2021-02-14")},
        global_cursor=t("2021-01-15"),
    )
    data = state.to_dict()
    assert data == {
        "states": [
            {"partition_key": "partition_1", "cursor": "2021-01-15T00:00:00+00:00"},
            {"partition_key": "partition_2", "cursor": "2021-02-14T00:00:00+00:00"},
        ],
        "state": {"cursor": "2021-01-15T00:00:00+00:00"},
        "use_global_cursor": False,
    }
    assert CursorState.from_dict(data) == state
    assert CursorState.from_dict(None) == CursorState() == CursorState.from_dict({})


def test_too_many_partitions_fall_back_to_the_global_cursor():
    config = CursorConfig(start="2022-01-01", end="2022-01-06", step="P1D", max_partitions=2)
    state = finish_run(CursorState(partitions={"a": t("2022-01-04"), "b": t("2022-01-03")}))
    assert state.global_cursor == t("2022-01-03")
    # Two partitions fit; a third one exceeds the limit.
    assert with_fallback(config, state, ["a", "b"]) == state
    fallen = with_fallback(config, state, ["a", "b", "c"])
    assert fallen.use_global_cursor and fallen.partitions == {}
    assert fallen.global_cursor == t("2022-01-03")  # the smallest: no known partition skips data

    checkpoints: list[CursorState] = []
    seen: list[Slice] = []
    final = run_slices(
        config, state, seen.append, checkpoints.append, NOW, partitions=["a", "b", "c"]
    )
    assert checkpoints[0] == fallen  # the switch is checkpointed before any slice
    assert [s.partition for s in seen] == [None, None, None]
    assert spans([s.window for s in seen]) == [
        ("2022-01-03T00:00:00", "2022-01-04T00:00:00"),
        ("2022-01-04T00:00:00", "2022-01-05T00:00:00"),
        ("2022-01-05T00:00:00", "2022-01-06T00:00:00"),
    ]
    assert final.use_global_cursor and final.global_cursor == t("2022-01-06")
    assert CursorState.from_dict(final.to_dict()) == final
    # Once global, it stays global (and plans one set of windows for every partition).
    assert plan_slices(config, final, NOW, partitions=["a"]) == []


def test_unpartitioned_cursor_uses_the_global_state():
    config = CursorConfig(start="2022-01-01", end="2022-01-03", step="P1D")
    checkpoints: list[CursorState] = []
    final = run_slices(config, CursorState(), lambda piece: None, checkpoints.append, NOW)
    assert [c.global_cursor for c in checkpoints] == [t("2022-01-02"), t("2022-01-03")]
    assert final == CursorState(global_cursor=t("2022-01-03"))


def test_new_partition_starts_at_start_in_per_partition_mode():
    config = CursorConfig(start="2022-01-01", end="2022-01-03", step="P1D", lookback_window="P1D")
    state = CursorState(partitions={"a": t("2022-01-03")}, global_cursor=t("2022-01-03"))
    slices = plan_slices(config, state, NOW, partitions=["a", "new"])
    assert [(s.partition, s.window.start.date().isoformat()) for s in slices] == [
        ("a", "2022-01-02"),
        ("new", "2021-12-31"),
        ("new", "2022-01-01"),
        ("new", "2022-01-02"),
    ]
