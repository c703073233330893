"""The UI's refresh job and the session models' restate_from config read their days, or say in one
sentence what is wrong (the job itself runs in commands/test_refresh.py)."""

from __future__ import annotations

import datetime as dt

import pytest

from sessionize_assets.errors import SettingsError, UserError
from sessionize_assets.refresh_job import from_day_of
from sessionize_assets.sessions.assets import restate_day


def test_from_day_is_an_iso_day_or_one_sentence():
    assert from_day_of("2024-03-02") == dt.date(2024, 3, 2)
    assert from_day_of(None) is None and from_day_of("") is None
    with pytest.raises(
        UserError, match=r"^from_day must be a day such as 2024-03-02, not 'soon'\.$"
    ):
        from_day_of("soon")


def test_restate_from_is_an_iso_day_or_one_sentence():
    assert restate_day("2024-03-02") == dt.date(2024, 3, 2)
    assert restate_day(None) is None
    with pytest.raises(SettingsError, match="restate_from must be a day such as"):
        restate_day("03/02/2024")
