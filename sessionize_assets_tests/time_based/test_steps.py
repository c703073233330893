"""The time-based assets through `dagster.materialize` on real Delta tables in temporary homes."""

from __future__ import annotations

import datetime as dt
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import yaml
from dagster import AssetKey, AssetRecordsFilter, AssetSpec, DagsterInstance, materialize
from deltalake import write_deltalake

from sessionize_assets.checks import (
    accounting_invariant,
    build_checks,
    duplicates_in_filtered_events,
)
from sessionize_assets.jobs import REQUESTED_BY_TAG
from sessionize_assets.metadata import FIGURES_TAG
from sessionize_assets.partitions import daily_partitions
from sessionize_assets.resources.lake import LakeResource
from sessionize_assets.resources.spark_resource import SparkDeltaResource
from sessionize_assets.time_based.assets import build_assets, is_keyhole_run
from sessionize_assets.time_based.state import (
    AccountingRecord,
    TimeBasedState,
    files_in,
    read_state,
)
from sessionize_assets.time_based.tables import TimeBasedTables
from sessionize_assets_tests.core.test_filtering import EVENTS_SCHEMA, event

SETTINGS = {
    "start_date": "2024-03-01",
    "min_rows_to_process": 2,
    "reprocess_days": 2,
    "dedupe_lookback_days": 1,
    "backfill_limit_days": 5,
}
NOW = "2024-03-06T12:00:00+00:00"


def day(n: int) -> dt.date:
    return dt.date(2024, 3, n)


def make_lake(home: Path, now: str = NOW, **overrides: Any) -> LakeResource:
    """A home folder with a settings file, and its lake resource."""
    home.mkdir(parents=True, exist_ok=True)
    config = home / "sessionize.yaml"
    config.write_text(yaml.safe_dump({**SETTINGS, **overrides}))
    return LakeResource(home=str(home), config_file=str(config), now=now)


def tables_of(lake: LakeResource) -> TimeBasedTables:
    return TimeBasedTables.at(lake.table)


def append_events(spark, lake: LakeResource, rows: Iterable[Mapping[str, Any]]) -> None:
    """Land rows into the `events` table as a loader would: one commit, partitioned by load_date
    (written with delta-rs: fast, and any Delta writer is a valid source of `events`)."""
    del spark
    rows = list(rows)
    columns = EVENTS_SCHEMA.fieldNames()
    fields = []
    for name in columns:
        kind = EVENTS_SCHEMA[name].dataType.typeName()
        fields.append(
            pa.field(
                name,
                {"timestamp": pa.timestamp("us", tz="UTC"), "date": pa.date32()}.get(
                    kind, pa.string()
                ),
            )
        )
    schema = pa.schema(fields)
    write_deltalake(
        lake.table("events"),
        pa.Table.from_pylist([{c: r.get(c) for c in columns} for r in rows], schema=schema),
        mode="append",
        partition_by=["load_date"],
    )


def materialize_time_based(
    lake: LakeResource,
    instance: DagsterInstance,
    selection: list[str],
    first: dt.date | None = None,
    last: dt.date | None = None,
    run_config: dict | None = None,
    with_checks: bool = False,
):
    settings = lake.settings
    assets = [
        AssetSpec("events", partitions_def=daily_partitions(settings)),
        *build_assets(settings),
    ]
    if with_checks:
        assets += build_checks(settings)
    tags = {}
    key = None
    if first and last and first != last:
        tags = {
            "dagster/asset_partition_range_start": first.isoformat(),
            "dagster/asset_partition_range_end": last.isoformat(),
        }
    elif first:
        key = first.isoformat()
    return materialize(
        assets,
        selection=selection,
        partition_key=key,
        instance=instance,
        resources={"lake": lake, "spark": SparkDeltaResource()},
        tags=tags,
        run_config=run_config,
    )


ROWS = [
    # load day 03-01: two on-time events, one before start_date
    event("a", "2024-03-01T10:00:00", user="u1"),
    event("b", "2024-03-01T11:00:00", "2024-03-01T10:59:00", user="u2"),
    event("old", "2024-03-01T11:00:00", "2024-02-28T10:00:00"),
    # load day 03-02: on time, one late row (03-01), a copy of `a`, a same-day copy of `c`
    event("c", "2024-03-02T10:00:00", user="u1"),
    event("c", "2024-03-02T10:30:00", "2024-03-02T10:00:00", user="u1"),
    event("d", "2024-03-02T10:00:00", "2024-03-01T09:00:00", user="u2"),
    event("a", "2024-03-02T11:00:00", "2024-03-01T10:00:00", user="u1"),
    # load day 03-03: two rows 2 days late (03-01 reaches min_rows_to_process with d)
    event("e", "2024-03-03T10:00:00", "2024-03-01T09:00:00", user="u1", name="link_click"),
    event("f", "2024-03-03T10:00:00", "2024-03-01T09:30:00", user="u3"),
    # load day 03-05: 4 days late (> reprocess_days): skipped, stays pending
    event("h", "2024-03-05T10:00:00", "2024-03-01T12:00:00", user="u3"),
]


