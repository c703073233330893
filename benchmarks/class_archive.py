"""The JVM class archive's effect, alternated: Spark's start and first Delta statements, and the
whole demo, with the archive (`sessionize_assets/class_archive.py`) and without it
(`SESSIONIZE_CLASS_ARCHIVE=off`).

    python -m benchmarks.class_archive [--start-pairs 3] [--demo-pairs 2] [--out DIR]

Each measurement is a process of its own, as a command's would be. `start`: a process starts the
embedded Spark (`resources/spark.get_spark`, the default settings), writes a 100-row Delta table
and reads it back grouped; the seconds of each step. `demo`: `sessionize --home TMP demo` (a
fresh home each time), its wall time. The pairs alternate which side goes first. Writes
`class-archive-<UTC time>.json` into `--out` (default `benchmarks/results`). Set-up must have
built the archive (`python -m sessionize_assets.class_archive`).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from sessionize_assets import class_archive

_START = """
import json, sys, time
started = time.perf_counter()
from sessionize_assets.resources.spark import get_spark
spark = get_spark({})
ready = time.perf_counter()
spark.range(100).selectExpr("id", "id % 7 AS k").write.format("delta").save(sys.argv[1])
written = time.perf_counter()
spark.read.format("delta").load(sys.argv[1]).groupBy("k").count().collect()
read = time.perf_counter()
print(json.dumps({"start_s": ready - started, "first_write_s": written - ready,
                  "first_read_s": read - written, "total_s": read - started}))
"""


def _env(archive: bool) -> dict[str, str]:
    env = dict(os.environ)
    env.pop(class_archive.BUILD_ENV, None)
    if archive:
        env.pop(class_archive.SWITCH_ENV, None)
    else:
        env[class_archive.SWITCH_ENV] = "off"
    return env


def measure_start(archive: bool, work: Path) -> dict[str, float]:
    table = tempfile.mkdtemp(dir=work) + "/t"
    done = subprocess.run(
        [sys.executable, "-c", _START, table],
        env=_env(archive),
        capture_output=True,
        text=True,
        check=True,
    )
    return {k: round(v, 2) for k, v in json.loads(done.stdout.strip().splitlines()[-1]).items()}


def measure_demo(archive: bool, work: Path) -> dict[str, float | bool]:
    home = tempfile.mkdtemp(dir=work)
    sessionize = Path(sys.executable).with_name("sessionize")
    started = time.perf_counter()
    done = subprocess.run(
        [str(sessionize), "--home", home, "demo"],
        env=_env(archive),
        capture_output=True,
        text=True,
        check=False,
    )
    wall = time.perf_counter() - started
    return {"wall_s": round(wall, 1), "verify_ok": "verify: OK" in done.stdout}


def _alternated(pairs: int, measure, work: Path) -> dict[str, list]:  # noqa: ANN001
    out: dict[str, list] = {"with_archive": [], "without_archive": []}
    for pair in range(pairs):
        order = (True, False) if pair % 2 else (False, True)
        for archive in order:
            key = "with_archive" if archive else "without_archive"
            out[key].append(measure(archive, work))
            print(key, out[key][-1], flush=True)
    return out


def _medians(runs: list[dict]) -> dict[str, float]:
    keys = [k for k, v in runs[0].items() if isinstance(v, float)] if runs else []
    return {k: round(statistics.median(r[k] for r in runs), 2) for k in keys}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.class_archive", description=__doc__)
    parser.add_argument("--start-pairs", type=int, default=3)
    parser.add_argument("--demo-pairs", type=int, default=2)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = parser.parse_args(argv)
    archive = class_archive.archive_path()
    if archive is None or not archive.is_file():
        print(f"no class archive at {archive}: run `python -m sessionize_assets.class_archive`")
        return 1
    result: dict = {
        "created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "archive": str(archive),
        "archive_bytes": archive.stat().st_size,
        "cpus": os.cpu_count(),
    }
    with tempfile.TemporaryDirectory(prefix="class-archive-bench-") as tmp:
        work = Path(tmp)
        for name, pairs, measure in (
            ("start", args.start_pairs, measure_start),
            ("demo", args.demo_pairs, measure_demo),
        ):
            if pairs <= 0:
                continue
            runs = _alternated(pairs, measure, work)
            result[name] = {
                **runs,
                "median_with": _medians(runs["with_archive"]),
                "median_without": _medians(runs["without_archive"]),
            }
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    path = Path(args.out) / f"class-archive-{stamp}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
