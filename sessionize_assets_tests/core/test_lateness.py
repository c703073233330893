"""Lateness per load day and the lateness matrix, from (load day, event day) row counts."""

from __future__ import annotations

import datetime as dt

from sessionize_assets.core.lateness import (
    lateness_by_load_day,
    lateness_lines,
    lateness_markdown,
    load_day_metadata,
    weighted_percentile,
)


def d(n: int) -> dt.date:
    return dt.date(2024, 3, n)


COUNTS = {
    # load day 10: 90 on time, 8 one day late, 2 nine days late
    (d(10), d(10)): 90,
    (d(10), d(9)): 8,
    (d(10), d(1)): 2,
    # load day 11: all on time, and one row dated the day after (a clock ahead)
    (d(11), d(11)): 50,
    (d(11), d(12)): 1,
}


def test_weighted_percentiles_count_rows_not_cells() -> None:
    assert weighted_percentile({0: 90, 1: 8, 9: 2}, 0.5) == 0
    assert weighted_percentile({0: 90, 1: 8, 9: 2}, 0.95) == 1
    assert weighted_percentile({0: 90, 1: 8, 9: 2}, 0.99) == 9
    assert weighted_percentile({}, 0.5) == 0


def test_lateness_by_load_day() -> None:
    first, second = lateness_by_load_day(COUNTS)
    assert (first.load_day, first.rows, first.late_rows) == (d(10), 100, 10)
    assert first.late_share == 0.1
    assert (first.p50_days, first.p95_days, first.max_days) == (0, 1, 9)
    assert (second.rows, second.late_rows, second.max_days) == (51, 0, 0)
    assert second.p50_days == 0
    assert load_day_metadata(COUNTS, [d(10)]) == {
        "2024-03-10": {
            "late rows": 10,
            "late share": 0.1,
            "lateness p50 (days)": 0,
            "lateness p95 (days)": 1,
            "lateness max (days)": 9,
        }
    }


def test_lateness_lines_show_the_summary_and_the_matrix() -> None:
    lines = lateness_lines(COUNTS, last_load_days=14, columns=4)
    text = "\n".join(lines)
    assert "2024-03-10        100   10.0%     0     1     9" in text
    header = next(line for line in lines if line.strip().startswith("load day") and "ahead" in line)
    assert header.split() == ["load", "day", "ahead", "0", "1", "2", "more"]
    row = next(
        line for line in lines[lines.index(header) :] if line.strip().startswith("2024-03-10")
    )
    assert row.split() == ["2024-03-10", "0", "90", "8", "0", "2"]
    row = next(
        line for line in lines[lines.index(header) :] if line.strip().startswith("2024-03-11")
    )
    assert row.split() == ["2024-03-11", "1", "50", "0", "0", "0"]
    # Only the last N load days are shown: with N = 1, load day 03-10 is left out.
    assert sum(line.strip().startswith("2024-03-10") for line in lateness_lines(COUNTS, 1)) == 0
    assert lateness_lines({}) == ["lateness: no rows in filtered_events yet"]


def test_the_lateness_table_for_the_ui_holds_the_same_numbers() -> None:
    lines = lateness_markdown(COUNTS, last_load_days=14, columns=4).splitlines()
    assert (
        lines[2]
        == "| load day | rows | late | p50 | p95 | max | ahead d | 0 d | 1 d | 2 d | more d |"
    )
    assert lines[3] == "|" + "---|" * 11
    assert lines[4] == "| 2024-03-10 | 100 | 10.0% | 0 | 1 | 9 | 0 | 90 | 8 | 0 | 2 |"
    assert lines[5] == "| 2024-03-11 | 51 | 0.0% | 0 | 0 | 0 | 1 | 50 | 0 | 0 | 0 |"
    assert len(lines) == 6
    assert lateness_markdown({}) == "No rows in filtered_events yet."