@pytest.fixture(scope="module")
def scenario(spark, tmp_path_factory):
    """Load days 03-01 .. 03-05 in one range run, then the decided event days, then attributes."""
    lake = make_lake(tmp_path_factory.mktemp("time_based") / "home")
    append_events(spark, lake, ROWS)
    instance = DagsterInstance.ephemeral()
    load = materialize_time_based(
        lake, instance, ["filtered_events", "days_to_process"], day(1), day(5)
    )
    outstanding = sorted(read_state(tables_of(lake)).outstanding())
    aggregate = materialize_time_based(
        lake, instance, ["daily_aggregates"], outstanding[0], outstanding[-1]
    )
    finish = materialize_time_based(lake, instance, ["attributes", "daily_aggregation_manifest"])
    return {
        "lake": lake,
        "instance": instance,
        "runs": (load, aggregate, finish),
        "outstanding": outstanding,
    }


def read(spark, lake: LakeResource, name: str):
    return spark.read.format("delta").load(lake.table(name))


def test_filtered_events_keeps_deduplicated_filtered_rows_per_load_day(spark, scenario) -> None:
    lake = scenario["lake"]
    assert all(r.success for r in scenario["runs"])
    kept = sorted(
        (r.load_date.day, r.event_id, r.event_date.day)
        for r in read(spark, lake, "filtered_events").collect()
    )
    assert kept == [
        (1, "a", 1),
        (1, "b", 1),
        (2, "c", 2),
        (2, "d", 1),
        (3, "e", 1),
        (3, "f", 1),
        (5, "h", 1),
    ]
    acc = {r.load_date.day: r for r in read(spark, lake, "filtered_events_accounting").collect()}
    assert set(acc) == {1, 2, 3, 5}  # the empty load day 03-04 is done without a row
    assert (acc[1].rows_read, acc[1].rows_kept, acc[1].dropped_before_start_date) == (3, 2, 1)
    assert (acc[2].rows_read, acc[2].rows_kept, acc[2].dropped_duplicate) == (4, 2, 2)
    for r in acc.values():
        dropped = (
            r.dropped_duplicate
            + r.dropped_app_filter
            + r.dropped_event_filter
            + r.dropped_before_start_date
        )
        assert r.rows_read == r.rows_kept + dropped
    assert not duplicates_in_filtered_events(spark, tables_of(lake), 1)


def test_reading_one_event_day_or_one_load_day_prunes_files(spark, scenario) -> None:
    lake = scenario["lake"]
    path = lake.table("filtered_events")
    event_day_files, total = files_in(path, "event_date", [day(2)])
    load_day_files, _ = files_in(path, "load_date", [day(3)])
    assert (event_day_files, load_day_files, total) == (1, 1, 5)
    one_event_day = read(spark, lake, "filtered_events").filter(f"event_date = DATE'{day(1)}'")
    assert len(one_event_day.inputFiles()) == files_in(path, "event_date", [day(1)])[0] == 4
    one_load_day = read(spark, lake, "filtered_events").filter(f"load_date = DATE'{day(2)}'")
    assert len(one_load_day.inputFiles()) == 2


