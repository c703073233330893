"""`--json` (issue 18): status, verify, manifest list|show and load print one JSON document on
stdout, errors included, with the process's exit status in it (docs/json.md). Run as a user
would (`cli.main`, or its own process) on the shared `two_days` home (conftest.py); every
document is checked against the tables themselves."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from deltalake import DeltaTable, write_deltalake
from jsonschema import Draft202012Validator

from sessionize_assets.cli import main
from sessionize_assets.commands.json_schema import NAMES, rendered, schema_of
from sessionize_assets.home import Home
from sessionize_assets.jars import jars_dir
from sessionize_assets.resources.delta import read_small_table
from sessionize_assets.resources.tables import (
    EVENTS,
    FILTERED_EVENTS,
    INVALID_EVENTS,
    PROCESSING_MANIFEST,
    SESSIONS,
)
from sessionize_assets_tests.conftest import cli_now

ENVELOPE = {"schema", "version", "exit_status", "error"}


def _document(text: str, status: int) -> dict[str, Any]:
    """stdout as exactly one JSON document carrying the process's exit status, valid against its
    published schema (docs/json-schema)."""
    lines = text.splitlines()
    assert len(lines) == 1, text
    doc = json.loads(lines[0])
    assert doc["version"] == 1 and doc["schema"].startswith("sessionize/"), doc
    assert doc["exit_status"] == status, (doc, status)
    schema = schema_of(doc["schema"].removeprefix("sessionize/"))
    errors = [e.message for e in Draft202012Validator(schema).iter_errors(doc)]
    assert not errors, (errors, doc)
    return doc


def test_the_committed_schemas_are_the_code_s_and_valid() -> None:
    folder = Path(__file__).resolve().parents[2] / "docs" / "json-schema"
    assert sorted(p.stem for p in folder.glob("*.json")) == sorted(NAMES)
    for name in NAMES:
        Draft202012Validator.check_schema(schema_of(name))
        assert (folder / f"{name}.json").read_text() == rendered(name), (
            f"docs/json-schema/{name}.json is stale: "
            "python -m sessionize_assets.commands.json_schema docs/json-schema"
        )


def test_the_schemas_refuse_what_the_documents_promise_never_to_be() -> None:
    ok = {"schema": "sessionize/load", "version": 1, "exit_status": 3, "error": None}
    validator = Draft202012Validator(schema_of("load"))
    assert not validator.is_valid(ok)  # a blocked command has an error
    error = {"kind": "blocked", "message": "held by run r"}
    assert validator.is_valid(ok | {"error": error})
    assert not validator.is_valid(ok | {"error": error, "exit_status": 1})
    ran = {
        "schema": "sessionize/load",
        "version": 1,
        "exit_status": 0,
        "error": None,
        "files": [],
        "totals": dict.fromkeys(
            ("files", "files_loaded", "files_skipped", "rows_read", "rows_kept", "rows_rejected"),
            0,
        ),
        "load_days": [],
        "by_load_date": None,
    }
    assert validator.is_valid(ran)
    assert not validator.is_valid({k: v for k, v in ran.items() if k != "by_load_date"})
    assert not validator.is_valid(ran | {"load_days": ["03/01/2024"]})


def _json(capsys, home: Path, *args: str) -> tuple[int, dict[str, Any]]:
    capsys.readouterr()
    status = main(["--home", str(home), *args])
    return status, _document(capsys.readouterr().out, status)


def _copy(two_days, tmp_path: Path) -> Path:
    home = tmp_path / "home"
    shutil.copytree(two_days[0], home)
    return home


def _rows(home: Path, table: str) -> int:
    column = {EVENTS: "event_id", INVALID_EVENTS: "reason"}[table]
    return len(read_small_table(Home(home).table(table), [column]))


def test_status_json_is_the_state_the_text_shows(two_days, capsys):
    home = two_days[0]
    status, doc = _json(capsys, home, *cli_now(3), "status", "--json")
    assert status == 0 and doc["schema"] == "sessionize/status" and doc["error"] is None
    time_based, sessions = doc["time_based"], doc["session_based"]
    assert time_based["failure"] is None and time_based["unreadable"] is None
    assert time_based["run_limits"]["state"] == "standard"
    assert time_based["next_run"]["load_days"] == []  # days 1 and 2 are processed
    assert time_based["pending_filtered_load_days"] == []
    # The session models consumed filtered_events' current version: nothing pending.
    version = DeltaTable(Home(home).table(FILTERED_EVENTS)).version()
    assert sessions["filtered_events_version"] == version
    assert {m["model"] for m in sessions["models"]} >= {"sessions", "users"}
    for model in sessions["models"]:
        assert model["in_manifest"] and model["consumed_version"] == version, model
        assert model["pending_versions"] == 0
    # Every item of the processing manifest is counted, by state.
    records = read_small_table(Home(home).table(PROCESSING_MANIFEST), ["item_id"])
    items = {r["item_id"] for r in records}
    manifest = doc["processing_manifest"]
    assert manifest["items"] == len(items) == sum(manifest["by_state"].values()) > 0
    assert manifest["by_state"]["processed"] == len(items) and manifest["attention"] == []

    # The text is printed from the same data: the same windows.
    assert main(["--home", str(home), *cli_now(3), "status"]) == 0
    text = capsys.readouterr().out
    window = time_based["run_limits"]["window"]
    assert f"next window [{window['start']}, {window['end']})" in text
    assert sessions["run_limits"]["message"] in text

    status, lateness = _json(capsys, home, *cli_now(3), "status", "--lateness", "--json")
    assert lateness["schema"] == "sessionize/status-lateness"
    days = lateness["load_days"]
    assert [d["load_day"] for d in days] == ["2024-03-01", "2024-03-02"]
    assert sum(d["rows"] for d in days) == len(
        read_small_table(Home(home).table(FILTERED_EVENTS), ["event_id"])
    )
    for d in days:
        assert sum(d["rows_by_days_late"].values()) == d["rows"]
        late = sum(n for k, n in d["rows_by_days_late"].items() if int(k) > 0)
        assert d["late_rows"] == late


def test_stdout_holds_the_document_alone_in_its_own_process(two_days):
    """Spark, Dagster and the command's own lines stay off stdout (file descriptor 1 too)."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "sessionize_assets.cli",
            "--home",
            str(two_days[0]),
            *cli_now(3),
            "status",
            "--json",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "SESSIONIZE_JARS_DIR": str(jars_dir())},
        timeout=300,
    )
    doc = _document(result.stdout, result.returncode)
    assert result.returncode == 0 and doc["time_based"]["run_limits"]["state"] == "standard"


