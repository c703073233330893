"""Where a small run's time goes: wall time, Spark jobs and SQL executions per command.

    python -m benchmarks.small_runs [--conf KEY=VALUE ...] [--commands run,run2,...]
                                    [--out benchmarks/results]

In one process (`local[2]`, the test suite's JVM options): the recovery test's 18-row history
(`sessionize_assets_tests/time_based/test_steps.py`, backfill limit 2 days) loaded into a fresh
home, then `run`, a second `run`, `backfill` of 2024-03-01..05 and `verify` (or the first of
them `--commands` names), each timed in wall seconds and the JVM's CPU seconds (steadier than
wall time on a shared machine: compare alternating runs, not one pair). Spark's status API (its
UI on port 4077, kept in memory only) gives each command's jobs and SQL executions; executions
(nested ones too, e.g. Delta's file listing inside a MERGE) are grouped by the call site PySpark
records (`toArrow at …frames.py`). `--conf` adds Spark settings to the session, to compare a
setting against the default. At this
size the fixed cost per run is everything: read the figures as "how many jobs, how much planning",
not throughput. Each command's Dagster runs are listed with their steps and seconds (from the
home's instance). Writes `small-runs-<UTC time>.json` in `--out`.
"""

from __future__ import annotations

import argparse
import collections
import datetime as dt
import json
import os
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

UI_PORT = 4077
COMMANDS = ("run", "run2", "backfill", "verify")  # in the order they run


def _get(app: str, what: str) -> list[dict[str, Any]]:
    url = f"http://127.0.0.1:{UI_PORT}/api/v1/applications/{app}/{what}"
    with urllib.request.urlopen(url) as response:
        return json.load(response)


def _seconds(start: str, end: str | None) -> float:
    parse = lambda s: dt.datetime.strptime(s[:23], "%Y-%m-%dT%H:%M:%S.%f")  # noqa: E731
    return (parse(end) - parse(start)).total_seconds() if end else 0.0


def by_call_site(jobs: list[dict], executions: list[dict]) -> list[dict[str, Any]]:
    """Per call site: SQL executions, their jobs, execution seconds and seconds inside jobs."""
    job_seconds = {j["jobId"]: _seconds(j["submissionTime"], j.get("completionTime")) for j in jobs}
    groups: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0, 0.0, 0.0])
    for e in executions:
        ids = e["successJobIds"] + e["failedJobIds"]
        if not ids or not all(i in job_seconds for i in ids):
            continue
        site = (e["description"] or "").split(" - ")[0].replace(str(Path.cwd()) + "/", "")[:90]
        g = groups[site]
        g[0] += 1
        g[1] += len(ids)
        g[2] += e["duration"] / 1000
        g[3] += sum(job_seconds[i] for i in ids)
    rows = [
        {
            "call_site": site,
            "executions": int(g[0]),
            "jobs": int(g[1]),
            "execution_seconds": round(g[2], 2),
            "job_seconds": round(g[3], 2),
        }
        for site, g in groups.items()
    ]
    return sorted(rows, key=lambda r: -r["execution_seconds"])