def test_filtered_events_files_hold_contiguous_ranges_of_users(spark, tmp_path) -> None:
    """With filtered_events_rows_per_file 10, a load day of 60 on-time rows of 20 users is
    written as six files of about 10 rows whose user ranges (Delta's min/max per file) do not
    overlap: the bounds searched from a sample the counts' query gathered (every row, at 100 a
    file)."""
    from deltalake import DeltaTable

    from sessionize_assets.time_based import steps

    lake = make_lake(tmp_path / "home", filtered_events_rows_per_file=10)
    rows = [
        event(f"e{u}-{i}", f"2024-03-02T{10 + i}:00:00", user=f"u{u:02d}")
        for u in range(20)
        for i in range(3)
    ]
    append_events(spark, lake, rows)
    now = dt.datetime.fromisoformat(NOW)
    result = steps.filtered_events_step(spark, tables_of(lake), lake.settings, [day(2)], now)
    assert result.metadata["filtered_events layout"] == (
        "6 tasks, a sample's bounds searched (sample gathered by the counts)"
    )
    actions = pa.table(
        DeltaTable(lake.table("filtered_events")).get_add_actions(flatten=True)
    ).to_pydict()
    ranges = sorted(zip(actions["min.domain_userid"], actions["max.domain_userid"], strict=True))
    files = actions["num_records"]
    assert len(files) == 6 and sum(files) == 60, files
    assert all(n % 3 == 0 and n <= 12 for n in files), files  # a user's 3 rows never split
    assert all(ranges[i][1] < ranges[i + 1][0] for i in range(len(ranges) - 1)), ranges


def test_days_to_process_decides_each_load_day_in_order(spark, scenario) -> None:
    rows = sorted(
        (r.load_date.day, r.event_date.day, r.rows, r.pending, r.decision)
        for r in read(spark, scenario["lake"], "days_to_process").collect()
    )
    assert rows == [
        (1, 1, 2, 2, "process"),
        (2, 1, 1, 1, "skip"),  # late by 1 day, 1 pending row < min_rows_to_process 2
        (2, 2, 1, 1, "process"),
        (3, 1, 2, 3, "process"),  # late by 2 days, 3 pending rows
        (5, 1, 1, 1, "skip"),  # late by 4 days > reprocess_days
    ]
    assert scenario["outstanding"] == [day(1), day(2)]


def test_daily_aggregates_count_rows_up_to_the_horizon(spark, scenario) -> None:
    lake = scenario["lake"]
    got = {
        (r.user_identifier, r.event_date.day): r
        for r in read(spark, lake, "daily_aggregates").collect()
    }
    assert {k: v.total_events for k, v in got.items()} == {
        ("u1", 1): 2,
        ("u2", 1): 2,
        ("u3", 1): 1,  # h (loaded 03-05) is pending
        ("u1", 2): 1,
    }
    assert got[("u1", 1)].event_counts == {"page_view": 1, "link_click": 1}
    assert {v._horizon_load_date for k, v in got.items() if k[1] == 1} == {day(3)}
    state = read_state(tables_of(lake))
    manifest = {r.event_date: r for r in state.manifest()}
    assert (
        manifest[day(1)].rows_aggregated,
        manifest[day(1)].pending,
        manifest[day(1)].rows_skipped_so_far,
    ) == (5, 1, 2)
    assert manifest[day(1)].horizon == day(3) and all(r.accounted for r in manifest.values())
    assert not state.outstanding()
    assert accounting_invariant(tables_of(lake)) == []
    stored_manifest = {
        r.event_date: r for r in read(spark, lake, "daily_aggregation_manifest").collect()
    }
    assert stored_manifest[day(1)].pending == 1 and stored_manifest[day(2)].pending == 0


def test_attributes_are_recomputed_from_daily_aggregates(spark, scenario) -> None:
    lake = scenario["lake"]
    got = {r.user_identifier: r for r in read(spark, lake, "attributes").collect()}
    assert set(got) == {"u1", "u2", "u3"}
    assert (got["u1"].total_events, got["u1"].active_days, got["u1"].total_events_last_7_days) == (
        3,
        2,
        3,
    )
    assert got["u1"].as_of == day(6)
    assert read_state(tables_of(lake)).attributes_stale(day(6)) is False
    assert read_state(tables_of(lake)).attributes_stale(day(7)) is True


def latest_metadata(
    instance: DagsterInstance, asset: str, partition: str | None = None, figures: bool = False
) -> dict:
    """The metadata of the latest materialization of the run's own (`figures`: of the latest
    per-partition figures event, `metadata.partition_figures`)."""
    records = instance.fetch_materializations(
        AssetRecordsFilter(
            asset_key=AssetKey(asset), asset_partitions=[partition] if partition else None
        ),
        limit=20,
    ).records
    wanted = [
        r.asset_materialization
        for r in records
        if (FIGURES_TAG in (r.asset_materialization.tags or {})) == figures
    ]
    return {k: v.value for k, v in wanted[0].metadata.items()}


