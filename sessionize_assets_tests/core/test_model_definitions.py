"""What shapes a session model, and the sentence a changed setting stops a run with."""

from __future__ import annotations

import datetime as dt

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
