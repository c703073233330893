"""The demo's report of what late events did to existing sessions."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
from deltalake import write_deltalake

from sessionize_assets.demo import superseded_lines

NOW = dt.datetime(2024, 3, 4, 0, 30, tzinfo=dt.UTC)


def test_merges_of_the_run_are_named_and_earlier_runs_left_out(tmp_path):
    path = str(tmp_path / "superseded_sessions")
    rows = [
        ("aaaaaaaa1", "cccccccc1", "u1", "merged", NOW),
        ("bbbbbbbb1", "cccccccc1", "u1", "merged", NOW),
        ("dddddddd1", "eeeeeeee1", "u2", "first event changed", NOW),
        ("ffffffff1", "gggggggg1", "u3", "merged", NOW - dt.timedelta(days=1)),
    ]
    columns = list(zip(*rows, strict=True))
    write_deltalake(
        path,
        pa.table(
            {
                "superseded_session_identifier": columns[0],
                "session_identifier": columns[1],
                "user_identifier": columns[2],
                "reason": columns[3],
                "superseded_at": pa.array(columns[4], pa.timestamp("us", tz="UTC")),
            }
        ),
    )
    assert superseded_lines(path, NOW) == [
        "Sessions changed by late events: 1 superseded (first event changed), 2 superseded (merged)",
        "  merged into session cccccccc: aaaaaaaa, bbbbbbbb (late events closed the gap)",
    ]
    assert superseded_lines(path, NOW + dt.timedelta(days=1)) == [
        "Sessions changed by late events: none"
    ]
    assert superseded_lines(str(tmp_path / "absent"), NOW) == [
        "Sessions changed by late events: none"
    ]


def test_the_demo_ends_yesterday_and_never_processes_after_now() -> None:
    from sessionize_assets.demo import demo_settings, demo_start, load_day_now

    now = dt.datetime(2026, 11, 25, 0, 10, tzinfo=dt.UTC)
    start = demo_start(now, 6)
    assert start == dt.date(2026, 11, 19)  # load days 11-19 .. 11-24: the last is yesterday
    assert load_day_now(dt.date(2026, 11, 19), now) == dt.datetime(
        2026, 11, 20, 0, 30, tzinfo=dt.UTC
    )
    assert load_day_now(dt.date(2026, 11, 24), now) == now  # 00:30 would be after now
    assert "start_date: 2026-11-19\n" in demo_settings(start)


def test_the_demo_runs_end_to_end_and_verifies(tmp_path, capsys) -> None:
    """`sessionize demo` as a user runs it (small): real-clock dates ending yesterday, every load
    day landed and run, `verify` clean, status 0."""
    from sessionize_assets.cli import main

    home = tmp_path / "demo"
    code = main(["--home", str(home), "demo", "--days", "2", "--events-per-day", "300"])
    out = capsys.readouterr().out
    assert code == 0, out[-3000:]
    yesterday = dt.datetime.now(dt.UTC).date() - dt.timedelta(days=1)
    assert f"=== load day {yesterday.isoformat()}" in out
    verified = out.split("=== verify ===")[1]
    assert verified.count("0 difference(s)") == verified.count("difference(s)") >= 1, verified
    assert (
        f"start_date: {yesterday - dt.timedelta(days=1)}" in (home / "sessionize.yaml").read_text()
    )
