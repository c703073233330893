import datetime as dt
import re

import pytest

from sessionize_assets.errors import SettingsError
from sessionize_assets.settings import (
    Settings,
    from_mapping,
    load_settings,
    parse_day,
    parse_now,
    to_mapping,
)


def test_defaults_follow_the_spec():
    s = from_mapping({})
    assert s == Settings()
    assert (s.start_date, s.backfill_limit_days, s.lookback_window_hours) == (
        dt.date(2020, 1, 1),
        30,
        6,
    )
    assert (s.max_session_days, s.days_late_allowed, s.session_lookback_days) == (3, 3, 730)
    assert (s.session_mode, s.session_identifier, s.user_identifier) == (
        "id",
        ("domain_sessionid",),
        ("domain_userid",),
    )
    assert (s.session_timestamp, s.session_gap_minutes) == ("collector_tstamp", 30)
    assert (
        s.reprocess_days,
        s.min_rows_to_process,
        s.dedupe_lookback_days,
        s.max_clock_skew_minutes,
    ) == (5, 1000, 3, 10)
    assert (s.app_ids, s.event_names, s.attribute_windows_days, s.attributes) == (
        (),
        (),
        (7, 30),
        (),
    )


def test_good_settings_round_trip():
    raw = {
        "start_date": "2024-01-01",
        "session_mode": "gap",
        "session_identifier": ["domain_sessionid", "network_userid"],
        "app_ids": ["web"],
        "attributes": [
            {"name": "spend", "aggregation": "sum", "property": "se_value", "period": "last_7_days"}
        ],
        "column_mapping": {"messageId": "event_id"},
        "spark": {"spark.master": "local[2]", "spark.driver.memory": "1g"},
    }
    s = from_mapping(raw)
    assert s.session_identifier == ("domain_sessionid", "network_userid")
    assert s.attributes[0].period_days == 7
    assert from_mapping(to_mapping(s)) == s


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        ({"backfill_limit_days": 0}, "backfill_limit_days"),
        ({"backfill_limit_days": "30"}, "backfill_limit_days"),
        ({"lookback_window_hours": -1}, "lookback_window_hours"),
        ({"reprocess_days": -2}, "reprocess_days"),
        ({"start_date": "2999-01-01"}, "start_date"),
        ({"start_date": "yesterday"}, "start_date"),
        ({"session_mode": "clock"}, "session_mode"),
        ({"no_such_setting": 1}, "no_such_setting"),
        ({"attribute_windows_days": [7, 0]}, "attribute_windows_days"),
        (
            {"attributes": [{"name": "x", "aggregation": "median", "property": "p"}]},
            "attributes[0].aggregation",
        ),
        ({"attributes": [{"name": "x", "aggregation": "sum"}]}, "attributes[0].property"),
        (
            {"attributes": [{"name": "x", "aggregation": "count", "period": "last_0_days"}]},
            "attributes[0].period",
        ),
        ({"spark": ["spark.master"]}, "spark"),
    ],
)
def test_bad_settings_name_the_key(raw, key):
    with pytest.raises(SettingsError) as info:
        from_mapping(raw, today=dt.date(2026, 1, 1))
    assert f"`{key}`" in str(info.value)
    assert "\n" not in str(info.value)


def test_resolution_order(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.delenv("SESSIONIZE_CONFIG", raising=False)
    assert load_settings(home) == Settings()
    (home / "sessionize.yaml").write_text("backfill_limit_days: 3\n")
    assert load_settings(home).backfill_limit_days == 3
    env_file = tmp_path / "env.yaml"
    env_file.write_text("backfill_limit_days: 4\n")
    monkeypatch.setenv("SESSIONIZE_CONFIG", str(env_file))
    assert load_settings(home).backfill_limit_days == 4
    flag_file = tmp_path / "flag.yaml"
    flag_file.write_text("backfill_limit_days: 5\n")
    assert load_settings(home, flag_file).backfill_limit_days == 5


def test_bad_file_is_one_sentence(tmp_path, monkeypatch):
    monkeypatch.delenv("SESSIONIZE_CONFIG", raising=False)
    bad = tmp_path / "bad.yaml"
    bad.write_text("min_rows_to_process: lots\n")
    with pytest.raises(SettingsError, match="`min_rows_to_process`.*bad.yaml"):
        load_settings(tmp_path, bad)
    with pytest.raises(SettingsError, match="does not exist"):
        load_settings(tmp_path, tmp_path / "missing.yaml")


def test_now_is_injectable_and_utc():
    assert parse_now("2024-03-01T12:00:00") == dt.datetime(2024, 3, 1, 12, tzinfo=dt.UTC)
    assert parse_now("2024-03-01T14:00:00+02:00") == dt.datetime(2024, 3, 1, 12, tzinfo=dt.UTC)
    with pytest.raises(SettingsError, match="--now"):
        parse_now("noon")


@pytest.mark.parametrize(
    ("spark", "needle"),
    [
        ({"spark.driver.memory": "lots"}, "`spark.spark.driver.memory` must be a size"),
        (
            {"spark.sql.shuffle.partitions": "many"},
            "`spark.spark.sql.shuffle.partitions` must be a whole number",
        ),
        ({"spark.ui.enabled": "yes"}, "`spark.spark.ui.enabled` must be true or false"),
        ({"driver.memory": "2g"}, "is not a Spark option"),
    ],
)
def test_spark_options_a_jvm_would_refuse_are_named_before_spark_starts(spark, needle) -> None:
    with pytest.raises(SettingsError, match=re.escape(needle)):
        from_mapping({"spark": spark})
    assert from_mapping({"spark": {"spark.driver.memory": "2g", "spark.master": "local[2]"}})


def test_an_impossible_date_names_the_key(tmp_path) -> None:
    (tmp_path / "sessionize.yaml").write_text("start_date: 2024-02-30\n")
    with pytest.raises(SettingsError, match=r"`start_date` must be a date .* '2024-02-30'"):
        load_settings(tmp_path, tmp_path / "sessionize.yaml")


def test_a_run_configs_day_is_an_iso_day_or_one_sentence_naming_the_field():
    """`refresh_job`'s from_day and `session_models`' restate_from."""
    assert parse_day("2024-03-02", "from_day") == dt.date(2024, 3, 2)
    assert parse_day(None, "from_day") is None and parse_day("", "from_day") is None
    with pytest.raises(
        SettingsError, match=r"^from_day must be a day such as 2024-03-02, not 'soon'\.$"
    ):
        parse_day("soon", "from_day")
    with pytest.raises(SettingsError, match="restate_from must be a day such as"):
        parse_day("03/02/2024", "restate_from")
