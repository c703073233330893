"""Helpers for the session-branch tests: tiny filtered_events tables written with Spark (CDF on,
one load day rewritten with replaceWhere), a home with settings, and runs of the session models."""

from __future__ import annotations

import datetime as dt
import hashlib
import itertools
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from sessionize_assets.core import sessionize as core
from sessionize_assets.core.run_history import RUN_ITEM
from sessionize_assets.home import Home
from sessionize_assets.resources.lake import LakeResource
from sessionize_assets.resources.processing_manifest import ProcessingManifest
from sessionize_assets.resources.spark_resource import SparkDeltaResource
from sessionize_assets.resources.tables import FILTERED_EVENTS, PROCESSING_MANIFEST
from sessionize_assets.sessions.assets import build_assets
from sessionize_assets.sessions.outcome import SessionRunOutcome
from sessionize_assets.sessions.run import run_session_models
from sessionize_assets.settings import Settings, from_mapping, to_mapping

FILTERED_EVENTS_SCHEMA = (
    "event_id string, app_id string, platform string, event_name string, domain_userid string, "
    "user_id string, network_userid string, domain_sessionid string, page_url string, "
    "page_referrer string, collector_tstamp timestamp, dvce_created_tstamp timestamp, "
    "dvce_sent_tstamp timestamp, derived_tstamp timestamp, load_tstamp timestamp, _row_hash string, "
    "event_date date, load_date date"
)
COLUMNS = [part.strip().split(" ")[0] for part in FILTERED_EVENTS_SCHEMA.split(",")]

# Prepared events (core.sessionize.PREPARED_COLUMNS) with a gap-mode PART, as Spark types them.
PREPARED_WITH_PART = T.StructType(
    [
        T.StructField("event_id", T.StringType()),
        T.StructField("event_name", T.StringType()),
        T.StructField("page_url", T.StringType()),
        T.StructField("derived_tstamp", T.TimestampType()),
        T.StructField("dvce_created_tstamp", T.TimestampType()),
        T.StructField(core.SESSION_KEY, T.StringType()),
        T.StructField(core.USER_KEY, T.StringType()),
        T.StructField(core.SESSION_TS, T.TimestampType()),
        T.StructField(core.SENT_LATE, T.BooleanType()),
        T.StructField(core.PART, T.LongType()),
    ]
)
_ids = itertools.count(1)


def utc(text: str) -> dt.datetime:
    """An aware UTC datetime from ISO text."""
    value = dt.datetime.fromisoformat(text)
    return value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value.astimezone(dt.UTC)


def event(
    derived: str | dt.datetime,
    user: str | None = "u1",
    session: str | None = None,
    *,
    collector: str | dt.datetime | None = None,
    loaded: str | dt.datetime | None = None,
    event_name: str = "page_view",
    event_id: str | None = None,
    page_url: str | None = None,
    sent_late_days: float = 0.0,
) -> dict[str, Any]:
    """One filtered_events row. `collector` defaults to `derived`, `loaded` to `collector`."""
    derived_t = utc(derived) if isinstance(derived, str) else derived
    collector_t = (utc(collector) if isinstance(collector, str) else collector) or derived_t
    loaded_t = (utc(loaded) if isinstance(loaded, str) else loaded) or collector_t
    eid = event_id or f"e{next(_ids):06d}"
    created = derived_t
    return {
        "event_id": eid,
        "app_id": "site",
        "platform": "web",
        "event_name": event_name,
        "domain_userid": user,
        "user_id": None,
        "network_userid": None,
        "domain_sessionid": session,
        "page_url": page_url or f"https://example.com/{eid}",
        "page_referrer": None,
        "collector_tstamp": collector_t,
        "dvce_created_tstamp": created,
        "dvce_sent_tstamp": created + dt.timedelta(days=sent_late_days, seconds=1),
        "derived_tstamp": derived_t,
        "load_tstamp": loaded_t,
        "_row_hash": hashlib.sha256(f"{eid}|{derived_t}|{user}|{session}".encode()).hexdigest(),
        "event_date": derived_t.date(),
        "load_date": loaded_t.date(),
    }


def events_frame(spark: SparkSession, rows: Iterable[Mapping[str, Any]]) -> DataFrame:
    return spark.createDataFrame(
        [tuple(r[c] for c in COLUMNS) for r in rows], FILTERED_EVENTS_SCHEMA
    )


def write_load_day(
    spark: SparkSession, home: Path, load_day: dt.date, rows: Iterable[Mapping[str, Any]]
) -> None:
    """(Re)write one load day of filtered_events with replaceWhere, as the time-based branch does."""
    rows = list(rows)
    assert all(r["load_date"] == load_day for r in rows), "rows must belong to the load day"
    write_load_days(spark, home, {load_day: rows})


