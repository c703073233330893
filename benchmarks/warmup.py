"""What a fresh process pays before its Delta operations run at speed (JVM warm-up).

    python -m benchmarks.warmup [--repeat 3] [--out benchmarks/results]

In one new process: the Spark session's start, then `--repeat` rounds of the same three small
Delta operations on a 3-row table in a temporary folder (an append, an insert-only MERGE like the
processing manifest's locks, a read back), each timed. The first round carries the class loading
and code generation; later rounds show the operations' own cost. Every `sessionize` command is a
new process and pays the first round once. Writes `warmup-<UTC time>.json` in `--out`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks import common


def timed(action: Callable[[], object]) -> float:
    """Seconds `action` took."""
    started = time.perf_counter()
    action()
    return round(time.perf_counter() - started, 3)


def summarize(rounds: Sequence[dict[str, float]]) -> dict[str, Any]:
    """Per operation: the first round, the median of the later ones, and the first's excess."""
    out: dict[str, Any] = {}
    for name in rounds[0] if rounds else ():
        first = rounds[0][name]
        later = sorted(r[name] for r in rounds[1:])
        median = later[len(later) // 2] if later else None
        out[name] = {
            "first_s": first,
            "later_median_s": median,
            "warm_up_s": round(first - median, 3) if median is not None else None,
        }
    return out


def measure(repeat: int) -> dict[str, Any]:
    """Start Spark and time `repeat` rounds of append, MERGE and read in this process."""
    from delta.tables import DeltaTable

    from sessionize_assets.resources.spark import get_spark

    spark_start = timed(get_spark)
    spark = get_spark()
    rounds: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="sessionize-warmup-") as folder:
        for round_number in range(repeat):
            path = str(Path(folder) / f"t{round_number}")
            timings = {
                "append": timed(lambda path=path: spark.range(3).write.format("delta").save(path)),
                "merge": timed(
                    lambda path=path: (
                        DeltaTable.forPath(spark, path)
                        .alias("t")
                        .merge(spark.range(5).alias("s"), "t.id = s.id")
                        .whenNotMatchedInsertAll()
                        .execute()
                    )
                ),
                "read": timed(lambda path=path: spark.read.format("delta").load(path).collect()),
            }
            rounds.append(timings)
    spark.stop()
    return {
        "spark_start_s": spark_start,
        "rounds": rounds,
        "operations": summarize(rounds),
        "first_round_s": round(sum(rounds[0].values()), 3) if rounds else None,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.warmup", description=__doc__)
    parser.add_argument("--repeat", type=int, default=3, help="rounds of operations (>= 2)")
    parser.add_argument("--out", type=Path, default=common.REPO_ROOT / "benchmarks" / "results")
    args = parser.parse_args(argv)
    if args.repeat < 2:
        parser.error("--repeat must be at least 2: the later rounds are the warm reference")
    load_before = os.getloadavg()
    result = {
        "benchmark": "warmup",
        "started_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": common.machine_facts(),
        "code": common.code_version(),
        "loadavg_before": load_before,
        **measure(args.repeat),
        "loadavg_after": os.getloadavg(),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    path = args.out / f"warmup-{stamp}.json"
    path.write_text(json.dumps(result, indent=2, default=str))
    ops = result["operations"]
    print(
        f"spark start {result['spark_start_s']} s; "
        + "; ".join(
            f"{name} first {o['first_s']} s, later {o['later_median_s']} s"
            for name, o in ops.items()
        )
    )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
