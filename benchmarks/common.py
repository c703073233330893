"""Shared pieces of the benchmarks: settings files, measurement subprocesses, machine facts."""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parent.parent
# 2: histories[].trash_and_rebuild (seed 002's baseline); 3: parameters.profile and
# data.profile (the generator's profile), per measurement `delta_commits_by_table` and
# `by_branch.*.spark_jobs`; 4: parameters.engine (off | warm) and per measurement `engine` (the
# warm engine's start seconds, pid, lifetime peak RSS; null when off)
SCHEMA_VERSION = 4

# Spark settings every measurement adds: an uncompressed, unrolled JSON event log per measurement.
EVENT_LOG_CONF = {
    "spark.eventLog.enabled": "true",
    "spark.eventLog.compress": "false",
    "spark.eventLog.rolling.enabled": "false",
}
TIME_BASED_ASSETS = frozenset(
    {
        "filtered_events",
        "days_to_process",
        "daily_aggregates",
        "attributes",
        "daily_aggregation_manifest",
    }
)
SESSION_ASSETS = frozenset(
    {
        "session_models",
        "sessions",
        "users",
        "user_session_stats",
        "sessions_lifecycle_manifest",
        "quarantined_sessions",
        "incremental_manifest",
    }
)
EVENT_SOURCES = ("landing", "table:events", "table:filtered_events")


