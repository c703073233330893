"""docs/tables.md is `table_catalog.render_markdown()`, every table has an entry, and the entries
match the tables the pipeline really writes (columns, types, nullability, partitioning, keys)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from deltalake import DeltaTable

from sessionize_assets import table_catalog
from sessionize_assets.commands.forget import record_request
from sessionize_assets.core.cursor import CursorState
from sessionize_assets.core.forget import ForgetRecord
from sessionize_assets.home import Home
from sessionize_assets.ingest.loader import load_paths
from sessionize_assets.resources import tables as names
from sessionize_assets.resources.cursor_store import CursorCheckpointStore
from sessionize_assets.sessions.run import run_session_models
from sessionize_assets.sessions.tables import USER_SESSION_STATS
from sessionize_assets.settings import Settings
from sessionize_assets.time_based import definitions, steps
from sessionize_assets.time_based.tables import TimeBasedTables

TABLE_NAMES = sorted(
    {v for k, v in vars(names).items() if k.isupper() and isinstance(v, str)} | {USER_SESSION_STATS}
)


def test_docs_tables_md_is_generated_from_the_code() -> None:
    committed = table_catalog.DOC_PATH.read_text(encoding="utf-8")
    assert committed == table_catalog.render_markdown(), (
        f"docs/tables.md is out of date: regenerate it with `{table_catalog.REGENERATE}`"
    )


def test_every_table_has_one_entry() -> None:
    entries = [t.name for t in table_catalog.catalog()]
    assert len(entries) == len(set(entries))
    assert sorted(entries) == TABLE_NAMES


@pytest.mark.parametrize("entry", table_catalog.catalog(), ids=lambda t: t.name)
def test_keys_and_partitions_are_columns(entry: table_catalog.Table) -> None:
    columns = [c.name for c in entry.columns]
    assert len(columns) == len(set(columns))
    assert set(entry.key) <= set(columns) and set(entry.partition_by) <= set(columns)
    assert [c.name for c in table_catalog.column_schema(entry.name).columns] == columns


def test_settings_dependent_columns_follow_the_settings() -> None:
    settings = Settings().replace(attribute_windows_days=[14])
    columns = [c.name for c in table_catalog.table(names.ATTRIBUTES, settings).columns]
    assert "total_events_last_14_days" in columns and "total_events_last_7_days" not in columns


# ---------------------------------------------------------------- the tables the pipeline writes

HEADER = (
    "event_id,app_id,platform,event_name,domain_userid,user_id,network_userid,domain_sessionid,"
    "page_url,page_referrer,collector_tstamp,dvce_created_tstamp,dvce_sent_tstamp,derived_tstamp,"
    "load_tstamp"
)


def _row(event_id: str, name: str, user: str, session: str, at: str, loaded: str) -> str:
    return f"{event_id},site,web,{name},{user},,,{session},https://x/{event_id},,{at},{at},{at},{at},{loaded}"


# Two files (two load_log rows), two load days, two event days, a late row, a copy, a bad row.
FILES = {
    "day1.csv": [
        _row("e1", "page_view", "u1", "s1", "2024-03-01 10:00:00", "2024-03-01 11:00:00"),
        _row("e2", "link_click", "u1", "s1", "2024-03-01 10:05:00", "2024-03-01 11:00:00"),
    ],
    "day2.csv": [
        _row("e3", "page_view", "u2", "s2", "2024-03-01 23:00:00", "2024-03-02 10:00:00"),
        _row("e3", "page_view", "u2", "s2", "2024-03-01 23:00:00", "2024-03-02 10:00:00"),
        _row("e4", "page_view", "u1", "s3", "2024-03-02 09:00:00", "2024-03-02 10:00:00"),
        _row("", "page_view", "u2", "s2", "2024-03-02 09:00:00", "2024-03-02 10:00:00"),
    ],
}


def write_every_table(spark, root: Path) -> Home:
    """A home where every table was written once by its real writer: the loader (events,
    invalid_events, load_log, processing_manifest), the time-based steps, one session-models run
    and one cursor checkpoint. Settings that change columns are the defaults, as in the doc."""
    home = Home(root)
    settings = Settings().replace(
        start_date=dt.date(2024, 3, 1),
        min_rows_to_process=1,
        session_models=["sessions", "users", USER_SESSION_STATS],
    )
    now = dt.datetime(2024, 3, 3, 12, tzinfo=dt.UTC)
    for name, rows in FILES.items():
        (root / name).write_text("\n".join([HEADER, *rows]) + "\n")
    report = load_paths(
        spark,
        [root / name for name in FILES],
        settings,
        {n: home.table(n) for n in (names.EVENTS, names.INVALID_EVENTS, names.LOAD_LOG)},
        now,
        manifest_path=home.table(names.PROCESSING_MANIFEST),
    )
    assert (report.rows_kept, report.rows_invalid) == (5, 1)
    tables = TimeBasedTables.at(home.table)
    days = [dt.date(2024, 3, 1), dt.date(2024, 3, 2)]
    steps.filtered_events_step(spark, tables, settings, days, now)
    decided = steps.days_to_process_step(tables, settings, days, now)
    assert decided.facts["requested"] == days
    steps.daily_aggregates_step(spark, tables, settings, days)
    steps.manifest_step(tables)
    steps.attributes_step(spark, tables, settings, now.date())
    run = run_session_models(spark, home.table, settings, now)
    assert not run.warnings, run.warnings
    CursorCheckpointStore(spark, home.table(names.CURSOR_STATE)).save("catalog", CursorState())
    forget_record = ForgetRecord(
        request_id="r1",
        requested_at=now,
        requested_by="ops",
        reason=None,
        users=1,
        rows_deleted={names.EVENTS: 2},
        load_days_redone=tuple(days),
    )
    record_request(home.table(names.FORGET_LOG), forget_record)
    definitions.record(
        home.table(names.TIME_BASED_DEFINITIONS), settings, ["filtered_events", "daily_aggregates"]
    )
    return home


@pytest.fixture(scope="module")
def written(spark, tmp_path_factory) -> Home:
    return write_every_table(spark, tmp_path_factory.mktemp("catalog"))


@pytest.mark.parametrize("entry", table_catalog.catalog(), ids=lambda t: t.name)
def test_the_written_table_matches_its_entry(spark, written, entry) -> None:
    path = written.table(entry.name)
    real = spark.read.format("delta").load(path).schema
    assert [(f.name, f.dataType.simpleString(), f.nullable) for f in real.fields] == [
        (c.name, c.type, c.nullable) for c in entry.columns
    ]
    delta = DeltaTable(path)
    assert tuple(delta.metadata().partition_columns) == entry.partition_by
    if entry.key:
        rows = delta.to_pyarrow_table(columns=list(entry.key)).to_pylist()
        keys = [tuple(r[k] for k in entry.key) for r in rows]
        assert len(keys) == len(set(keys)), f"{entry.name}: key {entry.key} repeats"


def test_the_written_home_has_every_table_and_some_rows(written) -> None:
    assert sorted(p.name for p in Path(written.warehouse).iterdir()) == TABLE_NAMES
    empty = {
        n for n in TABLE_NAMES if DeltaTable(written.table(n)).to_pyarrow_table().num_rows == 0
    }
    # Nothing is quarantined or superseded (id mode) in this small history.
    assert empty == {names.QUARANTINED_SESSIONS, names.SUPERSEDED_SESSIONS}