def test_every_materialization_carries_metadata(scenario) -> None:
    from sessionize_assets.metadata import RUN_TOTALS

    instance = scenario["instance"]
    # The scenario materialized load days 03-01..03-05 in one run: Dagster copies a run's
    # metadata onto each partition, so its totals are one JSON entry, not per-partition numbers.
    filtered = latest_metadata(instance, "filtered_events", "2024-03-02")
    totals = filtered[RUN_TOTALS]
    assert totals["rows read"] == 10 and totals["rows written"] == 7
    assert "rows read" not in filtered and "dagster/row_count" not in filtered
    assert filtered["partitions in this run"] == "5: 2024-03-01 .. 2024-03-05"
    assert filtered["next scheduled run: state"] == "first run"
    assert filtered["next scheduled run: load window"].startswith("[2024-03-01T00:00:00")
    assert totals["time taken (s)"] >= 0
    # Each partition's own figures follow in a materialization of their own, the partition's
    # latest, which the UI's partition plots read.
    own = latest_metadata(instance, "filtered_events", "2024-03-02", figures=True)
    assert own == {
        "rows read": 4,
        "rows written": 2,
        "dropped duplicate": 2,
        "dropped app filter": 0,
        "dropped event filter": 0,
        "dropped before start date": 0,
        "dagster/row_count": 2,
    }
    decided = latest_metadata(instance, "days_to_process", "2024-03-05")
    assert decided[RUN_TOTALS]["event days processed"] == 2
    assert decided[RUN_TOTALS]["event days skipped"] == 1
    assert decided["skipped event days (pending rows)"] == {"2024-03-01": 1}
    assert decided["daily_aggregates partitions requested"] == ["2024-03-01", "2024-03-02"]
    # How late each load day's rows are (one range run: one entry per load day).
    assert decided["lateness per load day"]["2024-03-05"] == {
        "late rows": 1,
        "late share": 1.0,
        "lateness p50 (days)": 4,
        "lateness p95 (days)": 4,
        "lateness max (days)": 4,
    }
    aggregated = latest_metadata(instance, "daily_aggregates", "2024-03-01")
    assert aggregated["rows counted per event day"] == {"2024-03-01": 5, "2024-03-02": 1}
    assert aggregated["pending rows after (not counted yet)"]["2024-03-01"] == 1
    # the 4 files of 03-01 and 1 of 03-02
    assert aggregated[RUN_TOTALS]["filtered_events files read"] == 5
    assert latest_metadata(instance, "daily_aggregates", "2024-03-01", figures=True) == {
        "rows read": 5,
        "pending rows (not counted yet)": 1,
    }
    assert (
        latest_metadata(instance, "days_to_process", "2024-03-05", figures=True)
        == (decided["lateness per load day"]["2024-03-05"])
    )
    attributes = latest_metadata(instance, "attributes")
    assert attributes["rows written"] == attributes["dagster/row_count"] == 3
    manifest = latest_metadata(instance, "daily_aggregation_manifest")
    assert manifest["pending rows"] == 1
    # The lateness matrix, a Markdown table the UI renders: load day 03-05's one row, 4 days late.
    table = manifest["lateness of the last 14 load days"]
    assert "| 2024-03-05 | 1 | 100.0% | 4 | 4 | 4 | 0 | 0 | 0 | 0 | 1 | 0 | 0 | 0 |" in table, table


def test_a_run_of_one_partition_reports_plottable_numbers(scenario, tmp_path) -> None:
    """One load day re-run alone: its numbers and its lateness are its own, as numbers."""
    lake, instance = clone(scenario, tmp_path)
    assert materialize_time_based(
        lake, instance, ["filtered_events", "days_to_process"], day(3)
    ).success
    filtered = latest_metadata(instance, "filtered_events", "2024-03-03")
    assert filtered["rows written"] == filtered["dagster/row_count"] == 2
    decided = latest_metadata(instance, "days_to_process", "2024-03-03")
    assert (decided["late rows"], decided["lateness max (days)"], decided["late share"]) == (
        2,
        2,
        1.0,
    )


def clone(scenario, tmp_path: Path) -> tuple[LakeResource, DagsterInstance]:
    """A copy of the scenario's home (its Delta tables) with a fresh Dagster instance."""
    source = Path(scenario["lake"].home)
    shutil.copytree(source, tmp_path / "home")
    lake = make_lake(tmp_path / "home")
    return lake, DagsterInstance.ephemeral()


