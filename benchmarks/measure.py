"""One measurement in its own process: run `sessionize` commands in-process through
`sessionize_assets.cli.main`, then report wall time, Spark's metrics (from the event log this
process's Spark application wrote), Delta's commit metrics, and the driver's peak memory and CPU.

    python -m benchmarks.measure --home H --config F --event-log-dir DIR --out result.json \\
        --steps '[{"label": "load", "now": "2024-03-06T00:30:00", "argv": ["load", "data/..."]},
                  {"label": "run", "now": "2024-03-06T00:30:00", "argv": ["run"]}]'

A fresh process per measurement gives a fresh Spark session (which picks up the settings file's
`spark.eventLog.dir`) and clean peak-memory numbers. With `--engine-event-log-dir DIR` the
commands run on the home's warm engine instead (started first if it is not running, writing its
event log to DIR; its start is timed apart, `engine_start_s`, and not in `command_wall_s`): the
engine's CPU and memory are sampled with this process's, and only the engine's Spark events
inside this measurement's commands are counted. The JSON is written to `--out` and printed as
the last line of stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

# The metadata key under which an asset check reports the event rows it read on the driver
# (sessionize_assets.checks.DRIVER_ROWS_READ; spelled out so that older revisions measure too).
DRIVER_ROWS_READ = "event rows read on the driver"

PROCESS_STARTED = time.time()


def _proc_bytes(path: str, field: str) -> int | None:
    """A `<field> <n> kB` line of a /proc file, in bytes (None when unreadable)."""
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(field):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def proportional_set_size(process: psutil.Process) -> int:
    """A process's PSS (Linux `smaps_rollup`): shared pages are split between the processes that
    share them, so the sum over forked Python workers is not counted twice. RSS elsewhere."""
    pss = _proc_bytes(f"/proc/{process.pid}/smaps_rollup", "Pss:")
    return pss if pss is not None else process.memory_info().rss


def is_jvm_executable(exe: str) -> bool:
    """Whether a process's executable is a Java launcher (its name, `comm`, may be a thread's:
    "Executor task l")."""
    return Path(exe).name == "java"


def spawn_in_flight(exe: str, parent_exe: str | None) -> bool:
    """Whether a process is a JVM's child between its spawn and its `exec`.

    Hadoop's local file system runs `chmod` and `readlink` as processes; the JVM starts them
    with posix_spawn (a vfork-style clone that shares the JVM's memory until it execs), so in
    that instant the child's PSS is the whole JVM's. Such a child still has the JVM's
    executable; once it has exec'd it has its own (and its own, small, memory). A forked Python
    worker, which does not share memory, is never one."""
    return parent_exe is not None and is_jvm_executable(parent_exe) and exe == parent_exe


def _exe(process: psutil.Process) -> str:
    try:
        return process.exe()
    except psutil.Error:
        return ""


def family(me: psutil.Process, roots: Sequence[psutil.Process] = ()) -> list[psutil.Process]:
    """This process's descendants, plus each of `roots` and its descendants, each process once
    (an engine this process started is also its child); a JVM's spawn in flight is left out:
    its memory is the JVM's (`spawn_in_flight`)."""
    out = {p.pid: p for p in me.children(recursive=True)}
    for root in roots:
        try:
            out |= {p.pid: p for p in [root, *root.children(recursive=True)]}
        except psutil.Error:
            continue
    kept = []
    for process in out.values():
        parent = out.get(process.ppid()) if process.pid != me.pid else None
        if parent is not None and spawn_in_flight(_exe(process), _exe(parent)):
            continue
        kept.append(process)
    return kept


def kind_of(process: psutil.Process) -> str:
    """ "jvm" or "other" (for a descendant)."""
    return "jvm" if is_jvm_executable(_exe(process)) or "java" in process.name() else "other"


@dataclass
class MemorySampler:
    """Samples the memory (PSS) of this process and its descendants (the Spark driver JVM, Python
    workers) and keeps the peaks."""

    interval_s: float = 0.2
    # Each wait is at least this many times the last sample's duration: reading `smaps_rollup`
    # walks a process's page tables, and for a JVM of a few GiB one pass over the family took
    # about 33 ms. Every 0.2 s that was 14 % of one core (py-spy of a warmed 5,000-event day on
    # the 30-day home: 6.5 s of the sampler thread in a 35 s day), taken from the run it measured
    # on this 2-core machine (docs/benchmarks.md, "Session 33"). At 20 times, at most 5 %.
    cost_factor: float = 20.0
    # ...but never longer than this: under load a sample takes longer, and a peak of a busy
    # phase would otherwise go unsampled for longer.
    max_wait_s: float = 2.0
    # Other processes to count with this one's descendants (a warm engine and its children).
    roots: list[psutil.Process] = field(default_factory=list)
    peak_total: int = 0
    peak_python: int = 0
    peak_jvm: int = 0
    # The processes that made up the highest total: (pid, name, PSS bytes), largest first.
    peak_processes: list[tuple[int, str, int]] = field(default_factory=list)
    samples: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def sample(self) -> None:
        me = psutil.Process()
        python = proportional_set_size(me)
        jvm = other = 0
        parts = [(me.pid, me.name(), python)]
        for child in family(me, self.roots):
            if child.pid == me.pid:
                continue
            try:
                size, name = proportional_set_size(child), child.name()
            except psutil.Error:
                continue
            parts.append((child.pid, name, size))
            if kind_of(child) == "jvm":
                jvm += size
            else:
                other += size
        self.samples += 1
        self.peak_python = max(self.peak_python, python)
        self.peak_jvm = max(self.peak_jvm, jvm)
        if python + jvm + other > self.peak_total:
            self.peak_total = python + jvm + other
            self.peak_processes = sorted(parts, key=lambda part: -part[2])

    def _loop(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            with contextlib.suppress(psutil.Error):
                self.sample()
            taken = time.monotonic() - started
            wait = max(self.interval_s, self.cost_factor * taken)
            self._stop.wait(min(wait, self.max_wait_s))

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="memory-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)


def hwm(pid: int) -> int:
    """A process's peak RSS (VmHWM, Linux; 0 when unknown)."""
    return _proc_bytes(f"/proc/{pid}/status", "VmHWM:") or 0


def high_water_marks() -> dict[str, int]:
    """Peak RSS (VmHWM, Linux) of this process and each live descendant, by kind."""
    out = {"python": 0, "jvm": 0, "other": 0}

    me = psutil.Process()
    out["python"] = hwm(me.pid)
    for child in family(me):
        try:
            kind = kind_of(child)
        except psutil.Error:
            continue
        out[kind] += hwm(child.pid)
    return out


def hwm_of(processes: Sequence[psutil.Process]) -> int:
    """Peak RSS (VmHWM) over the processes' lifetimes, summed (a warm engine's since its start)."""
    return sum(hwm(process.pid) for process in processes)


def cpu_seconds(roots: Sequence[psutil.Process] = ()) -> dict[str, float]:
    """CPU time (user + system) of this process and its live descendants (in local mode the
    JVM's includes every Spark task: robust to other load on the machine, unlike wall time),
    and of `roots` (a warm engine) and theirs."""
    me = psutil.Process()
    times = me.cpu_times()
    out = {"python": times.user + times.system, "jvm": 0.0, "other": 0.0}
    for child in family(me, roots):
        try:
            t = child.cpu_times()
            kind = kind_of(child)
        except psutil.Error:
            continue
        out[kind] += t.user + t.system
    return out


def dagster_run_windows(since: float) -> list[dict[str, Any]]:
    """The Dagster runs this process launched (the CLI exported DAGSTER_HOME): start, end, the
    assets they materialized and their status."""
    if not os.environ.get("DAGSTER_HOME"):
        return []
    import datetime as dt

    from dagster import DagsterEventType, DagsterInstance, RunsFilter

    instance = DagsterInstance.get()
    try:
        records = instance.get_run_records(
            filters=RunsFilter(created_after=dt.datetime.fromtimestamp(since - 1, dt.UTC))
        )
        out = []
        for record in records:
            run = record.dagster_run
            keys = sorted(k.to_user_string() for k in (run.asset_selection or ()))
            if not keys:  # an implicit asset job: the steps it ran are the assets
                keys = sorted(
                    {
                        e.dagster_event.step_key
                        for e in instance.all_logs(run.run_id, of_type=DagsterEventType.STEP_START)
                        if e.dagster_event is not None and e.dagster_event.step_key
                    }
                )
            out.append(
                {
                    "run_id": run.run_id,
                    "assets": keys,
                    "checks": _check_steps(instance, run),
                    "status": run.status.value,
                    "start": record.start_time,
                    "end": record.end_time,
                    "partition": run.tags.get("dagster/partition"),
                    "range": [
                        run.tags.get("dagster/asset_partition_range_start"),
                        run.tags.get("dagster/asset_partition_range_end"),
                    ],
                }
            )
        return sorted(out, key=lambda r: r["start"] or 0)
    finally:
        instance.dispose()


def _check_steps(instance: Any, run: Any) -> list[dict[str, Any]]:
    """The asset-check steps of a run with their start and end (seconds): their Spark work is
    reported apart from the assets' (`check:<step>` windows). A step is a check's when it
    recorded a check evaluation or its key ends with a selected check's name. A check that reads
    event rows on the driver (delta-rs, invisible to Spark's event log) says how many in its
    metadata: `driver_event_rows`."""
    from dagster import DagsterEventType

    names = {key.name for key in (run.asset_check_selection or ())}
    kinds = {
        DagsterEventType.STEP_START,
        DagsterEventType.STEP_SUCCESS,
        DagsterEventType.STEP_FAILURE,
        DagsterEventType.ASSET_CHECK_EVALUATION,
    }
    times: dict[str, dict[str, float]] = {}
    checks = set()
    driver_rows: dict[str, int] = {}
    for entry in instance.all_logs(run.run_id, of_type=kinds):
        event = entry.dagster_event
        if event is None or not event.step_key:
            continue
        key = event.step_key
        if event.event_type == DagsterEventType.ASSET_CHECK_EVALUATION:
            checks.add(key)
            metadata = getattr(event.event_specific_data, "metadata", None) or {}
            value = metadata.get(DRIVER_ROWS_READ)
            if value is not None:
                driver_rows[key] = driver_rows.get(key, 0) + int(value.value or 0)
        elif event.event_type == DagsterEventType.STEP_START:
            times.setdefault(key, {})["start"] = entry.timestamp
        else:
            times.setdefault(key, {})["end"] = entry.timestamp
    checks |= {k for k in times if any(k.endswith(name) for name in names)}
    return [
        {
            "step": step,
            "start": t["start"],
            "end": t["end"],
            "driver_event_rows": driver_rows.get(step, 0),
        }
        for step, t in sorted(times.items())
        if step in checks and "start" in t and "end" in t
    ]


def stop_spark() -> None:
    """Stop this process's Spark application so its event log is complete."""
    from pyspark import SparkContext

    context = SparkContext._active_spark_context
    if context is not None:
        context.stop()


def _ensure_verbose_default(cli: Any) -> None:
    """`cli.main` reads `args.verbose` (engine logs to <home>/logs unless verbose), but the parser
    of some revisions defines no `--verbose` option, so every `run` failed with AttributeError.
    Give the parser a `verbose=False` default when it lacks one (a no-op once the CLI has it)."""
    build = cli.build_parser
    if getattr(build, "_bench_verbose_default", False):
        return

    def build_parser() -> Any:
        parser = build()
        if not any(a.dest == "verbose" for a in parser._actions):
            parser.set_defaults(verbose=False)
        return parser

    build_parser._bench_verbose_default = True  # type: ignore[attr-defined]
    cli.build_parser = build_parser


def run_steps(
    home: str, config: str, steps: Sequence[dict[str, Any]], quiet: bool = True
) -> list[dict[str, Any]]:
    """Run each step's `sessionize` command in this process; time it; keep its output's tail.

    A step with `module` runs that module's `main(argv)` instead of the CLI (the same
    `--home`, `--config` and `--now`; e.g. `benchmarks.rebuild`)."""
    import importlib

    from sessionize_assets import cli

    _ensure_verbose_default(cli)
    out = []
    for step in steps:
        argv = ["--home", home, "--config", config]
        if step.get("now"):
            argv += ["--now", step["now"]]
        argv += list(step["argv"])
        entry = importlib.import_module(step["module"]).main if step.get("module") else cli.main
        buffer = io.StringIO()
        started = time.time()
        error = None
        try:
            if quiet:
                with contextlib.redirect_stdout(buffer):
                    code = entry(argv)
            else:
                code = entry(argv)
        except Exception as exc:  # noqa: BLE001 - reported, the measurement goes on
            code, error = -1, f"{type(exc).__name__}: {exc}"
        ended = time.time()
        out.append(
            {
                "label": step.get("label", step.get("module") or step["argv"][0]),
                "argv": argv,
                "exit_code": code,
                "error": error,
                "start": started,
                "end": ended,
                "wall_s": round(ended - started, 3),
                "output_tail": buffer.getvalue().splitlines()[-60:],
            }
        )
        if code != 0:
            break
    return out


def start_engine(home: str, config: str, event_log_dir: Path) -> tuple[psutil.Process, float]:
    """The home's warm engine, started (writing its event log to `event_log_dir`) unless it runs
    already, and this process pointed at it: (its process, seconds spent starting it)."""
    from sessionize_assets.resources import engine
    from sessionize_assets.settings import load_settings

    settings = load_settings(Path(home).resolve(), config)
    conf = dict(settings.spark) | {"spark.eventLog.dir": str(event_log_dir)}
    started = time.time()
    info = engine.start(Path(home), conf, port=0)
    os.environ["SESSIONIZE_SPARK_REMOTE"] = info.url
    return psutil.Process(info.pid), 0.0 if info.reused else round(time.time() - started, 3)


def measure(
    home: str,
    config: str,
    steps: Sequence[dict[str, Any]],
    event_log_dir: Path,
    landing_root: str | None,
    quiet: bool = True,
    engine_event_log_dir: Path | None = None,
) -> dict[str, Any]:
    """Run the steps and collect every metric (see the module docstring)."""
    from benchmarks import deltastats, eventlog
    from sessionize_assets.home import Home

    warehouse = Home(Path(home)).warehouse
    engine_start_s = None
    roots: list[psutil.Process] = []
    if engine_event_log_dir is not None:
        engine_process, engine_start_s = start_engine(home, config, engine_event_log_dir)
        roots = [engine_process]
        event_log_dir = engine_event_log_dir
    versions_before = deltastats.table_versions(Path(warehouse))
    load_before = os.getloadavg()
    cpu_before = cpu_seconds(roots)
    sampler = MemorySampler(roots=roots)
    sampler.start()
    commands_started = time.time()
    try:
        step_results = run_steps(home, config, steps, quiet)
    finally:
        sampler.stop()
    commands_done = time.time()
    hwm = high_water_marks()
    cpu_after = cpu_seconds(roots)
    runs = dagster_run_windows(PROCESS_STARTED)
    stop_spark()
    if roots:
        time.sleep(2.0)  # the engine's listener bus writes the last events a moment later
    stopped = time.time()

    windows = [eventlog.Window(s["label"], s["start"], s["end"]) for s in step_results]
    for run in runs:
        if run["start"] and run["end"]:
            windows.append(
                eventlog.Window("run:" + ",".join(run["assets"]), run["start"], run["end"])
            )
        for check in run.get("checks") or ():  # inside the run's window: the innermost wins
            windows.append(eventlog.Window("check:" + check["step"], check["start"], check["end"]))
    try:
        spark = eventlog.parse_event_log_dir(
            event_log_dir,
            warehouse,
            landing_root,
            windows,
            span=(commands_started, commands_done) if roots else None,
        )
        spark_json: dict[str, Any] | None = spark.to_json()
        spark_start_s = (
            round(spark.app_start_ms / 1000.0 - PROCESS_STARTED, 3) if spark.app_start_ms else None
        )
    except FileNotFoundError:
        spark_json, spark_start_s = None, None
    delta = deltastats.commits_since(Path(warehouse), versions_before)
    failed_runs = [r for r in runs if r["status"] == "FAILURE"]
    return {
        "steps": step_results,
        "ok": all(s["exit_code"] == 0 for s in step_results)
        and len(step_results) == len(steps)
        and not failed_runs,
        "error": (
            "failed Dagster run(s): " + "; ".join(",".join(r["assets"]) for r in failed_runs)
            if failed_runs
            else None
        ),
        "command_wall_s": round(commands_done - PROCESS_STARTED - (engine_start_s or 0.0), 3),
        "engine": None
        if not roots
        else {"start_s": engine_start_s, "pid": roots[0].pid, "hwm_bytes_lifetime": hwm_of(roots)},
        "steps_wall_s": round(sum(s["wall_s"] for s in step_results), 3),
        "spark_stop_s": round(stopped - commands_done, 3),
        "spark_app_started_after_s": spark_start_s,
        "memory": {
            "peak_pss_total_bytes": sampler.peak_total,
            "peak_pss_python_bytes": sampler.peak_python,
            "peak_pss_jvm_bytes": sampler.peak_jvm,
            "peak_processes": [
                {"pid": pid, "name": name, "pss_bytes": size}
                for pid, name, size in sampler.peak_processes
            ],
            "samples": sampler.samples,
            "hwm_bytes": hwm,
        },
        "cpu_s": {
            k: round(
                cpu_after.get(k, 0.0) - (cpu_before.get(k, 0.0) if k == "python" or roots else 0.0),
                3,
            )
            for k in ("python", "jvm", "other")
        },
        "loadavg_before": list(load_before),
        "loadavg_after": list(os.getloadavg()),
        "dagster_runs": runs,
        "spark": spark_json,
        "delta": {"tables": delta, "totals": deltastats.totals(delta)},
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--home", required=True)
    parser.add_argument("--config", required=True)
    parser.add_argument("--event-log-dir", required=True)
    parser.add_argument("--landing-root", default=None)
    parser.add_argument("--steps", required=True, help="JSON list of {label, now, argv}")
    parser.add_argument("--out", required=True)
    parser.add_argument("--verbose", action="store_true", help="let the commands print")
    parser.add_argument(
        "--engine-event-log-dir",
        default=None,
        help="run on the home's warm engine (started if needed, its event log written here)",
    )
    args = parser.parse_args(argv)
    Path(args.event_log_dir).mkdir(parents=True, exist_ok=True)
    result = measure(
        args.home,
        args.config,
        json.loads(args.steps),
        Path(args.event_log_dir),
        args.landing_root,
        quiet=not args.verbose,
        engine_event_log_dir=Path(args.engine_event_log_dir) if args.engine_event_log_dir else None,
    )
    text = json.dumps(result, sort_keys=True, default=str)
    Path(args.out).write_text(text + "\n")
    print(text)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
