"""The file statistics' columns (`core/schema.statistics_columns`): plain Python."""

from __future__ import annotations

from sessionize_assets.core.schema import STATISTICS_COLUMNS, statistics_columns
from sessionize_assets.settings import Settings


def test_statistics_name_the_key_columns_a_table_has_then_the_configured_ones() -> None:
    available = ["event_id", "page_url", *STATISTICS_COLUMNS, "my_user", "load_date", "event_date"]
    got = statistics_columns(available, ("my_user", "domain_userid", "missing"))
    assert got.split(",") == [*STATISTICS_COLUMNS, "my_user"]


def test_statistics_leave_out_partition_columns_and_columns_the_table_lacks() -> None:
    got = statistics_columns(["derived_tstamp", "load_date", "event_date", "user_id"])
    assert got == "user_id,derived_tstamp"


def test_the_settings_key_columns_are_the_user_session_and_timestamp_columns() -> None:
    settings = Settings(session_mode="gap")
    assert settings.key_columns() == ("domain_userid", "domain_sessionid", "collector_tstamp")
    custom = settings.replace(user_identifier=["user_id", "domain_userid"])
    assert custom.key_columns() == (
        "user_id",
        "domain_userid",
        "domain_sessionid",
        "collector_tstamp",
    )
