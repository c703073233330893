import datetime as dt
import json
from pathlib import Path

import pytest
from pyspark.sql import functions as F

from sessionize_assets.errors import SettingsError, UserError
from sessionize_assets.home import Home
from sessionize_assets.ingest.loader import file_sha256, load_paths, prepare_file
from sessionize_assets.resources.tables import EVENTS, INVALID_EVENTS, LOAD_LOG
from sessionize_assets.settings import Settings
from sessionize_assets_tests.conftest import ORACLE_DIR

ORACLE = ORACLE_DIR / "events.csv"
NOW = dt.datetime(2024, 3, 10, 12, tzinfo=dt.UTC)
HEADER = "event_id,app_id,event_name,domain_userid,domain_sessionid,collector_tstamp,derived_tstamp,load_tstamp,custom_col"


def _tables(home: Path) -> dict[str, str]:
    h = Home(home)
    h.ensure()
    return {n: h.table(n) for n in (EVENTS, INVALID_EVENTS, LOAD_LOG)}


def _load(spark, home, paths, settings=Settings(), **kw):
    return load_paths(spark, paths, settings, _tables(home), NOW, **kw)


def _events(spark, home):
    return spark.read.format("delta").load(Home(home).table(EVENTS))


def _invalid(spark, home):
    return spark.read.format("delta").load(Home(home).table(INVALID_EVENTS))


def test_a_batch_keeps_the_raw_text_of_its_rejected_rows_only(spark, tmp_path):
    """What `land_batch` persists while it counts and writes: a usable row's raw text is never
    written, so it is not kept (nor the raw field texts validation decided on)."""
    f = tmp_path / "day.csv"
    f.write_text(
        HEADER
        + "\ne1,web,page_view,u1,s1,2024-03-01 10:00:00,,2024-03-01 10:00:05,x"
        + "\ne5,web,page_view,u1,s1,not-a-time,,2024-03-01 10:04:05,x\n"
    )
    prepared = prepare_file(spark, f, file_sha256(f), Settings(), NOW)
    assert [c for c in prepared.typed.columns if c.startswith("_raw_")] == ["_raw_text"]
    rows = {r["event_id"]: r for r in prepared.typed.collect()}
    assert rows["e1"]["_raw_text"] is None and rows["e1"]["_invalid_reason"] is None
    assert rows["e5"]["_raw_text"].startswith("e5,web,page_view,u1,s1,not-a-time")


def test_csv_with_bad_rows_accounts_for_every_row(spark, home, tmp_path):
    f = tmp_path / "day.csv"
    f.write_text(
        "\n".join(
            [
                HEADER,
                "e1,web,page_view,u1,s1,2024-03-01 10:00:00.100,,2024-03-01 10:00:05,x",
                'e2,web,page_view,u1,s1,2024-03-01 10:01:00,2024-03-01 10:00:59,2024-03-01 10:01:05,"a,b"',
                "e3,web,page_view,u1,s1,2024-03-01 10:02:00",  # wrong number of fields
                ",web,page_view,u1,s1,2024-03-01 10:03:00,,2024-03-01 10:03:05,x",  # missing event_id
                "e5,web,page_view,u1,s1,not-a-time,,2024-03-01 10:04:05,x",  # unparseable
                "e6,web,page_view,u1,s1,2024-03-01 12:00:00,,2024-03-01 10:05:00,x",  # 2 h in the future
                "e7,web,page_ping,u2,s2,2024-03-02 09:00:00,,2024-03-02T09:00:01Z,x",
                "e8,web,page_view,u1,s1,2024-03-01 10:06:00,garbage,2024-03-01 10:06:05,x",  # bad derived
            ]
        )
        + "\n"
    )
    report = _load(spark, home, [f])
    assert (report.rows_read, report.rows_kept, report.rows_invalid) == (8, 3, 5)
    assert report.rows_read == report.rows_kept + report.rows_invalid
    assert report.load_days == [dt.date(2024, 3, 1), dt.date(2024, 3, 2)]
    reasons = {r["reason"]: r["raw"] for r in _invalid(spark, home).collect()}
    assert (
        reasons["wrong number of fields (expected 9)"]
        == "e3,web,page_view,u1,s1,2024-03-01 10:02:00"
    )
    assert "missing event_id" in reasons
    assert reasons["unparseable timestamp in collector_tstamp"].startswith("e5,")
    assert reasons["event time more than 10 minutes after its load time"].startswith("e6,")
    assert reasons["unparseable timestamp in derived_tstamp"].startswith("e8,")
    rows = {r["event_id"]: r for r in _events(spark, home).collect()}
    assert set(rows) == {"e1", "e2", "e7"}
    # derived_tstamp falls back to collector_tstamp; unknown columns are kept; UTC.
    assert rows["e1"]["derived_tstamp"] == dt.datetime(2024, 3, 1, 10, 0, 0, 100000)
    assert rows["e2"]["custom_col"] == "a,b"
    assert rows["e7"]["load_date"] == dt.date(2024, 3, 2)
    assert rows["e1"]["dvce_created_tstamp"] == rows["e1"]["collector_tstamp"]
    log = spark.read.format("delta").load(Home(home).table(LOAD_LOG)).collect()
    assert (log[0]["rows_read"], log[0]["rows_kept"], log[0]["rows_invalid"]) == (8, 3, 5)


