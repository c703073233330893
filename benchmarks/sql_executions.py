"""The SQL executions of one measurement's Dagster runs, longest first, with the rows each scan read.

    python -m benchmarks.sql_executions MEASUREMENT.json EVENTLOG [--tables ROOT] [--top 15]

MEASUREMENT.json is a measurement the harness writes (`<work>/measurements/dNNN-incremental.json`)
or a `bigday-*.json` (its `raw`); EVENTLOG is the engine's Spark event log
(`<work>/eventlogs/dNNN-engine/local-*`). For each Dagster run of the measurement (its assets and
wall time, and the time outside every query), prints the executions that started inside it:
duration, id, the execution it runs inside if any (Delta's own queries in a MERGE overlap it),
the SQL or write it ran if it says, and per scan the table read (`--tables`: the home's warehouse
folder, to name tables) with the rows the execution's own tasks read (its jobs'
`spark.sql.execution.id`), so a cached scan counts for the execution that read it. Session 29 in
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.eventlog import (
    DRIVER_ACCUM,
    SQL_AQE,
    SQL_END,
    SQL_START,
    _walk,
    classify_location,
)


@dataclass
class Execution:
    id: int
    start: float  # epoch seconds
    end: float | None = None
    what: str = ""  # `_what`
    root: int | None = None  # the execution this one runs inside (Delta's queries in a MERGE)
    # accumulator id of a scan's "number of output rows" -> the source it reads
    scans: dict[int, str] = field(default_factory=dict)

    @property
    def seconds(self) -> float | None:
        return None if self.end is None else self.end - self.start


def _events(lines: Iterable[str]) -> Iterator[dict[str, Any]]:
    """The events of a log; a line that is not JSON (the last line of a log being written) is
    skipped."""
    for line in lines:
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(event, dict):
            yield event


_QUERY = re.compile(r'query: "((?:[^"\\]|\\.){1,70})')


def _what(event: Mapping[str, Any]) -> str:
    """A short name for an execution: the SQL it ran (`MERGE INTO ...`, over Spark Connect), a
    write, or Delta's own description; empty for a DataFrame query."""
    details, description = str(event.get("details", "")), str(event.get("description", ""))
    found = _QUERY.search(details)
    if found:
        return " ".join(found.group(1).split())[:70]
    if "write_operation" in details:
        return "a write"
    if description.startswith("Delta:"):
        return " ".join(description.split())[:70]
    return ""


def executions(lines: Iterable[str], tables_root: str | None = None) -> list[Execution]:
    """Every SQL execution of an event log, with the scans its plans show. A scan inside a cached
    plan reappears in every execution that reads the cache, with the same accumulator; the rows
    are credited by `scan_rows` to the execution whose tasks read them."""
    found: dict[int, Execution] = {}
    for event in _events(lines):
        kind = event.get("Event")
        if kind not in (SQL_START, SQL_END, SQL_AQE):
            continue
        execution_id = int(event["executionId"])
        if kind == SQL_START:
            root = event.get("rootExecutionId")
            found[execution_id] = Execution(
                execution_id,
                event["time"] / 1000.0,
                what=_what(event),
                root=None if root in (None, execution_id, -1) else int(root),
            )
        elif kind == SQL_END and execution_id in found:
            found[execution_id].end = event["time"] / 1000.0
        if kind in (SQL_START, SQL_AQE) and execution_id in found:
            execution = found[execution_id]
            for node in _walk(event.get("sparkPlanInfo") or {}):
                name = str(node.get("nodeName", ""))
                if not name.startswith("Scan") or "LocalTableScan" in name:
                    continue
                source = classify_location(
                    (node.get("metadata") or {}).get("Location"), tables_root, None
                )
                for metric in node.get("metrics", ()):
                    if metric.get("name") == "number of output rows":
                        execution.scans.setdefault(int(metric["accumulatorId"]), source)
    return sorted(found.values(), key=lambda e: e.start)


