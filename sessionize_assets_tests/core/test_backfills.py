"""Which backfill a sensor waits for, and when daily_aggregates is a keyhole repair (plain Python)."""

from __future__ import annotations

import pytest

from sessionize_assets.core.backfills import (
    Backfill,
    backfill_in_the_way,
    is_keyhole_run,
    waiting_reason,
)

CASCADE = Backfill("cascade", frozenset({"filtered_events", "days_to_process", "daily_aggregates"}))
KEYHOLE = Backfill("keyhole", frozenset({"daily_aggregates"}))


def test_a_sensor_waits_for_the_first_backfill_that_selects_what_it_requests() -> None:
    assert backfill_in_the_way([KEYHOLE, CASCADE], ["filtered_events"]) == CASCADE
    assert backfill_in_the_way([KEYHOLE, CASCADE], ["daily_aggregates"]) == KEYHOLE
    assert backfill_in_the_way([KEYHOLE], ["filtered_events", "sessions"]) is None
    assert backfill_in_the_way([], ["filtered_events"]) is None


def test_the_reason_names_the_backfill_and_the_assets_in_common() -> None:
    reason = waiting_reason(CASCADE, ["days_to_process", "filtered_events", "sessions"])
    assert reason.startswith("Backfill cascade is materializing days_to_process, filtered_events:")


@pytest.mark.parametrize(
    ("tags", "configured", "selected", "expected"),
    [
        ({}, None, None, False),  # a sensor's or the command line's run
        ({"dagster/backfill": "b"}, None, {"daily_aggregates"}, True),  # keyhole backfill
        ({"dagster/backfill": "b"}, None, None, True),  # backfill record gone: as before
        ({"dagster/backfill": "b"}, None, {"filtered_events", "daily_aggregates"}, False),
        ({"dagster/backfill": "b"}, None, {"days_to_process", "daily_aggregates"}, False),
        ({"dagster/backfill": "b", "by": "late_days_sensor"}, None, {"daily_aggregates"}, False),
        ({"dagster/backfill": "b"}, False, {"daily_aggregates"}, False),  # configured wins
        ({"dagster/backfill": "b"}, True, {"filtered_events", "daily_aggregates"}, True),
        ({}, True, None, True),
    ],
)
def test_keyhole_only_for_a_backfill_without_the_load_days(
    tags, configured, selected, expected
) -> None:
    assert is_keyhole_run(tags, configured, selected, "by") is expected
