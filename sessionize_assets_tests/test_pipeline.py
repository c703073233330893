"""`pipeline` helpers that decide how a command runs."""

from __future__ import annotations

from sessionize_assets.pipeline import small_history
from sessionize_assets.sessions import frames


def test_verify_runs_interpreted_when_events_holds_few_rows(spark, tmp_path, monkeypatch):
    """`verify` recomputes under the small-query configuration when `events` holds at most
    SMALL_RUN_ROWS rows by its Delta log; a missing table is not small."""
    path = str(tmp_path / "events")
    assert small_history(path) is False
    spark.range(3).selectExpr("CAST(id AS STRING) AS event_id").write.format("delta").save(path)
    assert small_history(path) is True
    monkeypatch.setattr(frames, "SMALL_RUN_ROWS", 2)
    assert small_history(path) is False
