"""The "trash and rebuild" baseline of seed 002: every derived table recomputed from the raw
`events` table from scratch, each in one pass, with the project's own core transforms (the same
rules as the incremental assets, so the tables must come out equal), and written over the tables
of the home it runs in (a copy the benchmark made for it).

    python -m benchmarks.rebuild --home H --config F --now T

A data engineer who does not keep tables incremental runs this after every load: no manifests,
no horizons, no lifecycle. The benchmark times it in its own process (Spark's start included, as
for the incremental run) after the same new load day, so the two costs compare like for like.
Only the gap and id modes' sessions and users, filtered_events, daily_aggregates and attributes
are written; bookkeeping tables are left as they are (the home is thrown away afterwards).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession


def _overwrite(df: DataFrame, path: str, partition: str | None = None) -> None:
    # Static: the whole table is replaced (the session may default to dynamic partition overwrite).
    writer = (
        df.write.format("delta")
        .mode("overwrite")
        .option("partitionOverwriteMode", "static")
        .option("overwriteSchema", "true")
    )
    if partition:
        writer = writer.partitionBy(partition)
    writer.save(path)


def kept_filtered_events(spark: SparkSession, events_path: str, settings: Any) -> DataFrame:
    """filtered_events recomputed from every load day of the `events` table at `events_path`."""
    from sessionize_assets.core import filtering

    # Nothing is cached at full width: marking reads `events`' keys once (two columns, one
    # shuffle) and its rows once for the write; the aggregates and the sessions each read the few
    # columns of `filtered_events` they use. Caching the whole tables (before session 14) spilled
    # gigabytes to disk at 6 M rows and made the rebuild slower.
    events = spark.read.format("delta").load(events_path)
    # Every load day at once: same-day copies are ranked, copies of earlier load days matched
    # within dedupe_lookback_days (filtering.mark_rows over all rows).
    marked = filtering.mark_rows(
        events,
        events,
        settings.dedupe_lookback_days,
        settings.app_ids,
        settings.event_names,
        settings.start_date,
    )
    return filtering.kept_rows(marked)


def rebuild(
    spark: SparkSession, warehouse: Path, settings: Any, now: dt.datetime
) -> dict[str, Any]:
    """Recompute every derived table from `<warehouse>/events` and overwrite it; returns the
    seconds each table took."""
    from sessionize_assets.core import aggregates as agg
    from sessionize_assets.core import attributes as attrs
    from sessionize_assets.core import sessionize as core
    from sessionize_assets.core.schema import EVENT_DATE

    def table(name: str) -> str:
        return str(warehouse / name)

    seconds: dict[str, float] = {}

    def timed(name: str, write: Any) -> None:
        started = time.perf_counter()
        write()
        seconds[name] = round(time.perf_counter() - started, 3)

    timed(
        "filtered_events",
        lambda: _overwrite(
            kept_filtered_events(spark, table("events"), settings),
            table("filtered_events"),
            EVENT_DATE,
        ),
    )
    filtered = spark.read.format("delta").load(table("filtered_events"))
    daily = agg.daily_aggregates(filtered, settings.user_identifier, settings.attributes)
    timed("daily_aggregates", lambda: _overwrite(daily, table("daily_aggregates"), EVENT_DATE))
    as_of = now.astimezone(dt.UTC).date()
    timed(
        "attributes",
        lambda: _overwrite(
            attrs.attributes(
                spark.read.format("delta").load(table("daily_aggregates")),
                as_of,
                settings.attribute_windows_days,
                settings.attributes,
            ),
            table("attributes"),
        ),
    )
    upper = now.astimezone(dt.UTC).replace(tzinfo=None)
    sessions = core.session_rows(core.compute_sessions(filtered, settings, None, upper).sessions)
    timed("sessions", lambda: _overwrite(sessions, table("sessions")))
    users = core.users_from_sessions(spark.read.format("delta").load(table("sessions")))
    timed("users", lambda: _overwrite(users, table("users")))
    return {"seconds": seconds}


def main(argv: Sequence[str] | None = None) -> int:
    from sessionize_assets.home import Home
    from sessionize_assets.resources.spark import get_spark
    from sessionize_assets.settings import load_settings, parse_now

    parser = argparse.ArgumentParser(prog="python -m benchmarks.rebuild", description=__doc__)
    parser.add_argument("--home", required=True)
    parser.add_argument("--config")
    parser.add_argument("--now", required=True)
    args = parser.parse_args(argv)
    now = parse_now(args.now)
    home = Home(Path(args.home).resolve())
    settings = load_settings(home.root, args.config, today=now.date())
    spark = get_spark(settings.spark)
    result = rebuild(spark, Path(home.table("events")).parent, settings, now)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
