"""Delta's data skipping where it pays (`resources/delta.py`): off for the scans of steps whose
tables hold few files, where its planning job costs more than the files it could skip."""

from __future__ import annotations

from pyspark.sql import functions as F

from sessionize_assets.resources import delta
from sessionize_assets.resources.delta import (
    DATA_SKIPPING,
    SKIPPING_MIN_FILES,
    data_skipping_when_it_pays,
    live_files,
    skipping_pays,
)


def test_skipping_pays_only_when_a_table_has_more_files_than_the_threshold():
    assert not skipping_pays([])
    assert not skipping_pays([None, 3, SKIPPING_MIN_FILES])
    assert skipping_pays([None, 3, SKIPPING_MIN_FILES + 1])
    assert skipping_pays([5], min_files=4) and not skipping_pays([4], min_files=4)


def test_a_table_of_few_files_turns_skipping_off_for_the_block_only(spark, tmp_path, monkeypatch):
    path = str(tmp_path / "few")
    spark.range(0, 100, 1, 2).withColumn("user", F.col("id") % 7).write.format("delta").save(path)
    assert live_files(path) == 2 and live_files(str(tmp_path / "absent")) is None
    corrupt = tmp_path / "corrupt" / "_delta_log"
    corrupt.mkdir(parents=True)
    (corrupt / "00000000000000000000.json").write_text('{"garbage')
    assert live_files(str(corrupt.parent)) is None  # the reading step reports it, not the hint
    before = spark.conf.get(DATA_SKIPPING, None)
    assert before != "false"
    with data_skipping_when_it_pays(spark, [path, str(tmp_path / "absent")]):
        assert spark.conf.get(DATA_SKIPPING) == "false"
        # Results do not change: the filter still applies to the rows of every file opened.
        assert spark.read.format("delta").load(path).filter(F.col("user") == 3).count() == 14
    assert spark.conf.get(DATA_SKIPPING, None) == before  # restored

    # More files than the threshold: skipping stays as it was.
    monkeypatch.setattr(delta, "SKIPPING_MIN_FILES", 1)
    with data_skipping_when_it_pays(spark, [path]):
        assert spark.conf.get(DATA_SKIPPING, None) == before
    monkeypatch.undo()
    # The user's own `spark` setting for it is left alone.
    with data_skipping_when_it_pays(spark, [path], {DATA_SKIPPING: "true"}):
        assert spark.conf.get(DATA_SKIPPING, None) == before


def test_the_steps_and_the_session_run_plan_under_the_decision(spark, tmp_path, monkeypatch):
    """The time-based steps, the session models' run and the duplicates check do their Spark work
    inside the decision (here: an empty home, so every table counts as few files)."""
    import datetime as dt

    from sessionize_assets import checks
    from sessionize_assets.home import Home
    from sessionize_assets.sessions import run as session_run
    from sessionize_assets.settings import from_mapping
    from sessionize_assets.time_based import steps
    from sessionize_assets.time_based.tables import TimeBasedTables

    seen: dict[str, str | None] = {}

    def spy(name: str, result=None):  # noqa: ANN001, ANN202
        def inner(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            seen[name] = spark.conf.get(DATA_SKIPPING, None)
            return result

        return inner

    monkeypatch.setattr(steps, "_filtered_events", spy("filtered_events"))
    monkeypatch.setattr(steps, "_daily_aggregates", spy("daily_aggregates"))
    monkeypatch.setattr(session_run, "_run_session_models", spy("session_models"))
    home = Home(tmp_path / "home")
    tables = TimeBasedTables.at(home.table)
    settings = from_mapping({"start_date": "2024-03-01"}, today=dt.date(2024, 3, 2))
    now = dt.datetime(2024, 3, 2, tzinfo=dt.UTC)
    steps.filtered_events_step(spark, tables, settings, [now.date()], now)
    steps.daily_aggregates_step(spark, tables, settings, [now.date()])
    session_run.run_session_models(spark, home.table, settings, now)
    assert seen == {n: "false" for n in ("filtered_events", "daily_aggregates", "session_models")}
    assert spark.conf.get(DATA_SKIPPING, None) != "false"

    # The duplicates check, when it runs in Spark (more rows than the driver takes), runs its one
    # query (the collect) inside the decision too.
    class Found:
        def orderBy(self, *columns):  # noqa: ANN002, ANN202, N802 - DataFrame's names
            return self

        def limit(self, n):  # noqa: ANN001, ANN202
            return self

        def collect(self):  # noqa: ANN202
            seen["duplicates check"] = spark.conf.get(DATA_SKIPPING, None)
            return []

    monkeypatch.setattr(checks, "partition_counts", lambda path: (1, {}))
    monkeypatch.setattr(checks, "read_version", lambda spark, path, version: "filtered_events")
    monkeypatch.setattr(checks, "duplicate_event_ids", lambda frame, days: Found())
    assert checks.duplicates_in_filtered_events(spark, tables, 1, driver_rows=-1) == []
    assert seen["duplicates check"] == "false"
