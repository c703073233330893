"""Spark's own metrics, from its JSON event log (`spark.eventLog.enabled`, uncompressed, not rolled).

Two sources, both written by Spark itself:

- task metrics (`SparkListenerTaskEnd` -> "Task Metrics"): input bytes/records read, output
  bytes/records written, shuffle read/write, executor run and CPU time, spill, GC;
- SQL metrics of scan nodes: every `Scan ...` node of a query plan
  (`SparkListenerSQLExecutionStart` / `...SQLAdaptiveExecutionUpdate` -> `sparkPlanInfo`) names
  its files (`Location`) and the accumulators of its "number of output rows", "number of files
  read" and "size of files read"; the updates come from the tasks ("Accumulables") and the driver
  (`SparkListenerDriverAccumUpdates`). That gives the rows read per table, which the task totals
  cannot (they mix landing files, data files and the Delta log).

`parse_event_log` is pure (lines in, a summary out) so it is tested on small logs.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SQL_START = "org.apache.spark.sql.execution.ui.SparkListenerSQLExecutionStart"
SQL_END = "org.apache.spark.sql.execution.ui.SparkListenerSQLExecutionEnd"
SQL_AQE = "org.apache.spark.sql.execution.ui.SparkListenerSQLAdaptiveExecutionUpdate"
DRIVER_ACCUM = "org.apache.spark.sql.execution.ui.SparkListenerDriverAccumUpdates"
SCAN_METRICS = {
    "number of output rows": "rows",
    "number of files read": "files",
    "size of files read": "bytes",
}
# Task metrics summed over every task: (section, key) -> our name.
TASK_METRICS: dict[tuple[str | None, str], str] = {
    ("Input Metrics", "Bytes Read"): "input_bytes",
    ("Input Metrics", "Records Read"): "input_records",
    ("Output Metrics", "Bytes Written"): "output_bytes",
    ("Output Metrics", "Records Written"): "output_records",
    ("Shuffle Read Metrics", "Total Records Read"): "shuffle_read_records",
    ("Shuffle Read Metrics", "Local Bytes Read"): "shuffle_read_local_bytes",
    ("Shuffle Read Metrics", "Remote Bytes Read"): "shuffle_read_remote_bytes",
    ("Shuffle Write Metrics", "Shuffle Bytes Written"): "shuffle_write_bytes",
    ("Shuffle Write Metrics", "Shuffle Records Written"): "shuffle_write_records",
    (None, "Executor Run Time"): "executor_run_time_ms",
    (None, "Executor CPU Time"): "executor_cpu_time_ns",
    (None, "JVM GC Time"): "jvm_gc_time_ms",
    (None, "Memory Bytes Spilled"): "memory_bytes_spilled",
    (None, "Disk Bytes Spilled"): "disk_bytes_spilled",
}
_LOCATION = re.compile(r"\[(.*)\]\s*$")


@dataclass(frozen=True)
class Window:
    """A labelled time range (epoch seconds): a benchmark step, or one Dagster run in it."""

    label: str
    start: float
    end: float


@dataclass
class ScanTotals:
    """What the scans of one source read."""

    rows: int = 0
    files: int = 0
    bytes: int = 0
    scans: int = 0

    def add(self, other: ScanTotals) -> None:
        self.rows += other.rows
        self.files += other.files
        self.bytes += other.bytes
        self.scans += other.scans

    def to_json(self) -> dict[str, int]:
        return {"rows": self.rows, "files": self.files, "bytes": self.bytes, "scans": self.scans}


@dataclass
class EventLogSummary:
    """Totals of one Spark application's event log."""

    app_start_ms: int | None = None
    app_end_ms: int | None = None
    sql_executions: int = 0
    jobs: int = 0
    stages: int = 0
    tasks: int = 0
    failed_tasks: int = 0
    task_totals: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(TASK_METRICS.values(), 0)
    )
    peak_task_execution_memory: int = 0
    # source -> totals; source is `table:<name>`, `delta_log:<name>`, `landing`, or `other:<...>`
    scans: dict[str, ScanTotals] = field(default_factory=dict)
    # window label -> source -> totals (scans of the SQL executions that started in the window)
    scans_by_window: dict[str, dict[str, ScanTotals]] = field(default_factory=dict)
    # window label -> Spark jobs submitted in the window (by `Submission Time`)
    jobs_by_window: dict[str, int] = field(default_factory=dict)

    def rows_read(self, kinds: Sequence[str] = ("table", "landing")) -> int:
        """Rows read from the given kinds of sources (the Delta log excluded by default)."""
        return sum(t.rows for s, t in self.scans.items() if s.split(":", 1)[0] in kinds)

    def to_json(self) -> dict[str, Any]:
        return {
            "app_start_ms": self.app_start_ms,
            "app_end_ms": self.app_end_ms,
            "sql_executions": self.sql_executions,
            "jobs": self.jobs,
            "stages": self.stages,
            "tasks": self.tasks,
            "failed_tasks": self.failed_tasks,
            "task_totals": dict(self.task_totals),
            "peak_task_execution_memory": self.peak_task_execution_memory,
            "scans": {k: v.to_json() for k, v in sorted(self.scans.items())},
            "scans_by_window": {
                w: {k: v.to_json() for k, v in sorted(s.items())}
                for w, s in self.scans_by_window.items()
            },
            "jobs_by_window": dict(sorted(self.jobs_by_window.items())),
        }