def test_rerun_replaces_exactly_its_load_day_and_keyhole_repair_clears_pending(
    spark, scenario, tmp_path
) -> None:
    lake, instance = clone(scenario, tmp_path)
    path = lake.table("filtered_events")
    before = {r["load_date"]: sorted(r["paths"]) for r in _files_by_load_day(path)}
    result = materialize_time_based(lake, instance, ["filtered_events", "days_to_process"], day(2))
    assert result.success
    after = {r["load_date"]: sorted(r["paths"]) for r in _files_by_load_day(path)}
    assert {d: p for d, p in after.items() if d != day(2)} == {
        d: p for d, p in before.items() if d != day(2)
    }
    assert after[day(2)] != before[day(2)]  # rewritten, with the same rows
    assert read(spark, lake, "filtered_events").count() == 7
    # Load day 03-02 was counted into event day 03-01 (horizon 03-03): re-run, so re-aggregate.
    state = read_state(tables_of(lake))
    assert sorted(state.outstanding()) == [day(1), day(2)]
    assert accounting_invariant(tables_of(lake)) == []
    # Keyhole repair: event day 03-01 with every row loaded so far (clears its pending row).
    config = {"ops": {"daily_aggregates": {"config": {"all_loaded_rows": True}}}}
    repair = materialize_time_based(
        lake, instance, ["daily_aggregates"], day(1), run_config=config, with_checks=True
    )
    assert repair.success
    state = read_state(tables_of(lake))
    row = {r.event_date: r for r in state.manifest()}[day(1)]
    assert (row.horizon, row.rows_aggregated, row.pending) == (day(5), 6, 0)
    # The accounting check ran with the materialization, and holds.
    (check,) = repair.get_asset_check_evaluations()
    assert check.check_name == "accounting_invariant" and check.passed
    assert latest_metadata(instance, "daily_aggregates", "2024-03-01")["mode"].startswith("keyhole")


def _files_by_load_day(path: str) -> list[dict]:
    import pyarrow as pa
    from deltalake import DeltaTable

    actions = pa.table(DeltaTable(path).get_add_actions(flatten=True)).to_pylist()
    out: dict = {}
    for a in actions:
        out.setdefault(a["partition.load_date"], []).append(a["path"])
    return [{"load_date": k, "paths": v} for k, v in out.items()]


def test_a_late_load_into_an_earlier_load_day_reaches_later_load_days(
    spark, scenario, tmp_path
) -> None:
    lake, instance = clone(scenario, tmp_path)
    # A copy of `c` (kept in load day 03-02) lands late into load day 03-01: 03-01 is loaded first.
    append_events(
        spark, lake, [event("c", "2024-03-01T23:00:00", "2024-03-01T22:00:00", user="u1")]
    )
    state = read_state(tables_of(lake))
    assert state.pending_load_days() == [day(1)]
    assert materialize_time_based(
        lake, instance, ["filtered_events", "days_to_process"], day(1)
    ).success
    state = read_state(tables_of(lake))
    assert state.pending_filtered() == [day(2)]  # reached through the duplicate
    assert latest_metadata(instance, "filtered_events", "2024-03-01")[
        "later load days reached by duplicates (marked pending)"
    ] == ["2024-03-02"]
    assert materialize_time_based(
        lake, instance, ["filtered_events", "days_to_process"], day(2)
    ).success
    state = read_state(tables_of(lake))
    assert state.pending_load_days() == []
    kept_c = [
        (r.load_date, r.event_date)
        for r in read(spark, lake, "filtered_events").filter("event_id = 'c'").collect()
    ]
    assert kept_c == [(day(1), day(1))]
    assert not duplicates_in_filtered_events(spark, tables_of(lake), 1)
    # Event day 03-02 lost its only row: it was counted (horizon 03-02), so it is re-aggregated.
    assert sorted(state.outstanding()) == [day(1), day(2)]
    assert materialize_time_based(lake, instance, ["daily_aggregates"], day(1), day(2)).success
    assert accounting_invariant(tables_of(lake)) == []
    assert (
        read(spark, lake, "daily_aggregates").filter("event_date = DATE'2024-03-02'").count() == 0
    )


def test_keyhole_runs_know_the_late_days_sensors_tag() -> None:
    # The rule's cases are in core/test_backfills.py; here, the asset's wrapper and its tag.
    backfill = {"dagster/backfill": "abc"}
    assert is_keyhole_run(backfill, None, {"daily_aggregates"}) is True
    assert is_keyhole_run({**backfill, REQUESTED_BY_TAG: "late_days_sensor"}, None) is False
    assert is_keyhole_run(backfill, None, {"filtered_events", "daily_aggregates"}) is False


