"""A malformed-input corpus through `sessionize load` (in-process `main`): the exact outcome per
file, every row accounted for, nothing altered silently."""

from __future__ import annotations

import codecs
import json
from pathlib import Path

import pytest

from sessionize_assets.cli import main
from sessionize_assets.home import Home
from sessionize_assets.resources.tables import EVENTS, INVALID_EVENTS, LOAD_LOG
from sessionize_assets_tests.conftest import preserved_environment

HEADER = (
    "event_id,app_id,event_name,domain_userid,domain_sessionid,collector_tstamp,load_tstamp,note"
)
NOW = "2024-03-10T12:00:00"


def _row(
    event_id: str,
    collector: str = "2024-03-01 10:00:00",
    load: str = "2024-03-01 10:00:05",
    note: str = "n",
) -> str:
    return f"{event_id},web,page_view,u1,s1,{collector},{load},{note}"


def _json_event(event_id: str) -> dict:
    return {
        "event_id": event_id,
        "app_id": "web",
        "event_name": "page_view",
        "domain_userid": "u1",
        "domain_sessionid": "s1",
        "collector_tstamp": "2024-03-02T10:00:00Z",
        "load_tstamp": "2024-03-02T10:00:05Z",
    }


# name -> (bytes, read, kept, {reason prefix: rows})
def _corpus() -> dict[str, tuple[bytes, int, int, dict[str, int]]]:
    long_rows = "\n".join(_row(f"long-{i}", note="x" * 40) for i in range(250))  # > 8 KB
    return {
        # Excel's "CSV UTF-8": a byte-order mark before the header.
        "bom.csv": (
            codecs.BOM_UTF8 + f"{HEADER}\n{_row('bom-1')}\n{_row('bom-2')}\n".encode(),
            2,
            2,
            {},
        ),
        # Bytes that are not UTF-8 far after the first 8 KB.
        "late_bad_bytes.csv": (
            f"{HEADER}\n{long_rows}\n".encode()
            + _row("bad-1", note="caf").encode()
            + b"\xe9\n"
            + f"{_row('late-ok')}\n".encode(),
            252,
            251,
            {"undecodable bytes": 1},
        ),
        # latin-1 bytes on the first data line (UTF-8 expected): that row only is rejected.
        "latin1_early.csv": (
            f"{HEADER}\n".encode()
            + _row("lat-1", note="caf").encode()
            + b"\xe9\n"
            + f"{_row('lat-2')}\n".encode(),
            2,
            1,
            {"undecodable bytes": 1},
        ),
        # Load times in 1970 and 2100 would create load days that are never processed.
        "implausible.csv": (
            "\n".join(
                [
                    HEADER,
                    _row("old", collector="1970-01-01 00:00:00", load="1970-01-01 00:00:01"),
                    _row("future", collector="2100-01-01 00:00:00", load="2100-01-01 00:00:01"),
                    _row("plausible"),
                ]
            ).encode()
            + b"\n",
            3,
            1,
            {"implausible load time": 2},
        ),
        # A one-line JSON array holding two events, and a plain object line.
        "array.json": (
            (
                json.dumps([_json_event("arr-1"), _json_event("arr-2")])
                + "\n"
                + json.dumps(_json_event("obj-1"))
                + "\n"
            ).encode(),
            3,
            3,
            {},
        ),
        # Common RFC 3339 / ISO 8601 spellings.
        "timestamps.csv": (
            "\n".join(
                [
                    HEADER,
                    _row(
                        "space-offset", "2024-03-01 10:00:00 +01:00", "2024-03-01 10:00:05 +01:00"
                    ),
                    _row(
                        "nanos", "2024-03-01T10:00:00.123456789Z", "2024-03-01T10:00:05.987654321Z"
                    ),
                    _row("no-colon", "2024-03-01T10:00:00+0000", "2024-03-01T10:00:05+0000"),
                ]
            ).encode()
            + b"\n",
            3,
            3,
            {},
        ),
        # Binary data in a JSON file: every line rejected, the command goes on.
        "binary.json": (b"\x00\xff\xfe\x89PNG\n\xde\xad\xbe\xef\n", 2, 0, {"undecodable bytes": 2}),
        # Binary data in a CSV file: no header to read, so every line (the first one too) is
        # rejected, and the other files of the command still load.
        "binary.csv": (
            b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\n\xde\xad,\xbe\xef\n",
            5,
            0,
            {"unreadable CSV header (not valid utf-8": 5},
        ),
        # Binary bytes that happen to be valid UTF-8: control characters are no column names.
        "control_header.csv": (b"\x00\x01,,\x02\n\x03\x04\n", 2, 0, {"unreadable CSV header": 2}),
        # Starts like UTF-16 (FF FE) but is not: read as input_encoding says, not an error.
        "fake_utf16.csv": (b"\xff\xfe\x00\xd8\x01\n\x02\n", 2, 0, {"unreadable CSV header": 2}),
        # Two exports joined with `cat` (the second one an Excel "CSV UTF-8" with its BOM): the
        # repeated header lines are rows rejected with a reason, not dropped unseen.
        "concatenated.csv": (
            f"{HEADER}\n{_row('cat-1')}\n{HEADER}\n{_row('cat-2')}\n".encode()
            + codecs.BOM_UTF8
            + f"{HEADER}\n{_row('cat-3')}\n".encode(),
            5,
            3,
            {"repeated CSV header line": 2},
        ),
        # A device clock at 1970 (with a plausible load time): no event day in 1970.
        "old_event_time.csv": (
            "\n".join(
                [
                    HEADER,
                    _row("epoch", collector="1970-01-01 00:00:00"),
                    _row("year-old", collector="2023-03-01 10:00:04"),  # 366 days before
                    _row("recent", collector="2023-03-02 10:00:06"),  # 365 days before: kept
                ]
            ).encode()
            + b"\n",
            3,
            1,
            {"implausible event time: more than 365 days before its load time": 2},
        ),
    }