def classify_location(
    location: str | None, tables_root: str | None, landing_root: str | None
) -> str:
    """The source a scan reads, from its plan's `Location` (e.g.
    `PreparedDeltaFileIndex(1 paths)[file:/h/warehouse/sessions]`)."""
    if not location:
        return "other:in-memory"
    match = _LOCATION.search(location)
    paths = match.group(1) if match else location
    first = paths.split(",")[0].strip()
    first = re.sub(r"^file:(//)?", "", first)
    if tables_root:
        root = re.sub(r"^file:(//)?", "", tables_root).rstrip("/") + "/"
        if first.startswith(root) or first + "/" == root:
            rest = first[len(root) :].strip("/")
            name = rest.split("/", 1)[0] if rest else "?"
            kind = "delta_log" if "/_delta_log" in first or rest.endswith("_delta_log") else "table"
            return f"{kind}:{name}"
    if "_delta_log" in first:
        return "delta_log:?"
    if landing_root:
        root = re.sub(r"^file:(//)?", "", landing_root).rstrip("/") + "/"
        if first.startswith(root):
            return "landing"
    return f"other:{first}"


def _walk(node: Mapping[str, Any]) -> Iterable[Mapping[str, Any]]:
    yield node
    for child in node.get("children", ()):
        yield from _walk(child)