def test_load_blocked_by_a_lock_then_resolved_and_loaded(two_days, tmp_path, capsys, spark):
    """A file held by a live run: exit 3 and an error document naming the run; the item in
    `manifest list|show`; once resolved, the load's counts are the rows the tables gained."""
    from sessionize_assets.ingest.loader import expand_paths, file_sha256
    from sessionize_assets.resources.processing_manifest import ProcessingManifest

    home = _copy(two_days, tmp_path)
    folder = str(two_days[1] / "load_date=2024-03-03")
    (path,) = expand_paths([folder])
    item = f"file/{file_sha256(path)}"
    ProcessingManifest(spark, Home(home).table(PROCESSING_MANIFEST)).lock(
        item, "someone", "live-run"
    )
    load = ["load", folder, "--load-tstamp-from", "load_tstamp", "--json"]

    status, doc = _json(capsys, home, *cli_now(4), *load)
    assert status == 3 and set(doc) == ENVELOPE, doc
    assert doc["schema"] == "sessionize/load" and doc["error"]["kind"] == "blocked"
    assert "live-run" in doc["error"]["message"] and str(path) in doc["error"]["message"]

    status, listed = _json(
        capsys, home, *cli_now(4), "manifest", "list", "--state", "locked", "--json"
    )
    assert status == 0 and listed["filter"] == {"state": "locked", "item_prefix": None}
    (row,) = listed["items"]
    assert row["item_id"] == item and row["state"] == "locked"
    assert row["holder_run_id"] == "live-run" and row["lock_age_seconds"] >= 0
    status, shown = _json(capsys, home, *cli_now(4), "manifest", "show", item, "--json")
    assert shown["item"]["state"] == "locked" and shown["item"]["record_count"] == 1
    assert [(r["state"], r["run_id"]) for r in shown["records"]] == [("Processing", "live-run")]

    assert main(["--home", str(home), "manifest", "resolve", item, "--reason", "test"]) == 0
    before = _rows(home, EVENTS), _rows(home, INVALID_EVENTS)
    status, doc = _json(capsys, home, *cli_now(4), *load)
    assert status == 0 and doc["error"] is None, doc
    (loaded,) = doc["files"]
    assert loaded["status"] == "loaded" and loaded["path"] == str(path)
    totals = doc["totals"]
    assert totals["rows_kept"] == _rows(home, EVENTS) - before[0] > 0
    assert totals["rows_rejected"] == _rows(home, INVALID_EVENTS) - before[1]
    assert totals["rows_read"] == totals["rows_kept"] + totals["rows_rejected"]
    assert sum(loaded["rows_by_load_day"].values()) == loaded["rows_kept"]
    assert sum(loaded["rejected_by_reason"].values()) == loaded["rows_rejected"]
    assert doc["load_days"] == ["2024-03-03"] and doc["by_load_date"] is None

    status, again = _json(capsys, home, *cli_now(4), *load)
    assert status == 0 and again["totals"]["files_skipped"] == 1
    assert again["files"][0]["status"] == "skipped" and again["totals"]["rows_kept"] == 0
    assert _rows(home, EVENTS) - before[0] == totals["rows_kept"]


