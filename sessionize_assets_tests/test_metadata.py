"""Metadata per partition: numbers of a one-partition run are plottable, a multi-partition run's
totals are not copied onto each partition as numbers."""

from __future__ import annotations

from sessionize_assets.metadata import RUN_TOTALS, partition_metadata


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