def test_pending_load_days_and_last_success_from_the_state() -> None:
    def account(n: int, fingerprint: str, kept: int, materialization: str) -> AccountingRecord:
        loaded = dt.datetime(2024, 3, n, 20, tzinfo=dt.UTC)
        return AccountingRecord(
            day(n), fingerprint, kept, kept, {}, loaded, materialization, loaded
        )

    def state(fingerprints, accounting, decided_from) -> TimeBasedState:
        return TimeBasedState(
            events_version=3,
            events_fingerprints=fingerprints,
            filtered_version=2,
            counts={},
            accounting=accounting,
            decisions=[],
            decided_from=decided_from,
            aggregated={},
            daily_aggregates_version=None,
        )

    # Load day 2 kept nothing (all duplicates): it needs no decisions and is up to date.
    current = state(
        {day(1): "f1", day(2): "f2"},
        {day(1): account(1, "f1", 2, "m1"), day(2): account(2, "f2", 0, "m2")},
        {day(1): frozenset({"m1"})},
    )
    assert current.pending_load_days() == []
    settings = make_lake_settings()
    limits = current.load_window(settings, dt.datetime(2024, 3, 9, tzinfo=dt.UTC))
    assert limits.state.value == "standard" and limits.start == dt.datetime(
        2024, 3, 2, tzinfo=dt.UTC
    )
    # New files in load day 2, a redo mark on load day 3, decisions behind on load day 1, and a
    # load day before start_date.
    behind = state(
        {day(1): "f1", day(2): "f2b", day(3): "f3", dt.date(2024, 2, 27): "x"},
        {
            day(1): account(1, "f1", 2, "m1b"),
            day(2): account(2, "f2", 0, "m2"),
            day(3): account(3, "redo: reached by duplicates of 2024-03-02", 1, "m3"),
        },
        {day(1): frozenset({"m1"}), day(3): frozenset({"m3"})},
    )
    assert behind.pending_filtered() == [dt.date(2024, 2, 27), day(2), day(3)]
    assert behind.pending_decisions() == [day(1)]
    assert behind.pending_load_days(dt.date(2024, 3, 1)) == [day(1), day(2), day(3)]
    assert behind.last_success() == {
        "filtered_events": account(1, "", 0, "").max_load_tstamp,
        "days_to_process": None,
    }
    assert (
        behind.load_window(settings, dt.datetime(2024, 3, 9, tzinfo=dt.UTC)).state.value
        == "out of sync"
    )


def make_lake_settings():
    from sessionize_assets.settings import from_mapping

    return from_mapping(SETTINGS)


def test_small_outputs_are_committed_by_the_driver_as_spark_would_write_them(
    spark, scenario, tmp_path, monkeypatch
) -> None:
    """daily_aggregates (once the table exists) and attributes of few rows are collected as Arrow
    and committed with delta-rs, attributes reading daily_aggregates on the driver; Spark's writes
    and read (forced here) give the same tables and the same record of what attributes were
    computed from."""
    from sessionize_assets.resources import delta
    from sessionize_assets.resources.delta import delta_table
    from sessionize_assets.time_based import steps
    from sessionize_assets.time_based.state import attributes_source

    def plain(value: Any) -> Any:  # maps as sorted pairs: rows become sortable and comparable
        return tuple(sorted(value.items())) if isinstance(value, dict) else value

    def rows(lake: LakeResource, name: str) -> list:
        return sorted(
            tuple(sorted((k, plain(v)) for k, v in r.asDict(recursive=True).items()))
            for r in read(spark, lake, name).drop("_aggregated_at").collect()
        )

    got = {}
    for writer in ("the driver (delta-rs)", "Spark"):
        lake, _ = clone(scenario, tmp_path / writer.split()[0])
        if writer == "Spark":  # Spark writes, and reads daily_aggregates
            monkeypatch.setattr(steps, "DRIVER_WRITE_ROWS", -1)
            monkeypatch.setattr(delta, "LOCAL_READ_ROWS", -1)
        tables = tables_of(lake)
        # A keyhole repair counts the pending row of 03-01 (loaded 03-05): the rows change;
        # event day 03-04 has no rows and is replaced by none.
        daily = steps.daily_aggregates_step(
            spark, tables, lake.settings, [day(1), day(2), day(4)], all_loaded_rows=True
        )
        attributes = steps.attributes_step(spark, tables, lake.settings, day(7))
        assert daily.metadata["written by"] == attributes.metadata["written by"] == writer
        assert daily.metadata["event days read by"] == writer
        got[writer] = (
            rows(lake, "daily_aggregates"),
            rows(lake, "attributes"),
            attributes_source(tables.attributes),
            # the tables' schemas too: every column nullable, as Spark writes them
            [
                delta_table(p).schema().to_json()
                for p in (tables.daily_aggregates, tables.attributes)
            ],
        )
        assert got[writer][2]["as_of"] == "2024-03-07"
    assert got["the driver (delta-rs)"] == got["Spark"]
    daily_rows = [dict(r) for r in got["Spark"][0]]
    assert {(r["user_identifier"], r["event_date"].day): r["total_events"] for r in daily_rows}[
        ("u3", 1)
    ] == 2  # the pending row counted


