"""Markdown tables from benchmark result files (for docs/benchmarks.md).

python -m benchmarks.report benchmarks/results/bench-*.json [benchmarks/results/cluster-*.json]
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def _mb(value: int | None) -> str:
    return "–" if value is None else f"{value / 2**20:,.0f}"


def _n(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        if abs(value) < 0.1:
            return f"{value:.2g}"
        return f"{value:,.2f}" if value < 100 else f"{value:,.0f}"
    return f"{value:,}"


def bench_tables(result: Mapping[str, Any]) -> list[str]:
    """One row per (history length, measurement), then the targets."""
    params, machine = result["parameters"], result["machine"]
    data = result.get("data") or {}
    lines = [
        f"{params['events_per_day']:,} events/day, history {params['history']}, profile "
        f"`{params.get('profile', 'harsh')}` ({_n(data.get('late_rows'))} late rows, "
        f"{_n(data.get('max_lateness_days'))} days late at most), policy "
        f"`{params['policy']}`, {machine['cpu_count_logical']} cores, "
        f"{machine['memory_total_bytes'] / 2**30:.0f} GiB, load average at start "
        f"{machine['loadavg'][0]:.1f}; PySpark {machine['versions'].get('pyspark')}, delta-spark "
        f"{machine['versions'].get('delta-spark')}, DuckDB {machine['versions'].get('duckdb')}.",
        "",
        "| D | run | wall s | JVM CPU s | event rows read | minimal rows | rows written | files +/− | files read | shuffle rows | Spark jobs | Delta commits | peak MiB | tables = DuckDB |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for h in result["histories"]:
        for kind, label in (
            ("full_rebuild", "catch-up (full)"),
            ("incremental", "incremental"),
            ("noop", "no-op"),
            ("trash_and_rebuild_warmup", "trash and rebuild of D days (warm-up, untimed)"),
            ("trash_and_rebuild", "trash and rebuild"),
        ):
            m = h.get(kind)
            if m is None:  # before the trash-and-rebuild baseline, or a cold rebuild's warm-up
                continue
            check = h["checks"].get(
                {
                    "full_rebuild": "after_full_rebuild",
                    "trash_and_rebuild": "trash_and_rebuild",
                }.get(kind, "after_incremental")
            )
            unchecked = kind in ("noop", "trash_and_rebuild_warmup")
            equal = "–" if not check or unchecked else ("yes" if check["equal"] else "**no**")
            minimal = h["minimal"]["minimal_rows"] if kind == "incremental" else None
            lines.append(
                f"| {h['history_days']} | {label}{'' if m['ok'] else ' (failed)'} | {_n(m['wall_s'])} "
                f"| {_n((m.get('cpu_s') or {}).get('jvm'))} | {_n(m['rows_read']['event_rows'])} "
                f"| {_n(minimal)} | {_n(m['rows_written'])} | {m['files_added']}/{m['files_removed']} "
                f"| {_n(m['files_read'])} | {_n(m['shuffle']['read_records'])} "
                f"| {_n(m.get('spark_jobs'))} | {_n(m.get('delta_commits'))} "
                f"| {_mb(m['peak_memory_bytes'])} | {equal} |"
            )
        duck = h["duckdb_full"]
        lines.append(
            f"| {h['history_days']} | DuckDB (D days) | {_n(duck['wall_s'])} | – | {_n(duck['raw_rows'])} "
            f"| – | – | – | – | – | – | – | – | – |"
        )
    lines += ["", "| target | value | met | same on JVM CPU |", "|---|---|---|---|"]
    for name, t in result["targets"].items():
        met = {True: "yes", False: "**no**", None: "n/a"}[t["met"]]
        lines.append(
            f"| {name} ({t['rule']}) | {_n(t['value'])} | {met} | {_n(t.get('value_jvm_cpu'))} |"
        )
    return lines


def branch_table(result: Mapping[str, Any]) -> list[str]:
    """Where the incremental and no-op runs spent their reads, time and Spark jobs, per branch."""
    lines = [
        "| D | run | branch | wall s | event rows read | other table rows read | Dagster runs | Spark jobs |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for h in result["histories"]:
        for kind in ("full_rebuild", "incremental", "noop"):
            for branch, b in sorted(h[kind]["by_branch"].items()):
                lines.append(
                    f"| {h['history_days']} | {kind} | {branch} | {_n(b.get('wall_s'))} "
                    f"| {_n(b['event_rows_read'])} | {_n(b['other_table_rows_read'])} "
                    f"| {_n(b.get('dagster_runs'))} | {_n(b.get('spark_jobs'))} |"
                )
    return lines


def commits_by_table(history: Mapping[str, Any], kind: str) -> dict[str, int]:
    """A run's Delta commits per table: the summary's (schema version 3) or, in older results,
    the raw measurement's per-table Delta metrics."""
    m = history.get(kind) or {}
    if "delta_commits_by_table" in m:
        return dict(m["delta_commits_by_table"])
    tables = (((history.get("raw") or {}).get(kind) or {}).get("delta") or {}).get("tables") or {}
    return {name: int(t.get("commits", 0)) for name, t in tables.items()}


