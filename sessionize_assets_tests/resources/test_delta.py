"""Delta's data skipping where it pays (`resources/delta.py`): off for the scans of steps whose
tables hold few files, where its planning job costs more than the files it could skip."""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyspark.sql import functions as F

from sessionize_assets.resources import delta
from sessionize_assets.resources.delta import (
    DATA_SKIPPING,
    SKIPPING_MIN_FILES,
    data_skipping_when_it_pays,
    live_files,
    skipping_pays,
)


def merged_by_delta_rs(path: str) -> str:
    """A table of rows k a, b, c (v 5, 2, 6), the last written by delta-rs's MERGE: its files
    hold strings as string_views."""
    from deltalake import write_deltalake

    write_deltalake(path, pa.table({"k": ["a", "b"], "v": [1, 2]}))
    delta.fresh_table(path).merge(
        pa.table({"k": ["a", "c"], "v": [5, 6]}),
        predicate="t.k = s.k",
        source_alias="s",
        target_alias="t",
    ).when_matched_update_all().when_not_matched_insert_all().execute()
    return path


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


def test_a_driver_write_leaves_absent_tables_and_schema_changes_to_spark(spark, tmp_path):
    """`replace_partitions_from_driver` writes only into an existing table with the same columns
    of the same types (nullability aside), replacing exactly the named days; otherwise (absent
    table, another column, another type: a timestamp or an int32 where the table has a long)
    it writes nothing and says so, for the Spark writer, which merges or refuses."""
    import datetime as dt

    import pyarrow as pa

    from sessionize_assets.resources.delta import (
        delta_version,
        read_small_table,
        replace_partitions_from_driver,
    )

    path = str(tmp_path / "daily")
    days = [dt.date(2024, 3, 1), dt.date(2024, 3, 2)]
    data = pa.table({"day": pa.array(days), "n": pa.array([1, 2], pa.int64())})
    assert not replace_partitions_from_driver(path, data, "day", days)
    assert delta_version(path) is None
    spark.createDataFrame(
        [(d, 10 + i) for i, d in enumerate(days)], "day date, n long"
    ).write.format("delta").partitionBy("day").save(path)
    assert not replace_partitions_from_driver(
        path, data.append_column("extra", pa.array(["x", "y"])), "day", days
    )
    for kind in (pa.int32(), pa.timestamp("us", tz="UTC")):
        other = data.set_column(1, "n", pa.array([1, 2], pa.int64()).cast(kind))
        assert not replace_partitions_from_driver(path, other, "day", days)
    assert delta_version(path) == 0
    # Only 03-02 is replaced; 03-01 keeps its row.
    assert replace_partitions_from_driver(path, data.slice(1), "day", days[1:])
    assert sorted((r["day"], r["n"]) for r in read_small_table(path)) == [
        (days[0], 10),
        (days[1], 2),
    ]
    assert spark.read.format("delta").load(path).schema["n"].dataType.typeName() == "long"
    # Driver commits keep Spark's checkpoint rhythm (every CHECKPOINT_INTERVAL versions), which
    # Spark reads back; delta-rs alone would checkpoint every 100.
    log = tmp_path / "daily" / "_delta_log"
    while delta_version(path) < delta.CHECKPOINT_INTERVAL:
        assert not list(log.glob("*.checkpoint.parquet"))
        assert replace_partitions_from_driver(path, data.slice(1), "day", days[1:])
    assert (log / f"{delta.CHECKPOINT_INTERVAL:020d}.checkpoint.parquet").exists()
    assert spark.read.format("delta").load(path).count() == 2


def test_a_merge_of_few_rows_on_the_driver_writes_what_spark_merge_writes(
    spark, tmp_path, monkeypatch
):
    """`merge` through delta-rs (a small table and source) and through Spark's MERGE INTO (forced
    with DRIVER_WRITE_ROWS below the sizes) leave the same rows: updates, deletes, inserts, and
    neither a delete of an absent key nor a null `_delete` inserting a row."""
    import datetime as dt

    from sessionize_assets.resources.delta import merge

    schema = "k string, v long, ts timestamp"
    at = dt.datetime(2024, 3, 1, 12, tzinfo=dt.UTC)
    before = [("a", 1, at), ("b", 2, at), ("c", 3, None)]
    source = spark.createDataFrame(
        [
            ("a", 10, at, False),  # update
            ("b", None, None, True),  # delete
            ("d", 4, at, False),  # insert
            ("e", None, None, True),  # delete of an absent key: nothing
            ("f", 6, at, None),  # null `_delete`: neither insert nor delete
            ("c", 30, None, None),  # null `_delete` on a match: an update
        ],
        f"{schema}, _delete boolean",
    )
    got = {}
    for writer in ("driver", "spark", "a writer feature"):
        path = str(tmp_path / writer.replace(" ", "_"))
        table = spark.createDataFrame(before, schema).write.format("delta")
        if writer == "a writer feature":  # a table delta-rs is not trusted to write: Spark does
            table = table.option("delta.enableDeletionVectors", "true")
        table.save(path)
        if writer == "spark":
            monkeypatch.setattr(delta, "DRIVER_WRITE_ROWS", -1)
        merge(spark, path, source, "k", schema)
        monkeypatch.undo()
        got[writer] = sorted(
            (r["k"], r["v"], r["ts"].replace(tzinfo=dt.UTC) if r["ts"] else None)
            for r in spark.read.format("delta").load(path).collect()
        )
        commit = delta.delta_table(path).history(1)[0]
        assert commit["operation"] == "MERGE", commit
        assert str(commit.get("engineInfo")).startswith("delta-rs") == (writer == "driver")
    expected = [("a", 10, at), ("c", 30, None), ("d", 4, at)]
    assert got["driver"] == got["spark"] == got["a writer feature"] == expected


