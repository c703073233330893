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