def test_few_aggregated_rows_of_many_rows_are_written_by_the_driver(
    spark, scenario, tmp_path, monkeypatch
) -> None:
    """More rows aggregated than DRIVER_WRITE_ROWS (up to DRIVER_AGGREGATE_ROWS): Spark aggregates
    them and the driver writes the result when it holds at most DRIVER_WRITE_ROWS rows, Spark when
    it holds more; both leave the table Spark's write leaves."""
    from sessionize_assets.resources import delta
    from sessionize_assets.time_based import steps

    days = [day(1), day(2), day(4)]

    def daily_rows(lake: LakeResource) -> list:
        return sorted(
            tuple(
                sorted((k, tuple(sorted(v.items())) if isinstance(v, dict) else v) for k, v in row)
            )
            for row in (
                r.asDict(recursive=True).items()
                for r in read(spark, lake, "daily_aggregates").drop("_aggregated_at").collect()
            )
        )

    monkeypatch.setattr(delta, "LOCAL_READ_ROWS", -1)  # Spark reads, so Spark aggregates
    got, written_by = {}, {}
    for case in ("reference", "fits", "too many"):
        lake, _ = clone(scenario, tmp_path / case.replace(" ", "_"))
        if case == "reference":
            monkeypatch.setattr(steps, "DRIVER_WRITE_ROWS", -1)
        else:
            out = sum(dict(r)["event_date"] in days for r in got["reference"])
            monkeypatch.setattr(steps, "DRIVER_WRITE_ROWS", out if case == "fits" else out - 1)
        result = steps.daily_aggregates_step(
            spark, tables_of(lake), lake.settings, days, all_loaded_rows=True
        )
        aggregated = sum(result.metadata["rows counted per event day"].values())
        got[case], written_by[case] = daily_rows(lake), result.metadata["written by"]
        if case == "fits":
            assert aggregated > steps.DRIVER_WRITE_ROWS  # the limit on the rows aggregated missed
    assert written_by == {
        "reference": "Spark",
        "fits": "the driver (delta-rs)",
        "too many": "Spark",
    }
    assert got["fits"] == got["too many"] == got["reference"]


