"""The three sensors wait while a Dagster backfill materializes what they would request (a real
ephemeral instance holding backfill records, the sensors on the `two_days` home), and resume when
it has ended."""

from __future__ import annotations

import time

import pytest
from dagster import AssetKey, DagsterInstance, SensorResult, build_sensor_context
from dagster._core.execution.backfill import BulkActionStatus, PartitionBackfill

from sessionize_assets.backfills import backfill_assets, in_progress_backfills
from sessionize_assets.definitions import build_definitions
from sessionize_assets_tests.conftest import cli_now

SENSORS = ("new_loads_sensor", "late_days_sensor", "session_models_sensor")


def _backfill(backfill_id: str, status: BulkActionStatus, *assets: str) -> PartitionBackfill:
    return PartitionBackfill(
        backfill_id=backfill_id,
        status=status,
        from_failure=False,
        tags={},
        backfill_timestamp=time.time(),
        asset_selection=[AssetKey(a) for a in assets],
    )


def _reasons(two_days, instance: DagsterInstance) -> dict[str, str]:
    defs = build_definitions(two_days[0], now=cli_now(3)[1])
    lake = defs.resources["lake"]
    out = {}
    for name in SENSORS:
        sensor = defs.resolve_sensor_def(name)
        result = sensor(build_sensor_context(instance=instance, resources={"lake": lake}))
        assert isinstance(result, SensorResult) and not result.run_requests
        out[name] = result.skip_reason.skip_message
    return out


@pytest.fixture
def instance():
    with DagsterInstance.ephemeral() as instance:
        yield instance


def test_sensors_wait_for_a_backfill_of_what_they_request_then_resume(two_days, instance):
    caught_up = _reasons(two_days, instance)
    assert not any("Backfill" in r for r in caught_up.values()), caught_up

    # A keyhole repair of daily_aggregates: only the late-days sensor waits for it.
    instance.add_backfill(_backfill("keyhole", BulkActionStatus.REQUESTED, "daily_aggregates"))
    reasons = _reasons(two_days, instance)
    assert reasons["late_days_sensor"].startswith("Backfill keyhole is materializing")
    assert reasons["new_loads_sensor"] == caught_up["new_loads_sensor"]
    assert reasons["session_models_sensor"] == caught_up["session_models_sensor"]

    # A cascade from the load days: every sensor waits, naming it.
    cascade = ("filtered_events", "days_to_process", "daily_aggregates", "sessions")
    instance.add_backfill(_backfill("cascade", BulkActionStatus.REQUESTED, *cascade))
    reasons = _reasons(two_days, instance)
    assert reasons["new_loads_sensor"] == (
        "Backfill cascade is materializing days_to_process, filtered_events: this sensor waits "
        "until it ends, so nothing the backfill does is done twice."
    )
    assert reasons["session_models_sensor"].startswith(
        "Backfill cascade is materializing filtered_events, sessions:"
    )
    assert "Backfill" in reasons["late_days_sensor"]
    assert {b.backfill_id for b in in_progress_backfills(instance)} == {"keyhole", "cascade"}
    assert backfill_assets(instance, "cascade") == frozenset(cascade)
    assert backfill_assets(instance, "gone") is None and backfill_assets(instance, None) is None

    # Both ended: the sensors are back to their own reasons.
    for backfill_id in ("keyhole", "cascade"):
        done = instance.get_backfill(backfill_id)
        instance.update_backfill(done.with_status(BulkActionStatus.COMPLETED_SUCCESS))
    assert _reasons(two_days, instance) == caught_up