def test_same_file_again_is_skipped_with_a_warning(spark, home, tmp_path):
    f = tmp_path / "a.csv"
    f.write_text(HEADER + "\ne1,web,page_view,u1,s1,2024-03-01 10:00:00,,2024-03-01 10:00:05,x\n")
    _load(spark, home, [f])
    copy = tmp_path / "renamed.csv"
    copy.write_bytes(f.read_bytes())
    again = _load(spark, home, [f, copy])
    assert [x.skipped_reason is not None for x in again.files] == [True, True]
    assert any(line.startswith("WARNING: skipped") for line in again.lines())
    assert _events(spark, home).count() == 1


def test_ndjson_and_parquet_and_missing_load_tstamp(spark, home, tmp_path):
    (tmp_path / "load_date=2024-03-05").mkdir()
    j = tmp_path / "load_date=2024-03-05" / "day.ndjson"
    j.write_text(
        "\n".join(
            [
                json.dumps(
                    {
                        "event_id": "j1",
                        "event_name": "page_view",
                        "collector_tstamp": "2024-03-05 10:00:00",
                        "extra": 3,
                    }
                ),
                "{not json",
                json.dumps(
                    {
                        "event_id": "j2",
                        "event_name": "page_view",
                        "collector_tstamp": "2024-03-05 10:00:01",
                        "extra": 4,
                    }
                ),
            ]
        )
        + "\n"
    )
    (tmp_path / "_manifest.json").write_text("{}")  # metadata, not data: skipped in folders
    report = _load(spark, home, [tmp_path])
    assert [Path(f.path).name for f in report.files] == ["day.ndjson"]
    assert (report.rows_read, report.rows_kept, report.rows_invalid) == (3, 2, 1)
    bad = _invalid(spark, home).first()
    # The unreadable line has no load time of its own: it is filed under the folder's load day.
    assert (bad["reason"], bad["load_date"]) == ("not valid JSON", dt.date(2024, 3, 5))
    # Rows without load_tstamp and no option: now.
    assert {r["load_date"] for r in _events(spark, home).collect()} == {NOW.date()}
    p = tmp_path / "p.parquet"
    spark.createDataFrame(
        [("p1", "2024-03-06 08:00:00")], "event_id string, collector_tstamp string"
    ).coalesce(1).write.parquet(str(tmp_path / "pq"))
    parquet_file = next((tmp_path / "pq").glob("*.parquet"))
    parquet_file.rename(p)
    report = _load(spark, home, [p], load_tstamp=dt.datetime(2024, 3, 7, 1, tzinfo=dt.UTC))
    assert report.load_days == [dt.date(2024, 3, 7)]
    loaded = {r["event_id"]: r for r in _events(spark, home).collect()}
    assert loaded["j2"]["extra"] == 4
    assert loaded["p1"]["load_tstamp"] == dt.datetime(2024, 3, 7, 1)


def test_segment_source_through_column_mapping(spark, home, tmp_path):
    from sessionize_assets.core.schema import SEGMENT_COLUMN_MAPPING

    f = tmp_path / "segment.ndjson"
    f.write_text(
        json.dumps(
            {
                "messageId": "m1",
                "anonymousId": "a1",
                "event": "Signed Up",
                "timestamp": "2024-03-01T10:00:00.000Z",
                "receivedAt": "2024-03-01T10:00:02.000Z",
            }
        )
        + "\n"
    )
    _load(spark, home, [f], settings=Settings(column_mapping=SEGMENT_COLUMN_MAPPING))
    row = _events(spark, home).first()
    assert (row["event_id"], row["domain_userid"], row["event_name"]) == ("m1", "a1", "Signed Up")
    assert row["derived_tstamp"] == dt.datetime(2024, 3, 1, 10)
    assert row["load_date"] == dt.date(2024, 3, 1)


