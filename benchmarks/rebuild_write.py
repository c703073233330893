"""How long the trash-and-rebuild's write of `filtered_events` takes under other writer settings:
the rows of `benchmarks.rebuild` (every load day of the home's `events` marked, the kept rows
written partitioned by event day), written to a scratch table beside the home, once per variant
and round, the variants alternated in one embedded Spark process. The home is not changed.

    python -m benchmarks.rebuild_write --home H --now T [--config F]
        [--variants base,writers,writers_no_dictionary] [--rounds 3] [--out DIR]

Each write is followed by a narrow read of the table it wrote (three columns aggregated), since
a setting that makes the write cheaper may make files larger or slower to read. The first write
of the process pays the JVM's warm-up and is reported but left out of the medians. Writes
`rebuild-write-<UTC time>.json` into `--out` (default `benchmarks/results`).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

# Session-level settings tried on the write (Parquet's `parquet.*` keys reach its writer through
# the session's Hadoop configuration). `base`: the embedded engine's defaults.
VARIANTS: dict[str, dict[str, str]] = {
    "base": {},
    # One open file per event day in each task instead of a sort of the task's rows by event day.
    "writers": {"spark.sql.maxConcurrentOutputFileWriters": "200"},
    "no_dictionary": {"parquet.enable.dictionary": "false"},
    "writers_no_dictionary": {
        "spark.sql.maxConcurrentOutputFileWriters": "200",
        "parquet.enable.dictionary": "false",
    },
    "lz4": {"spark.sql.parquet.compression.codec": "lz4_raw"},
    "parquet_v2": {"parquet.writer.version": "v2"},
    "small_splits": {"spark.sql.files.maxPartitionBytes": str(32 * 1024 * 1024)},
}


def summarize(records: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per variant: the median write and read seconds of its writes after the process's first,
    the number of those writes, and the rows, bytes and files of its last write."""
    out: dict[str, dict[str, Any]] = {}
    for variant in dict.fromkeys(r["variant"] for r in records):
        mine = [r for r in records if r["variant"] == variant]
        warm = [r for r in mine if r is not records[0]]
        out[variant] = {
            "writes": len(warm),
            "write_s_median": round(statistics.median(r["write_s"] for r in warm), 2)
            if warm
            else None,
            "read_s_median": round(statistics.median(r["read_s"] for r in warm), 2)
            if warm
            else None,
            "rows": mine[-1].get("rows"),
            "bytes": mine[-1]["bytes"],
            "files": mine[-1]["files"],
        }
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.rebuild_write", description=__doc__)
    parser.add_argument("--home", required=True)
    parser.add_argument("--config")
    parser.add_argument("--now", required=True)
    parser.add_argument("--variants", default="base,writers,writers_no_dictionary")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = parser.parse_args(argv)
    variants = args.variants.split(",")
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        parser.error(f"unknown variants {unknown}; known: {sorted(VARIANTS)}")

    from benchmarks.common import write_result
    from benchmarks.rebuild import _overwrite, kept_filtered_events
    from sessionize_assets.core.schema import EVENT_DATE
    from sessionize_assets.home import Home
    from sessionize_assets.resources.delta import delta_table, live_rows
    from sessionize_assets.resources.spark import get_spark
    from sessionize_assets.settings import load_settings, parse_now

    now = parse_now(args.now)
    home = Home(Path(args.home).resolve())
    settings = load_settings(home.root, args.config, today=now.date())
    spark = get_spark(settings.spark)
    kept = kept_filtered_events(spark, home.table("events"), settings)
    scratch = home.root / "rebuild-write-scratch"
    records: list[dict[str, Any]] = []
    try:
        for round_ in range(args.rounds):
            for variant in variants:
                conf = VARIANTS[variant]
                for key, value in conf.items():
                    spark.conf.set(key, value)
                shutil.rmtree(scratch, ignore_errors=True)
                started = time.perf_counter()
                try:
                    _overwrite(kept, str(scratch), EVENT_DATE)
                finally:
                    for key in conf:
                        spark.conf.unset(key)
                write_s = time.perf_counter() - started
                files = list(scratch.rglob("*.parquet"))
                rows = live_rows(delta_table(str(scratch)))  # from its Delta log: no second pass
                started = time.perf_counter()
                spark.read.format("delta").load(str(scratch)).selectExpr(
                    "count(distinct domain_userid)", "max(derived_tstamp)", "sum(length(page_url))"
                ).collect()
                record = {
                    "round": round_,
                    "variant": variant,
                    "write_s": round(write_s, 2),
                    "read_s": round(time.perf_counter() - started, 2),
                    "rows": rows,
                    "bytes": sum(f.stat().st_size for f in files),
                    "files": len(files),
                }
                records.append(record)
                print(json.dumps(record), flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    result = {
        "home": str(home.root),
        "variants": {v: VARIANTS[v] for v in variants},
        "records": records,
        "summary": summarize(records),
    }
    write_result(args.out, "rebuild-write", result)
    print(json.dumps(result["summary"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