def dagster_runs(since: float) -> list[dict[str, Any]]:
    """The Dagster runs the command recorded in the home's instance (the command line exports
    DAGSTER_HOME), oldest first: their steps (assets and checks), each step's seconds, and the
    run's seconds from start to end."""
    from dagster import DagsterEventType, DagsterInstance, RunsFilter

    out = []
    with DagsterInstance.get() as instance:
        records = instance.get_run_records(
            RunsFilter(created_after=dt.datetime.fromtimestamp(since))
        )
        for record in sorted(records, key=lambda r: r.create_timestamp):
            run_id = record.dagster_run.run_id
            steps = instance.all_logs(run_id, of_type=DagsterEventType.STEP_START)
            ends = {
                e.step_key: e.timestamp
                for e in instance.all_logs(
                    run_id,
                    of_type={DagsterEventType.STEP_SUCCESS, DagsterEventType.STEP_FAILURE},
                )
            }
            out.append(
                {
                    "steps": [e.step_key for e in steps],
                    # Each step's seconds from its start to its success or failure.
                    "step_seconds": {
                        e.step_key: round(ends[e.step_key] - e.timestamp, 2)
                        for e in steps
                        if e.step_key in ends
                    },
                    "status": record.dagster_run.status.value,
                    "seconds": round((record.end_time or 0) - (record.start_time or 0), 1),
                }
            )
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument(
        "--commands",
        default=",".join(COMMANDS),
        help="which of run, run2, backfill, verify to time (in that order; each needs those before)",
    )
    args = parser.parse_args(argv)
    wanted = args.commands.split(",")
    unknown = sorted(set(wanted) - set(COMMANDS))
    if unknown:
        parser.error(f"unknown command(s) {', '.join(unknown)}: choose from {', '.join(COMMANDS)}")
    extra = dict(c.split("=", 1) for c in args.conf)

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from sessionize_assets.resources.spark import get_spark

    spark = get_spark(
        {
            "spark.master": "local[2]",
            "spark.sql.shuffle.partitions": "2",
            "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -XX:ReservedCodeCacheSize=256m",
            "spark.ui.enabled": "true",
            "spark.ui.port": str(UI_PORT),
            "spark.ui.retainedJobs": "100000",
            "spark.ui.retainedStages": "100000",
            "spark.sql.ui.retainedExecutions": "100000",
            **extra,
        }
    )
    from benchmarks.measure import cpu_seconds
    from sessionize_assets.cli import main as sessionize
    from sessionize_assets_tests.time_based.test_steps import ROWS, append_events, make_lake

    app = spark.sparkContext.applicationId
    home = Path(tempfile.mkdtemp()) / "home"
    append_events(spark, make_lake(home, backfill_limit_days=2), ROWS)
    now = ["--home", str(home), "--now", "2024-03-08T12:00:00"]
    commands = {
        "run": [*now, "run"],
        "run2": [*now, "run"],
        "backfill": [*now, "backfill", "--start", "2024-03-01", "--end", "2024-03-05"],
        "verify": [*now, "verify"],
    }
    commands = {name: command for name, command in commands.items() if name in wanted}
    results: dict[str, Any] = {"conf": extra, "commands": {}}
    seen_jobs, seen_sql = len(_get(app, "jobs")), len(_get(app, "sql?length=100000"))
    for name, command in commands.items():
        started, cpu, clock = time.perf_counter(), cpu_seconds(), time.time()
        code = sessionize(command)
        wall = time.perf_counter() - started
        jvm_cpu, own_cpu = (cpu_seconds()[k] - cpu[k] for k in ("jvm", "python"))
        jobs, sql = _get(app, "jobs"), _get(app, "sql?details=false&length=100000")
        new_jobs = jobs[: len(jobs) - seen_jobs]
        new_sql = sql[seen_sql:]
        seen_jobs, seen_sql = len(jobs), len(sql)
        results["commands"][name] = {
            "exit_code": code,
            "wall_seconds": round(wall, 1),
            # CPU time varies less than wall time on a shared machine: compare both.
            "jvm_cpu_seconds": round(jvm_cpu, 1),
            "python_cpu_seconds": round(own_cpu, 1),
            "jobs": len(new_jobs),
            "sql_executions": len(new_sql),
            # Top-level executions only: Delta runs nested ones inside its commands.
            "execution_seconds": round(
                sum(e["duration"] for e in new_sql if e.get("rootExecutionId", e["id"]) == e["id"])
                / 1000,
                1,
            ),
            "by_call_site": by_call_site(new_jobs, new_sql),
            # Each Dagster run's steps and seconds: where the command's wall time went.
            "dagster_runs": dagster_runs(clock),
        }
        print(
            f"{name}: exit {code}, {wall:.1f} s, JVM CPU {jvm_cpu:.1f} s, {len(new_jobs)} jobs",
            file=sys.stderr,
        )
        for run in results["commands"][name]["dagster_runs"]:
            steps = ", ".join(
                f"{step} {run['step_seconds'].get(step, '?')}" for step in run["steps"]
            )
            print(f"  {run['seconds']:6.1f} s  {steps}", file=sys.stderr)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    path = out / f"small-runs-{stamp}.json"
    path.write_text(json.dumps(results, indent=1))
    print(path)
    return 0 if all(c["exit_code"] == 0 for c in results["commands"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
