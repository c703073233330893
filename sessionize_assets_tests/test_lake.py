"""`Lake` (plain data, what the command line plans with) and the Dagster resource agree."""

from __future__ import annotations

import datetime as dt

from sessionize_assets.lake import Lake
from sessionize_assets.resources.lake import LakeResource


def test_the_plain_lake_and_its_dagster_resource_name_the_same_tables_settings_and_now(home):
    (home / "sessionize.yaml").write_text("start_date: '2024-02-01'\nsession_gap_minutes: 45\n")
    lake = Lake(home=str(home), now="2024-03-05T06:00:00+00:00")
    resource = lake.resource()
    assert isinstance(resource, LakeResource) and resource.resource() is resource
    assert (resource.home, resource.config_file, resource.now) == (lake.home, None, lake.now)
    assert (
        lake.table("sessions") == resource.table("sessions") == str(home / "warehouse" / "sessions")
    )
    assert (
        lake.current_time() == resource.current_time() == dt.datetime(2024, 3, 5, 6, tzinfo=dt.UTC)
    )
    assert lake.settings == resource.settings
    assert lake.settings.session_gap_minutes == 45
    assert lake.settings.start_date == dt.date(2024, 2, 1)
