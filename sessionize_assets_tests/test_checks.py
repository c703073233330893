"""The time-based asset checks, run through Dagster against real Delta tables."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pyarrow as pa
import pytest
import yaml
from dagster import AssetSelection, AssetSpec, DagsterInstance, materialize
from deltalake import write_deltalake

from sessionize_assets.checks import (
    build_checks,
    duplicates_in_filtered_events,
    repeated_event_ids,
)
from sessionize_assets.partitions import daily_partitions
from sessionize_assets.resources.lake import LakeResource
from sessionize_assets.resources.spark_resource import SparkDeltaResource
from sessionize_assets.time_based.assets import build_assets
from sessionize_assets.time_based.tables import TimeBasedTables


def day(n: int) -> dt.date:
    return dt.date(2024, 3, n)


def write_filtered(path: str, rows: list[tuple[str, int, int]]) -> None:
    """filtered_events rows (event_id, load day, event day), partitioned by both days."""
    table = pa.table(
        {
            "event_id": [r[0] for r in rows],
            "load_date": [day(r[1]) for r in rows],
            "event_date": [day(r[2]) for r in rows],
        }
    )
    write_deltalake(path, table, partition_by=["load_date", "event_date"])


def write_aggregates(
    path: str, rows: list[tuple[int, int, int]], users: list[str | None] | None = None
) -> None:
    """daily_aggregates rows (event day, total_events, horizon load day); one user per row
    unless `users` names them."""
    table = pa.table(
        {
            "user_identifier": users or [f"u{i}" for i in range(len(rows))],
            "event_date": [day(r[0]) for r in rows],
            "total_events": pa.array([r[1] for r in rows], pa.int64()),
            "_horizon_load_date": [day(r[2]) for r in rows],
        }
    )
    write_deltalake(path, table, partition_by=["event_date"])


def run_checks(home: Path) -> dict[str, object]:
    config = home / "sessionize.yaml"
    config.write_text(yaml.safe_dump({"start_date": "2024-03-01", "dedupe_lookback_days": 1}))
    lake = LakeResource(home=str(home), config_file=str(config), now="2024-03-10T00:00:00+00:00")
    settings = lake.settings
    result = materialize(
        [
            AssetSpec("events", partitions_def=daily_partitions(settings)),
            *build_assets(settings),
            *build_checks(settings),
        ],
        selection=AssetSelection.all_asset_checks(),
        instance=DagsterInstance.ephemeral(),
        resources={"lake": lake, "spark": SparkDeltaResource()},
        raise_on_error=False,
    )
    return {e.check_name: e for e in result.get_asset_check_evaluations()}


@pytest.mark.parametrize("broken", [False, True])
def test_checks_pass_on_consistent_tables_and_name_what_is_wrong(spark, tmp_path, broken) -> None:
    home = tmp_path / "home"
    home.mkdir()
    tables = TimeBasedTables.at(lambda name: str(home / "warehouse" / name))
    filtered = [
        ("a", 1, 1),
        ("b", 1, 1),
        ("c", 2, 1),
        ("d", 3, 1),
        ("a", 3, 3),
    ]  # `a` 2 days apart: fine
    if broken:
        filtered.append(("c", 3, 1))  # a copy of `c` kept one load day after it
    write_filtered(tables.filtered_events, filtered)
    # Event day 1 counted up to load day 2 (3 rows) with load day 3 pending; event day 3 counted.
    write_aggregates(
        tables.daily_aggregates, [(1, 2, 2), (1, 1, 2), (3, 1 if not broken else 2, 3)]
    )
    checks = run_checks(home)
    assert set(checks) == {"no_duplicate_event_ids", "accounting_invariant"}
    duplicates = checks["no_duplicate_event_ids"]
    accounting = checks["accounting_invariant"]
    assert duplicates.passed is (not broken)
    assert accounting.passed is (not broken)
    if broken:
        assert duplicates.metadata["duplicates (first examples)"].value == [
            "event_id c kept in load days 2024-03-02 and 2024-03-03"
        ]
        assert accounting.metadata["differences"].value == [
            "event day 2024-03-03: 1 rows in filtered_events != 2 counted into daily_aggregates "
            "(horizon 2024-03-03) + 0 pending"
        ]
    # Pending rows are reported, not differences: load day 3's row(s) of event day 1.
    assert accounting.metadata["pending rows per event day"].value == {
        "2024-03-01": 2 if broken else 1
    }


def test_the_accounting_check_fails_on_a_user_counted_twice_on_an_event_day(spark, tmp_path):
    """The counts add up, but a user has two rows on event day 1 (attributes would count two
    active days), and so does the null user on day 3: the blocking check fails and names both
    pairs. One row per day of the same user on different days is no repeat."""
    home = tmp_path / "home"
    home.mkdir()
    tables = TimeBasedTables.at(lambda name: str(home / "warehouse" / name))
    write_filtered(
        tables.filtered_events,
        [("a", 1, 1), ("b", 1, 1), ("c", 1, 1), ("d", 1, 3), ("e", 1, 3), ("f", 1, 4)],
    )
    write_aggregates(
        tables.daily_aggregates,
        [(1, 1, 1), (1, 1, 1), (1, 1, 1), (3, 1, 1), (3, 1, 1), (4, 1, 1)],
        users=["u1", None, "u1", None, None, "u1"],
    )
    accounting = run_checks(home)["accounting_invariant"]
    assert not accounting.passed
    assert accounting.metadata["differences"].value == []
    assert accounting.metadata["(user, event day) rows repeated (first examples)"].value == [
        "user u1 has 2 rows on event day 2024-03-01",
        "user (null) has 2 rows on event day 2024-03-03",
    ]


def test_the_duplicates_check_finds_the_same_copies_on_the_driver_as_in_spark(
    spark, tmp_path
) -> None:
    """Up to DRIVER_CHECK_ROWS rows the check reads event ids with delta-rs; beyond, in Spark.
    Both read only the load days within the lookback of the run's (partition filters)."""
    tables = TimeBasedTables.at(lambda name: str(tmp_path / name))
    assert duplicates_in_filtered_events(spark, tables, 1) == []  # no table yet
    write_filtered(
        tables.filtered_events,
        [
            ("a", 1, 1), ("a", 2, 1),  # copies in load days 1 and 2
            ("b", 4, 3), ("b", 4, 4),  # two copies in load day 4
            ("c", 5, 5), ("c", 7, 5),  # two days apart: fine with lookback 1
            ("d", 6, 6), ("d", 7, 7),  # copies in load days 6 and 7
            ("e", 3, 3),
        ],
    )  # fmt: skip
    scopes = {
        None: [
            "event_id a kept in load days 2024-03-01 and 2024-03-02",
            "event_id b kept in load days 2024-03-04 and 2024-03-04",
            "event_id d kept in load days 2024-03-06 and 2024-03-07",
        ],
        (day(3), day(3)): [],  # load days 2..4 read; neither copy of `a` or `b` is in day 3
        (day(2), day(2)): ["event_id a kept in load days 2024-03-01 and 2024-03-02"],
        (day(5), day(7)): ["event_id d kept in load days 2024-03-06 and 2024-03-07"],
    }
    for load_days, expected in scopes.items():
        assert duplicates_in_filtered_events(spark, tables, 1, load_days) == expected, load_days
        in_spark = duplicates_in_filtered_events(spark, tables, 1, load_days, driver_rows=0)
        assert in_spark == expected, load_days
    # Only the ids kept more than once in the load days read reach Python.
    assert sorted(repeated_event_ids(tables.filtered_events, 0, (day(1), day(4)))) == [
        ("a", day(1)), ("a", day(2)), ("b", day(4)), ("b", day(4))
    ]  # fmt: skip
