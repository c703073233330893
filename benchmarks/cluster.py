"""The pipeline on a Spark standalone cluster, by configuration only, checked against local mode.

    python -m benchmarks.cluster [--workers 2] [--days 3] [--events-per-day 5000]
                                 [--out benchmarks/results]

Starts a standalone master and workers on loopback from the pip-installed PySpark
(`<pyspark>/bin/spark-class org.apache.spark.deploy.master.Master --host 127.0.0.1 ...` and
`...worker.Worker spark://127.0.0.1:P --cores 1 --memory 2g`, SPARK_HOME = the pyspark package),
runs the same measurement (load every day, then `sessionize run`) once in local mode and once with
`spark: {spark.master: spark://127.0.0.1:P}` in the settings file (the Delta jars travel through
`spark.jars` as always), checks that every table is the same, stops the cluster (always), and
writes the times as JSON (`cluster-<time>.json` in `--out`).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks import common
from benchmarks.run import DEFAULT_START, day_folders, now_after

# Columns that differ between two runs of the same data by construction (ids, wall-clock times,
# Dagster run ids): left out of the table comparison, and listed in the result.
VOLATILE_COLUMNS = frozenset(
    {
        "_load_id",
        "load_id",
        "run_id",
        "record_id",
        "previous_record_id",
        "materialization_id",
        "payload",
        "time",
        "decided_through",  # a wall-clock time
    }
)
# Wall-clock times, Dagster ids, and fingerprints of Delta data files (random file names).
VOLATILE_SUFFIXES = ("_at", "_run_id", "materialization_id", "fingerprint")
DATA_TABLES = ("events", "filtered_events", "daily_aggregates", "attributes", "sessions", "users")
SKIPPED_TABLES = frozenset({"processing_manifest", "load_log"})  # run bookkeeping: ids and times


def spark_home() -> Path:
    """The pip-installed PySpark package: its `bin/spark-class` runs the standalone daemons."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class StandaloneCluster:
    """A master and `workers` workers on 127.0.0.1, started and stopped by this process."""

    workdir: Path
    workers: int = 2
    worker_cores: int = 1
    worker_memory: str = "2g"
    port: int = field(default_factory=free_port)
    ui_port: int = field(default_factory=free_port)
    processes: list[subprocess.Popen] = field(default_factory=list)
    started_s: float | None = None

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def _env(self) -> dict[str, str]:
        env = os.environ.copy()
        home = spark_home()
        env |= {
            "SPARK_HOME": str(home),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_LOG_DIR": str(self.workdir / "logs"),
            "SPARK_WORKER_DIR": str(self.workdir / "work"),
            "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
            "PYSPARK_PYTHON": sys.executable,
        }
        return env

    def _spawn(self, name: str, args: Sequence[str]) -> subprocess.Popen:
        log = (self.workdir / "logs" / f"{name}.log").open("w")
        command = [str(spark_home() / "bin" / "spark-class"), *args]
        process = subprocess.Popen(
            command,
            env=self._env(),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: stopped as one, by its id
        )
        self.processes.append(process)
        return process

    def status(self) -> dict[str, Any] | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=5) as r:
                return json.loads(r.read().decode())
        except (OSError, ValueError):
            return None

    def start(self, timeout_s: float = 180.0) -> None:
        """Start the master, then the workers; wait until every worker is ALIVE."""
        for folder in ("logs", "work"):
            (self.workdir / folder).mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        master = "org.apache.spark.deploy.master.Master"
        self._spawn(
            "master",
            [
                master,
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--webui-port",
                str(self.ui_port),
            ],
        )
        deadline = time.monotonic() + timeout_s
        while self.status() is None:
            self._check_alive()
            if time.monotonic() > deadline:
                raise RuntimeError("the Spark master did not start in time")
            time.sleep(1)
        for i in range(self.workers):
            self._spawn(
                f"worker-{i}",
                [
                    "org.apache.spark.deploy.worker.Worker",
                    self.url,
                    "--host",
                    "127.0.0.1",
                    "--cores",
                    str(self.worker_cores),
                    "--memory",
                    self.worker_memory,
                    "--webui-port",
                    str(free_port()),
                    "--work-dir",
                    str(self.workdir / "work"),
                ],
            )
        while True:
            self._check_alive()
            status = self.status() or {}
            if int(status.get("aliveworkers", 0)) >= self.workers:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"only {status.get('aliveworkers', 0)} worker(s) registered in time"
                )
            time.sleep(1)
        self.started_s = round(time.perf_counter() - started, 3)

    def _check_alive(self) -> None:
        for process in self.processes:
            if process.poll() is not None:
                raise RuntimeError(
                    f"a Spark daemon exited with {process.returncode}; see {self.workdir / 'logs'}"
                )

    def stop(self) -> None:
        """Stop the daemons this object started (their own process groups), workers first."""
        for process in reversed(self.processes):
            if process.poll() is None:
                try:
                    os.killpg(process.pid, signal.SIGTERM)
                except ProcessLookupError:
                    continue
        for process in reversed(self.processes):
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                process.wait(timeout=10)

    @property
    def stopped(self) -> bool:
        return all(p.poll() is not None for p in self.processes)


