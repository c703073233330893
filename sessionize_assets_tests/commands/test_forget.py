"""`sessionize forget` on real Spark + Delta through the command line: a user's rows leave every
table, what they changed is recomputed (`verify` passes), the request is recorded without the id,
and a late event of the same user is new data: it comes back alone, and a backfill of the load days
the user was forgotten from brings nothing else back."""

from __future__ import annotations

import csv
import datetime as dt
import shutil
from pathlib import Path

from deltalake import DeltaTable
from pyspark.sql import functions as F

from sessionize_assets.cli import main
from sessionize_assets.home import Home
from sessionize_assets.resources.tables import EVENTS, FILTERED_EVENTS, FORGET_LOG, SESSIONS
from sessionize_assets_tests.conftest import TWO_DAYS_START, cli_now


def _tables(home: Path) -> list[Path]:
    warehouse = Path(Home(home).table(EVENTS)).parent
    return sorted(p for p in warehouse.iterdir() if (p / "_delta_log").is_dir())


def _rows_naming(home: Path, text: str) -> dict[str, int]:
    """Per table, the rows of which any value (as text) holds `text` (delta-rs: the tables are
    small)."""
    found = {}
    for path in _tables(home):
        rows = sum(
            text in repr(row) for row in DeltaTable(str(path)).to_pyarrow_table().to_pylist()
        )
        if rows:
            found[path.name] = rows
    return found


def _late_copy(landing: Path, user: str, folder: Path) -> str:
    """One of the user's rows of load day 1, landed again with load day 3's load time."""
    source = next((landing / f"load_date={TWO_DAYS_START}").glob("*.csv"))
    with open(source, newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        row = next(r for r in reader if r["domain_userid"] == user)
        fields = reader.fieldnames
    row["load_tstamp"] = "2024-03-03 10:00:00.000"
    folder.mkdir(parents=True)
    with open(folder / "late.csv", "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        writer.writerow(row)
    return row["event_id"]


def test_forget_removes_a_user_everywhere_and_a_late_event_comes_back_alone(
    spark, two_days, tmp_path, capsys
):
    home = tmp_path / "home"
    shutil.copytree(two_days[0], home)
    landing = two_days[1]
    cli = ["--home", str(home), *cli_now(3)]
    events = spark.read.format("delta").load(Home(home).table(EVENTS))
    pick = (
        events.groupBy("domain_userid")
        .agg(F.countDistinct("load_date").alias("days"), F.count(F.lit(1)).alias("rows"))
        .filter("days = 2")
        .orderBy(F.desc("rows"), "domain_userid")
        .first()
    )
    user, rows = pick["domain_userid"], pick["rows"]
    before = _rows_naming(home, user)
    assert {EVENTS, FILTERED_EVENTS, SESSIONS, "users", "daily_aggregates"} <= set(before)

    capsys.readouterr()
    assert main([*cli, "forget", user]) == 2
    assert "confirm it with --yes" in capsys.readouterr().err
    assert main([*cli, "forget"]) == 2
    assert "at least one user id" in capsys.readouterr().err

    # Settings changed since the models were built: refused before anything is deleted.
    settings_file = home / "sessionize.yaml"
    kept = settings_file.read_text()
    settings_file.write_text(kept + "dedupe_lookback_days: 5\n")
    assert main([*cli, "forget", user, "--yes"]) == 2
    assert "dedupe_lookback_days changed from 3 to 5" in capsys.readouterr().err
    assert _rows_naming(home, user) == before
    settings_file.write_text(kept)

    assert main([*cli, "forget", user, "--yes", "--reason", "ticket 42"]) == 0, capsys.readouterr()
    out = capsys.readouterr().out
    assert f"events: {rows} rows deleted" in out, out
    assert "removed after the redo" not in out, out  # the recompute itself removed them
    assert "re-materialized for 2024-03-01..2024-03-02" in out, out
    assert _rows_naming(home, user) == {}
    assert main([*cli, "verify"]) == 0, capsys.readouterr()

    log = DeltaTable(Home(home).table(FORGET_LOG)).to_pyarrow_table().to_pylist()
    assert len(log) == 1 and log[0]["users"] == 1 and log[0]["reason"] == "ticket 42"
    assert dict(log[0]["rows_deleted"])[EVENTS] == rows
    assert user not in repr(log)

    # A late copy of one of the deleted events arrives on load day 3: it is new data, processed
    # alone; nothing else of the user comes back, neither then nor through a backfill.
    event_id = _late_copy(landing, user, tmp_path / "late" / "load_date=2024-03-03")
    later = ["--home", str(home), *cli_now(4)]
    load = [str(tmp_path / "late"), "--load-tstamp-from", "load_tstamp"]
    assert main([*later, "load", *load]) == 0, capsys.readouterr()
    assert main([*later, "run"]) == 0, capsys.readouterr()
    filtered = spark.read.format("delta").load(Home(home).table(FILTERED_EVENTS))
    sessions = spark.read.format("delta").load(Home(home).table(SESSIONS))
    for step in ("after the run", "after a backfill of the load days it was forgotten from"):
        mine = filtered.filter(F.col("domain_userid") == user).collect()
        assert [(r["event_id"], r["load_date"]) for r in mine] == [
            (event_id, dt.date(2024, 3, 3))
        ], step
        theirs = sessions.filter(F.col("user_identifier") == user).collect()
        assert [r["total_events"] for r in theirs] == [1], step
        if step == "after the run":
            backfill = ["backfill", "--start", "2024-03-01", "--end", "2024-03-02"]
            assert main([*later, *backfill]) == 0, capsys.readouterr()
            filtered = spark.read.format("delta").load(Home(home).table(FILTERED_EVENTS))
            sessions = spark.read.format("delta").load(Home(home).table(SESSIONS))