def test_a_merge_into_a_table_larger_than_its_source_limit_is_the_drivers_up_to_its_own(
    spark, tmp_path, monkeypatch
):
    """A small source merged into a table above DRIVER_WRITE_ROWS is still the driver's MERGE
    while the table holds at most DRIVER_MERGE_TARGET_ROWS rows (Spark's above), writes row groups
    of at most MERGE_ROW_GROUP_ROWS, and leaves the rows Spark's MERGE leaves."""
    import pyarrow.parquet as pq

    from sessionize_assets.resources.delta import merge

    schema = "k string, v long"
    before = [(f"k{i}", i) for i in range(6)]
    source = spark.createDataFrame(
        [("k0", 100, False), ("k1", None, True), ("k9", 9, False)], f"{schema}, _delete boolean"
    )
    monkeypatch.setattr(delta, "DRIVER_WRITE_ROWS", 3)  # the source's size, below the table's
    monkeypatch.setattr(delta, "MERGE_ROW_GROUP_ROWS", 2)
    got = {}
    for target_limit, writer in ((6, "delta-rs"), (5, "Apache-Spark")):
        monkeypatch.setattr(delta, "DRIVER_MERGE_TARGET_ROWS", target_limit)
        path = tmp_path / writer
        spark.createDataFrame(before, schema).coalesce(1).write.format("delta").save(str(path))
        merge(spark, str(path), source, "k", schema)
        table = delta.delta_table(str(path))
        commit = table.history(1)[0]
        assert commit["operation"] == "MERGE", commit
        assert str(commit.get("engineInfo")).startswith(writer), commit
        if writer == "delta-rs":
            files = [f.removeprefix("file://") for f in table.file_uris()]
            assert sum(pq.ParquetFile(f).metadata.num_rows for f in files) == 6
            assert {
                pq.ParquetFile(f).metadata.row_group(i).num_rows <= 2
                for f in files
                for i in range(pq.ParquetFile(f).metadata.num_row_groups)
            } == {True}
        got[writer] = sorted(tuple(r) for r in spark.read.format("delta").load(str(path)).collect())
    expected = sorted([("k0", 100), *((f"k{i}", i) for i in range(2, 6)), ("k9", 9)])
    assert got["delta-rs"] == got["Apache-Spark"] == expected


def test_a_merge_that_only_inserts_is_appended_by_the_driver(spark, tmp_path, monkeypatch):
    """`merge` of new keys only (a null key matches nothing) is one delta-rs append with the rows
    Spark's MERGE INTO inserts; a source with a stored key, a removal or a null `_delete` is
    merged; and the append commits only as the version after the one whose keys it checked."""
    import datetime as dt

    from sessionize_assets.resources.delta import append_if_new, delta_table, merge

    schema = "k string, v long, ts timestamp"
    at = dt.datetime(2024, 3, 1, 12, tzinfo=dt.UTC)
    before = [("a", 1, at), ("b", 2, None)]
    new_rows = [("d", 4, at, False), (None, 5, None, False), ("e", None, at, False)]
    got = {}
    for writer in ("driver", "spark"):
        path = str(tmp_path / writer)
        spark.createDataFrame(before, schema).write.format("delta").save(path)
        if writer == "spark":
            monkeypatch.setattr(delta, "DRIVER_WRITE_ROWS", -1)
        held = delta_table(path)  # a reader's table, kept open by `delta_table`
        merge(
            spark, path, spark.createDataFrame(new_rows, f"{schema}, _delete boolean"), "k", schema
        )
        monkeypatch.undo()
        assert held.version() == 0 and delta_table(path).version() == 1  # the append's own table
        commit = delta_table(path).history(1)[0]
        assert commit["operation"] == ("WRITE" if writer == "driver" else "MERGE"), commit
        assert str(commit.get("engineInfo")).startswith("delta-rs") == (writer == "driver")
        got[writer] = sorted(
            ((r["k"] or ""), r["v"], r["ts"].replace(tzinfo=dt.UTC) if r["ts"] else None)
            for r in spark.read.format("delta").load(path).collect()
        )
    assert got["driver"] == got["spark"]
    assert len(got["driver"]) == 5
    path = str(tmp_path / "driver")
    # Each beside a new key of its own: the row alone makes it a MERGE.
    for new, row in [
        ("h1", ("a", 10, at, False)),
        ("h2", ("f", 6, at, True)),
        ("h3", ("g", 7, at, None)),
    ]:
        merge(
            spark,
            path,
            spark.createDataFrame([(new, 8, at, False), row], f"{schema}, _delete boolean"),
            "k",
            schema,
        )
        assert delta_table(path).history(1)[0]["operation"] == "MERGE", row
    assert delta.read_small_table(path, ["k"]) and {
        r["k"] for r in delta.read_small_table(path, ["k"])
    } >= {"h1", "h2", "h3"}
    table = delta.fresh_table(path)
    version = table.version()
    rows = pa.table(
        {
            "k": ["z"],
            "v": pa.array([1], pa.int64()),
            "ts": pa.array([at], pa.timestamp("us", tz="UTC")),
            "_delete": [False],
        }
    )
    # Another writer commits after the keys were checked: nothing is appended.
    spark.createDataFrame([("y", 9, at)], schema).write.format("delta").mode("append").save(path)
    assert not append_if_new(table, rows, "k")
    assert delta_table(path).version() == version + 1
    assert append_if_new(delta.fresh_table(path), rows, "k")
    assert spark.read.format("delta").load(path).filter(F.col("k") == "z").count() == 1
    # A new key whose value has another type than the table's column: not appended.
    other = rows.set_column(0, "k", pa.array(["x"])).set_column(1, "v", pa.array([1], pa.int32()))
    assert not append_if_new(delta.fresh_table(path), other, "k")
    assert append_if_new(delta.fresh_table(path), rows.set_column(0, "k", pa.array(["x"])), "k")
    # A file delta-rs's MERGE wrote (its strings are string_views) is searched as well.
    path = merged_by_delta_rs(str(tmp_path / "views"))
    for k, appended in (("c", False), ("d", True)):
        row = pa.table({"k": [k], "v": [7], "_delete": [False]})
        assert append_if_new(delta.fresh_table(path), row, "k") == appended, k
    assert sorted(r["k"] for r in delta.read_small_table(path)) == ["a", "b", "c", "d"]