def benchmark_settings(
    start_date: dt.date,
    backfill_limit_days: int,
    policy: str = "exact",
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The settings every measurement of a run shares (written to YAML with the event log added).

    `policy`: `exact` (min_rows_to_process 1, reprocess_days beyond the generator's 60-day
    lateness: every late event day is re-aggregated, so daily_aggregates equals a full recompute)
    or `default` (the project's thresholds: late days are re-aggregated only when worth it).
    """
    settings: dict[str, Any] = {
        "start_date": start_date.isoformat(),
        "backfill_limit_days": int(backfill_limit_days),
        "session_mode": "gap",
        "session_gap_minutes": 30,
    }
    if policy == "exact":
        settings |= {"min_rows_to_process": 1, "reprocess_days": 61}
    elif policy != "default":
        raise ValueError(f"policy must be `exact` or `default`, got {policy!r}")
    settings |= dict(extra or {})
    return settings


def write_settings(
    path: Path, settings: Mapping[str, Any], spark: Mapping[str, str], event_log_dir: Path | None
) -> Path:
    """A settings file: the shared settings plus Spark settings (and this measurement's event log)."""
    conf = dict(spark)
    if event_log_dir is not None:
        conf |= EVENT_LOG_CONF | {"spark.eventLog.dir": str(event_log_dir)}
    content = dict(settings)
    if conf:
        content["spark"] = {k: str(v) for k, v in conf.items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(content, sort_keys=True))
    return path


def write_result(out_dir: str | Path, prefix: str, result: Mapping[str, Any]) -> Path:
    """Write `result`, after its creation time (`created_at`, UTC), as `<prefix>-<UTC time>.json`
    into `out_dir` (created if need be)."""
    now = dt.datetime.now(dt.UTC)
    out = Path(out_dir) / f"{prefix}-{now.strftime('%Y%m%dT%H%M%SZ')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    created = {"created_at": now.isoformat(timespec="seconds")}
    out.write_text(json.dumps(created | dict(result), indent=1) + "\n")
    return out


def step(label: str, now: dt.datetime, *argv: str) -> dict[str, Any]:
    """One `sessionize` command of a measurement."""
    return {"label": label, "now": now.isoformat(), "argv": list(argv)}


def load_step(now: dt.datetime, folders: Sequence[Path]) -> dict[str, Any]:
    return step(
        "load", now, "load", *[str(f) for f in folders], "--load-tstamp-from", "load_tstamp"
    )


def rebuild_step(now: dt.datetime) -> dict[str, Any]:
    """The trash-and-rebuild of every derived table (`benchmarks.rebuild`) as of `now`."""
    return {"label": "rebuild", "module": "benchmarks.rebuild", "now": now.isoformat(), "argv": []}


def run_measurement(
    workdir: Path,
    name: str,
    home: Path,
    settings: Mapping[str, Any],
    spark: Mapping[str, str],
    steps: Sequence[Mapping[str, Any]],
    landing_root: Path | None,
    timeout_s: float | None = None,
    env: Mapping[str, str] | None = None,
    engine_event_log_dir: Path | None = None,
) -> dict[str, Any]:
    """Run `python -m benchmarks.measure` for the steps in a fresh process; its JSON result, plus
    the process's wall time as seen from here."""
    event_log_dir = workdir / "eventlogs" / name
    event_log_dir.mkdir(parents=True, exist_ok=True)
    config = write_settings(workdir / "configs" / f"{name}.yaml", settings, spark, event_log_dir)
    out = workdir / "measurements" / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    log = workdir / "logs" / f"{name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable,
        "-m",
        "benchmarks.measure",
        "--home",
        str(home),
        "--config",
        str(config),
        "--event-log-dir",
        str(event_log_dir),
        "--steps",
        json.dumps(list(steps)),
        "--out",
        str(out),
    ]
    if landing_root is not None:
        command += ["--landing-root", str(landing_root)]
    if engine_event_log_dir is not None:
        engine_event_log_dir.mkdir(parents=True, exist_ok=True)
        command += ["--engine-event-log-dir", str(engine_event_log_dir)]
    child_env = os.environ.copy()
    child_env["PYTHONPATH"] = os.pathsep.join(
        [str(REPO_ROOT), *[p for p in child_env.get("PYTHONPATH", "").split(os.pathsep) if p]]
    )
    child_env.setdefault("PYSPARK_PYTHON", sys.executable)
    for key in ("SESSIONIZE_CONFIG", "SESSIONIZE_HOME", "SESSIONIZE_NOW", "DAGSTER_HOME"):
        child_env.pop(key, None)
    child_env |= dict(env or {})
    started = time.time()
    with log.open("w") as handle:
        try:
            completed = subprocess.run(
                command,
                cwd=REPO_ROOT,
                env=child_env,
                stdout=handle,
                stderr=subprocess.STDOUT,
                timeout=timeout_s,
                check=False,
            )
            code = completed.returncode
        except subprocess.TimeoutExpired:
            code = "timeout"
    wall = time.time() - started
    if out.is_file():
        result = json.loads(out.read_text())
    else:
        tail = log.read_text(errors="replace").splitlines()[-40:]
        result = {"ok": False, "error": f"measurement process exited {code}", "log_tail": tail}
    result["process_wall_s"] = round(wall, 3)
    result["process_exit"] = code
    result["name"] = name
    result["log"] = str(log)
    return result


def _version(module: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(module)
    except Exception:  # noqa: BLE001
        return None


def java_version() -> str | None:
    try:
        text = subprocess.run(
            ["java", "-version"], capture_output=True, text=True, timeout=30, check=False
        ).stderr
        return text.splitlines()[0] if text else None
    except (OSError, subprocess.SubprocessError):
        return None


def machine_facts() -> dict[str, Any]:
    """What the numbers were measured on."""
    import psutil

    memory = psutil.virtual_memory()
    return {
        "hostname_hash": abs(hash(platform.node())) % 10**8,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_count_logical": os.cpu_count(),
        "cpu_count_physical": psutil.cpu_count(logical=False),
        "cpu_model": _cpu_model(),
        "memory_total_bytes": memory.total,
        "memory_available_bytes": memory.available,
        "loadavg": list(os.getloadavg()),
        "java": java_version(),
        "code": code_version(),
        "versions": {
            name: _version(name)
            for name in (
                "pyspark",
                "delta-spark",
                "deltalake",
                "duckdb",
                "dagster",
                "pyarrow",
                "sessionize_assets",
            )
        },
    }


def code_version() -> dict[str, Any]:
    """The commit measured, and whether the working tree had changes (read-only git calls)."""

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(
                ["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=30
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    status = git("status", "--porcelain", "--untracked-files=no")
    return {
        "commit": git("rev-parse", "HEAD"),
        "dirty": bool(status) if status is not None else None,
    }


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def branch_of(label: str) -> str:
    """The branch a measurement window belongs to: `load`, `time-based`, `session-based`,
    `checks` (an asset check's step inside a run), or `other` (a step's own work outside Dagster
    runs, e.g. planning)."""
    if label == "load":
        return "load"
    if label.startswith("check:"):
        return "checks"
    if label.startswith("run:"):
        assets = set(label[4:].split(",")) - {""}
        if assets & SESSION_ASSETS:
            return "session-based"
        if assets & TIME_BASED_ASSETS:
            return "time-based"
        return "other"
    return "other"


def summarize_measurement(raw: Mapping[str, Any]) -> dict[str, Any]:
    """The stable, comparable figures of one measurement (the raw result stays under `raw`)."""
    spark = raw.get("spark") or {}
    scans: Mapping[str, Mapping[str, int]] = spark.get("scans") or {}
    tasks: Mapping[str, int] = spark.get("task_totals") or {}
    delta = (raw.get("delta") or {}).get("totals") or {}

    def rows(sources: Sequence[str] | None = None, kind: str | None = None) -> int:
        return sum(
            int(v.get("rows", 0))
            for k, v in scans.items()
            if (sources is not None and k in sources) or (kind is not None and k.startswith(kind))
        )

    # Event rows an asset check read on the driver (delta-rs: not in Spark's event log), from the
    # checks' own metadata; counted with the rest.
    driver_event_rows = sum(
        int(c.get("driver_event_rows") or 0)
        for run in raw.get("dagster_runs") or ()
        for c in run.get("checks") or ()
    )
    event_rows = rows(EVENT_SOURCES) + driver_event_rows
    table_rows = rows(kind="table:")
    # What the asset checks read (their steps' windows), reported apart: verification, not the
    # pipeline's own reads.
    check_event_rows = driver_event_rows + sum(
        int(totals.get("rows", 0))
        for label, sources in (spark.get("scans_by_window") or {}).items()
        if label.startswith("check:")
        for source, totals in sources.items()
        if source in EVENT_SOURCES
    )
    by_branch: dict[str, dict[str, Any]] = {}
    for label, sources in (spark.get("scans_by_window") or {}).items():
        branch = branch_of(label)
        entry = by_branch.setdefault(
            branch, {"event_rows_read": 0, "other_table_rows_read": 0, "bytes_read": 0}
        )
        for source, totals in sources.items():
            if source in EVENT_SOURCES:
                entry["event_rows_read"] += int(totals.get("rows", 0))
            elif source.startswith("table:"):
                entry["other_table_rows_read"] += int(totals.get("rows", 0))
            entry["bytes_read"] += int(totals.get("bytes", 0))
    if driver_event_rows:
        entry = by_branch.setdefault(
            "checks", {"event_rows_read": 0, "other_table_rows_read": 0, "bytes_read": 0}
        )
        entry["event_rows_read"] += driver_event_rows
    for run in raw.get("dagster_runs") or ():
        branch = branch_of("run:" + ",".join(run.get("assets") or ()))
        entry = by_branch.setdefault(
            branch, {"event_rows_read": 0, "other_table_rows_read": 0, "bytes_read": 0}
        )
        if run.get("start") and run.get("end"):
            entry["wall_s"] = round(entry.get("wall_s", 0.0) + run["end"] - run["start"], 3)
        entry["dagster_runs"] = entry.get("dagster_runs", 0) + 1
    # Spark jobs by the window they were submitted in (Spark's start and the gaps: `other`).
    for label, jobs in (spark.get("jobs_by_window") or {}).items():
        entry = by_branch.setdefault(
            branch_of(label), {"event_rows_read": 0, "other_table_rows_read": 0, "bytes_read": 0}
        )
        entry["spark_jobs"] = entry.get("spark_jobs", 0) + int(jobs)
    # Wall time: a load step is all `load`; what a run step spends outside its Dagster runs
    # (planning, reading state, starting Spark) is `other`.
    empty = {"event_rows_read": 0, "other_table_rows_read": 0, "bytes_read": 0}
    for s in raw.get("steps") or ():
        if s.get("label") == "load":
            entry = by_branch.setdefault("load", dict(empty))
            entry["wall_s"] = round(entry.get("wall_s", 0.0) + s["wall_s"], 3)
        elif s.get("start") and s.get("end"):
            inside = sum(
                r["end"] - r["start"]
                for r in raw.get("dagster_runs") or ()
                if r.get("start") and r.get("end") and s["start"] <= r["start"] <= s["end"]
            )
            entry = by_branch.setdefault("other", dict(empty))
            entry["wall_s"] = round(entry.get("wall_s", 0.0) + s["wall_s"] - inside, 3)
    files_read = sum(int(v.get("files", 0)) for k, v in scans.items() if not k.startswith("other"))
    return {
        "ok": bool(raw.get("ok")),
        "error": raw.get("error")
        or next((s.get("error") for s in raw.get("steps", ()) if s.get("error")), None),
        "wall_s": raw.get("command_wall_s"),
        "process_wall_s": raw.get("process_wall_s"),
        "engine": raw.get("engine"),
        "steps": [
            {k: s.get(k) for k in ("label", "wall_s", "exit_code", "error")}
            for s in raw.get("steps", ())
        ],
        "spark_app_started_after_s": raw.get("spark_app_started_after_s"),
        "rows_read": {
            "event_rows": event_rows,
            "check_event_rows": check_event_rows,
            "driver_event_rows": driver_event_rows,
            "landing": rows(["landing"]),
            "events_table": rows(["table:events"]),
            "filtered_events_table": rows(["table:filtered_events"]),
            "other_tables": table_rows - rows(["table:events", "table:filtered_events"]),
            "delta_log": rows(kind="delta_log:"),
            # Spark's scans, plus `driver:filtered_events` when a check read event ids with
            # delta-rs (their sum is `event_rows` + other tables + the Delta log).
            "by_source": {
                **{k: int(v.get("rows", 0)) for k, v in sorted(scans.items())},
                **({"driver:filtered_events": driver_event_rows} if driver_event_rows else {}),
            },
        },
        "bytes_read": {
            "task_input_bytes": int(tasks.get("input_bytes", 0)),
            "scanned_file_bytes": sum(int(v.get("bytes", 0)) for v in scans.values()),
        },
        "task_input_records": int(tasks.get("input_records", 0)),
        "files_read": files_read,
        "rows_written": int(delta.get("rows_written", 0)),
        "task_output_records": int(tasks.get("output_records", 0)),
        "files_added": int(delta.get("files_added", 0)),
        "files_removed": int(delta.get("files_removed", 0)),
        "files_touched": files_read
        + int(delta.get("files_added", 0))
        + int(delta.get("files_removed", 0)),
        "delta_commits": int(delta.get("commits", 0)),
        "delta_commits_by_table": {
            name: int(t.get("commits", 0))
            for name, t in sorted(((raw.get("delta") or {}).get("tables") or {}).items())
        },
        "shuffle": {
            "read_records": int(tasks.get("shuffle_read_records", 0)),
            "read_bytes": int(tasks.get("shuffle_read_local_bytes", 0))
            + int(tasks.get("shuffle_read_remote_bytes", 0)),
            "write_records": int(tasks.get("shuffle_write_records", 0)),
            "write_bytes": int(tasks.get("shuffle_write_bytes", 0)),
        },
        "spill_bytes": int(tasks.get("memory_bytes_spilled", 0))
        + int(tasks.get("disk_bytes_spilled", 0)),
        "spark_jobs": int(spark.get("jobs", 0)),
        "spark_tasks": int(spark.get("tasks", 0)),
        "executor_cpu_s": round(int(tasks.get("executor_cpu_time_ns", 0)) / 1e9, 3),
        "cpu_s": raw.get("cpu_s"),
        "peak_memory_bytes": (raw.get("memory") or {}).get("peak_pss_total_bytes"),
        "memory": raw.get("memory"),
        "dagster_runs": len(raw.get("dagster_runs") or ()),
        "by_branch": by_branch,
        "loadavg_before": raw.get("loadavg_before"),
        "loadavg_after": raw.get("loadavg_after"),
    }
