"""Session steps in isolation, on real Delta tables."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from sessionize_assets.home import Home
from sessionize_assets.sessions import steps
from sessionize_assets_tests.sessions.support import event, make_settings, utc, write_load_days


def test_where_data_resumes_needs_no_query_when_the_log_bounds_every_timestamp(
    spark, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    settings = make_settings(start_date="2024-03-01")
    write_load_days(
        spark,
        home,
        {
            dt.date(2024, 3, 2): [
                event("2024-03-01T10:00:00", session="s1", loaded="2024-03-02T01:00:00"),
                event("2024-03-02T09:30:00", session="s2", loaded="2024-03-02T10:00:00"),
            ]
        },
    )
    resumes = lambda upper: steps.next_data_after(  # noqa: E731
        spark, Home(home).table, settings, utc(upper)
    )
    assert resumes("2024-03-01T00:00:00") == utc("2024-03-01T10:00:00")
    assert resumes("2024-03-01T12:00:00") == utc("2024-03-02T09:30:00")

    # At or after the newest timestamp the file statistics give, no Spark query is planned.
    def no_query(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise AssertionError("next_data_after read filtered_events")

    monkeypatch.setattr(steps, "read_pinned", no_query)
    assert resumes("2024-03-02T09:30:01") is None
    assert resumes("2024-03-05T00:00:00") is None
    with pytest.raises(AssertionError, match="read filtered_events"):
        resumes("2024-03-02T09:00:00")  # a row lies after it: the query decides