def test_a_small_table_is_read_by_the_driver_with_the_rows_spark_reads(
    spark, tmp_path, monkeypatch
):
    """`table_or_empty` reads a table of at most LOCAL_READ_ROWS rows with delta-rs into a
    driver-local DataFrame (no Delta scan in its plan), pinned to the version it read; above the
    limit Spark reads it. Same rows, types, nulls and maps either way."""
    import datetime as dt

    from sessionize_assets.resources.delta import read_pinned, table_or_empty

    schema = "k string, n long, ts timestamp, m map<string,bigint>"
    at = dt.datetime(2024, 3, 1, 12, tzinfo=dt.UTC)
    path = str(tmp_path / "small")
    assert table_or_empty(spark, path, schema).count() == 0  # absent: empty, with the schema
    rows = [("a", 1, at, {"x": 1}), ("b", None, None, None), ("c", 3, at, {})]
    spark.createDataFrame(rows, schema).write.format("delta").save(path)

    def plain(df):
        return sorted((r.k, r.n, r.ts, tuple(sorted((r.m or {}).items()))) for r in df.collect())

    local = table_or_empty(spark, path, schema)
    assert "Relation" not in local._jdf.queryExecution().optimizedPlan().toString().replace(
        "LocalRelation", ""
    )
    # Pinned: a later write does not change the frame already read.
    spark.createDataFrame([("d", 4, at, {})], schema).write.format("delta").mode("append").save(
        path
    )
    assert plain(local) == plain(spark.read.format("delta").option("versionAsOf", 0).load(path))
    assert (
        local.schema.simpleString() == spark.read.format("delta").load(path).schema.simpleString()
    )
    # `read_pinned`: every column, in the table's order and with the types Spark reads.
    pinned = read_pinned(spark, path, 0)
    assert "LocalRelation" in pinned._jdf.queryExecution().optimizedPlan().toString()
    assert pinned.schema.simpleString() == local.schema.simpleString()
    assert plain(pinned) == plain(local)
    monkeypatch.setattr(delta, "LOCAL_READ_ROWS", 3)  # the table now holds 4 rows
    read = table_or_empty(spark, path, schema)
    assert "LocalRelation" not in read._jdf.queryExecution().optimizedPlan().toString()
    monkeypatch.undo()
    assert plain(read) == plain(table_or_empty(spark, path, schema)) and len(plain(read)) == 4


def test_the_driver_writes_only_into_columns_of_the_same_type():
    """`_same_type`: nullability and the names of nested fields may differ (Spark's `toArrow()`
    and the table's schema spell them differently); a width, a unit or a time zone may not."""
    from sessionize_assets.resources.delta import _same_type

    utc = pa.timestamp("us", tz="UTC")
    assert _same_type(utc, utc) and not _same_type(utc, pa.timestamp("us"))
    assert not _same_type(pa.int32(), pa.int64()) and not _same_type(utc, pa.int64())
    assert _same_type(
        pa.map_(pa.string(), pa.field("value", pa.int64(), False)),
        pa.map_(pa.string(), pa.field("value", pa.int64(), True)),
    )
    assert _same_type(
        pa.list_(pa.field("element", pa.string(), False)), pa.list_(pa.field("item", pa.string()))
    )
    assert _same_type(
        pa.struct([pa.field("ts", utc, False)]), pa.struct([pa.field("ts", utc, True)])
    ) and not _same_type(pa.struct([pa.field("ts", utc)]), pa.struct([pa.field("at", utc)]))


def test_event_days_of_a_partitioned_table_are_read_by_the_driver_as_spark_reads_them(
    spark, tmp_path, monkeypatch
):
    """`read_pinned` with columns and partitions: the named columns in the table's order, the
    rows of the named days only (the Delta log counts their rows, not the table's), as Spark's
    filtered read gives them; above the limit for those days, Spark's read of the whole table."""
    import datetime as dt

    from sessionize_assets.resources.delta import delta_table, live_rows, read_pinned

    day = dt.date(2024, 3, 1)
    at = dt.datetime(2024, 3, 1, 12, tzinfo=dt.UTC)
    path = str(tmp_path / "by_day")
    schema = "event_id string, ts timestamp, load_date date, n long, event_date date"
    rows = [
        ("a", at, day, 1, day),
        ("b", None, day, None, day + dt.timedelta(days=1)),
        ("c", at, day + dt.timedelta(days=1), 3, day + dt.timedelta(days=1)),
        ("d", at, day, 4, day + dt.timedelta(days=2)),
        ("e", at, day, 5, None),  # a null partition is never one of the named days
    ]
    df = spark.createDataFrame(rows, schema)
    df.write.format("delta").partitionBy("load_date", "event_date").save(path)
    days = [day + dt.timedelta(days=1), day + dt.timedelta(days=2)]
    table = delta_table(path, 0)
    assert live_rows(table) == 5 and live_rows(table, ("event_date", days)) == 3
    assert live_rows(table, ("event_date", [])) == 0

    local = read_pinned(spark, path, 0, ["event_date", "event_id", "ts"], ("event_date", days))
    assert "LocalRelation" in local._jdf.queryExecution().optimizedPlan().toString()
    expected = (
        spark.read.format("delta")
        .load(path)
        .filter(F.col("event_date").isin(days))
        .select("event_id", "ts", "event_date")
    )
    assert local.columns == ["event_id", "ts", "event_date"]
    assert local.schema.simpleString() == expected.schema.simpleString()
    assert sorted(local.collect()) == sorted(expected.collect())

    monkeypatch.setattr(delta, "LOCAL_READ_ROWS", 2)  # the two days hold 3 rows
    read = read_pinned(spark, path, 0, ["event_id"], ("event_date", days))
    assert "LocalRelation" not in read._jdf.queryExecution().optimizedPlan().toString()
    assert read.count() == 5  # Spark's read: every row, the caller filters


