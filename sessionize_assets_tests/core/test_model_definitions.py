"""What shapes a session model, and the sentence a changed setting stops a run with."""

from __future__ import annotations

import datetime as dt

from sessionize_assets.core import model_definitions
from sessionize_assets.core.model_definitions import (
    changed_settings,
    definition,
    encode,
    refusal,
)
from sessionize_assets.settings import Settings


def test_a_definition_holds_what_shapes_the_rows_and_nothing_that_only_limits_a_run():
    values = definition(Settings(start_date=dt.date(2024, 3, 1)))
    assert values["max_session_days"] == 3 and values["start_date"] == "2024-03-01"
    assert values["session_identifier"] == ["domain_sessionid"]
    for limit in ("backfill_limit_days", "lookback_window_hours", "spark", "min_rows_to_process"):
        assert limit not in values
    assert "session_gap_minutes" not in values  # id mode does not read it
    assert "session_gap_minutes" in definition(Settings(session_mode="gap"))


def test_limits_change_nothing_and_shaping_settings_are_named_with_both_values():
    built = encode(definition(Settings()))
    assert changed_settings(built, definition(Settings(backfill_limit_days=2))) == []
    assert changed_settings(None, definition(Settings(max_session_days=9))) == []  # unrecorded
    changes = changed_settings(built, definition(Settings(max_session_days=9, days_late_allowed=1)))
    assert changes == [("max_session_days", 3, 9), ("days_late_allowed", 3, 1)]
    assert refusal("sessions", changes) == (
        "The setting max_session_days changed from 3 to 9 (and days_late_allowed) since sessions "
        "was built, and its rows would mix both definitions: rebuild it with "
        "`sessionize refresh sessions --yes`, or put the setting back."
    )


def test_a_new_mode_is_named_alone():
    built = encode(definition(Settings(session_mode="id")))
    changes = changed_settings(built, definition(Settings(session_mode="gap")))
    assert changes == [("session_mode", "id", "gap")]
    ids = changed_settings(
        built, definition(Settings(user_identifier=("user_id", "domain_userid")))
    )
    assert ids == [("user_identifier", ["domain_userid"], ["user_id", "domain_userid"])]
    assert "from [domain_userid] to [user_id, domain_userid]" in refusal("users", ids)


def test_time_based_models_refuse_a_changed_filter_and_adopt_what_was_never_recorded():
    settings = Settings()
    recorded = {
        m: model_definitions.encode(model_definitions.time_based_definition(m, settings))
        for m in model_definitions.TIME_BASED_SHAPING
    }
    limits = settings.replace(backfill_limit_days=3, min_rows_to_process=5, start_date="2024-01-01")
    assert model_definitions.time_based_verdict(recorded, limits) == (None, [])
    narrowed = settings.replace(event_names=["page_view"])
    refused, _ = model_definitions.time_based_verdict(recorded, narrowed)
    assert refused is not None and refused.startswith(
        "The setting event_names changed from [] to [page_view] since filtered_events was built"
    )
    assert "`sessionize refresh filtered_events --yes`" in refused
    # Only the models asked about are looked at; one never recorded is returned to record.
    assert model_definitions.time_based_verdict(recorded, narrowed, ["daily_aggregates"]) == (
        None,
        [],
    )
    assert model_definitions.time_based_verdict({}, narrowed) == (
        None,
        ["filtered_events", "daily_aggregates"],
    )


def test_an_attribute_definition_change_is_named_for_daily_aggregates():
    counted = Settings().replace(
        attributes=[{"name": "clicks", "aggregation": "count", "event_names": ["link_click"]}]
    )
    recorded = {
        "daily_aggregates": model_definitions.encode(
            model_definitions.time_based_definition("daily_aggregates", counted)
        )
    }
    recounted = Settings().replace(
        attributes=[{"name": "clicks", "aggregation": "count", "event_names": ["page_view"]}]
    )
    refused, _ = model_definitions.time_based_verdict(recorded, recounted, ["daily_aggregates"])
    assert (
        refused is not None
        and "The setting attributes changed from [{aggregation: count, event_names: [link_click]"
        in refused
    )
    assert "event_names: [link_click]" in refused and "event_names: [page_view]" in refused


def test_reordered_filters_and_a_changed_period_are_not_a_new_definition():
    attribute = {"name": "clicks", "aggregation": "count", "event_names": ["b", "a"]}
    before = Settings().replace(event_names=["page_view", "link_click"], attributes=[attribute])
    recorded = {
        m: model_definitions.encode(model_definitions.time_based_definition(m, before))
        for m in model_definitions.TIME_BASED_SHAPING
    }
    after = Settings().replace(
        event_names=["link_click", "page_view"],
        attributes=[{**attribute, "event_names": ["a", "b"], "period": "last_7_days"}],
    )
    assert model_definitions.time_based_verdict(recorded, after) == (None, [])
