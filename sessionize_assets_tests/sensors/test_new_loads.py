"""The sensor on new loads, against a real Dagster instance and a real Delta events table."""

import datetime as dt
import json
import uuid

import pytest
from dagster import DagsterInstance, build_sensor_context
from pyspark.sql import functions as F

from sessionize_assets.home import Home
from sessionize_assets.ingest.load_days import EMPTY_FINGERPRINT
from sessionize_assets.resources.lake import LakeResource
from sessionize_assets.resources.tables import EVENTS
from sessionize_assets.sensors.new_loads import build_sensors, plan_requests
from sessionize_assets.settings import Settings


def _append_events(spark, path, day: str, n: int) -> None:
    """A commit to `events` by "another writer": canonical columns, one load day."""
    frame = spark.range(n).select(
        F.concat(
            F.lit(f"{day}-"), F.col("id").cast("string"), F.lit(f"-{uuid.uuid4().hex[:6]}")
        ).alias("event_id"),
        F.lit("web").alias("app_id"),
        F.lit("page_view").alias("event_name"),
        F.lit("u1").alias("domain_userid"),
        F.lit("s1").alias("domain_sessionid"),
        *[
            F.lit(f"{day} 10:00:00").cast("timestamp").alias(c)
            for c in (
                "collector_tstamp",
                "dvce_created_tstamp",
                "dvce_sent_tstamp",
                "derived_tstamp",
                "load_tstamp",
            )
        ],
        F.sha2(F.col("id").cast("string"), 256).alias("_row_hash"),
        F.lit(day).cast("date").alias("load_date"),
    )
    frame.write.format("delta").mode("append").option("mergeSchema", "true").partitionBy(
        "load_date"
    ).save(path)


def _consume(home, instance, day: str) -> None:
    """Materialize the load day for real (filtered_events + days_to_process)."""
    from dagster import AssetSpec, materialize

    from sessionize_assets.partitions import daily_partitions
    from sessionize_assets.resources.spark_resource import SparkDeltaResource
    from sessionize_assets.time_based.assets import build_assets as time_based_assets

    settings = Settings(start_date=dt.date(2024, 1, 1))
    lake = LakeResource(home=str(home), now="2024-03-10T00:00:00")
    result = materialize(
        [
            AssetSpec("events", partitions_def=daily_partitions(settings)),
            *time_based_assets(settings),
        ],
        selection=["filtered_events", "days_to_process"],
        partition_key=day,
        instance=instance,
        resources={"lake": lake, "spark": SparkDeltaResource()},
    )
    assert result.success


def _tick(sensor, instance, lake, cursor):
    with build_sensor_context(
        instance=instance, cursor=cursor, resources={"lake": lake}
    ) as context:
        result = sensor(context)
        return result, result.cursor


def test_plan_requests_never_repeats_and_forgets_processed_days():
    d1, d2 = dt.date(2024, 3, 1), dt.date(2024, 3, 2)
    todo, requested, _ = plan_requests({d2: "b", d1: "a"}, {})
    assert todo == [("2024-03-01", "a"), ("2024-03-02", "b")]
    todo, requested, _ = plan_requests({d1: "a", d2: "b"}, requested)
    assert todo == []
    todo, requested, _ = plan_requests({d2: "c"}, requested)  # d1 processed, d2 changed again
    assert todo == [("2024-03-02", "c")] and requested == {"2024-03-02": "c"}
    todo, _, blocked = plan_requests({d1: "a"}, {}, blocked={"2024-03-01"})
    assert todo == [] and blocked == ["2024-03-01"]


@pytest.fixture
def instance():
    with DagsterInstance.ephemeral() as inst:
        yield inst


def test_several_loads_between_ticks_no_repeats_and_restart(spark, home, instance):
    settings = Settings(start_date=dt.date(2024, 1, 1))
    lake = LakeResource(home=str(home), now="2024-03-10T00:00:00")
    events = Home(home).table(EVENTS)
    [sensor] = build_sensors(settings)

    result, cursor = _tick(sensor, instance, lake, None)
    assert not result.run_requests and result.skip_reason  # nothing loaded yet

    # Three commits (two load days) land between two ticks.
    _append_events(spark, events, "2024-03-01", 3)
    _append_events(spark, events, "2024-03-02", 2)
    _append_events(spark, events, "2024-03-01", 1)
    result, cursor = _tick(sensor, instance, lake, cursor)
    assert [r.partition_key for r in result.run_requests] == ["2024-03-01", "2024-03-02"]
    assert all(r.tags["sessionize/lane"] == "time_based" for r in result.run_requests)
    first_keys = {r.run_key for r in result.run_requests}

    # Same state: nothing is asked twice, even though the days are still unprocessed.
    result, cursor = _tick(sensor, instance, lake, cursor)
    assert not result.run_requests

    # "Restart": a new sensor definition and context resumes from the stored cursor.
    [sensor_again] = build_sensors(settings)
    saved = json.loads(cursor)
    assert set(saved["requested"]) == {"2024-03-01", "2024-03-02"}
    result, cursor = _tick(sensor_again, instance, lake, cursor)
    assert not result.run_requests

    # filtered_events consumes 03-01 (recorded in the lake); new loads land on 03-02 and 03-03.
    _consume(home, instance, "2024-03-01")
    _append_events(spark, events, "2024-03-02", 1)
    _append_events(spark, events, "2024-03-03", 4)
    result, cursor = _tick(sensor_again, instance, lake, cursor)
    assert [r.partition_key for r in result.run_requests] == ["2024-03-02", "2024-03-03"]
    assert not first_keys & {r.run_key for r in result.run_requests}

    # A lost cursor (e.g. a reset sensor) does not ask again for what the lake says is processed.
    result, _ = _tick(sensor_again, instance, lake, None)
    assert "2024-03-01" not in [r.partition_key for r in result.run_requests]
    # Load days before start_date or after today are not partitions: never requested.
    _append_events(spark, events, "2023-12-31", 1)
    _append_events(spark, events, "2024-03-12", 1)
    result, _ = _tick(sensor_again, instance, lake, None)
    assert [r.partition_key for r in result.run_requests] == ["2024-03-02", "2024-03-03"]


def test_empty_fingerprint_marks_a_day_whose_files_were_removed():
    from sessionize_assets.ingest.load_days import changed_load_days

    d = dt.date(2024, 3, 1)
    assert changed_load_days({}, {d: "abc"}) == [d]
    assert changed_load_days({}, {d: EMPTY_FINGERPRINT}) == []


def test_fail_locked_load_day_is_skipped_and_said_so(spark, home, instance):
    from sessionize_assets.resources.processing_manifest import ProcessingManifest
    from sessionize_assets.resources.tables import PROCESSING_MANIFEST

    settings = Settings(start_date=dt.date(2024, 1, 1))
    lake = LakeResource(home=str(home), now="2024-03-10T00:00:00")
    [sensor] = build_sensors(settings)
    _append_events(spark, Home(home).table(EVENTS), "2024-03-04", 2)
    _append_events(spark, Home(home).table(EVENTS), "2024-03-05", 2)
    manifest = ProcessingManifest(spark, Home(home).table(PROCESSING_MANIFEST))
    lock = manifest.lock("filtered_events/2024-03-04", "test", "run-1")
    manifest.fail(lock, "boom")
    result, cursor = _tick(sensor, instance, lake, None)
    assert [r.partition_key for r in result.run_requests] == ["2024-03-05"]
    manifest.resolve("filtered_events/2024-03-04", "fixed")
    result, _ = _tick(sensor, instance, lake, cursor)
    assert [r.partition_key for r in result.run_requests] == ["2024-03-04"]
