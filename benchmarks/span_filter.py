"""What the filter of a gap-mode session read costs row by row: the same read of a home's
`filtered_events` (every column a session read takes, into Spark's noop sink) under a filter of
the read's shape, once as the plain OR of the spans and once with the named spans guarded by one
set lookup of their users (`sessions.modes.UserFilter.any_user`), alternated in one embedded
Spark process under the small-query configuration a session run of up to `SMALL_RUN_ROWS` rows
uses. The home is not changed.

    python -m benchmarks.span_filter --home H [--config F] [--users 300] [--rounds 4] [--out DIR]

The filter's terms are built by the session run's own `core/read_spans.read_terms` (at most 32
spans naming their users, at most 400 users named in all) from one range of every user over the
last three days and one-hour ranges of single users: a seeded sample of (user key, hour) pairs
of the older days. Both filters must pass the same rows (counted once each after the timed
reads; the run stops otherwise). The first read of the process pays the JVM's warm-up and is
reported but left out of the medians. Writes `span-filter-<UTC time>.json` into `--out`
(default `benchmarks/results`).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def summarize(records: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per variant: the median seconds of its reads after the process's first, how many, and the
    rows its last read counted."""
    out: dict[str, dict[str, Any]] = {}
    for variant in dict.fromkeys(r["variant"] for r in records):
        mine = [r for r in records if r["variant"] == variant]
        warm = [r["s"] for r in mine if r is not records[0]]
        out[variant] = {
            "reads": len(warm),
            "s_median": round(statistics.median(warm), 2) if warm else None,
            "rows": mine[-1]["rows"],
        }
    return out


def measure(
    spark: Any,
    table: str,
    settings: Any,
    users: int,
    rounds: int,
    recent_days: int = 3,
    seed: int = 7,
) -> list[dict[str, Any]]:
    """Read `table` `rounds` times under each filter (plain, guarded; the order alternated) into
    Spark's noop sink; one record per read, with the rows its filter passes."""
    from pyspark.sql import functions as F

    from sessionize_assets.core.clock import as_utc, to_micros
    from sessionize_assets.core.read_spans import read_terms
    from sessionize_assets.core.sessionize import shared_columns, user_key
    from sessionize_assets.resources.spark import small_query_conf
    from sessionize_assets.sessions.modes import spans_filter, user_filter

    events = spark.read.format("delta").load(table)
    last = as_utc(events.agg(F.max("derived_tstamp")).first()[0])
    recent = last - dt.timedelta(days=recent_days)
    sample = (
        events.filter(F.col("derived_tstamp") < F.lit(recent))
        .select(
            user_key(settings).alias("user"), F.date_trunc("hour", "derived_tstamp").alias("hour")
        )
        .where(F.col("user").isNotNull())
        .distinct()
        .orderBy(F.rand(seed))
        .limit(users)
        .collect()
    )
    # The read's terms as a session run builds them from its ranges: at most MAX_SPANS spans
    # naming their users, at most MAX_USERS_IN_FILTER users named in all.
    ranges: list[tuple[int, int, list[str] | None]] = [(to_micros(recent), to_micros(last), None)]
    for row in sample:
        start = as_utc(row["hour"])
        ranges.append((to_micros(start), to_micros(start + dt.timedelta(hours=1)), [row["user"]]))
    terms = read_terms(ranges)
    spans = [(lo, hi) for lo, hi, _ in terms]
    members = [named for _, _, named in terms]
    named_users = len(set().union(*(m for m in members if m)))
    named_spans = sum(m is not None for m in members)
    guarded = user_filter(settings, dict(events.dtypes))
    columns = shared_columns(settings)  # every column a session read takes

    def within(lo: dt.datetime, hi: dt.datetime) -> Any:
        return F.col("derived_tstamp").between(F.lit(lo), F.lit(hi))

    filters = {
        "plain": spans_filter(spans, within, members=members, of_users=guarded.__call__),
        "guarded": spans_filter(spans, within, members=members, of_users=guarded),
    }
    records: list[dict[str, Any]] = []
    for round_ in range(rounds):
        order = list(filters) if round_ % 2 == 0 else list(reversed(filters))
        for variant in order:
            read = spark.read.format("delta").load(table).select(*columns)
            with small_query_conf(spark, True):
                started = time.perf_counter()
                read.filter(filters[variant]).write.format("noop").mode("overwrite").save()
                seconds = time.perf_counter() - started
            records.append(
                {
                    "round": round_,
                    "variant": variant,
                    "s": round(seconds, 2),
                    "named_users": named_users,
                    "named_spans": named_spans,
                }
            )
            print(json.dumps(records[-1]), flush=True)
    with small_query_conf(spark, True):  # compiled, a filter this long fails and is interpreted
        counted = {
            variant: spark.read.format("delta").load(table).filter(condition).count()
            for variant, condition in filters.items()
        }
    if len(set(counted.values())) != 1:
        raise AssertionError(f"the filters passed different rows: {counted}")
    for record in records:
        record["rows"] = counted[record["variant"]]
    return records


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.span_filter", description=__doc__)
    parser.add_argument("--home", required=True)
    parser.add_argument("--config")
    parser.add_argument("--users", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = parser.parse_args(argv)

    from benchmarks.common import write_result
    from sessionize_assets.home import Home
    from sessionize_assets.resources.spark import get_spark
    from sessionize_assets.settings import load_settings

    home = Home(Path(args.home).resolve())
    table = home.table("filtered_events")
    if not (Path(table) / "_delta_log").is_dir():
        print(
            f"error: {args.home} has no filtered_events table (run the pipeline first)",
            file=sys.stderr,
        )
        return 2
    settings = load_settings(home.root, args.config)
    spark = get_spark(settings.spark)
    records = measure(spark, table, settings, args.users, args.rounds)
    result = {
        "home": str(home.root),
        "users": args.users,
        "records": records,
        "summary": summarize(records),
    }
    write_result(args.out, "span-filter", result)
    print(json.dumps(result["summary"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