def test_a_small_change_feed_is_read_by_the_driver_as_spark_reads_it(spark, tmp_path, monkeypatch):
    """`local_changes`: the change data feed of a version range read by delta-rs holds the rows
    and change types Spark's feed holds, after an append, a partition replacement (replaceWhere:
    deletes and inserts), a MERGE (updates and inserts) and a DELETE; beyond its row limit, or
    from a version the log does not hold, it leaves the read to Spark (None)."""
    import datetime as dt

    from sessionize_assets.resources.delta import local_changes

    day = dt.date(2024, 3, 1)
    path = str(tmp_path / "feed")
    schema = "k string, n long, d date"
    spark.createDataFrame([("a", 1, day), ("b", 2, day)], schema).write.format("delta").option(
        "delta.enableChangeDataFeed", "true"
    ).partitionBy("d").save(path)
    spark.createDataFrame([("c", 3, day + dt.timedelta(days=1))], schema).write.format(
        "delta"
    ).mode("append").save(path)
    spark.createDataFrame([("a", 10, day), ("z", 26, day)], schema).write.format("delta").mode(
        "overwrite"
    ).option("replaceWhere", f"d = DATE'{day}'").save(path)
    spark.createDataFrame(
        [("c", 30, day + dt.timedelta(days=1)), ("y", 25, day)], schema
    ).createOrReplaceTempView("feed_source")
    spark.sql(
        f"MERGE INTO delta.`{path}` t USING feed_source s ON t.k = s.k "
        "WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *"
    )
    spark.sql(f"DELETE FROM delta.`{path}` WHERE k = 'z'")

    def spark_feed(start, end):
        feed = (
            spark.read.format("delta")
            .option("readChangeFeed", "true")
            .option("startingVersion", start)
            .option("endingVersion", end)
            .load(path)
        )
        return sorted(tuple(r) for r in feed.select("k", "n", "d", "_change_type").collect())

    for start, end in [(0, 4), (1, 1), (2, 2), (3, 4), (1, 4)]:
        local = local_changes(spark, path, start, end, ["k", "n", "d"])
        assert local is not None, (start, end)
        assert "LocalRelation" in local._jdf.queryExecution().optimizedPlan().toString()
        got = sorted(tuple(r) for r in local.select("k", "n", "d", "_change_type").collect())
        assert got == spark_feed(start, end), (start, end)
    assert local_changes(spark, path, 0, 4, ["k", "n", "d"], limit=3) is None
    assert local_changes(spark, path, 7, 9, ["k", "n", "d"]) is None
    assert local_changes(spark, str(tmp_path / "absent"), 0, 1, ["k"]) is None


def test_rows_of_some_keys_are_read_by_the_driver_as_spark_reads_them(spark, tmp_path, monkeypatch):
    """`rows_by_key`: the rows whose key is (or, `keep=False`, is not) in the keys, or where any
    of several key columns matches, null keys with the others, the columns asked for in their
    order, in files Spark wrote and in files delta-rs's MERGE
    wrote (strings as string_view); None above DRIVER_SCAN_ROWS, above the caller's limit, for a
    key column the table lacks, or for a table that needs a reader feature."""
    import datetime as dt

    from sessionize_assets.resources.delta import delta_table, rows_by_key
    from sessionize_assets.resources.spark import arrow_frame

    schema = "k string, n long, ts timestamp, m map<string,bigint>"
    at = dt.datetime(2024, 3, 1, 12, tzinfo=dt.UTC)
    path = str(tmp_path / "spark")
    rows = [("a", 1, at, {"x": 1}), ("b", None, None, None), (None, 3, at, {}), ("c", 4, at, {})]
    spark.createDataFrame(rows, schema).repartition(3).write.format("delta").save(path)
    keys = pa.array(["a", "c", "zz"])

    def by_spark(keep: bool) -> list:
        stored = spark.read.format("delta").load(path)
        kind = "left_semi" if keep else "left_anti"
        chosen = spark.createDataFrame([(k,) for k in keys.to_pylist()], "k string")
        return sorted(map(tuple, stored.join(chosen, "k", kind).collect()), key=str)

    for keep in (True, False):
        data = rows_by_key(delta_table(path), {"k": keys}, keep=keep)
        assert data is not None and data.column_names == ["k", "n", "ts", "m"]
        local = arrow_frame(spark, data, schema)
        assert sorted(map(tuple, local.collect()), key=str) == by_spark(keep), keep
    only = rows_by_key(delta_table(path), {"k": keys}, columns=["n", "k"])
    assert only is not None and only.column_names == ["n", "k"]
    assert sorted(only.column("n").to_pylist()) == [1, 4]
    # Any of several key columns: k in the keys, or n in its own.
    either = rows_by_key(delta_table(path), {"k": keys, "n": pa.array([3, 99])}, columns=["n"])
    assert either is not None and sorted(either.column("n").to_pylist()) == [1, 3, 4]
    assert rows_by_key(delta_table(path), {}) is None
    assert rows_by_key(delta_table(path), {"k": keys}, limit=1) is None
    assert rows_by_key(delta_table(path), {"k": keys}, limit=2) is not None
    assert rows_by_key(delta_table(path), {"missing": keys}) is None
    assert rows_by_key(delta_table(path), {"k": keys}, columns=["k", "missing"]) is None
    assert rows_by_key(None, {"k": keys}) is None
    monkeypatch.setattr(delta, "DRIVER_SCAN_ROWS", 3)
    assert rows_by_key(delta_table(path), {"k": keys}) is None
    monkeypatch.undo()
    # Files delta-rs's MERGE wrote: the strings come back as plain strings Spark takes.
    views = merged_by_delta_rs(str(tmp_path / "views"))
    data = rows_by_key(delta_table(views), {"k": pa.array(["a", "c"])})
    assert data is not None and data.schema.field("k").type == pa.string()
    assert sorted(spark.createDataFrame(data).collect()) == [("a", 5), ("c", 6)]
    # A table that needs a reader feature (deletion vectors) is Spark's to read.
    dv = str(tmp_path / "dv")
    spark.createDataFrame(rows, schema).write.format("delta").option(
        "delta.enableDeletionVectors", "true"
    ).save(dv)
    assert rows_by_key(delta_table(dv), {"k": keys}) is None