def test_the_drivers_deduplication_marks_the_rows_spark_marks(spark, tmp_path, monkeypatch) -> None:
    """`filtered_events` with its decisions on the driver (few load day rows: delta-rs reads the
    look-back keys, `decisions_needed` decides) against Spark's marking (forced), on random
    copies across load days 03-01..03-08 with a look-back of 2, processed as non-contiguous sets
    of load days and then the rest: the same rows kept, the same accounting, the same later load
    days reached, after every step. The writes too: the first creates the table (Spark), the
    later ones are the driver's (few rows, `_replaced_by_driver`) in one home and Spark's
    (forced) in the other; the tables are equal column for column, and so are their change
    feeds (a redo's whole-file removes read as deletes), version for version."""
    import random

    from deltalake import DeltaTable

    from sessionize_assets.resources import delta
    from sessionize_assets.time_based import steps

    rng = random.Random(34)
    rows = []
    for i in range(240):
        loaded = day(rng.randrange(1, 9))
        rows.append(
            event(
                f"e{rng.randrange(90)}",  # ~2.7 copies an id: within and across load days
                f"{loaded.isoformat()}T{rng.randrange(24):02d}:{rng.randrange(60):02d}:00",
                user=f"u{rng.randrange(12)}",
                row_hash=f"h{i:04d}",
            )
        )
    now = dt.datetime.fromisoformat(NOW) + dt.timedelta(days=3)
    got: dict[str, list] = {}
    files: dict[str, list[int]] = {}  # one file per load day (one append)
    # Spark's marking twice: its ids needing a decision broadcast from the driver, and cached
    # (more of them than LOCAL_CARE_ROWS).
    for variant in ("the driver (delta-rs)", "Spark", "Spark, ids cached"):
        reader = variant.split(",")[0]
        lake = make_lake(tmp_path / variant.replace(" ", "_"), dedupe_lookback_days=2)
        append_events(spark, lake, rows)
        tables = tables_of(lake)
        if reader == "Spark":
            monkeypatch.setattr(delta, "LOCAL_READ_ROWS", -1)
            monkeypatch.setattr(delta, "DRIVER_FETCH_ROWS", -1)
        if variant.endswith("cached"):
            monkeypatch.setattr(steps, "LOCAL_CARE_ROWS", 0)
        seen = []
        for days in (
            [day(3), day(6)],
            [day(8)],
            [day(1), day(2), day(4), day(5), day(7)],
            [day(4)],
        ):
            first = not Path(tables.filtered_events).exists()
            result = steps.filtered_events_step(spark, tables, lake.settings, days, now)
            assert result.metadata["events read by"] == reader
            assert result.metadata.get("ids needing a decision") == {
                "Spark": "broadcast from the driver",
                "Spark, ids cached": "cached by Spark",
            }.get(variant)
            writer = "Spark" if first else reader
            assert result.metadata["filtered_events written by"] == writer
            kept = sorted(
                (
                    tuple(sorted(r.asDict().items()))
                    for r in read(spark, lake, "filtered_events").collect()
                ),
                key=repr,
            )
            seen.append((kept, result.facts["accounting"], result.facts["reached"]))
            files.setdefault(variant, []).append(result.metadata["events files read"])
        feed = pa.table(DeltaTable(tables.filtered_events).load_cdf(starting_version=0).read_all())
        changes = sorted(
            zip(
                *(
                    feed.column(c).to_pylist()
                    for c in ("_commit_version", "_change_type", "event_id", "_row_hash")
                ),
                strict=True,
            )
        )
        got[variant] = [*seen, changes]
        monkeypatch.undo()
    assert got["the driver (delta-rs)"] == got["Spark"] == got["Spark, ids cached"]
    assert {change for _, change, _, _ in got["Spark"][-1]} == {"insert", "delete"}
    # The files each read: 03-03 and 03-06 with their look-back days (03-01..06) on the driver,
    # the whole window 03-01..08 with Spark.
    assert files["the driver (delta-rs)"][0] == 6 and files["Spark"][0] == 8
    duplicates = [a["dropped_duplicate"] for _, acc, _ in got["Spark"][:-1] for a in acc.values()]
    assert sum(duplicates) > 20
    # Load days 03-01/02 processed after 03-03 reach it through copies (the look-back of 2).
    assert got["Spark"][2][2]


@pytest.mark.parametrize("stored_total", [pa.int64(), pa.float64()])
def test_the_drivers_daily_aggregates_are_written_only_to_a_table_of_their_types(
    tmp_path, stored_total
) -> None:
    """The plain-Python rows are Spark's types; the driver's write refuses a stored
    daily_aggregates of other types (here `total_events` as double) instead of converting the
    values, and the step leaves the table to Spark's computation and writer."""
    from sessionize_assets.core.aggregates import DRIVER_DAILY_SCHEMA
    from sessionize_assets.resources.delta import read_small_table, replace_partitions_from_driver
    from sessionize_assets.settings import from_mapping
    from sessionize_assets.time_based.steps import _daily_on_driver

    computed = to_arrow(DRIVER_DAILY_SCHEMA)
    stored = pa.schema(
        [pa.field(f.name, stored_total if f.name == "total_events" else f.type) for f in computed]
    )
    tables = TimeBasedTables.at(lambda name: str(tmp_path / name))
    write_deltalake(tables.daily_aggregates, stored.empty_table())
    day = dt.date(2024, 3, 1)
    rows = pa.table(
        {
            "domain_userid": ["u1", "u1"],
            "event_name": ["page_view", None],
            "derived_tstamp": pa.array(
                [dt.datetime(2024, 3, 1, 9, tzinfo=dt.UTC)] * 2, pa.timestamp("us", tz="UTC")
            ),
            "event_date": [day, day],
            "load_date": [day, day],
        }
    )
    got = _daily_on_driver(rows, from_mapping({}), {day: day}, [day], dt.datetime.now(dt.UTC))
    assert got is not None and got.schema == computed
    written = replace_partitions_from_driver(tables.daily_aggregates, got, "event_date", [day])
    assert written == (stored_total == pa.int64())
    stored_rows = read_small_table(tables.daily_aggregates)
    assert [r["total_events"] for r in stored_rows] == ([2] if written else [])


def to_arrow(schema) -> pa.Schema:
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timezone="UTC")
