"""Metadata per partition: numbers of a one-partition run are plottable, a multi-partition run's
totals are not copied onto each partition as numbers, and each partition's own figures follow in
a materialization event of their own."""

from __future__ import annotations

from sessionize_assets.metadata import (
    FIGURES_TAG,
    RUN_TOTALS,
    partition_figures,
    partition_metadata,
)


def test_one_partition_keeps_numbers_and_reports_the_row_count() -> None:
    md = partition_metadata({"rows read": 10, "rows written": 7, "note": "x"}, ["2024-03-02"])
    assert md["rows read"].value == 10
    assert md["dagster/row_count"].value == 7
    assert md["note"].value == "x"


def test_several_partitions_keep_their_totals_in_one_json_entry() -> None:
    md = partition_metadata(
        {"rows read": 10, "share": 0.5, "ok": True, "decisions": [1, 2]},
        ["2024-03-01", "2024-03-02", "2024-03-03"],
    )
    assert md[RUN_TOTALS].value == {"rows read": 10, "share": 0.5}
    assert "rows read" not in md and "dagster/row_count" not in md
    assert md["ok"].value is True and md["decisions"].value == [1, 2]
    assert md["partitions in this run"].value == "3: 2024-03-01 .. 2024-03-03"


def test_one_partition_also_reports_its_own_figures() -> None:
    figures = {"2024-03-02": {"pending rows (not counted yet)": 3}, "2024-03-03": {"x": 1}}
    md = partition_metadata({"rows read": 10}, ["2024-03-02"], figures)
    assert md["pending rows (not counted yet)"].value == 3 and "x" not in md


def test_each_partition_of_a_run_gets_its_own_figures_event() -> None:
    figures = {
        "2024-03-01": {"rows read": 4, "rows written": 2},
        "2024-03-02": {"rows read": 1, "rows written": 1},
    }
    events = partition_figures("filtered_events", figures, ["2024-03-01", "2024-03-02"])
    assert [e.partition for e in events] == ["2024-03-01", "2024-03-02"]
    first = events[0]
    assert first.asset_key.to_user_string() == "filtered_events"
    assert {k: v.value for k, v in first.metadata.items()} == {
        "rows read": 4,
        "rows written": 2,
        "dagster/row_count": 2,
    }
    assert first.tags == {FIGURES_TAG: "true"}
    assert "from a run of 2 partitions (2024-03-01 .. 2024-03-02)" in first.description
    # A run of one partition has them in its own metadata; a partition without figures is left out.
    assert partition_figures("filtered_events", figures, ["2024-03-01"]) == []
    assert len(partition_figures("x", {"2024-03-01": {"n": 1}}, ["2024-03-01", "2024-03-09"])) == 1
