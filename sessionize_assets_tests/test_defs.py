"""The Definitions load, validate, and resolve the same settings as the CLI."""

import subprocess
import sys
from pathlib import Path

from dagster import AssetKey

from sessionize_assets.definitions import build_definitions

ROOT = Path(__file__).resolve().parents[1]


def test_definitions_load_with_every_asset_sensor_and_resource(home):
    (home / "sessionize.yaml").write_text("start_date: 2024-01-01\nreprocess_days: 4\n")
    defs = build_definitions(home)
    graph = defs.resolve_asset_graph()
    keys = {k.to_user_string() for k in graph.get_all_asset_keys()}
    for name in (
        "events",
        "filtered_events",
        "days_to_process",
        "daily_aggregates",
        "attributes",
        "sessions",
        "users",
    ):
        assert name in keys
    partitions = graph.get(AssetKey("filtered_events")).partitions_def
    assert partitions.get_first_partition_key() == "2024-01-01"
    assert {s.name for s in defs.sensors} >= {"new_loads_sensor", "late_days_sensor"}
    assert set(defs.resources) >= {"lake", "spark"}
    defs.resolve_job_def("load_day_job")


def test_every_table_asset_shows_the_catalog_s_columns(home):
    """`dagster/column_schema` on every table asset, equal to its entry in the table catalog
    (docs/tables.md), which the catalog's own tests compare with the tables the code writes."""
    from sessionize_assets import table_catalog

    graph = build_definitions(home).resolve_asset_graph()
    for key in graph.get_all_asset_keys():
        name = key.to_user_string()
        schema = graph.get(key).metadata.get("dagster/column_schema")
        assert schema is not None, name
        entry = table_catalog.table(name)
        assert [(c.name, c.type) for c in schema.columns] == [
            (c.name, c.type) for c in entry.columns
        ], name
    sessions = graph.get(AssetKey("sessions")).metadata["dagster/column_schema"]
    assert [c.name for c in sessions.columns][:2] == ["session_identifier", "user_identifier"]


def test_dagster_definitions_validate_passes(tmp_path):
    env = {
        "SESSIONIZE_HOME": str(tmp_path),
        "PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin",
        "HOME": str(tmp_path),
    }
    result = subprocess.run(
        [
            str(Path(sys.executable).with_name("dagster")),
            "definitions",
            "validate",
            "-w",
            "workspace.yaml",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]


def test_bad_settings_stop_the_code_location_with_the_key_named(tmp_path):
    (tmp_path / "sessionize.yaml").write_text("backfill_limit_days: 0\n")
    env = {"SESSIONIZE_HOME": str(tmp_path), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "-c", "import sessionize_assets.definitions"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert result.returncode != 0
    assert "backfill_limit_days" in result.stderr