def cluster_spark_conf(url: str, workers: int, executor_memory: str = "1g") -> dict[str, str]:
    """Settings-file `spark:` entries that point the pipeline at the cluster."""
    return {
        "spark.master": url,
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.executor.cores": "1",
        "spark.executor.memory": executor_memory,
        "spark.cores.max": str(workers),
        "spark.pyspark.python": sys.executable,
    }


def comparable_columns(names: Sequence[str]) -> list[str]:
    """The columns compared between two runs (run ids and wall-clock times left out)."""
    return [
        n
        for n in names
        if n not in VOLATILE_COLUMNS and not any(n.endswith(s) for s in VOLATILE_SUFFIXES)
    ]


def compare_warehouses(left: Path, right: Path) -> dict[str, Any]:
    """Every table of two warehouses compared as multisets of rows (delta-rs + DuckDB), with the
    columns that differ by construction left out."""
    import duckdb
    from deltalake import DeltaTable

    from benchmarks.deltastats import table_dirs

    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'").fetchall()
    names = sorted({p.name for p in table_dirs(left)} | {p.name for p in table_dirs(right)})
    out: dict[str, Any] = {}
    for name in names:
        if name in SKIPPED_TABLES:
            out[name] = {"skipped": "run bookkeeping (ids and times)"}
            continue
        try:
            a = DeltaTable(str(left / name)).to_pyarrow_table()
            b = DeltaTable(str(right / name)).to_pyarrow_table()
        except Exception as exc:  # noqa: BLE001 - a table missing on one side is a difference
            out[name] = {"equal": False, "error": str(exc)}
            continue
        columns = [c for c in comparable_columns(a.column_names) if c in b.column_names]
        ignored = sorted((set(a.column_names) | set(b.column_names)) - set(columns))
        select = ", ".join(f'CAST("{c}" AS VARCHAR) AS "{c}"' for c in columns) or "1 AS one"
        con.register("a_arrow", a)
        con.register("b_arrow", b)
        con.execute(f"CREATE OR REPLACE TEMP TABLE a AS SELECT {select} FROM a_arrow").fetchall()
        con.execute(f"CREATE OR REPLACE TEMP TABLE b AS SELECT {select} FROM b_arrow").fetchall()
        con.unregister("a_arrow")
        con.unregister("b_arrow")
        only_a = con.execute(
            "SELECT count(*) FROM (SELECT * FROM a EXCEPT ALL SELECT * FROM b)"
        ).fetchall()[0][0]
        only_b = con.execute(
            "SELECT count(*) FROM (SELECT * FROM b EXCEPT ALL SELECT * FROM a)"
        ).fetchall()[0][0]
        out[name] = {
            "local_rows": a.num_rows,
            "cluster_rows": b.num_rows,
            "only_local": only_a,
            "only_cluster": only_b,
            "ignored_columns": ignored,
            "equal": only_a == 0 and only_b == 0 and a.num_rows == b.num_rows,
        }
    con.close()
    return out


