"""The SQL executions of one measurement's Dagster runs, longest first, with the rows each scan read.

    python -m benchmarks.sql_executions MEASUREMENT.json EVENTLOG [--tables ROOT] [--top 15]

MEASUREMENT.json is a measurement the harness writes (`<work>/measurements/dNNN-incremental.json`)
or a `bigday-*.json` (its `raw`); EVENTLOG is the engine's Spark event log
(`<work>/eventlogs/dNNN-engine/local-*`). For each Dagster run of the measurement (its assets and
wall time), prints the executions that started inside it: duration, id, and per scan the table
read (`--tables`: the home's warehouse folder, to name tables) and its output rows. A nested
execution (Delta's own queries inside a command) is listed apart and overlaps its parent, so the
durations can add up to more than the run. Session 29 in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.eventlog import SQL_AQE, SQL_END, SQL_START, _walk, classify_location


@dataclass
class Execution:
    id: int
    start: float  # epoch seconds
    end: float | None = None
    description: str = ""
    # accumulator id of a scan's "number of output rows" -> the source it reads
    scans: dict[int, str] = field(default_factory=dict)

    @property
    def seconds(self) -> float | None:
        return None if self.end is None else self.end - self.start


def executions(lines: Iterable[str], tables_root: str | None = None) -> list[Execution]:
    """Every SQL execution of an event log, with its scans (their accumulators). A scan inside a
    cached plan reappears in every execution that reads the cache, with the same accumulator; it
    belongs to the first (the one that filled the cache), so no rows count twice."""
    found: dict[int, Execution] = {}
    owner: dict[int, int] = {}
    for line in lines:
        if "SQLExecution" not in line and "SQLAdaptive" not in line:
            continue
        event = json.loads(line)
        kind = event.get("Event")
        if kind == SQL_START:
            found[int(event["executionId"])] = Execution(
                int(event["executionId"]),
                event["time"] / 1000.0,
                description=" ".join(str(event.get("description", "")).split())[:100],
            )
        elif kind == SQL_END and int(event["executionId"]) in found:
            found[int(event["executionId"])].end = event["time"] / 1000.0
        if kind in (SQL_START, SQL_AQE) and int(event["executionId"]) in found:
            execution = found[int(event["executionId"])]
            for node in _walk(event.get("sparkPlanInfo") or {}):
                name = str(node.get("nodeName", ""))
                if not name.startswith("Scan") or "LocalTableScan" in name:
                    continue
                source = classify_location(
                    (node.get("metadata") or {}).get("Location"), tables_root, None
                )
                for metric in node.get("metrics", ()):
                    if metric.get("name") == "number of output rows":
                        accumulator = int(metric["accumulatorId"])
                        if owner.setdefault(accumulator, execution.id) == execution.id:
                            execution.scans.setdefault(accumulator, source)
    return sorted(found.values(), key=lambda e: e.start)


def accumulator_values(lines: Iterable[str]) -> dict[int, int]:
    """Every accumulator's total: the tasks' updates and the driver's."""
    values: dict[int, int] = defaultdict(int)
    for line in lines:
        if "Accum" not in line and "Accumulables" not in line:
            continue
        event = json.loads(line)
        if event.get("Event") == "SparkListenerTaskEnd":
            for acc in (event.get("Task Info") or {}).get("Accumulables", ()):
                try:
                    values[int(acc["ID"])] += int(acc.get("Update") or 0)
                except (TypeError, ValueError):
                    continue
        elif str(event.get("Event", "")).endswith("SparkListenerDriverAccumUpdates"):
            for accumulator, value in event.get("accumUpdates", ()):
                values[int(accumulator)] += int(value)
    return values


def by_run(
    runs: Sequence[Mapping[str, Any]], found: Sequence[Execution], values: Mapping[int, int]
) -> list[dict[str, Any]]:
    """Per Dagster run (`assets`, `start`, `end`), its executions longest first with their scans'
    rows (`[source, rows]`, scans that read nothing left out)."""
    out = []
    for run in runs:
        inside = [e for e in found if run["start"] <= e.start <= run["end"]]
        inside.sort(key=lambda e: -(e.seconds or 0.0))
        out.append(
            {
                "assets": list(run.get("assets") or []),
                "wall_s": round(run["end"] - run["start"], 3),
                "executions": [
                    {
                        "id": e.id,
                        "seconds": None if e.seconds is None else round(e.seconds, 3),
                        "description": e.description,
                        "scans": [
                            [source, values.get(acc, 0)]
                            for acc, source in e.scans.items()
                            if values.get(acc, 0)
                        ],
                    }
                    for e in inside
                ],
            }
        )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("measurement", type=Path)
    parser.add_argument("eventlog", type=Path)
    parser.add_argument("--tables", help="the home's warehouse folder (names the tables)")
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args(argv)
    for path in (args.measurement, args.eventlog):
        if not path.is_file():
            print(f"no file at {path}", file=sys.stderr)
            return 2
    measurement = json.loads(args.measurement.read_text())
    runs = (measurement.get("raw") or measurement).get("dagster_runs") or []
    if not runs:
        print(f"{args.measurement} records no Dagster runs", file=sys.stderr)
        return 2
    lines = args.eventlog.read_text(encoding="utf-8").splitlines()
    report = by_run(runs, executions(lines, args.tables), accumulator_values(lines))
    for run in report:
        print(f"== {', '.join(run['assets'][:3])}: {run['wall_s']} s")
        for e in run["executions"][: args.top]:
            scans = ", ".join(f"{s} {n:,}" for s, n in e["scans"])
            print(f"  {e['seconds'] or 0:7.2f} s  #{e['id']:<5d} {scans}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
