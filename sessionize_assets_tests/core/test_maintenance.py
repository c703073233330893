"""The VACUUM retention rule: never delete what a reader of old versions still needs."""

from __future__ import annotations

import datetime as dt

from sessionize_assets.core.maintenance import (
    FRAGMENTED_SLACK_FILES,
    OldVersionReader,
    compaction_finds_work,
    fragmented,
    hours_needed,
    vacuum_finds_work,
    vacuum_refusal,
)

NOW = dt.datetime(2024, 3, 10, 12, tzinfo=dt.UTC)
READER = OldVersionReader(
    table="filtered_events",
    reader="session model `sessions` (its change data feed from version 7)",
    since=NOW - dt.timedelta(hours=30),
)


def test_a_retention_shorter_than_the_oldest_read_is_refused_naming_the_reader() -> None:
    assert hours_needed([READER], NOW) == 30.0
    refusal = vacuum_refusal(29.5, [READER], NOW)
    assert refusal is not None
    assert "session model `sessions`" in refusal and "30.0 hours ago" in refusal
    assert "--vacuum-hours 31 or more" in refusal
    assert vacuum_refusal(30.0, [READER], NOW) is None
    assert vacuum_refusal(0, [], NOW) is None and hours_needed([], NOW) == 0.0
    assert vacuum_refusal(-1, [], NOW) == "--vacuum-hours must be 0 or more, not -1."


def test_the_change_feed_needs_no_file_of_commits_that_change_no_data() -> None:
    from sessionize_assets.core.maintenance import first_data_change

    ops = {0: "WRITE", 1: "VACUUM START", 2: "VACUUM END", 3: "OPTIMIZE", 4: "MERGE"}
    assert first_data_change(ops, 0) == 4  # an earlier maintain's commits are skipped
    assert first_data_change(ops, 4) is None  # caught up
    assert first_data_change({**ops, 2: "WRITE"}, 0) == 2


def test_the_last_data_change_skips_optimize_and_vacuum_commits() -> None:
    from sessionize_assets.core.maintenance import last_data_change

    history = [(12, "VACUUM END"), (11, "VACUUM START"), (10, "OPTIMIZE"), (9, "MERGE")]
    assert last_data_change(history, 12) == 9
    assert last_data_change([(12, "WRITE"), (11, "VACUUM END")], 12) == 12
    # every commit read changed nothing: the one before them counts as a change (never later
    # than the truth)
    assert last_data_change([(12, "VACUUM END"), (11, "VACUUM START")], 12) == 10
    assert last_data_change([], 5) == 5
    assert last_data_change([(3, "DELETE")], 3) == 3


def test_compaction_finds_work_only_where_a_partition_holds_several_files():
    assert not compaction_finds_work([])  # no file
    assert not compaction_finds_work([()])  # unpartitioned, one file
    assert compaction_finds_work([(), ()])  # unpartitioned, two files
    one_each = [("2024-03-01",), ("2024-03-02",), (None,)]
    assert not compaction_finds_work(one_each)
    assert compaction_finds_work([*one_each, ("2024-03-02",)])


def test_a_small_table_is_fragmented_past_two_files_a_partition_and_the_slack():
    slack = FRAGMENTED_SLACK_FILES
    assert not fragmented([])
    assert not fragmented([()] * (2 + slack))  # unpartitioned: 2 + slack files are fine
    assert fragmented([()] * (3 + slack))
    buckets = [(b,) for b in range(16)]
    assert not fragmented(buckets * 2 + [(0,)] * slack)  # 16 buckets: up to 32 + slack files
    assert fragmented(buckets * 2 + [(0,)] * (slack + 1))
    assert fragmented([()] * 4, slack=1) and not fragmented([()] * 3, slack=1)


def test_vacuum_finds_work_only_for_an_unreferenced_file_older_than_the_retention():
    assert not vacuum_finds_work([], 0)  # every file on disk is referenced
    assert vacuum_finds_work([0.0], 0)  # no retention: any unreferenced file goes
    assert not vacuum_finds_work([1.0, 167.9], 168)
    assert vacuum_finds_work([1.0, 168.0], 168)