def run_cluster_benchmark(args: argparse.Namespace) -> dict[str, Any]:
    """Local mode, then the cluster, on the same data and settings; the cluster always stopped."""
    from sessionize_assets.generator import generate

    work = Path(args.work or tempfile.mkdtemp(prefix="sessionize-cluster-"))
    work.mkdir(parents=True, exist_ok=True)
    data = work / "data"
    start = args.start_date
    summary = generate(
        data,
        start_date=start,
        days=args.days,
        events_per_day=args.events_per_day,
        seed=args.seed,
        overwrite=True,
    )
    settings = common.benchmark_settings(start, args.days + 1, args.policy)
    now = now_after(start, args.days)
    steps = [
        common.load_step(now, day_folders(data, start, 0, args.days)),
        common.step("run", now, "run"),
    ]
    result: dict[str, Any] = {
        "schema_version": common.SCHEMA_VERSION,
        "kind": "sessionize-cluster-benchmark",
        "created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": common.machine_facts(),
        "parameters": {
            "days": args.days,
            "events_per_day": args.events_per_day,
            "seed": args.seed,
            "workers": args.workers,
            "worker_cores": 1,
            "worker_memory": "2g",
            "policy": args.policy,
            "settings": settings,
        },
        "data": {"total_rows": summary.total_rows, "load_days": args.days},
    }
    local = common.run_measurement(
        work, "local", work / "home-local", settings, {}, steps, data, args.timeout
    )
    result["local"] = common.summarize_measurement(local)
    cluster = StandaloneCluster(work / "cluster", workers=args.workers)
    try:
        cluster.start()
        result["cluster_start_s"] = cluster.started_s
        conf = cluster_spark_conf(cluster.url, args.workers)
        result["cluster_spark_conf"] = conf
        remote = common.run_measurement(
            work, "cluster", work / "home-cluster", settings, conf, steps, data, args.timeout
        )
        result["cluster"] = common.summarize_measurement(remote)
        status = cluster.status() or {}
        result["cluster_status_after"] = {
            k: status.get(k) for k in ("url", "aliveworkers", "cores", "memory", "completedapps")
        }
        if isinstance(result["cluster_status_after"]["completedapps"], list):
            result["cluster_status_after"]["completedapps"] = len(
                result["cluster_status_after"]["completedapps"]
            )
    except Exception as exc:  # noqa: BLE001 - reported; the cluster is stopped below
        result["cluster_error"] = f"{type(exc).__name__}: {exc}"
    finally:
        cluster.stop()
    result["cluster_stopped"] = cluster.stopped
    result["cluster_logs"] = str(cluster.workdir / "logs")
    if "cluster" in result:
        result["tables"] = compare_warehouses(
            work / "home-local" / "warehouse", work / "home-cluster" / "warehouse"
        )
    else:
        result["cluster"] = {"ok": False, "wall_s": None}
        result["tables"] = {}
    compared = [t for t in result["tables"].values() if "skipped" not in t]
    result["tables_equal"] = bool(compared) and all(t.get("equal") for t in compared)
    result["data_tables_equal"] = {
        name: (result["tables"].get(name) or {}).get("equal") for name in DATA_TABLES
    }
    local_wall, cluster_wall = result["local"]["wall_s"], result["cluster"]["wall_s"]
    both = bool(local_wall and cluster_wall)
    result["overhead"] = {
        "local_wall_s": local_wall,
        "cluster_wall_s": cluster_wall,
        "cluster_start_s": result.get("cluster_start_s"),
        "cluster_over_local": round(cluster_wall / local_wall, 3) if both else None,
        "extra_s": round(cluster_wall - local_wall, 3) if both else None,
        "local_cpu_s": result["local"].get("cpu_s"),
        "cluster_driver_cpu_s": result["cluster"].get("cpu_s"),
    }
    result["ok"] = bool(
        result["local"]["ok"] and result["cluster"]["ok"] and result["tables_equal"]
    )
    if not args.keep_work and not args.work:
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    else:
        result["workdir"] = str(work)
    return result


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.cluster", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--workers", type=int, choices=(1, 2), default=2)
    parser.add_argument("--days", type=int, default=3)
    parser.add_argument("--events-per-day", type=int, default=5000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--start-date", type=dt.date.fromisoformat, default=DEFAULT_START)
    parser.add_argument("--policy", choices=("exact", "default"), default="exact")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--work", help="work folder (default: a temporary folder, removed)")
    parser.add_argument("--keep-work", action="store_true")
    parser.add_argument("--timeout", type=float, default=None, help="seconds per measurement")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    result = run_cluster_benchmark(args)
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = result["created_at"].replace(":", "").replace("-", "").replace("+0000", "Z")
    path = args.out / f"cluster-{stamp}-{args.days}d-{args.events_per_day}.json"
    path.write_text(json.dumps(result, indent=1, sort_keys=True, default=str) + "\n")
    print(f"results: {path}")
    print(
        json.dumps(
            {"overhead": result["overhead"], "tables_equal": result["tables_equal"]}, indent=1
        )
    )
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