def write_load_days(
    spark: SparkSession, home: Path, days: Mapping[dt.date, Iterable[Mapping[str, Any]]]
) -> None:
    """(Re)write several load days in one commit (replaceWhere on their load_date values)."""
    path = Home(home).table(FILTERED_EVENTS)
    rows = [r for day_rows in days.values() for r in day_rows]
    df = events_frame(spark, rows)
    from delta.tables import DeltaTable

    if not DeltaTable.isDeltaTable(spark, path):
        df.limit(0).write.format("delta").partitionBy("load_date").option(
            "delta.enableChangeDataFeed", "true"
        ).save(path)
    keys = ", ".join(f"DATE'{d.isoformat()}'" for d in sorted(days))
    df.coalesce(1).write.format("delta").mode("overwrite").option(
        "replaceWhere", f"load_date IN ({keys})"
    ).save(path)


def delete_events(spark: SparkSession, home: Path, condition: str) -> None:
    """Delete filtered_events rows (e.g. one user's events)."""
    from delta.tables import DeltaTable

    DeltaTable.forPath(spark, Home(home).table(FILTERED_EVENTS)).delete(condition)


def write_settings(home: Path, settings: Settings) -> Path:
    """Put the settings in the home's sessionize.yaml (how the CLI and Dagster find them)."""
    mapping = to_mapping(settings)
    mapping["start_date"] = settings.start_date.isoformat()
    path = home / "sessionize.yaml"
    path.write_text(yaml.safe_dump(mapping))
    return path


def make_settings(**values: Any) -> Settings:
    return from_mapping(values, today=dt.date(2100, 1, 1))


def run(
    spark: SparkSession, home: Path, settings: Settings, now: str | dt.datetime
) -> SessionRunOutcome:
    """One run of the session models (the function the asset calls)."""
    now_t = utc(now) if isinstance(now, str) else now
    return run_session_models(spark, Home(home).table, settings, now_t)


def run_locked(
    spark: SparkSession, home: Path, settings: Settings, now: str | dt.datetime
) -> SessionRunOutcome:
    """One run of the session models inside the processing-manifest lock the asset takes (item
    `session_models`), its record filled by the run: what `verify` replays in id mode."""
    now_t = utc(now) if isinstance(now, str) else now
    manifest = ProcessingManifest(spark, Home(home).table(PROCESSING_MANIFEST))
    with manifest.processing(RUN_ITEM, "tests", f"test-run-{next(_ids)}") as record:
        return run_session_models(spark, Home(home).table, settings, now_t, record=record)


def run_until_caught_up(
    spark: SparkSession,
    home: Path,
    settings: Settings,
    now: str | dt.datetime,
    max_runs: int = 50,
    locked: bool = False,
) -> list[SessionRunOutcome]:
    """Runs until a run's window reached now with every model in it, or until a run moved nothing
    (no data in the window: nothing newer is waiting, or a gap longer than backfill_limit_days)."""
    now_t = utc(now) if isinstance(now, str) else now
    runs = []
    for _ in range(max_runs):
        outcome = (run_locked if locked else run)(spark, home, settings, now_t)
        runs.append(outcome)
        all_ran = all(o.ran or o.no_data for o in outcome.models.values())
        if (outcome.limits.reaches(now_t) and all_ran) or not outcome.moved:
            return runs
    raise AssertionError(f"not caught up after {max_runs} runs")


def materialize(home: Path, settings: Settings, now: str, instance=None):
    """Materialize the session_models multi-asset through Dagster, as the UI or the CLI would."""
    import dagster

    config = write_settings(home, settings)
    lake = LakeResource(home=str(home), config_file=str(config), now=now)
    return dagster.materialize(
        build_assets(settings),
        instance=instance or dagster.DagsterInstance.ephemeral(),
        resources={"lake": lake, "spark": SparkDeltaResource()},
    )


def table(spark: SparkSession, home: Path, name: str) -> DataFrame:
    return spark.read.format("delta").load(Home(home).table(name))


def rows_of(df: DataFrame, *columns: str, order: tuple[str, ...] | None = None) -> list[tuple]:
    """Rows as tuples (timestamps as aware UTC datetimes), sorted."""
    selected = df.select(
        *[
            F.unix_micros(c).alias(c) if dict(df.dtypes)[c] == "timestamp" else F.col(c)
            for c in columns
        ]
    )
    kinds = dict(df.dtypes)
    out = []
    for r in selected.collect():
        out.append(
            tuple(
                (dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(microseconds=r[c]))
                if kinds[c] == "timestamp" and r[c] is not None
                else r[c]
                for c in columns
            )
        )
    return (
        sorted(out, key=lambda t: tuple((x is None, str(x)) for x in t)) if order is None else out
    )
