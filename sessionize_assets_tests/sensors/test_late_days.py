"""The late-days sensor against a real Dagster instance and real (delta-rs written) state tables."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pyarrow as pa
import pytest
from dagster import DagsterInstance, SensorResult, build_sensor_context
from deltalake import write_deltalake

from sessionize_assets.resources.delta import replace_small, upsert_small
from sessionize_assets.resources.lake import LakeResource
from sessionize_assets.sensors.late_days import build_sensors, plan_late_day_requests
from sessionize_assets.settings import from_mapping
from sessionize_assets.time_based.tables import DECISIONS_SCHEMA, HORIZONS_SCHEMA, TimeBasedTables

UTC = dt.UTC
SETTINGS = from_mapping({"start_date": "2024-03-01"})


def day(n: int) -> dt.date:
    return dt.date(2024, 3, n)


def at(minute: int) -> dt.datetime:
    return dt.datetime(2024, 3, 20, 12, minute, tzinfo=UTC)


def test_plan_late_day_requests() -> None:
    outstanding = {day(1): at(1), day(2): at(2), day(9): at(2)}
    requests, requested, waiting = plan_late_day_requests(
        outstanding, {"2024-03-01": at(1).isoformat()}, day(8)
    )
    assert requests == [("2024-03-02", at(2).isoformat())]
    assert requested == {"2024-03-01": at(1).isoformat(), "2024-03-02": at(2).isoformat()}
    assert waiting == ["2024-03-09"]  # decided for a day that is not a partition yet
    # A newer decision for an event day asks again; finished days leave the cursor.
    requests, requested, _ = plan_late_day_requests({day(1): at(5)}, requested, day(8))
    assert requests == [("2024-03-01", at(5).isoformat())] and requested == {
        "2024-03-01": at(5).isoformat()
    }


def decide(
    tables: TimeBasedTables, load_day: dt.date, decided_at: dt.datetime, decisions: dict
) -> None:
    """Write days_to_process(load_day) as the asset would (decisions: event day -> decision)."""
    rows = [
        {
            "load_date": load_day,
            "event_date": event_day,
            "rows": 3,
            "is_late": event_day < load_day,
            "horizon_before": None,
            "pending": 3,
            "decision": decision,
            "reason": "test",
            "decided_at": decided_at,
            "filtered_materialization_id": f"m-{load_day}",
            "max_load_tstamp": None,
        }
        for event_day, decision in decisions.items()
    ]
    replace_small(
        tables.days_to_process, rows, DECISIONS_SCHEMA, "load_date", [load_day], ["load_date"]
    )


def aggregated(
    tables: TimeBasedTables, event_day: dt.date, horizon: dt.date, decided_through: dt.datetime
) -> None:
    """Record a materialization of daily_aggregates(event_day) as the asset would."""
    row = {
        "event_date": event_day,
        "horizon_load_date": horizon,
        "rows_aggregated": 3,
        "decided_through": decided_through,
        "aggregated_at": decided_through,
        "all_loaded_rows": False,
    }
    upsert_small(tables.horizons, [row], HORIZONS_SCHEMA, "event_date")


@pytest.fixture
def setup(tmp_path: Path):
    lake = LakeResource(home=str(tmp_path / "home"), now="2024-03-20T12:00:00+00:00")
    (tmp_path / "home").mkdir()
    (tmp_path / "dagster").mkdir()
    instance = DagsterInstance.local_temp(str(tmp_path / "dagster"))
    (sensor,) = build_sensors(SETTINGS)
    yield lake, TimeBasedTables.at(lake.table), instance, sensor
    instance.dispose()


def tick(sensor, instance, lake, cursor):
    context = build_sensor_context(instance=instance, cursor=cursor, resources={"lake": lake})
    result = sensor(context)
    assert isinstance(result, SensorResult)
    requests = [
        (r.partition_key, tuple(k.to_user_string() for k in r.asset_selection))
        for r in (result.run_requests or [])
    ]
    return requests, result.cursor, result


def test_requests_each_decided_partition_once_across_ticks_and_restarts(setup) -> None:
    lake, tables, instance, sensor = setup
    requests, cursor, result = tick(sensor, instance, lake, None)
    assert requests == [] and result.skip_reason is not None  # nothing decided yet

    # Two load days finish between ticks: every event day they decided is requested once.
    decide(tables, day(2), at(1), {day(1): "skip", day(2): "process"})
    decide(tables, day(3), at(2), {day(1): "process", day(3): "process", day(2): "process"})
    requests, cursor, result = tick(sensor, instance, lake, cursor)
    assert requests == [
        ("2024-03-01", ("daily_aggregates",)),
        ("2024-03-02", ("daily_aggregates",)),
        ("2024-03-03", ("daily_aggregates",)),
    ]
    keys = [r.run_key for r in result.run_requests]
    assert len(set(keys)) == 3 and all(k.startswith("daily_aggregates:2024-03-0") for k in keys)
    assert all(r.tags["sessionize/requested_by"] == "late_days_sensor" for r in result.run_requests)

    # The runs have not finished: the next tick, and a tick after a restart with the stored
    # cursor, request nothing again.
    assert tick(sensor, instance, lake, cursor)[0] == []
    assert tick(sensor, instance, lake, json.loads(json.dumps(cursor)))[0] == []

    # Event days 03-01 and 03-02 are aggregated; then load day 03-04 decides 03-02 again.
    aggregated(tables, day(1), day(3), at(2))
    aggregated(tables, day(2), day(3), at(2))
    decide(tables, day(4), at(3), {day(2): "process", day(4): "skip"})
    requests, cursor, _ = tick(sensor, instance, lake, cursor)
    assert requests == [("2024-03-02", ("daily_aggregates",))]  # 03-03 is still in flight
    assert set(json.loads(cursor)["requested"]) == {"2024-03-02", "2024-03-03"}

    # A lost cursor (or a new sensor) derives the work from the lake: only what is not done.
    requests, _, _ = tick(sensor, instance, lake, None)
    assert requests == [
        ("2024-03-02", ("daily_aggregates",)),
        ("2024-03-03", ("daily_aggregates",)),
    ]


def test_requests_attributes_when_the_aggregates_are_done(setup) -> None:
    lake, tables, instance, sensor = setup
    decide(tables, day(1), at(1), {day(1): "process"})
    requests, cursor, _ = tick(sensor, instance, lake, None)
    assert requests == [("2024-03-01", ("daily_aggregates",))]
    # daily_aggregates(03-01) ran: a daily_aggregates table exists and its record is current.
    write_deltalake(
        tables.daily_aggregates, pa.table({"event_date": [day(1)], "total_events": [1]})
    )
    aggregated(tables, day(1), day(1), at(1))
    requests, cursor, result = tick(sensor, instance, lake, cursor)
    assert requests == [(None, ("attributes", "daily_aggregation_manifest"))]
    assert result.run_requests[0].run_key.startswith("attributes:0:2024-03-20")
    assert tick(sensor, instance, lake, cursor)[0] == []  # requested once