def scan_rows(lines: Iterable[str]) -> dict[tuple[int, int], int]:
    """{(execution id, accumulator id): total}: each task's updates go to the SQL execution of
    its stage's job (`spark.sql.execution.id`), the driver's to the execution they name."""
    stage_execution: dict[int, int] = {}
    values: dict[tuple[int, int], int] = defaultdict(int)
    for event in _events(lines):
        kind = str(event.get("Event", ""))
        if kind == "SparkListenerJobStart":
            execution = (event.get("Properties") or {}).get("spark.sql.execution.id")
            if execution is not None:
                for stage in event.get("Stage IDs", ()):
                    stage_execution[int(stage)] = int(execution)
        elif kind == "SparkListenerTaskEnd":
            execution = stage_execution.get(int(event.get("Stage ID", -1)))
            if execution is None:
                continue
            for acc in (event.get("Task Info") or {}).get("Accumulables", ()):
                try:
                    values[(execution, int(acc["ID"]))] += int(acc.get("Update") or 0)
                except (KeyError, TypeError, ValueError):
                    continue
        elif kind == DRIVER_ACCUM:
            for accumulator, value in event.get("accumUpdates", ()):
                values[(int(event["executionId"]), int(accumulator))] += int(value)
    return values


def by_run(
    runs: Sequence[Mapping[str, Any]],
    found: Sequence[Execution],
    rows: Mapping[tuple[int, int], int],
) -> list[dict[str, Any]]:
    """Per Dagster run (`assets`, `start`, `end`), the executions that started in it, longest
    first, with the rows their own tasks read per scan (`[source, rows]`, none left out) and the
    time outside every top-level execution (`outside_s`: planning, the driver's own work)."""
    out = []
    for run in runs:
        inside = [e for e in found if run["start"] <= e.start <= run["end"]]
        busy, cursor = 0.0, run["start"]
        for e in sorted((e for e in inside if e.root is None), key=lambda e: e.start):
            stop = min(e.end if e.end is not None else e.start, run["end"])
            busy += max(0.0, stop - max(e.start, cursor))
            cursor = max(cursor, stop)
        inside.sort(key=lambda e: -(e.seconds or 0.0))
        out.append(
            {
                "assets": list(run.get("assets") or []),
                "wall_s": round(run["end"] - run["start"], 3),
                "outside_s": round(run["end"] - run["start"] - busy, 3),
                "executions": [
                    {
                        "id": e.id,
                        "inside": e.root,
                        "seconds": None if e.seconds is None else round(e.seconds, 3),
                        "what": e.what,
                        "scans": [
                            [source, rows[(e.id, acc)]]
                            for acc, source in e.scans.items()
                            if rows.get((e.id, acc))
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
    try:
        measurement = json.loads(args.measurement.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        print(f"{args.measurement} is not a measurement's JSON", file=sys.stderr)
        return 2
    runs = (measurement.get("raw") or measurement).get("dagster_runs") or []
    if not runs:
        print(f"{args.measurement} records no Dagster runs", file=sys.stderr)
        return 2
    lines = args.eventlog.read_text(encoding="utf-8").splitlines()
    report = by_run(runs, executions(lines, args.tables), scan_rows(lines))
    if not any(run["executions"] for run in report):
        print(f"no SQL execution of {args.eventlog} started during those runs", file=sys.stderr)
        return 2
    for run in report:
        print(
            f"== {', '.join(run['assets'][:3])}: {run['wall_s']} s "
            f"({run['outside_s']} s outside every query)"
        )
        for e in run["executions"][: args.top]:
            scans = ", ".join(f"{s} {n:,}" for s, n in e["scans"])
            nested = f" in #{e['inside']}" if e["inside"] is not None else ""
            print(f"  {e['seconds'] or 0:7.2f} s  #{e['id']}{nested}  {e['what']}  {scans}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
