"""Would a load gain from knowing its columns without asking the engine? (session 45)

    python -m benchmarks.load_round_trips --home H --config C --file F [--repeat 3] [--out DIR]

Over Spark Connect, every `DataFrame.columns` of a new plan is a round trip in which the engine
analyzes the plan. `ingest.loader.prepare_file` asks eight times for a CSV file (the reader's
columns, the canonical and typed columns, the kept rows'), and a 5,000-row file's deepest plans
took 0.3-1 s each to analyze on a slow machine. This measures whether skipping them would pay:
each round opens a new Connect session (a new plan cache on the engine) to the home's warm
engine (started when it is not running) and loads nothing, but times the load's first steps on
`--file` twice:

- `asked`: `prepare_file` as the loader runs it, then the batch's counting job (the typed rows
  persisted, counted by reason) and the fetch of the kept rows;
- `replayed`: the same, with every schema lookup after the first answered on the client from
  the answers `asked` got (what the loader would do if it carried its columns itself).

Writes `load-round-trips-<UTC time>.json` in `--out`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks import common


def one_round(url: str, settings: Any, path: Path, answers: list[Any] | None) -> dict[str, Any]:
    """Time prepare, count and fetch on a new session; `answers`: replay these schemas (all but
    the first lookup), else record into a new list returned under `answers`."""
    from pyspark import StorageLevel
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from sessionize_assets.core import validate
    from sessionize_assets.ingest.loader import file_sha256, prepare_file
    from sessionize_assets.resources.spark import fetch_arrow, small_query_conf

    spark = SparkSession.builder.remote(url).create()
    client = spark.client
    ask = client.schema
    recorded: list[Any] = []
    lookups = {"asked": 0, "answered_on_client": 0, "asked_s": 0.0}

    def schema(plan: Any) -> Any:
        index = len(recorded)
        if answers is not None and 0 < index < len(answers):
            recorded.append(answers[index])
            lookups["answered_on_client"] += 1
            return answers[index]
        started = time.perf_counter()
        answer = ask(plan)
        lookups["asked"] += 1
        lookups["asked_s"] = round(lookups["asked_s"] + time.perf_counter() - started, 3)
        recorded.append(answer)
        return answer

    client.schema = schema
    now = dt.datetime.now(dt.UTC)
    try:
        with small_query_conf(spark, True):
            started = time.perf_counter()
            prepared = prepare_file(
                spark, path, file_sha256(path), settings, now, load_tstamp_from="load_tstamp"
            )
            prepare_s = time.perf_counter() - started
            prepared.typed.persist(StorageLevel.DISK_ONLY)
            started = time.perf_counter()
            prepared.typed.groupBy(F.col(validate.REASON)).count().collect()
            count_s = time.perf_counter() - started
            started = time.perf_counter()
            kept = fetch_arrow(prepared.valid)[0].num_rows
            fetch_s = time.perf_counter() - started
            prepared.typed.unpersist()
    finally:
        spark.stop()
    return {
        "prepare_s": round(prepare_s, 3),
        "count_job_s": round(count_s, 3),
        "fetch_kept_s": round(fetch_s, 3),
        "total_s": round(prepare_s + count_s + fetch_s, 3),
        "kept_rows": kept,
        "schema_lookups": lookups,
        "answers": recorded,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.load_round_trips", description=__doc__
    )
    parser.add_argument("--home", type=Path, required=True)
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--file", type=Path, required=True, help="a CSV file of events to time")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", type=Path, default=common.REPO_ROOT / "benchmarks" / "results")
    args = parser.parse_args(argv)

    from sessionize_assets.resources import engine
    from sessionize_assets.settings import load_settings

    settings = load_settings(args.home.resolve(), args.config)
    url = engine.start(args.home, dict(settings.spark), port=0).url
    rounds = []
    for _ in range(args.repeat):
        asked = one_round(url, settings, args.file, None)
        replayed = one_round(url, settings, args.file, asked["answers"])
        rounds.append({"asked": asked, "replayed": replayed})
    for pair in rounds:
        for side in pair.values():
            side.pop("answers")
    medians = {
        side: {
            key: statistics.median(r[side][key] for r in rounds)
            for key in ("prepare_s", "count_job_s", "fetch_kept_s", "total_s")
        }
        for side in ("asked", "replayed")
    }
    result = {
        "benchmark": "load_round_trips",
        "started_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": common.machine_facts(),
        "code": common.code_version(),
        "file": str(args.file),
        "loadavg": os.getloadavg(),
        "rounds": rounds,
        "medians": medians,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    out = args.out / f"load-round-trips-{stamp}.json"
    out.write_text(json.dumps(result, indent=2, default=str))
    for side, m in medians.items():
        print(f"{side}: " + ", ".join(f"{k} {v}" for k, v in m.items()))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
