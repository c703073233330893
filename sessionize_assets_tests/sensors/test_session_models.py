"""The session-models sensor on a real ephemeral instance and real Delta tables: nothing to do
before filtered_events exists, a request when something is new, a skip for the same situation
(same run key) and a skip once the models are caught up."""

from __future__ import annotations

import datetime as dt

from dagster import DagsterInstance, SensorResult, build_sensor_context

from sessionize_assets.commands.maintenance import maintain_home
from sessionize_assets.core.maintenance import DELTA_MINIMUM_HOURS
from sessionize_assets.home import Home
from sessionize_assets.jobs import SESSIONS_LANE
from sessionize_assets.resources.delta import delta_version
from sessionize_assets.resources.lake import LakeResource
from sessionize_assets.sensors.session_models import build_sensors
from sessionize_assets_tests.sessions.support import (
    event,
    make_settings,
    run_until_caught_up,
    write_load_day,
    write_settings,
)

DAY0 = dt.date(2021, 1, 1)
NOW = "2021-01-03T00:00:00"


def day_rows(day: dt.date) -> list[dict]:
    rows = []
    for u in range(2):
        for minute in (0, 10, 20):
            when = dt.datetime.combine(day, dt.time(9, minute + u), tzinfo=dt.UTC)
            rows.append(
                event(when, f"user{u}", f"user{u}-{day}", loaded=when + dt.timedelta(minutes=1))
            )
    return rows


def tick(sensor, instance, lake, cursor: str | None) -> SensorResult:
    result = sensor(
        build_sensor_context(instance=instance, cursor=cursor, resources={"lake": lake})
    )
    assert isinstance(result, SensorResult)
    return result


def test_session_models_sensor(spark, home):
    settings = make_settings(start_date=DAY0.isoformat(), backfill_limit_days=5)
    lake = LakeResource(home=str(home), config_file=str(write_settings(home, settings)), now=NOW)
    (sensor,) = build_sensors(settings)
    instance = DagsterInstance.ephemeral()

    # no filtered_events yet: nothing to run
    first = tick(sensor, instance, lake, None)
    assert not first.run_requests
    assert first.skip_reason.skip_message == "filtered_events does not exist yet."

    # new data: one request, keyed on (version, manifest), in the sessions lane
    write_load_day(spark, home, DAY0, day_rows(DAY0))
    second = tick(sensor, instance, lake, None)
    (request,) = second.run_requests
    assert request.run_key == second.cursor and request.run_key.startswith("session_models:v1:")
    assert request.tags == dict(SESSIONS_LANE)

    # the same situation again (same key): skipped, cursor kept
    again = tick(sensor, instance, lake, second.cursor)
    assert not again.run_requests and again.cursor == second.cursor
    assert (
        again.skip_reason.skip_message == "Nothing new for the session models (filtered_events v1)."
    )

    # caught up (every model consumed v1 -- v0 created the table -- and processed past its
    # newest row): skipped whatever the cursor, although the manifest, and so the key, changed
    run_until_caught_up(spark, home, settings, NOW)
    caught = tick(sensor, instance, lake, second.cursor)
    assert not caught.run_requests and caught.cursor == second.cursor
    assert caught.skip_reason.skip_message.startswith(
        "Nothing new for the session models: each consumed filtered_events v1"
    )

    # `maintain` changes no row; nor do VACUUM's START and END commits on filtered_events (run
    # here directly: maintain skips a VACUUM that would find nothing old enough to delete): still
    # nothing new, no run of the session models for an empty feed
    maintain_home(Home(home), lambda: spark, vacuum_hours=DELTA_MINIMUM_HOURS)
    spark.sql(
        f"VACUUM delta.`{lake.table('filtered_events')}` RETAIN {DELTA_MINIMUM_HOURS:g} HOURS"
    ).collect()
    assert delta_version(lake.table("filtered_events")) > 1
    maintained = tick(sensor, instance, lake, second.cursor)
    assert not maintained.run_requests
    assert maintained.skip_reason.skip_message.startswith(
        "Nothing new for the session models: each consumed filtered_events v1 (v2..v"
    )

    # a new load day: requested again, with a new key
    write_load_day(spark, home, DAY0 + dt.timedelta(days=1), day_rows(DAY0 + dt.timedelta(days=1)))
    later = tick(sensor, instance, lake, second.cursor)
    (request,) = later.run_requests
    assert request.run_key.startswith("session_models:v") and later.cursor == request.run_key
    assert request.run_key != second.cursor

    # the settings that built the models changed: skipped with the refusal, nothing requested
    changed = settings.replace(session_mode="gap")
    lake = LakeResource(home=str(home), config_file=str(write_settings(home, changed)), now=NOW)
    (sensor,) = build_sensors(changed)
    refused = tick(sensor, instance, lake, None)
    assert not refused.run_requests
    assert refused.skip_reason.skip_message.startswith(
        "The setting session_mode changed from id to gap since sessions was built"
    )