def commits_table(result: Mapping[str, Any]) -> list[str]:
    """Delta commits per table of every run."""
    kinds = (
        ("full_rebuild", "catch-up"),
        ("incremental", "incremental"),
        ("noop", "no-op"),
        ("trash_and_rebuild", "trash and rebuild"),
    )
    tables = sorted(
        {
            t
            for h in result["histories"]
            for kind, _ in kinds
            if h.get(kind) is not None
            for t in commits_by_table(h, kind)
        }
    )
    if not tables:
        return []
    lines = [
        "| D | run | " + " | ".join(tables) + " | all |",
        "|---|---|" + "---|" * (len(tables) + 1),
    ]
    for h in result["histories"]:
        for kind, label in kinds:
            m = h.get(kind)
            if m is None:
                continue
            by_table = commits_by_table(h, kind)
            cells = " | ".join(_n(by_table.get(t, 0)) for t in tables)
            lines.append(
                f"| {h['history_days']} | {label} | {cells} | {_n(m.get('delta_commits'))} |"
            )
    return lines


def _extra(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    return f"{_n(abs(seconds))} s {'more' if seconds >= 0 else 'less'}"


def cluster_table(result: Mapping[str, Any]) -> list[str]:
    o = result["overhead"]
    data = result.get("data_tables_equal") or {}
    return [
        "| mode | wall s | driver JVM CPU s | cluster start s | tables equal |",
        "|---|---|---|---|---|",
        f"| local | {_n(o['local_wall_s'])} | {_n((o.get('local_cpu_s') or {}).get('jvm'))} | – | – |",
        f"| standalone, {result['parameters']['workers']} × 1 core | {_n(o['cluster_wall_s'])} "
        f"| {_n((o.get('cluster_driver_cpu_s') or {}).get('jvm'))} | {_n(o['cluster_start_s'])} "
        f"| {'all' if result['tables_equal'] else 'NOT all'} "
        f"({', '.join(k for k, v in data.items() if v)}) |",
        "",
        f"Cluster over local: ×{_n(o['cluster_over_local'])} ({_extra(o['extra_s'])}).",
    ]


def main(argv: Sequence[str] | None = None) -> int:
    for name in argv if argv is not None else sys.argv[1:]:
        result = json.loads(Path(name).read_text())
        print(f"### {Path(name).name}\n")
        if result.get("kind") == "sessionize-cluster-benchmark":
            print("\n".join(cluster_table(result)))
        else:
            print("\n".join(bench_tables(result)))
            print()
            print("\n".join(branch_table(result)))
            commits = commits_table(result)
            if commits:
                print()
                print("\n".join(commits))
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
