"""`sessionize load --by-load-date`: landing folders of load days as cursor windows per source."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from sessionize_assets.cli import main
from sessionize_assets.commands.loading import load_by_load_date
from sessionize_assets.core.cursor import CursorState
from sessionize_assets.errors import UserError


def t(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text).replace(tzinfo=dt.UTC)


def make_source(root: Path, *days: str) -> Path:
    for day in days:
        (root / f"load_date={day}").mkdir(parents=True)
        (root / f"load_date={day}" / "events.csv").write_text("x\n")
    (root / "_manifest.json").write_text("{}")  # not a load day: ignored
    return root


class Recorder:
    def __init__(self, fail_on: str | None = None) -> None:
        self.loads: list[list[str]] = []
        self.checkpoints: list[CursorState] = []
        self.fail_on = fail_on

    def load(self, folders: list[Path]) -> None:
        names = [f.name.removeprefix("load_date=") for f in folders]
        if self.fail_on in names:
            raise RuntimeError(f"cannot read {self.fail_on}")
        self.loads.append(names)

    def checkpoint(self, state: CursorState) -> None:
        self.checkpoints.append(state)


def test_days_up_to_now_then_only_new_days_with_the_lookback(tmp_path):
    web = make_source(tmp_path / "web", "2024-03-01", "2024-03-02", "2024-03-03", "2024-03-05")
    first = Recorder()
    state, report = load_by_load_date(
        [web], CursorState(), first.load, first.checkpoint, t("2024-03-03T06:00:00")
    )
    assert first.loads == [["2024-03-01"], ["2024-03-02"], ["2024-03-03"]]  # 03-05 is not yet
    key = str(web.resolve())
    assert state.partitions == {key: t("2024-03-03T06:00:00")}
    assert state.global_cursor == t("2024-03-03T06:00:00")
    assert len(first.checkpoints) == 4  # after each window that loaded, then the global cursor
    assert "web [2024-03-03T00:00:00+00:00, 2024-03-03T06:00:00+00:00)" in report.lines()[2]

    second = Recorder()
    state, _ = load_by_load_date(
        [web], state, second.load, second.checkpoint, t("2024-03-06T01:00:00")
    )
    # the lookback (P1D) lists 03-02 and 03-03 again (the loader skips files it has by content)
    assert second.loads == [["2024-03-02"], ["2024-03-03"], ["2024-03-05"]]
    third = Recorder()
    load_by_load_date(
        [web], state, third.load, third.checkpoint, t("2024-03-06T02:00:00"), lookback="P0D"
    )
    assert third.loads == []


def test_a_failed_window_resumes_there_per_source(tmp_path):
    web = make_source(tmp_path / "web", "2024-03-01", "2024-03-02", "2024-03-03")
    app = make_source(tmp_path / "app", "2024-03-01", "2024-03-02")
    now = t("2024-03-04T00:00:00")
    failing = Recorder(fail_on="2024-03-02")
    saved: list[CursorState] = []
    with pytest.raises(RuntimeError, match="cannot read 2024-03-02"):
        load_by_load_date(
            [web, app], CursorState(), failing.load, saved.append, now, lookback="P0D"
        )
    state = saved[-1]
    # sources are taken in path order: app's 03-01 loaded and checkpointed, then its 03-02 failed
    assert failing.loads == [["2024-03-01"]]
    assert state.partitions == {str(app.resolve()): t("2024-03-02T00:00:00")}

    retry = Recorder()
    final, _ = load_by_load_date(
        [web, app], state, retry.load, retry.checkpoint, now, lookback="P0D"
    )
    assert retry.loads == [["2024-03-02"], ["2024-03-01"], ["2024-03-02"], ["2024-03-03"]]
    assert set(final.partitions.values()) == {now}


def test_more_sources_than_max_partitions_fall_back_to_the_global_cursor(tmp_path):
    sources = [make_source(tmp_path / f"s{i}", "2024-03-01", "2024-03-02") for i in range(3)]
    state = CursorState(partitions={str(sources[0].resolve()): t("2024-03-02T00:00:00")})
    rec = Recorder()
    final, report = load_by_load_date(
        sources, state, rec.load, rec.checkpoint, t("2024-03-03T00:00:00"),
        lookback="P0D", max_partitions=2,
    )  # fmt: skip
    assert rec.checkpoints[0].use_global_cursor  # the switch is checkpointed first
    assert final.use_global_cursor and final.global_cursor == t("2024-03-03T00:00:00")
    # from the smallest known cursor (s0's 03-02): every source's 03-02, none skipped
    assert [sorted(x) for x in rec.loads] == [["2024-03-02"] * 3]
    assert report.use_global_cursor


def test_not_a_folder_is_one_sentence(tmp_path):
    with pytest.raises(UserError, match="is not a folder"):
        load_by_load_date(
            [tmp_path / "missing"], CursorState(), print, print, t("2024-03-01T00:00:00")
        )


def test_the_command_loads_each_file_once_across_calls(spark, tmp_path, capsys):
    from sessionize_assets.generator import generate
    from sessionize_assets.home import Home
    from sessionize_assets.resources.cursor_store import read_cursor_state
    from sessionize_assets.resources.delta import read_small_table

    landing = tmp_path / "landing"
    summary = generate(landing, start_date="2024-03-01", days=3, events_per_day=40, seed=3)
    home = tmp_path / "home"
    args = ["load", "--by-load-date", str(landing), "--load-tstamp-from", "load_tstamp"]
    assert main(["--home", str(home), "--now", "2024-03-02T12:00:00", *args]) == 0
    first = capsys.readouterr().out
    assert "load days 2024-03-01" in first and "load days 2024-03-02" in first
    assert "2024-03-03" not in first
    assert main(["--home", str(home), "--now", "2024-03-04T00:30:00", *args]) == 0
    second = capsys.readouterr()
    assert "load days 2024-03-03" in second.out
    assert "already loaded" in second.err or "skipped" in second.err  # 03-02 listed again
    rows = len(read_small_table(Home(home).table("events"), ["event_id"]))
    invalid = len(read_small_table(Home(home).table("invalid_events"), ["reason"]))
    assert rows + invalid == summary.total_rows
    state = read_cursor_state(Home(home).table("cursor_state"), "load")
    assert state.partitions == {str(landing.resolve()): t("2024-03-04T00:30:00")}