def test_rows_of_some_keys_in_some_partitions_are_read_by_the_driver(spark, tmp_path, monkeypatch):
    """`rows_by_key(..., partitions=)`: only the files of the partitions named are read (rows of
    the same keys elsewhere are left out), DRIVER_SCAN_ROWS counts the rows of those partitions
    only, and no partition named reads nothing (an empty table of the columns asked for)."""
    import datetime as dt

    from sessionize_assets.resources.delta import delta_table, rows_by_key

    path = str(tmp_path / "by_day")
    day = [dt.date(2024, 3, d) for d in (1, 2, 3)]
    rows = [("a", day[0]), ("a", day[1]), ("b", day[1]), ("a", day[2]), ("c", day[2])] * 2
    spark.createDataFrame(rows, "k string, load_date date").write.format("delta").partitionBy(
        "load_date"
    ).save(path)
    table = delta_table(path)
    keys = {"k": pa.array(["a", "c"])}
    got = rows_by_key(table, keys, columns=["load_date", "k"], partitions=("load_date", day[1:]))
    assert got is not None and got.column_names == ["load_date", "k"]
    assert sorted(zip(*got.to_pydict().values(), strict=True)) == sorted(
        [(day[1], "a"), (day[2], "a"), (day[2], "c")] * 2
    )
    none = rows_by_key(table, keys, columns=["load_date", "k"], partitions=("load_date", []))
    assert none is not None and none.num_rows == 0 and none.column_names == ["load_date", "k"]
    assert none.schema == got.schema
    # The rows counted are those of the partitions read: 2 in 03-01, 8 in the other two.
    monkeypatch.setattr(delta, "DRIVER_SCAN_ROWS", 4)
    assert rows_by_key(table, keys, partitions=("load_date", [day[0]])) is not None
    assert rows_by_key(table, keys, partitions=("load_date", day[1:])) is None


def test_a_driver_append_is_the_rows_spark_would_append_once_per_transaction(
    spark, tmp_path, monkeypatch
):
    """`append_from_driver`: the rows land in the table's partitions with its types (Spark reads
    them back as it wrote its own); an idempotent-write id already committed (by Spark or by the
    driver) writes nothing again; an absent table or other columns are the caller's Spark write."""
    import datetime as dt

    from sessionize_assets.resources.delta import append_from_driver, delta_table

    path = str(tmp_path / "t")
    schema = "k string, days array<date>, at timestamp, load_date date"
    at = dt.datetime(2024, 3, 1, 12, tzinfo=dt.UTC)
    first = [("a", [dt.date(2024, 3, 1)], at, dt.date(2024, 3, 1))]
    spark.createDataFrame(first, schema).write.format("delta").partitionBy("load_date").options(
        txnAppId="spark-app", txnVersion="1"
    ).save(path)
    more = [("b", [dt.date(2024, 3, 2), dt.date(2024, 3, 3)], at, dt.date(2024, 3, 2))]
    data = spark.createDataFrame(more, schema).toArrow()
    txn = {"txnAppId": "driver-app", "txnVersion": "1"}
    assert append_from_driver(path, data, txn)
    assert append_from_driver(path, data, txn)  # the same transaction again: nothing written
    assert append_from_driver(path, data, {"txnAppId": "spark-app", "txnVersion": "1"})
    got = spark.read.format("delta").load(path)
    naive = at.replace(tzinfo=None)  # how Spark collects a timestamp (UTC sessions)
    assert sorted(map(tuple, got.select("k", "days", "at", "load_date").collect())) == sorted(
        (k, days, naive, day) for k, days, _, day in first + more
    )
    assert delta_table(path).version() == 1
    files = {a["partition.load_date"] for a in delta.add_actions(path)[1]}
    assert {str(d)[:10] for d in files} == {"2024-03-01", "2024-03-02"}
    # Spark's idempotent writes see the driver's transaction too.
    spark.createDataFrame(more, schema).write.format("delta").mode("append").options(
        txnAppId="driver-app", txnVersion="1"
    ).save(path)
    assert spark.read.format("delta").load(path).count() == 2
    assert not append_from_driver(str(tmp_path / "absent"), data)
    assert not append_from_driver(path, data.drop_columns(["at"]))
    # A concurrent writer of the same batch commits first and this attempt's commit fails: the
    # retry sees that writer's transaction and appends nothing (delta-rs itself would accept the
    # same id again).
    import deltalake
    from deltalake.exceptions import CommitFailedError

    real_write = deltalake.write_deltalake
    attempts = []

    def beaten_once(table, rows, **kwargs):
        attempts.append(1)
        if len(attempts) == 1:
            real_write(table, rows, **kwargs)  # the other writer, same transaction id
            raise CommitFailedError("Concurrent transaction failed")
        real_write(table, rows, **kwargs)

    monkeypatch.setattr(deltalake, "write_deltalake", beaten_once)
    assert append_from_driver(path, data, {"txnAppId": "racing", "txnVersion": "1"})
    assert len(attempts) == 1 and spark.read.format("delta").load(path).count() == 3


