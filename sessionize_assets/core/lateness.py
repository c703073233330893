"""How late events arrive, per load day, from the rows of `filtered_events` by (load day, event
day) -- plain Python, no Spark (the counts come from the Delta log's partition statistics).

A row of load day L and event day D is `L - D` days late (0: on time; negative: an event dated
after the day it was loaded, a clock ahead). The figures are what Snowplow's users watch to set
`days_late_allowed`, `reprocess_days` and `min_rows_to_process`: the share of late rows, and how
late they are (weighted percentiles over rows, in whole days).
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

Counts = Mapping[tuple[dt.date, dt.date], int]  # (load day, event day) -> rows


@dataclass(frozen=True)
class LoadDayLateness:
    """The lateness of one load day's rows."""

    load_day: dt.date
    rows: int
    late_rows: int  # event day before the load day
    p50_days: int
    p95_days: int
    max_days: int

    @property
    def late_share(self) -> float:
        return self.late_rows / self.rows if self.rows else 0.0

    def metadata(self) -> dict[str, float | int]:
        """Numeric figures, named as the Dagster UI plots them per partition."""
        return {
            "late rows": self.late_rows,
            "late share": round(self.late_share, 4),
            "lateness p50 (days)": self.p50_days,
            "lateness p95 (days)": self.p95_days,
            "lateness max (days)": self.max_days,
        }


def weighted_percentile(values: Mapping[int, int], q: float) -> int:
    """The smallest value v with at least q of the total weight at or below v (0 when empty)."""
    total = sum(values.values())
    if total <= 0:
        return 0
    running = 0
    for value in sorted(values):
        running += values[value]
        if running >= q * total:
            return value
    return max(values)


def lateness_by_load_day(counts: Counts) -> list[LoadDayLateness]:
    """Per load day, ascending: rows, late rows and lateness percentiles (days)."""
    by_day: dict[dt.date, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    for (load_day, event_day), rows in counts.items():
        if rows:
            by_day[load_day][(load_day - event_day).days] += rows
    out = []
    for load_day in sorted(by_day):
        days = by_day[load_day]
        out.append(
            LoadDayLateness(
                load_day=load_day,
                rows=sum(days.values()),
                late_rows=sum(n for d, n in days.items() if d > 0),
                p50_days=weighted_percentile(days, 0.50),
                p95_days=weighted_percentile(days, 0.95),
                max_days=max(days),
            )
        )
    return out


def lateness_matrix(
    counts: Counts, last_load_days: int = 14, columns: int = 8
) -> tuple[list[LoadDayLateness], list[str], dict[dt.date, dict[str, int]]]:
    """The last load days' summaries, the matrix's column labels (`ahead` when a row is dated
    after its load day, 0 .. columns - 2 days late, then `more`) and its rows by load day."""
    summary = lateness_by_load_day(counts)[-last_load_days:] if last_load_days else []
    shown = {s.load_day for s in summary}
    matrix: dict[dt.date, dict[str, int]] = {d: defaultdict(int) for d in shown}
    labels = [str(n) for n in range(columns - 1)] + ["more"]
    for (load_day, event_day), rows in counts.items():
        if load_day not in shown or not rows:
            continue
        late = (load_day - event_day).days
        label = "ahead" if late < 0 else (str(late) if late < columns - 1 else "more")
        matrix[load_day][label] += rows
    if any(matrix[d].get("ahead") for d in shown):
        labels = ["ahead", *labels]
    return summary, labels, matrix


def lateness_lines(counts: Counts, last_load_days: int = 14, columns: int = 8) -> list[str]:
    """`sessionize status --lateness`: per load day its late share and percentiles, then the
    matrix of rows by load day and lateness (`lateness_matrix`)."""
    summary, labels, matrix = lateness_matrix(counts, last_load_days, columns)
    if not summary:
        return ["lateness: no rows in filtered_events yet"]
    lines = [
        f"lateness of the last {len(summary)} load day(s) (rows of filtered_events; days late = "
        "load day - event day):",
        f"  {'load day':<10}  {'rows':>9}  {'late':>7}  {'p50':>4}  {'p95':>4}  {'max':>4}",
    ]
    for s in summary:
        lines.append(
            f"  {s.load_day.isoformat():<10}  {s.rows:>9}  {s.late_share:>6.1%}  "
            f"{s.p50_days:>4}  {s.p95_days:>4}  {s.max_days:>4}"
        )
    width = max(7, *(len(str(max(m.values(), default=0))) + 1 for m in matrix.values()))
    lines.append("rows by days late:")
    lines.append(f"  {'load day':<10}" + "".join(f"{label:>{width}}" for label in labels))
    for s in summary:
        row = matrix[s.load_day]
        lines.append(
            f"  {s.load_day.isoformat():<10}"
            + "".join(f"{row.get(label, 0):>{width}}" for label in labels)
        )
    return lines


def lateness_markdown(counts: Counts, last_load_days: int = 14, columns: int = 8) -> str:
    """The same summary and matrix as one Markdown table (the UI shows it on
    `daily_aggregation_manifest`): a row per load day, its rows, late share, p50/p95/max days
    late, then its rows by days late."""
    summary, labels, matrix = lateness_matrix(counts, last_load_days, columns)
    if not summary:
        return "No rows in filtered_events yet."
    head = ["load day", "rows", "late", "p50", "p95", "max", *(f"{x} d" for x in labels)]
    out = [
        f"Rows of filtered_events by days late (load day - event day), last {len(summary)} "
        "load day(s):",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for s in summary:
        row = matrix[s.load_day]
        cells = [
            s.load_day.isoformat(),
            str(s.rows),
            f"{s.late_share:.1%}",
            str(s.p50_days),
            str(s.p95_days),
            str(s.max_days),
            *(str(row.get(label, 0)) for label in labels),
        ]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def load_day_metadata(counts: Counts, load_days: Sequence[dt.date]) -> dict[str, dict]:
    """Lateness metadata of the given load days, keyed by ISO day (for per-partition reports)."""
    wanted = set(load_days)
    return {
        s.load_day.isoformat(): s.metadata()
        for s in lateness_by_load_day(counts)
        if s.load_day in wanted
    }