@pytest.fixture(scope="module")
def loaded(spark, tmp_path_factory):
    """The corpus landed with one `sessionize load` call."""
    folder = tmp_path_factory.mktemp("corpus")
    home = tmp_path_factory.mktemp("home")
    corpus = _corpus()
    for name, (data, *_rest) in corpus.items():
        (folder / name).write_bytes(data)
    with preserved_environment():
        code = main(["--home", str(home), "--now", NOW, "load", str(folder)])
    assert code == 0
    return spark, Home(home), corpus, folder


def test_every_file_is_accounted_for_exactly(loaded) -> None:
    spark, home, corpus, folder = loaded
    log = {
        Path(r["source_file"]).name: r
        for r in spark.read.format("delta").load(home.table(LOAD_LOG)).collect()
    }
    invalid = spark.read.format("delta").load(home.table(INVALID_EVENTS)).collect()
    for name, (_, read, kept, reasons) in corpus.items():
        row = log[name]
        assert (row["rows_read"], row["rows_kept"], row["rows_invalid"]) == (
            read,
            kept,
            read - kept,
        ), name
        mine = [r for r in invalid if Path(r["_source_file"]).name == name]
        for prefix, n in reasons.items():
            assert sum(r["reason"].startswith(prefix) for r in mine) == n, (name, prefix)
        assert len(mine) == read - kept, name


def test_bom_does_not_rename_the_first_column(loaded) -> None:
    spark, home, *_ = loaded
    events = spark.read.format("delta").load(home.table(EVENTS))
    assert not [c for c in events.columns if c.startswith("\ufeff")]
    rows = events.where("event_id LIKE 'bom-%'").collect()
    assert sorted(r["event_id"] for r in rows) == ["bom-1", "bom-2"]


def test_undecodable_rows_keep_their_bytes_escaped_and_nothing_is_replaced(loaded) -> None:
    spark, home, *_ = loaded
    invalid = spark.read.format("delta").load(home.table(INVALID_EVENTS))
    raws = [r["raw"] for r in invalid.where("reason LIKE 'undecodable%'").collect()]
    assert any(raw.endswith("caf\\xe9") and raw.startswith("bad-1,") for raw in raws)
    assert any("\\xff\\xfe\\x89PNG" in raw for raw in raws)
    events = spark.read.format("delta").load(home.table(EVENTS))
    assert events.where("note LIKE '%\ufffd%'").count() == 0
    assert events.where("event_id IN ('late-ok', 'lat-2')").count() == 2


