"""`sessionize manifest list/show/resolve/skip` and status lines, on a real manifest table."""

from __future__ import annotations

import datetime as dt

import pytest

from sessionize_assets.commands.manifest import (
    ItemRow,
    list_items,
    manifest_rows,
    manifest_status_lines,
    parse_status,
    resolve_item,
    show_item,
    skip_item,
)
from sessionize_assets.core.manifest_state import ItemStatus
from sessionize_assets.errors import UserError
from sessionize_assets.resources.processing_manifest import ProcessingManifest, item_state

T0 = dt.datetime(2024, 3, 1, 12, 0, tzinfo=dt.UTC)
LATER = T0 + dt.timedelta(hours=3, minutes=12)


@pytest.fixture(scope="module")
def populated(spark, tmp_path_factory):
    """A manifest with one item in each state, its records at T0 + 0, 1, 2, ... minutes."""
    path = str(tmp_path_factory.mktemp("cmd") / "processing_manifest")
    clock = {"now": T0}
    manifest = ProcessingManifest(spark, path, clock=lambda: clock["now"])

    def at(minute: int) -> None:
        clock["now"] = T0 + dt.timedelta(minutes=minute)

    at(0)
    lock = manifest.lock("filtered_events/2024-03-01", "filtered_events", "run-1")
    at(1)
    manifest.complete(lock, {"rows": 5})
    at(2)
    manifest.lock("filtered_events/2024-03-02", "filtered_events", "run-2")
    at(3)
    lock = manifest.lock("daily_aggregates/2024-03-01", "daily_aggregates", "run-3")
    at(4)
    manifest.fail(lock, "boom")
    at(5)
    manifest.skip("landing/bad.tsv", "corrupt file", run_id="op-0")
    return manifest


def test_list_all_items_with_state_holder_and_age(populated):
    rows = manifest_rows(populated.path, now=LATER)
    assert [(r.item_id, r.status) for r in rows] == [
        ("daily_aggregates/2024-03-01", "fail-locked"),
        ("filtered_events/2024-03-01", "processed"),
        ("filtered_events/2024-03-02", "locked"),
        ("landing/bad.tsv", "skipped"),
    ]
    locked = rows[2]
    assert locked == ItemRow(
        item_id="filtered_events/2024-03-02",
        status="locked",
        holder_run_id="run-2",
        application="filtered_events",
        age="3h 10m",
        last_record_at=T0 + dt.timedelta(minutes=2),
        records=1,
        reason="locked by run run-2 (filtered_events)",
    )
    assert rows[0].reason == "boom" and rows[3].reason == "corrupt file"
    text = list_items(populated.path, now=LATER)
    assert text.splitlines()[0].split() == [
        "ITEM",
        "STATE",
        "RUN",
        "AGE",
        "LAST",
        "RECORD",
        "RECORDS",
        "REASON",
    ]
    assert len(text.splitlines()) == 5


def test_list_filters_by_state_and_prefix(populated):
    assert [r.item_id for r in manifest_rows(populated.path, state="locked")] == [
        "filtered_events/2024-03-02"
    ]
    assert [r.item_id for r in manifest_rows(populated.path, state="failed")] == [
        "daily_aggregates/2024-03-01"
    ]
    assert [r.item_id for r in manifest_rows(populated.path, item_prefix="filtered_events/")] == [
        "filtered_events/2024-03-01",
        "filtered_events/2024-03-02",
    ]
    assert (
        list_items(populated.path, state="invalid") == "No items in the processing manifest match."
    )
    with pytest.raises(UserError, match="Unknown manifest state 'stuck'"):
        list_items(populated.path, state="stuck")
    assert parse_status("Fail-Locked") is ItemStatus.FAIL_LOCKED and parse_status(None) is None


def test_show_prints_the_state_then_the_records_in_order(populated):
    text = show_item(populated.path, "filtered_events/2024-03-01", now=LATER)
    lines = text.splitlines()
    assert lines[0] == "Item filtered_events/2024-03-01 is processed."
    assert [line.split()[1] for line in lines[2:]] == ["Processing", "Processed"]
    assert '{"rows": 5}' in lines[3]
    with pytest.raises(UserError, match="no records"):
        show_item(populated.path, "nope/1")


def test_status_lines_name_locked_and_failed_items(populated):
    lines = manifest_status_lines(populated.path, now=LATER)
    assert lines[0] == (
        "processing manifest: 4 items (1 locked, 1 fail-locked, 1 skipped, 1 processed)"
    )
    assert any(
        "locked" in line
        and "filtered_events/2024-03-02" in line
        and "run run-2" in line
        and "3h 10m" in line
        for line in lines
    )
    assert any("fail-locked" in line and "run-3" in line and ": boom" in line for line in lines)
    assert "landing/bad.tsv" not in "\n".join(lines)
    assert lines[-1].startswith("  (release with")


def test_resolve_abandons_a_stale_lock_then_resolves_and_skip_is_final(spark, tmp_path):
    manifest = ProcessingManifest(spark, str(tmp_path / "processing_manifest"))
    manifest.lock("sessions/2024-03-01", "sessions", "crashed")
    message = resolve_item(manifest, "sessions/2024-03-01", "run was killed")
    assert message == (
        "Abandoned the lock of run crashed on item sessions/2024-03-01 and resolved it: run was killed."
    )
    state = item_state(manifest.path, "sessions/2024-03-01")
    assert state.status is ItemStatus.FREE
    assert [r.state.value for r in state.records] == ["Processing", "Failed", "Resolved"]
    with pytest.raises(UserError, match="is free; there is nothing to resolve"):
        resolve_item(manifest, "sessions/2024-03-01", "again")

    manifest.fail(manifest.lock("sessions/2024-03-01", "sessions", "run-2"), "bad input")
    assert "Resolved the failure of run run-2" in resolve_item(
        manifest, "sessions/2024-03-01", "fixed"
    )
    assert skip_item(manifest, "sessions/2024-03-01", "not needed") == (
        "Skipped item sessions/2024-03-01: not needed."
    )
    assert item_state(manifest.path, "sessions/2024-03-01").status is ItemStatus.SKIPPED


def test_lock_ages_are_wall_clock_ages_under_now(spark, tmp_path, capsys):
    """Lock records carry the wall clock; `manifest list`, `show` and `status` measure their age on
    it too, so a replay's `--now` in the past does not turn a two-hour-old lock into "0s"."""
    from sessionize_assets.cli import main
    from sessionize_assets.core.clock import utc_now
    from sessionize_assets.home import Home

    home = tmp_path / "home"
    home.mkdir()
    (home / "sessionize.yaml").write_text("start_date: 2024-03-01\n")
    path = Home(home).table("processing_manifest")
    two_hours_ago = utc_now() - dt.timedelta(hours=2, minutes=5)
    ProcessingManifest(spark, path, clock=lambda: two_hours_ago).lock(
        "filtered_events/2024-03-02", "filtered_events", "run-9"
    )
    cli = ["--home", str(home), "--now", "2024-03-03T00:00:00"]
    capsys.readouterr()
    assert main([*cli, "manifest", "list"]) == 0
    listed = capsys.readouterr().out
    assert "2h 5m" in listed or "2h 6m" in listed, listed
    assert main([*cli, "manifest", "show", "filtered_events/2024-03-02"]) == 0
    shown = capsys.readouterr().out
    assert "2h 5m" in shown or "2h 6m" in shown, shown
