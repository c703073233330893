"""What a `persist()` costs over Spark Connect, against the same query run without one.

    python -m benchmarks.persist_probe --home H [--day 2024-01-29] [--repeat 4]

On the home's running engine (`sessionize engine start`), a Delta read like `event_days`' (two
event days of `filtered_events`, grouped by user) is run alternately: persisted and then counted
twice, and counted alone. Each query carries its own literal, so no plan cached by the server
makes one look cheaper than the others. Prints one JSON object per query and writes them all to
`--out` (default `benchmarks/results/persist-probe-<UTC time>.json`). The first query pays the
session's warm-up; compare the later ones.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def probe(spark: Any, table: str, day: dt.date, repeat: int) -> list[dict[str, Any]]:
    """`repeat` pairs of (persist, count, count again) and (count alone); seconds each."""
    from pyspark.sql import functions as F

    def query(i: int) -> Any:
        since = dt.datetime(2000, 1, 1) + dt.timedelta(seconds=i)  # a literal of its own
        return (
            spark.read.format("delta")
            .load(table)
            .filter(F.col("event_date").isin(day, day + dt.timedelta(days=1)))
            .filter(F.col("derived_tstamp") > F.lit(since))
            .groupBy("domain_userid")
            .agg(F.count(F.lit(1)).alias("n"))
        )

    out: list[dict[str, Any]] = []
    for i in range(2 * repeat):
        df = query(i)
        if i % 2 == 0:
            t0 = time.perf_counter()
            df.persist()
            t1 = time.perf_counter()
            rows = df.count()
            t2 = time.perf_counter()
            df.count()
            t3 = time.perf_counter()
            df.unpersist()
            seconds = {"persist": t1 - t0, "first count": t2 - t1, "second count": t3 - t2}
            out.append({"query": i, "kind": "persisted", "rows": rows, **seconds})
        else:
            t0 = time.perf_counter()
            rows = df.count()
            out.append(
                {"query": i, "kind": "alone", "rows": rows, "count": time.perf_counter() - t0}
            )
        out[-1] = {k: round(v, 3) if isinstance(v, float) else v for k, v in out[-1].items()}
        print(json.dumps(out[-1]), flush=True)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    from pyspark.sql import SparkSession

    from sessionize_assets.resources.engine import remote_url

    parser = argparse.ArgumentParser(prog="python -m benchmarks.persist_probe", description=__doc__)
    parser.add_argument("--home", required=True, type=Path)
    parser.add_argument("--day", type=dt.date.fromisoformat, default=dt.date(2024, 1, 29))
    parser.add_argument("--repeat", type=int, default=4)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    url = remote_url(args.home.resolve())
    if url is None:
        print(
            f"error: no engine runs for {args.home}; start it with "
            f"`sessionize --home {args.home} engine start`",
            file=sys.stderr,
        )
        return 2
    spark = SparkSession.builder.remote(url).getOrCreate()
    table = str(args.home.resolve() / "warehouse" / "filtered_events")
    results = probe(spark, table, args.day, args.repeat)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    out = args.out or Path("benchmarks/results") / f"persist-probe-{stamp}.json"
    out.write_text(
        json.dumps(
            {
                "kind": "persist-probe",
                "created_at": stamp,
                "parameters": {
                    "home": str(args.home),
                    "day": args.day.isoformat(),
                    "repeat": args.repeat,
                },
                "queries": results,
            },
            indent=1,
        )
        + "\n"
    )
    print(f"written {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
