"""The Spark stages of one step of a measurement, in the order they ran: wall, task time, spill,
shuffle and rows, so a long step can be taken apart stage by stage.

    python -m benchmarks.stages MEASUREMENT.json EVENTLOG [--step rebuild] [--min-s 0.3]

MEASUREMENT.json is a measurement the harness writes (`<work>/measurements/dNNN-rebuild.json`);
its step named `--step` (default: the last one) gives the time window. EVENTLOG is the Spark
event log of the engine that ran it (`<work>/eventlogs/dNNN-rebuild-engine/local-*` for the
trash and rebuild, `<work>/eventlogs/dNNN-engine/local-*` for the other measurements). Stages
shorter than `--min-s` are left out. Session 54 in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.sql_executions import _events

STAGE_DONE = "SparkListenerStageCompleted"
JOB_START = "SparkListenerJobStart"

# The task metrics of a stage kept here, by the name of its accumulable.
METRICS = {
    "run_ms": "internal.metrics.executorRunTime",
    "gc_ms": "internal.metrics.jvmGCTime",
    "memory_spilled": "internal.metrics.memoryBytesSpilled",
    "disk_spilled": "internal.metrics.diskBytesSpilled",
    "shuffle_local_read": "internal.metrics.shuffle.read.localBytesRead",
    "shuffle_remote_read": "internal.metrics.shuffle.read.remoteBytesRead",
    "shuffle_written": "internal.metrics.shuffle.write.bytesWritten",
    "rows_read": "internal.metrics.input.recordsRead",
    "rows_written": "internal.metrics.output.recordsWritten",
}


@dataclass(frozen=True)
class Stage:
    id: int
    start_s: float  # after the window's start
    wall_s: float
    tasks: int
    execution: str | None  # spark.sql.execution.id of its job
    metrics: Mapping[str, int]

    @property
    def shuffle_read(self) -> int:
        return self.metrics["shuffle_local_read"] + self.metrics["shuffle_remote_read"]


def _metric(info: Mapping[str, Any], name: str) -> int:
    for accumulable in info.get("Accumulables", ()):
        if accumulable.get("Name") == name:
            try:
                return int(accumulable.get("Value", 0))
            except (TypeError, ValueError):
                return 0
    return 0


def stages(
    events: Iterable[Mapping[str, Any]], start_s: float, end_s: float, min_s: float = 0.0
) -> list[Stage]:
    """The completed stages submitted within [start_s, end_s] (epoch seconds) that took at least
    `min_s`, in submission order."""
    execution_of_stage: dict[int, str | None] = {}
    found = []
    for event in events:
        kind = event.get("Event")
        if kind == JOB_START:
            execution = (event.get("Properties") or {}).get("spark.sql.execution.id")
            for stage_id in event.get("Stage IDs", ()):
                execution_of_stage[stage_id] = execution
        elif kind == STAGE_DONE:
            info = event["Stage Info"]
            submitted = info.get("Submission Time", 0) / 1000
            completed = info.get("Completion Time", 0) / 1000
            if not start_s <= submitted <= end_s or completed - submitted < min_s:
                continue
            metrics = {key: _metric(info, name) for key, name in METRICS.items()}
            found.append(
                Stage(
                    id=info["Stage ID"],
                    start_s=round(submitted - start_s, 3),
                    wall_s=round(completed - submitted, 3),
                    tasks=info.get("Number of Tasks", 0),
                    execution=execution_of_stage.get(info["Stage ID"]),
                    metrics=metrics,
                )
            )
    return sorted(found, key=lambda s: (s.start_s, s.id))


def step_window(measurement: Any, step: str | None) -> tuple[float, float]:
    """The (start, end) epoch seconds of the measurement's step named `step` (None: the last)."""
    steps = measurement.get("steps") if isinstance(measurement, dict) else None
    if not steps:
        raise ValueError(
            "the measurement has no steps: give one the harness wrote "
            "(<work>/measurements/dNNN-<name>.json)"
        )
    chosen = [s for s in steps if step is None or s.get("label") == step]
    if not chosen:
        labels = ", ".join(str(s.get("label")) for s in steps)
        raise ValueError(f"the measurement has no step {step!r} (its steps: {labels})")
    try:
        return float(chosen[-1]["start"]), float(chosen[-1]["end"])
    except (KeyError, TypeError, ValueError):
        raise ValueError(f"the measurement's step {step!r} has no start and end times") from None


def render(found: Sequence[Stage]) -> str:
    gb, mb = 1e9, 1e6
    lines = [
        "stage  start_s  wall_s  task_s   gc_s  spill_mem_GB spill_disk_GB  shuffle_read_MB"
        "  shuffle_written_MB  rows_read  rows_written  tasks  execution"
    ]
    for s in found:
        m = s.metrics
        lines.append(
            f"{s.id:5d} {s.start_s:8.1f} {s.wall_s:7.1f} {m['run_ms'] / 1000:7.1f} "
            f"{m['gc_ms'] / 1000:6.1f} {m['memory_spilled'] / gb:13.2f} {m['disk_spilled'] / gb:13.2f}"
            f" {s.shuffle_read / mb:16.0f} {m['shuffle_written'] / mb:19.0f} {m['rows_read']:10d}"
            f" {m['rows_written']:13d} {s.tasks:6d}  {s.execution or '-'}"
        )
    return "\n".join(lines)


def as_record(stage: Stage) -> dict[str, Any]:
    """A stage as plain JSON values: what `render` prints, in the event log's units."""
    return {
        "stage": stage.id,
        "start_s": stage.start_s,
        "wall_s": stage.wall_s,
        "tasks": stage.tasks,
        "execution": stage.execution,
        "shuffle_read_bytes": stage.shuffle_read,
        **stage.metrics,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.stages", description=__doc__)
    parser.add_argument("measurement")
    parser.add_argument("eventlog")
    parser.add_argument("--step")
    parser.add_argument("--min-s", type=float, default=0.3)
    parser.add_argument("--json", action="store_true", help="one JSON object per stage instead")
    args = parser.parse_args(argv)
    try:
        measurement = json.loads(Path(args.measurement).read_text())
        start, end = step_window(measurement, args.step)
        with Path(args.eventlog).open() as lines:
            # A line cut short (the log of an engine still running) is skipped.
            found = stages(_events(lines), start, end, args.min_s)
    except (OSError, ValueError) as error:
        print(f"stages: {error}", file=sys.stderr)
        return 2
    if not found:
        print(
            f"stages: no stage of {args.eventlog} ran in that step: is it the log of the engine "
            "that ran the measurement (the trash and rebuild has its own)?",
            file=sys.stderr,
        )
        return 2
    if args.json:
        print(json.dumps([as_record(s) for s in found], indent=1))
    else:
        print(render(found))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