def test_the_drivers_writes_honour_a_column_invariant_spark_set(spark, tmp_path):
    """A table Spark created with a change data feed and a column invariant (writer version 7,
    the features of APPEND_FEATURES) is the driver's to write (`driver_writable`), and delta-rs
    checks the invariant: rows that break it are refused whole, by the append and by the
    partition replace, and the table keeps its rows; rows that keep it are written."""
    import datetime as dt
    import json

    from pyspark.sql import types as T

    from sessionize_assets.resources.delta import (
        APPEND_FEATURES,
        append_from_driver,
        delta_table,
        driver_writable,
        replace_partitions_from_driver,
    )

    path = str(tmp_path / "t")
    invariant = {"delta.invariants": json.dumps({"expression": {"expression": "n > 0"}})}
    schema = T.StructType(
        [
            T.StructField("n", T.LongType(), metadata=invariant),
            T.StructField("day", T.DateType()),
        ]
    )
    day = dt.date(2024, 3, 1)
    spark.createDataFrame([(1, day)], schema).write.format("delta").partitionBy("day").option(
        "delta.enableChangeDataFeed", "true"
    ).save(path)
    table = driver_writable(path)
    assert table is not None
    protocol = table.protocol()
    assert protocol.min_writer_version == 7 and "invariants" in protocol.writer_features
    arrow_schema = pa.schema([("n", pa.int64()), ("day", pa.date32())])
    bad = pa.table({"n": [2, -1], "day": [day, day]}, schema=arrow_schema)
    with pytest.raises(Exception, match="validation"):
        append_from_driver(path, bad, table=table)
    with pytest.raises(Exception, match="validation"):
        replace_partitions_from_driver(path, bad, "day", [day], APPEND_FEATURES)
    assert delta_table(path).version() == 0
    assert append_from_driver(path, bad.slice(0, 1), table=table)
    assert sorted(r["n"] for r in spark.read.format("delta").load(path).collect()) == [1, 2]


def test_a_column_added_after_the_driver_opened_the_table_sends_the_write_back_to_spark(
    spark, tmp_path
):
    """`delta.driver_writable` opens the table before the caller fetches its rows. When another
    writer adds a column in between, the append and the partition replace compare the rows with
    the table as it is now (not as it was opened), and write nothing: the caller's Spark write
    then merges the schema."""
    import datetime as dt

    path = str(tmp_path / "t")
    day = dt.date(2024, 3, 1)
    spark.createDataFrame([(1, day)], "n long, day date").write.format("delta").partitionBy(
        "day"
    ).save(path)
    rows = pa.table(
        {"n": [2], "day": [day]}, schema=pa.schema([("n", pa.int64()), ("day", pa.date32())])
    )
    for write in (
        lambda table: delta.append_from_driver(path, rows, table=table),
        lambda table: delta.replace_partitions_from_driver(
            path, rows, "day", [day], delta.APPEND_FEATURES, table=table
        ),
    ):
        table = delta.driver_writable(path)
        assert table is not None
        before = delta.delta_table(path).version()
        spark.createDataFrame([(3, day, "x")], "n long, day date, extra string").write.format(
            "delta"
        ).mode("append").option("mergeSchema", "true").save(path)
        assert not write(table)
        assert delta.delta_table(path).version() == before + 1  # the other writer's commit only
    assert sorted(r["n"] for r in spark.read.format("delta").load(path).collect()) == [1, 3, 3]


def test_distinct_values_of_several_columns_whatever_their_chunks():
    """The keys of several columns, one of them an empty table's (a column of no chunk: joined
    as Python values, its type was lost and the next column's strings were refused), nulls left
    out."""
    from sessionize_assets.resources.delta import distinct_values

    empty = pa.chunked_array([], pa.string())
    assert empty.num_chunks == 0
    some = pa.chunked_array([pa.array(["b", None, "a"]), pa.array(["a", "c"])])
    got = distinct_values(empty, some, pa.array([None, "d"], pa.string()))
    assert got.type == pa.string()
    assert sorted(got.to_pylist()) == ["a", "b", "c", "d"]
    assert distinct_values(empty).to_pylist() == []


