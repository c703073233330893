"""sessions/frames.py: the small-query configuration a small run's session models execute under."""

from __future__ import annotations

from pyspark.sql import functions as F

from sessionize_assets.sessions.frames import small_query_conf
from sessionize_assets_tests.plans import executed_nodes

KEYS = ("spark.sql.adaptive.enabled", "spark.sql.codegen.wholeStage")


def _grouped(spark):
    df = spark.range(100).groupBy((F.col("id") % 7).alias("k")).agg(F.count("*").alias("n"))
    df.collect()
    return {node.getClass().getSimpleName() for node in executed_nodes(df)}


def test_a_small_run_executes_interpreted_without_adaptive_stages_then_restores(spark) -> None:
    before = {k: spark.conf.get(k) for k in KEYS}
    with small_query_conf(spark, True):
        assert {k: spark.conf.get(k) for k in KEYS} == dict.fromkeys(KEYS, "false")
        inside = _grouped(spark)
    assert {k: spark.conf.get(k) for k in KEYS} == before
    assert "WholeStageCodegenExec" not in inside and "AdaptiveSparkPlanExec" not in inside
    assert "HashAggregateExec" in inside  # the plan was walked


def test_a_large_run_keeps_the_session_settings(spark) -> None:
    before = {k: spark.conf.get(k) for k in KEYS}
    with small_query_conf(spark, False):
        assert {k: spark.conf.get(k) for k in KEYS} == before
        nodes = _grouped(spark)
    assert ("WholeStageCodegenExec" in nodes) == (before["spark.sql.codegen.wholeStage"] == "true")


def test_a_run_is_small_only_when_what_it_takes_and_what_it_scans_are_small():
    from sessionize_assets.sessions.frames import SMALL_RUN_ROWS, small_run

    assert small_run(10, 1_000) and small_run(SMALL_RUN_ROWS, SMALL_RUN_ROWS)
    assert not small_run(SMALL_RUN_ROWS + 1, 1_000)  # takes on many rows
    assert not small_run(10, SMALL_RUN_ROWS + 1)  # few rows, but reads scan a large table
    assert not small_run(10, None)  # a file without a row count: the size is unknown


def test_localize_collects_a_small_result_and_persists_a_large_one(spark) -> None:
    from sessionize_assets.sessions.frames import localize

    small = localize(spark, spark.range(5), limit=5)
    assert not small.is_cached and sorted(r.id for r in small.collect()) == [0, 1, 2, 3, 4]
    large = localize(spark, spark.range(6), limit=5)
    assert large.is_cached and large.count() == 6
    large.unpersist()


def test_localize_computes_a_large_result_once_in_one_partition_per_core(spark) -> None:
    """Finding that a result is too large to collect does not compute it a second time: each
    input row passes through the result's computation once (counted by an accumulator) up to
    and including its first uses; the persisted result has at most one partition per core, not
    the shuffle's 64."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import LongType

    from sessionize_assets.sessions.frames import default_parallelism, localize

    computed = spark.sparkContext.accumulator(0)

    def seen(value: int) -> int:
        computed.add(1)
        return value

    counted = F.udf(seen, LongType())
    rows = spark.range(0, 40, numPartitions=4).select(counted("id").alias("id"))
    large = localize(spark, rows.groupBy((F.col("id") % 20).alias("k")).count(), limit=5)
    assert large.is_cached
    assert large.count() == 20 and large.agg(F.sum("count")).collect()[0][0] == 40
    assert computed.value == 40
    assert large.rdd.getNumPartitions() <= default_parallelism(spark)
    large.unpersist()


def test_a_merge_source_keeps_only_the_rows_that_change_the_table(spark) -> None:
    """Rows equal to the stored ones (nulls equal) go; changed and new rows and the removals of
    stored rows stay; a removal of a row the table does not hold goes."""
    from sessionize_assets.sessions.frames import without_unchanged

    schema = "k string, a long, b string, _delete boolean"
    stored = spark.createDataFrame(
        [
            ("same", 1, "x"),
            ("nulls", 2, None),
            ("changed", 3, "x"),
            ("to-null", 4, "x"),
            ("removed", 5, "x"),
        ],
        "k string, a long, b string",
    )
    source = spark.createDataFrame(
        [
            ("same", 1, "x", False),
            ("nulls", 2, None, False),
            ("changed", 3, "y", False),
            ("to-null", 4, None, False),
            ("new", 6, "x", False),
            ("removed", None, None, True),
            ("never-stored", None, None, True),
        ],
        schema,
    )
    kept = without_unchanged(source, stored, "k", ["k", "a", "b"])
    assert sorted((r.k, r._delete) for r in kept.collect()) == [
        ("changed", False),
        ("new", False),
        ("removed", True),
        ("to-null", False),
    ]