def _number(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        try:
            return int(float(value))
        except (TypeError, ValueError):
            return 0


def _window_of(time_s: float, windows: Sequence[Window]) -> str | None:
    """The innermost (shortest) window holding `time_s`."""
    holding = [w for w in windows if w.start <= time_s <= w.end]
    if not holding:
        return None
    return min(holding, key=lambda w: w.end - w.start).label


def parse_event_log(
    lines: Iterable[str],
    tables_root: str | None = None,
    landing_root: str | None = None,
    windows: Sequence[Window] = (),
    span: tuple[float, float] | None = None,
) -> EventLogSummary:
    """Summarize an event log's lines. `windows` attribute SQL executions (by start time) and
    jobs (by submission time) to the step or Dagster run they ran in (the innermost window wins;
    none: `outside`). `span` (epoch seconds, from, to) keeps only the executions, jobs, stages
    and tasks that started inside it: one measurement's share of a long-lived engine's log."""
    summary = EventLogSummary()

    def inside(time_ms: Any) -> bool:
        return span is None or span[0] <= _number(time_ms) / 1000.0 <= span[1]

    # accumulator id -> (execution id, source, metric)
    accumulators: dict[int, tuple[int, str, str]] = {}
    scan_nodes: dict[tuple[int, str, str], int] = {}
    execution_window: dict[int, str] = {}
    values: dict[int, int] = defaultdict(int)

    def register_plan(execution: int, plan: Mapping[str, Any]) -> None:
        for node in _walk(plan):
            name = str(node.get("nodeName", ""))
            if not name.startswith("Scan") or "LocalTableScan" in name:
                continue
            source = classify_location(
                (node.get("metadata") or {}).get("Location"), tables_root, landing_root
            )
            if source.startswith("other:in-memory") and "ExistingRDD" in name:
                source = "other:rdd"
            key = None
            for metric in node.get("metrics", ()):
                ours = SCAN_METRICS.get(metric.get("name"))
                if ours is None:
                    continue
                accumulator = int(metric["accumulatorId"])
                if accumulator not in accumulators:
                    accumulators[accumulator] = (execution, source, ours)
                    key = (execution, source, str(node.get("simpleString", name))[:200])
            if key is not None:
                scan_nodes[key] = scan_nodes.get(key, 0) + 1

    for line in lines:
        line = line.strip()
        if not line:
            continue
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            if span is None:
                raise
            continue  # a running engine's log may end in a line being written
        kind = event.get("Event")
        if kind == "SparkListenerApplicationStart":
            summary.app_start_ms = event.get("Timestamp")
        elif kind == "SparkListenerApplicationEnd":
            summary.app_end_ms = event.get("Timestamp")
        elif kind == SQL_START:
            if not inside(event.get("time")):
                continue
            summary.sql_executions += 1
            execution = int(event["executionId"])
            label = _window_of(event.get("time", 0) / 1000.0, windows)
            execution_window[execution] = label or "outside"
            register_plan(execution, event.get("sparkPlanInfo") or {})
        elif kind == SQL_AQE:
            if int(event["executionId"]) not in execution_window:
                continue  # an execution outside the span
            register_plan(int(event["executionId"]), event.get("sparkPlanInfo") or {})
        elif kind == DRIVER_ACCUM:
            for accumulator, value in event.get("accumUpdates", ()):
                values[int(accumulator)] += _number(value)
        elif kind == "SparkListenerJobStart":
            if not inside(event.get("Submission Time")):
                continue
            summary.jobs += 1
            label = _window_of(_number(event.get("Submission Time")) / 1000.0, windows)
            label = label or "outside"
            summary.jobs_by_window[label] = summary.jobs_by_window.get(label, 0) + 1
        elif kind == "SparkListenerStageCompleted":
            if not inside((event.get("Stage Info") or {}).get("Submission Time")):
                continue
            summary.stages += 1
        elif kind == "SparkListenerTaskEnd":
            if not inside((event.get("Task Info") or {}).get("Launch Time")):
                continue
            summary.tasks += 1
            reason = (event.get("Task End Reason") or {}).get("Reason")
            if reason not in (None, "Success"):
                summary.failed_tasks += 1
            metrics = event.get("Task Metrics") or {}
            for (section, key), ours in TASK_METRICS.items():
                source = metrics.get(section) if section else metrics
                if isinstance(source, Mapping):
                    summary.task_totals[ours] += _number(source.get(key))
            summary.peak_task_execution_memory = max(
                summary.peak_task_execution_memory, _number(metrics.get("Peak Execution Memory"))
            )
            # Every update is kept, not only those of scans already seen: the tasks that fill a
            # cached table (`persist`) run before the adaptive re-plan that shows their scan.
            for acc in (event.get("Task Info") or {}).get("Accumulables", ()):
                values[_number(acc.get("ID"))] += _number(acc.get("Update"))

    # Count each scan node once per execution, whatever metrics it has.
    for execution, source, _ in scan_nodes:
        label = execution_window.get(execution, "outside")
        summary.scans.setdefault(source, ScanTotals()).scans += 1
        summary.scans_by_window.setdefault(label, {}).setdefault(source, ScanTotals()).scans += 1
    for accumulator, (execution, source, metric) in accumulators.items():
        value = values.get(accumulator, 0)
        label = execution_window.get(execution, "outside")
        for totals in (
            summary.scans.setdefault(source, ScanTotals()),
            summary.scans_by_window.setdefault(label, {}).setdefault(source, ScanTotals()),
        ):
            setattr(totals, metric, getattr(totals, metric) + value)
    return summary


def find_event_logs(directory: Path) -> list[Path]:
    """The application logs in an event log folder (in-progress ones included)."""
    return sorted(
        p for p in Path(directory).iterdir() if p.is_file() and not p.name.startswith(".")
    )


def merge_summaries(parts: Sequence[EventLogSummary]) -> EventLogSummary:
    """One summary of several applications' logs (sums; the earliest start, the latest end)."""
    out = EventLogSummary()
    starts = [p.app_start_ms for p in parts if p.app_start_ms is not None]
    ends = [p.app_end_ms for p in parts if p.app_end_ms is not None]
    out.app_start_ms = min(starts) if starts else None
    out.app_end_ms = max(ends) if ends else None
    for part in parts:
        for name in ("sql_executions", "jobs", "stages", "tasks", "failed_tasks"):
            setattr(out, name, getattr(out, name) + getattr(part, name))
        for key, value in part.task_totals.items():
            out.task_totals[key] = out.task_totals.get(key, 0) + value
        out.peak_task_execution_memory = max(
            out.peak_task_execution_memory, part.peak_task_execution_memory
        )
        for source, totals in part.scans.items():
            out.scans.setdefault(source, ScanTotals()).add(totals)
        for label, jobs in part.jobs_by_window.items():
            out.jobs_by_window[label] = out.jobs_by_window.get(label, 0) + jobs
        for label, scans in part.scans_by_window.items():
            for source, totals in scans.items():
                out.scans_by_window.setdefault(label, {}).setdefault(source, ScanTotals()).add(
                    totals
                )
    return out


def parse_event_log_dir(
    directory: Path,
    tables_root: str | None = None,
    landing_root: str | None = None,
    windows: Sequence[Window] = (),
    span: tuple[float, float] | None = None,
) -> EventLogSummary:
    """Parse every application log in `directory` (one per Spark application) and merge them;
    `span` as in `parse_event_log`."""
    logs = find_event_logs(directory)
    if not logs:
        raise FileNotFoundError(f"no Spark event log in {directory}")
    parts = []
    for path in logs:
        with path.open(encoding="utf-8") as handle:
            parts.append(parse_event_log(handle, tables_root, landing_root, windows, span))
    return merge_summaries(parts)