def test_a_pruned_scan_keeps_every_matching_row_and_refuses_over_its_limits(spark, tmp_path):
    """`scan_pruned` keeps the files the Delta log's statistics cannot rule out: a row inside a
    span by less than a millisecond (statistics are kept to the millisecond: STATS_SLACK widens
    the spans, and delta-rs compares in milliseconds too), files without statistics
    (`delta.dataSkippingNumIndexedCols` = 0) and rows whose timestamp is null but whose other
    column matches; it refuses (None) a scan or a result over its limits."""
    import datetime as dt

    import pyarrow.compute as pc

    utc = dt.UTC
    base = dt.datetime(2024, 1, 10, tzinfo=utc)
    edge = base + dt.timedelta(microseconds=999)  # in the millisecond the statistics truncate to
    rows = [
        (f"e{i}", base + dt.timedelta(hours=i), base + dt.timedelta(days=1, hours=i))
        for i in range(0, 48, 3)
    ]
    schema = "id string, ts timestamp, loaded timestamp"
    with_stats = str(tmp_path / "with_stats")
    without = str(tmp_path / "without_stats")
    frame = spark.createDataFrame(rows, schema).repartition(6, "id")
    # The edge row alone in its file: its statistics say `base`, a microsecond before the span.
    # So is the row of no timestamp (no minimum or maximum for it).
    alone = [
        spark.createDataFrame([row], schema).coalesce(1)
        for row in [("edge", edge, base), ("null", None, base + dt.timedelta(hours=5))]
    ]
    frame.write.format("delta").save(with_stats)
    spark.sql(
        f"CREATE TABLE delta.`{without}` ({schema}) USING delta "
        "TBLPROPERTIES ('delta.dataSkippingNumIndexedCols' = '0')"
    )
    frame.write.format("delta").mode("append").save(without)
    for one in alone:
        one.write.format("delta").mode("append").save(with_stats)
        one.write.format("delta").mode("append").save(without)
    lo = edge  # the span starts at the edge row's exact microsecond
    hi = base + dt.timedelta(hours=10)
    load_lo, load_hi = base + dt.timedelta(hours=4), base + dt.timedelta(hours=6)
    ts, loaded = pc.field("ts"), pc.field("loaded")
    stamp = pa.timestamp("us", tz="UTC")
    inside = (ts >= pa.scalar(lo, stamp)) & (ts <= pa.scalar(hi, stamp))
    inside = inside | (ts.is_null() & (loaded >= pa.scalar(load_lo, stamp)))
    inside = inside & (loaded <= pa.scalar(dt.datetime(2030, 1, 1, tzinfo=utc), stamp))
    pruning = [
        *delta.timestamp_spans_pruning("ts", [(lo, hi)]),
        *delta.timestamp_spans_pruning("loaded", [(load_lo, load_hi)]),
    ]
    expected = {"edge", "null", "e3", "e6", "e9"}
    for path in (with_stats, without):
        table = delta.delta_table(path)
        kept = delta.scan_pruned(
            table, pruning, ["id", "ts"], inside, scan_limit=1000, keep_limit=1000
        )
        assert kept is not None and set(kept.column("id").to_pylist()) == expected, path
        assert kept.num_rows == len(expected)
    # The statistics prune: a span of no row leaves no file of the table with statistics.
    far = base + dt.timedelta(days=300)
    assert (
        delta.delta_table(with_stats).file_uris(
            file_pruning_predicate=delta.timestamp_spans_pruning("ts", [(far, far)])
        )
        == []
    )
    # The rows surely inside a span: those of files whose statistics put every row inside, a
    # lower bound of the true count whatever the span; none without statistics.
    surely = delta.rows_surely_within
    every = (base - dt.timedelta(days=1), base + dt.timedelta(days=10))
    assert surely(delta.delta_table(with_stats), "ts", *every) == 17  # all but the null row
    assert surely(delta.delta_table(without), "ts", *every) == 0
    assert surely(delta.delta_table(with_stats), "ts", edge, edge) == 0  # truncated maximum
    stamps = [r[1] for r in rows] + [edge]
    for hours in range(0, 48, 5):
        span = (base + dt.timedelta(hours=hours), base + dt.timedelta(hours=hours + 9))
        true = sum(span[0] <= t <= span[1] for t in stamps)
        assert surely(delta.delta_table(with_stats), "ts", *span) <= true
    # Over the limits: None, for Spark to read.
    table = delta.delta_table(with_stats)
    assert delta.scan_pruned(table, pruning, ["id"], inside, scan_limit=1, keep_limit=1000) is None
    assert delta.scan_pruned(table, pruning, ["id"], inside, scan_limit=1000, keep_limit=4) is None


def test_a_small_state_table_compacts_itself_and_keeps_every_row(tmp_path):
    """`compact=True` (the manifest, the accounting, the horizons, the load log): the files stay
    within the `fragmented` bound and the rows are those of the same writes without it."""
    from sessionize_assets.core.maintenance import FRAGMENTED_SLACK_FILES

    schema = pa.schema([("day", pa.string()), ("n", pa.int64())])
    compacting, plain = str(tmp_path / "compacting"), str(tmp_path / "plain")
    for i in range(3 * (FRAGMENTED_SLACK_FILES + 2)):
        rows = [{"day": f"d{i // 2:03d}", "n": i}]  # every other write updates its day's row
        delta.upsert_small(compacting, rows, schema, "day", compact=True)
        delta.upsert_small(plain, rows, schema, "day")
    compacted, kept = delta.delta_table(compacting), delta.delta_table(plain)
    assert sorted(compacted.to_pyarrow_table().to_pylist(), key=lambda r: r["day"]) == sorted(
        kept.to_pyarrow_table().to_pylist(), key=lambda r: r["day"]
    )
    assert len(compacted.file_uris()) <= 2 + FRAGMENTED_SLACK_FILES < len(kept.file_uris())
    assert "OPTIMIZE" in [c["operation"] for c in compacted.history()]
    assert "OPTIMIZE" not in [c["operation"] for c in kept.history()]