def test_a_column_changing_type_is_an_error_naming_it(spark, home, tmp_path):
    a = tmp_path / "a.ndjson"
    a.write_text(
        json.dumps(
            {
                "event_id": "x1",
                "collector_tstamp": "2024-03-01 10:00:00",
                "load_tstamp": "2024-03-01 10:00:00",
                "score": 3,
            }
        )
        + "\n"
    )
    b = tmp_path / "b.ndjson"
    b.write_text(
        json.dumps(
            {
                "event_id": "x2",
                "collector_tstamp": "2024-03-01 10:00:00",
                "load_tstamp": "2024-03-01 10:00:00",
                "score": {"v": 1},
            }
        )
        + "\n"
    )
    _load(spark, home, [a])
    with pytest.raises(UserError, match="`score`"):
        _load(spark, home, [b])


def test_wrong_paths_are_user_errors(spark, home, tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        _load(spark, home, [tmp_path / "nope.csv"])
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(UserError, match="not a supported file"):
        _load(spark, home, [tmp_path / "notes.txt"])


def test_oracle_events_csv_loads_as_it_is(spark, home):
    report = _load(spark, home, [ORACLE], load_tstamp_from="collector_tstamp")
    assert report.rows_read == 160
    assert report.rows_kept + report.rows_invalid == 160
    assert report.rows_invalid == 0
    events = _events(spark, home)
    assert events.count() == 160
    assert len(events.columns) >= 135
    # Rows without a load_tstamp took it from collector_tstamp; the 65 with one kept theirs,
    # which in this file equal their collector_tstamp: every row's load time is its collector's.
    assert events.where(F.col("load_tstamp").isNull()).count() == 0
    assert events.where(~F.col("load_tstamp").eqNullSafe(F.col("collector_tstamp"))).count() == 0
    assert events.where("load_date is null").count() == 0


def test_each_file_load_goes_through_the_processing_manifest(spark, home, tmp_path):
    from sessionize_assets.core.manifest_state import ItemStatus
    from sessionize_assets.resources.processing_manifest import item_state
    from sessionize_assets.resources.tables import PROCESSING_MANIFEST

    f = tmp_path / "m.csv"
    f.write_text(HEADER + "\ne1,web,page_view,u1,s1,2024-03-01 10:00:00,,2024-03-01 10:00:05,x\n")
    manifest = Home(home).table(PROCESSING_MANIFEST)
    _load(spark, home, [f], manifest_path=manifest)
    state = item_state(manifest, f"file/{file_sha256(f)}")
    assert state.status is ItemStatus.PROCESSED
    assert state.last_processed.payload["rows_kept"] == 1


def _day_file(folder: Path, name: str, day: str, ids: list[str], extra: str = "x") -> Path:
    lines = [HEADER] + [
        f"{i},web,page_view,u1,s1,{day} 10:0{n}:00,,{day} 10:0{n}:05,{extra}"
        for n, i in enumerate(ids)
    ]
    lines.append(f"bad-{name},web,page_view,u1,s1,not-a-time,,{day} 10:09:05,x")
    path = folder / name
    path.write_text("\n".join(lines) + "\n")
    return path


def test_plan_batches_keeps_order_and_caps_files_and_bytes():
    from sessionize_assets.ingest.loader import plan_batches

    assert plan_batches([]) == []
    assert plan_batches([10, 10, 10, 10, 10], max_files=2, max_bytes=1000) == [[0, 1], [2, 3], [4]]
    assert plan_batches([400, 400, 400, 50], max_files=10, max_bytes=1000) == [[0, 1], [2, 3]]
    # A file bigger than the byte cap is a batch of its own; it never empties a batch.
    assert plan_batches([5, 5000, 5], max_files=10, max_bytes=1000) == [[0], [1], [2]]


def test_files_land_in_batches_with_one_commit_per_table(spark, home, tmp_path):
    """Many files: one append per table per batch, one lock and one close commit per batch, and
    the same rows, counts and manifest states as landing them one by one."""
    from deltalake import DeltaTable

    from sessionize_assets.core.manifest_state import ItemStatus
    from sessionize_assets.resources.processing_manifest import item_state
    from sessionize_assets.resources.tables import PROCESSING_MANIFEST

    files = [
        _day_file(tmp_path, f"d{n}.csv", f"2024-03-0{n}", [f"e{n}a", f"e{n}b"]) for n in (1, 2, 3)
    ]
    manifest = Home(home).table(PROCESSING_MANIFEST)
    report = _load(spark, home, files, manifest_path=manifest, max_files=2)
    assert [(f.rows_read, f.rows_kept, f.rows_invalid) for f in report.files] == [(3, 2, 1)] * 3
    assert [Path(f.path).name for f in report.files] == ["d1.csv", "d2.csv", "d3.csv"]
    assert report.files[1].rows_by_load_day == {dt.date(2024, 3, 2): 2}
    assert sorted(r["event_id"] for r in _events(spark, home).collect()) == [
        "e1a", "e1b", "e2a", "e2b", "e3a", "e3b"
    ]  # fmt: skip
    invalid = {r["raw"].split(",")[0]: r["load_date"] for r in _invalid(spark, home).collect()}
    assert invalid == {f"bad-d{n}.csv": dt.date(2024, 3, n) for n in (1, 2, 3)}
    # Two batches (2 files + 1): two appends to each table (versions 0 and 1). Spark creates
    # each table; the second batch's rows, rejected rows and load log row are the driver's
    # appends (`append_from_driver`; `events`' change feed needs nothing of an append), and the
    # driver's appends of rows and rejected rows record the batch's idempotent-write id.
    writers = {
        table: _writers(Home(home).table(table)) for table in (EVENTS, INVALID_EVENTS, LOAD_LOG)
    }
    assert writers == {
        EVENTS: ["Apache-Spark", "delta-rs"],
        INVALID_EVENTS: ["Apache-Spark", "delta-rs"],
        LOAD_LOG: ["Apache-Spark", "delta-rs"],
    }
    from types import SimpleNamespace

    from sessionize_assets.ingest.loader import _batch_txn

    txn = _batch_txn([SimpleNamespace(sha256=file_sha256(files[2]))])
    for table in (EVENTS, INVALID_EVENTS):
        written = DeltaTable(Home(home).table(table))
        assert written.transaction_version(txn["txnAppId"]) == int(txn["txnVersion"])
    history = DeltaTable(manifest).history()
    writes = [h for h in history if h["operation"] != "CREATE TABLE"]
    assert len(writes) == 4  # lock + close per batch
    for f in files:
        state = item_state(manifest, f"file/{file_sha256(f)}")
        assert state.status is ItemStatus.PROCESSED
        assert state.last_processed.payload["rows_kept"] == 2
    # The load id is the file's own (from its content), the same in every table.
    log = {
        r["source_file"]: r["load_id"]
        for r in spark.read.format("delta").load(Home(home).table(LOAD_LOG)).collect()
    }
    events_ids = {r["_source_file"]: r["_load_id"] for r in _events(spark, home).collect()}
    assert log == events_ids


def _writers(path: str) -> list[str]:
    from deltalake import DeltaTable

    commits = sorted(DeltaTable(path).history(), key=lambda h: h["version"])
    return [str(h.get("engineInfo", "")).split("/")[0].split(":")[0] for h in commits]


def test_the_drivers_append_of_a_small_batch_gives_the_rows_and_types_of_sparks(
    spark, tmp_path, monkeypatch
):
    """The Snowplow oracle's 135 columns in two halves, the second appended by the driver (the
    table exists, its columns match), against Spark's load of the whole file: the same types
    and the same rows (apart from the file each came from). A file with a column of its own is
    then Spark's to write (mergeSchema)."""
    from sessionize_assets.resources import delta

    rows = ORACLE.read_text().splitlines()
    halves = [tmp_path / "first.csv", tmp_path / "second.csv"]
    halves[0].write_text("\n".join([rows[0], *rows[1:81]]) + "\n")
    halves[1].write_text("\n".join([rows[0], *rows[81:]]) + "\n")
    for path in halves:
        _load(spark, tmp_path / "driver", [path], load_tstamp_from="collector_tstamp")
    monkeypatch.setattr(delta, "DRIVER_FETCH_ROWS", 0)
    _load(spark, tmp_path / "spark", [ORACLE], load_tstamp_from="collector_tstamp")
    driver, by_spark = _events(spark, tmp_path / "driver"), _events(spark, tmp_path / "spark")
    assert driver.schema == by_spark.schema
    assert driver.count() == 160

    def rows_of(frame):
        plain = frame.drop("_load_id", "_source_file")
        return sorted((r.asDict() for r in plain.collect()), key=lambda r: r["event_id"])

    assert rows_of(driver) == rows_of(by_spark)
    monkeypatch.undo()
    own = _day_file(tmp_path, "own.csv", "2024-03-02", ["x1", "x2"], extra="own")
    _load(spark, tmp_path / "driver", [own])
    assert _writers(Home(tmp_path / "driver").table(EVENTS)) == [
        "Apache-Spark", "delta-rs", "Apache-Spark"
    ]  # fmt: skip
    assert _writers(Home(tmp_path / "spark").table(EVENTS)) == ["Apache-Spark"]
    assert _events(spark, tmp_path / "driver").count() == 162  # own.csv rejects its third row


def test_a_bad_file_stops_the_load_before_anything_is_written(spark, home, tmp_path):
    """A good file, then one whose column clashes with the good file's type: one UserError naming
    the column, and neither file written nor locked."""
    from sessionize_assets.resources.delta import table_exists
    from sessionize_assets.resources.tables import PROCESSING_MANIFEST

    good = _day_file(tmp_path, "good.csv", "2024-03-01", ["g1"])  # custom_col: a string
    clash = tmp_path / "clash.ndjson"
    clash.write_text(
        json.dumps(
            {
                "event_id": "g2",
                "collector_tstamp": "2024-03-01 10:00:00",
                "load_tstamp": "2024-03-01 10:00:05",
                "custom_col": 3,
            }
        )
        + "\n"
    )
    manifest = Home(home).table(PROCESSING_MANIFEST)
    with pytest.raises(UserError, match="`custom_col`"):
        _load(spark, home, [good, clash], manifest_path=manifest)
    for table in (EVENTS, INVALID_EVENTS, LOAD_LOG):
        assert not table_exists(spark, Home(home).table(table))
    assert not table_exists(spark, manifest)


def test_a_load_that_failed_after_its_commit_lands_once_when_retried(spark, home, tmp_path):
    """The events append committed, then the load failed (its load_log write, here): the files
    are fail-locked; once resolved, loading them again adds no second copy of their rows."""
    from sessionize_assets.core.manifest_state import ItemStatus
    from sessionize_assets.resources.processing_manifest import ProcessingManifest, item_state
    from sessionize_assets.resources.tables import PROCESSING_MANIFEST

    files = [
        _day_file(tmp_path, f"r{n}.csv", f"2024-03-0{n}", [f"r{n}a", f"r{n}b"]) for n in (1, 2)
    ]
    manifest_path = Home(home).table(PROCESSING_MANIFEST)
    tables = _tables(home)
    blocked = tmp_path / "not-a-table"
    blocked.write_text("a file where the load log's folder should be")
    with pytest.raises(Exception, match="not-a-table"):  # Delta's error names the blocked path
        load_paths(
            spark,
            files,
            Settings(),
            {**tables, LOAD_LOG: str(blocked / "load_log")},
            NOW,
            manifest_path=manifest_path,
        )
    assert _events(spark, home).count() == 4  # the append had committed
    manifest = ProcessingManifest(spark, manifest_path)
    for f in files:
        item = f"file/{file_sha256(f)}"
        assert item_state(manifest_path, item).status is ItemStatus.FAIL_LOCKED
        manifest.resolve(item, "load log folder fixed")
    # Retried in another grouping (one file per batch): the committed rows are found by load id.
    report = _load(spark, home, files, manifest_path=manifest_path, max_files=1)
    assert [(f.rows_read, f.rows_kept, f.rows_invalid) for f in report.files] == [(3, 2, 1)] * 2
    assert _events(spark, home).count() == 4
    assert _invalid(spark, home).count() == 2
    for f in files:
        assert item_state(manifest_path, f"file/{file_sha256(f)}").status is ItemStatus.PROCESSED


def _age_file(folder: Path) -> Path:
    f = folder / "ages.csv"
    f.write_text(
        "\n".join(
            [
                HEADER,
                "a1,web,page_view,u1,s1,1970-01-01 00:00:00,,2024-03-01 10:00:05,x",  # epoch clock
                "a2,web,page_view,u1,s1,2024-03-01 10:00:00,1999-12-31 23:59:59,2024-03-01 10:00:05,x",
                "a3,web,page_view,u1,s1,2024-01-15 10:00:00,,2024-03-01 10:00:05,x",  # 46 days old
                "a4,web,page_view,u1,s1,2024-03-01 10:00:00,,2024-03-01 10:00:05,x",
            ]
        )
        + "\n"
    )
    return f


def test_an_event_time_implausibly_older_than_its_load_time_is_rejected(spark, home, tmp_path):
    """`max_event_age_days` (default 365) bounds the event time (`derived_tstamp`, else
    `collector_tstamp`) from below, relative to the row's own load time; 0 turns it off."""
    from sessionize_assets.settings import from_mapping

    assert Settings().max_event_age_days == 365
    report = _load(spark, home, [_age_file(tmp_path)])
    assert (report.rows_read, report.rows_kept, report.rows_invalid) == (4, 2, 2)
    reason = "implausible event time: more than 365 days before its load time (max_event_age_days)"
    assert report.files[0].invalid_by_reason == {reason: 2}
    invalid = {r["raw"].split(",")[0]: r for r in _invalid(spark, home).collect()}
    assert set(invalid) == {"a1", "a2"}
    assert {r["load_date"] for r in invalid.values()} == {dt.date(2024, 3, 1)}  # its load day
    assert sorted(r["event_id"] for r in _events(spark, home).collect()) == ["a3", "a4"]

    tighter = _load(
        spark, tmp_path / "h30", [_age_file(tmp_path)], Settings().replace(max_event_age_days=30)
    )
    assert (tighter.rows_kept, tighter.rows_invalid) == (1, 3)
    off = _load(
        spark, tmp_path / "h0", [_age_file(tmp_path)], Settings().replace(max_event_age_days=0)
    )
    assert (off.rows_kept, off.rows_invalid) == (4, 0)
    with pytest.raises(SettingsError, match="`max_event_age_days`"):
        from_mapping({"max_event_age_days": -1})


def test_an_unreadable_csv_header_rejects_that_file_and_the_others_load(spark, home, tmp_path):
    """Binary data named .csv: its lines go to invalid_events with the reason (also with
    --load-tstamp-from, whose column it cannot have); the good file lands."""
    good = _day_file(tmp_path, "good.csv", "2024-03-01", ["g1"])
    binary = tmp_path / "photo.csv"
    binary.write_bytes(b"\x89PNG\xff\xfe\x00\x01,\x02\n\xbe\xef\n")
    report = _load(spark, home, [binary, good], load_tstamp_from="load_tstamp")
    assert [(f.rows_read, f.rows_kept, f.rows_invalid) for f in report.files] == [
        (2, 0, 2),
        (2, 1, 1),
    ]
    [reason] = report.files[0].invalid_by_reason
    assert reason.startswith("unreadable CSV header (not valid utf-8 text; set input_encoding")
    assert report.rows_read == report.rows_kept + report.rows_invalid
    assert [r["event_id"] for r in _events(spark, home).collect()] == ["g1"]
    raws = {r["raw"] for r in _invalid(spark, home).where(F.col("reason") == reason).collect()}
    assert raws == {"\\x89PNG\\xff\\xfe\x00\x01,\x02", "\\xbe\\xef"}


def test_repeated_header_lines_are_rejected_in_every_split_of_a_file(spark, home, tmp_path):
    """A file Spark reads in many splits: only its first line is the header; every later copy
    (in the first split or another) is a row rejected with the reason."""
    lines = [HEADER]
    for n in range(40):
        lines.append(f"s{n},web,page_view,u1,s1,2024-03-01 10:00:00,,2024-03-01 10:00:05,x")
        if n % 10 == 0:
            lines.append(HEADER)
    f = tmp_path / "joined.csv"
    f.write_text("\n".join(lines) + "\n")
    key = "spark.sql.files.maxPartitionBytes"
    before = spark.conf.get(key)
    spark.conf.set(key, "512")
    try:
        assert spark.read.text(str(f)).rdd.getNumPartitions() > 4
        report = _load(spark, home, [f])
    finally:
        spark.conf.set(key, before)
    assert (report.rows_read, report.rows_kept, report.rows_invalid) == (44, 40, 4)
    assert report.files[0].invalid_by_reason == {
        "repeated CSV header line (files joined with cat?)": 4
    }
    assert report.lines()[-1] == "total: read 44 = kept 40 + rejected 4"
    assert {r["raw"] for r in _invalid(spark, home).collect()} == {HEADER}
