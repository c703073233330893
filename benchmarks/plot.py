"""The benchmark's plot: incremental vs full-rebuild cost as history grows (matplotlib, Agg)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any


def plot_result(result: Mapping[str, Any], path: Path) -> Path:
    """Three panels over history length D: wall time, the JVM's CPU time, and event rows read
    (with the incremental run's minimal rows)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    histories = list(result.get("histories") or ())
    days = [h["history_days"] for h in histories]

    def series(kind: str, key: str) -> list[float | None]:
        out = []
        for h in histories:
            m = h.get(kind) or {}
            if not m.get("ok"):
                out.append(None)
                continue
            out.append(m.get(key) if key != "event_rows" else m["rows_read"]["event_rows"])
        return out

    fig, (wall, cpu, rows) = plt.subplots(1, 3, figsize=(16, 4.4))
    for kind, label, style in (
        ("trash_and_rebuild", "trash and rebuild (load 1 day + recompute all)", "D-"),
        ("full_rebuild", "catch-up from scratch (load D days + run)", "o-"),
        ("incremental", "incremental (load 1 day + run)", "s-"),
        ("noop", "no-op run", "^--"),
    ):
        wall.plot(days, series(kind, "wall_s"), style, label=label)
    duck = [(h.get("duckdb_full") or {}).get("wall_s") for h in histories]
    wall.plot(days, duck, "x:", label="DuckDB reference (D days)")
    wall.set_xlabel("history (load days)")
    wall.set_ylabel("wall time (s, incl. Spark start)")
    wall.set_title("Wall time")
    wall.grid(alpha=0.3)
    wall.legend(fontsize=8)

    def jvm_cpu(kind: str) -> list[float | None]:
        return [
            ((h.get(kind) or {}).get("cpu_s") or {}).get("jvm")
            if (h.get(kind) or {}).get("ok")
            else None
            for h in histories
        ]

    for kind, label, style in (
        ("trash_and_rebuild", "trash and rebuild", "D-"),
        ("full_rebuild", "catch-up from scratch", "o-"),
        ("incremental", "incremental", "s-"),
        ("noop", "no-op run", "^--"),
    ):
        cpu.plot(days, jvm_cpu(kind), style, label=label)
    cpu.set_xlabel("history (load days)")
    cpu.set_ylabel("CPU seconds of the driver JVM (all tasks)")
    cpu.set_title("JVM CPU (steadier than wall on a shared machine)")
    cpu.grid(alpha=0.3)
    cpu.legend(fontsize=8)

    rows.plot(
        days,
        series("trash_and_rebuild", "event_rows"),
        "D-",
        label="trash and rebuild: event rows read",
    )
    rows.plot(days, series("full_rebuild", "event_rows"), "o-", label="catch-up: event rows read")
    rows.plot(days, series("incremental", "event_rows"), "s-", label="incremental: event rows read")
    minimal = [(h.get("minimal") or {}).get("minimal_rows") for h in histories]
    rows.plot(days, minimal, "k*:", label="incremental: minimal rows")
    rows.set_xlabel("history (load days)")
    rows.set_ylabel("rows (landing + events + filtered_events scans)")
    rows.set_title("Rows read (Spark scan metrics)")
    rows.grid(alpha=0.3)
    rows.legend(fontsize=8)

    params = result.get("parameters") or {}
    machine = result.get("machine") or {}
    fig.suptitle(
        f"sessionize benchmark: {params.get('events_per_day')} events/day, profile "
        f"{params.get('profile', 'harsh')}, policy {params.get('policy')}, "
        f"{machine.get('cpu_count_logical')} cores",
        fontsize=10,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