def test_verify_names_a_planted_difference_with_exit_1(two_days, tmp_path, capsys):
    home = _copy(two_days, tmp_path)
    path = Home(home).table(SESSIONS)
    table = DeltaTable(path).to_pyarrow_table()
    deleted = table.column("session_identifier")[0].as_py()
    write_deltalake(path, table.slice(1), mode="overwrite")

    # --replay (id mode, this home's): the lifecycle memory replayed from the recorded runs,
    # which agrees with the stored manifest (the planted difference is in sessions alone).
    status, doc = _json(capsys, home, *cli_now(3), "verify", "--replay", "--json")
    assert status == 1 and doc["error"] is None and doc["ok"] is False
    assert doc["session_based"]["lifecycle_runs_replayed"] >= 1, doc["session_based"]
    assert doc["session_based"]["lifecycle_taken_as_given"] is None
    checks = {(c["branch"], c["table"], c["check"]): c for c in doc["checks"]}
    assert checks[("session_based", "sessions_lifecycle_manifest", "recompute")]["differences"] == 0
    sessions = checks[("session_based", "sessions", "recompute")]
    assert sessions["rows_compared"] == table.num_rows
    assert {"table": "sessions", "kind": "missing", "key": deleted} in [
        {k: d[k] for k in ("table", "kind", "key")} for d in sessions["details"]
    ]
    assert sessions["differences"] == len(sessions["details"]) >= 1
    others = [c for key, c in checks.items() if key[1] != "sessions"]
    assert others and all(c["differences"] == 0 for c in others), others
    assert {"accounting", "duplicates", "recompute", "consistency", "listing"} == {
        c["check"] for c in doc["checks"]
    }
    assert doc["differences"] == sum(c["differences"] for c in doc["checks"])


def test_errors_are_documents_with_the_exit_status(two_days, tmp_path, capsys):
    # A bad setting: 2, the same sentence as on stderr, no content.
    bad = tmp_path / "bad.yaml"
    bad.write_text("reprocess_days: many\n")
    status, doc = _json(capsys, two_days[0], "--config", str(bad), "verify", "--json")
    assert status == 2 and set(doc) == ENVELOPE
    assert doc["error"]["kind"] == "user_error" and "`reprocess_days`" in doc["error"]["message"]
    capsys.readouterr()
    main(["--home", str(two_days[0]), "--config", str(bad), "verify"])
    assert capsys.readouterr().err.strip() == f"error: {doc['error']['message']}"

    # An argument argparse rejects, and an item without records.
    status, doc = _json(capsys, two_days[0], "manifest", "list", "--json", "--state")
    assert status == 2 and doc["schema"] == "sessionize/manifest-list"
    assert "--state" in doc["error"]["message"]
    status, doc = _json(capsys, two_days[0], "manifest", "show", "nope/1", "--json")
    assert status == 2 and "no records" in doc["error"]["message"]

    # A table that cannot be read: a failed step, 4, naming where the trace is.
    home = _copy(two_days, tmp_path)
    log = sorted((Path(Home(home).table(PROCESSING_MANIFEST)) / "_delta_log").glob("*.json"))
    log[-1].write_text('{"garbage')
    status, doc = _json(capsys, home, *cli_now(3), "manifest", "list", "--json")
    assert status == 4 and doc["error"]["kind"] == "failed" and set(doc) == ENVELOPE
    assert "engine.log" in doc["error"]["message"]