def test_implausible_load_times_create_no_load_day(loaded) -> None:
    spark, home, *_ = loaded
    days = {
        r["load_date"].year
        for r in spark.read.format("delta")
        .load(home.table(EVENTS))
        .select("load_date")
        .distinct()
        .collect()
    }
    assert days == {2024}
    invalid_days = {
        r["load_date"].year
        for r in spark.read.format("delta")
        .load(home.table(INVALID_EVENTS))
        .select("load_date")
        .distinct()
        .collect()
    }
    assert invalid_days == {2024}


def test_timestamp_spellings_parse_to_the_same_instant(loaded) -> None:
    spark, home, *_ = loaded
    events = (
        spark.read.format("delta")
        .load(home.table(EVENTS))
        .where("event_id IN ('space-offset', 'nanos', 'no-colon')")
    )
    got = {r["event_id"]: r["collector_tstamp"].isoformat() for r in events.collect()}
    assert got == {
        "space-offset": "2024-03-01T09:00:00",
        "nanos": "2024-03-01T10:00:00.123456",
        "no-colon": "2024-03-01T10:00:00",
    }


def test_json_array_elements_are_rows(loaded) -> None:
    spark, home, *_ = loaded
    events = spark.read.format("delta").load(home.table(EVENTS))
    ids = sorted(
        r["event_id"] for r in events.where("event_id IN ('arr-1', 'arr-2', 'obj-1')").collect()
    )
    assert ids == ["arr-1", "arr-2", "obj-1"]


def test_input_encoding_latin1_keeps_the_row(spark, tmp_path) -> None:
    f = tmp_path / "latin1.csv"
    f.write_bytes(f"{HEADER}\n".encode() + _row("lat-1", note="caf").encode() + b"\xe9\n")
    home = tmp_path / "home"
    home.mkdir()
    (home / "sessionize.yaml").write_text("input_encoding: latin-1\n")
    assert main(["--home", str(home), "--now", NOW, "load", str(f)]) == 0
    rows = spark.read.format("delta").load(Home(home).table(EVENTS)).collect()
    assert [(r["event_id"], r["note"]) for r in rows] == [("lat-1", "caf\u00e9")]


def test_unreadable_csv_header_rejects_its_lines_with_their_bytes(loaded) -> None:
    spark, home, *_ = loaded
    invalid = spark.read.format("delta").load(home.table(INVALID_EVENTS))
    rows = invalid.where("_source_file LIKE '%/binary.csv'").collect()
    assert rows and all(r["reason"].startswith("unreadable CSV header") for r in rows)
    assert "\\x89PNG" in {r["raw"] for r in rows}
    # Filed under the command's day (no load time could be read), not lost.
    assert {str(r["load_date"]) for r in rows} == {NOW[:10]}


def test_repeated_header_lines_are_rejected_rows(loaded) -> None:
    spark, home, *_ = loaded
    invalid = spark.read.format("delta").load(home.table(INVALID_EVENTS))
    raws = sorted(r["raw"] for r in invalid.where("reason LIKE 'repeated CSV header%'").collect())
    assert raws == [HEADER, "\ufeff" + HEADER]
    events = spark.read.format("delta").load(home.table(EVENTS))
    ids = sorted(r["event_id"] for r in events.where("event_id LIKE 'cat-%'").collect())
    assert ids == ["cat-1", "cat-2", "cat-3"]


def test_an_implausibly_old_event_time_creates_no_event_day(loaded) -> None:
    spark, home, *_ = loaded
    events = spark.read.format("delta").load(home.table(EVENTS))
    assert events.where("year(derived_tstamp) < 2023").count() == 0
    assert events.where("event_id = 'recent'").count() == 1
    invalid = spark.read.format("delta").load(home.table(INVALID_EVENTS))
    rows = invalid.where("reason LIKE 'implausible event time%'").collect()
    # The load time is plausible: the row is filed under its own load day.
    assert {str(r["load_date"]) for r in rows} == {"2024-03-01"}