def test_a_partitioned_table_is_compacted_only_once_fragmented(tmp_path):
    from deltalake import write_deltalake

    from sessionize_assets.core.maintenance import FRAGMENTED_SLACK_FILES

    path = str(tmp_path / "buckets")
    for i in range(4 + FRAGMENTED_SLACK_FILES):  # two buckets: fragmented past 4 + slack files
        write_deltalake(path, pa.table({"b": [i % 2], "n": [i]}), mode="append", partition_by=["b"])
        assert not delta.compact_when_fragmented(path)
    write_deltalake(path, pa.table({"b": [0], "n": [99]}), mode="append")
    assert delta.compact_when_fragmented(delta.delta_table(path))
    table = delta.delta_table(path)
    assert len(table.file_uris()) == 2
    assert table.to_pyarrow_table().num_rows == 5 + FRAGMENTED_SLACK_FILES
    assert not delta.compact_when_fragmented(path)  # compact now: nothing to do
    assert delta.compact_when_fragmented(str(tmp_path / "absent")) is False


def test_a_small_table_read_again_sees_each_version_and_a_table_made_anew(tmp_path):
    """`read_small_table` reads a version once per process: never a stale one, even when the
    table is deleted and made again at the same path up to the same version."""
    import shutil

    from deltalake import write_deltalake

    path = str(tmp_path / "state")
    write_deltalake(path, pa.table({"k": ["a"]}))
    assert delta.read_small_table(path) == [{"k": "a"}]
    write_deltalake(path, pa.table({"k": ["b"]}), mode="append")
    assert sorted(r["k"] for r in delta.read_small_table(path)) == ["a", "b"]
    shutil.rmtree(path)
    write_deltalake(path, pa.table({"k": ["c"]}))
    write_deltalake(path, pa.table({"k": ["d"]}), mode="append")  # version 1 again
    assert sorted(r["k"] for r in delta.read_small_table(path)) == ["c", "d"]
    rows = delta.read_small_table(path)
    rows[0]["k"] = "changed by the caller"
    assert sorted(r["k"] for r in delta.read_small_table(path)) == ["c", "d"]
    assert delta.read_small_table(path, columns=["k"]) == delta.read_small_table(path)
    assert delta.read_small_table(str(tmp_path / "absent")) == []


def test_add_actions_keep_only_the_columns_asked_for_that_the_log_has(tmp_path):
    from deltalake import write_deltalake

    path = str(tmp_path / "stats")
    write_deltalake(path, pa.table({"d": ["x", "y"], "n": [1, 2]}), partition_by=["d"])
    version, every = delta.add_actions(path)
    _, some = delta.add_actions(path, columns=["num_records", "partition.d", "max.nothing"])
    assert version == 0 and len(every) == len(some) == 2
    assert {"min.n", "max.n", "path"} <= set(every[0])
    assert [sorted(a) for a in some] == [["num_records", "partition.d"]] * 2
    assert sorted((a["partition.d"], a["num_records"]) for a in some) == [("x", 1), ("y", 1)]


def test_a_table_version_is_opened_once_per_thread_and_a_table_made_anew_is_opened_again(tmp_path):
    """`delta_table` returns the version it opened before while that version's commit file is
    the one it saw; a new commit, a table deleted and made again at the same path up to the same
    version, another thread and a writer's `fresh_table` each get a table of their own."""
    import shutil
    import threading

    from deltalake import write_deltalake

    path = str(tmp_path / "state")
    assert delta.delta_table(path) is None
    write_deltalake(path, pa.table({"k": ["a"]}))
    first = delta.delta_table(path)
    assert delta.delta_table(path) is first and delta.delta_table(path, 0) is first
    write_deltalake(path, pa.table({"k": ["b"]}), mode="append")
    second = delta.delta_table(path)
    assert second is not first and second.version() == 1 and first.version() == 0
    assert delta.delta_table(path, 0) is first
    assert sorted(second.to_pyarrow_table().column("k").to_pylist()) == ["a", "b"]

    writer = delta.fresh_table(path)
    assert writer is not second
    writer.update_incremental()  # a writer's table moves; the readers' stays where it was
    assert second.version() == 1

    other: list = []
    thread = threading.Thread(target=lambda: other.append(delta.delta_table(path)))
    thread.start()
    thread.join()
    assert other[0] is not second and other[0].version() == 1

    shutil.rmtree(path)
    write_deltalake(path, pa.table({"k": ["c"]}))
    write_deltalake(path, pa.table({"k": ["d"]}), mode="append")  # version 1 again
    again = delta.delta_table(path)
    assert again is not second
    assert sorted(again.to_pyarrow_table().column("k").to_pylist()) == ["c", "d"]
    assert delta.delta_table(path, 0).to_pyarrow_table().column("k").to_pylist() == ["c"]


def test_only_tables_on_the_local_file_system_are_kept_open():
    assert delta._local_log("s3a://bucket/warehouse/events") is None
    assert delta._local_log("file:///w/events") == "/w/events/_delta_log"
    assert delta._local_log("/w/events/") == "/w/events/_delta_log"


def test_naive_rows_give_utc_wall_times_that_arrow_takes_back_as_the_same_instants() -> None:
    import datetime as dt

    from sessionize_assets.core.clock import to_micros

    aware = dt.datetime(2024, 3, 10, 23, 59, 59, 999_999, tzinfo=dt.UTC)
    table = pa.table(
        {
            "at": pa.array([aware, None], pa.timestamp("us", tz="UTC")),
            "local": pa.array([aware, None], pa.timestamp("us", tz="Europe/Paris")),
            "plain": pa.array([dt.datetime(2024, 1, 1), None], pa.timestamp("us")),
            "n": [1, 2],
        }
    )
    rows = delta.naive_rows(table)
    wall = aware.replace(tzinfo=None)
    assert rows == [
        {"at": wall, "local": wall, "plain": dt.datetime(2024, 1, 1), "n": 1},
        {"at": None, "local": None, "plain": None, "n": 2},
    ]
    back = pa.Table.from_pylist(rows, schema=table.schema)
    assert back.equals(table)
    assert to_micros(wall) == to_micros(aware) == 1_710_115_199_999_999  # user models' durations
