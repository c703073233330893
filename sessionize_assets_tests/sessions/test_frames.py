"""sessions/frames.py: the small-query configuration a small run's session models execute under."""

from __future__ import annotations

import pytest
from pyspark.sql import functions as F

from sessionize_assets.resources.spark import small_query_conf, temporary_conf
from sessionize_assets_tests.plans import executed_nodes

KEYS = (
    "spark.sql.adaptive.enabled",
    "spark.sql.codegen.wholeStage",
    "spark.sql.codegen.factoryMode",
)
# A session as the product's engine runs it (the tests' own runs everything interpreted).
PRODUCTION = {
    "spark.sql.adaptive.enabled": "true",
    "spark.sql.codegen.wholeStage": "true",
    "spark.sql.codegen.factoryMode": "FALLBACK",
}


def _grouped(spark):
    df = spark.range(100).groupBy((F.col("id") % 7).alias("k")).agg(F.count("*").alias("n"))
    df.collect()
    return {node.getClass().getSimpleName() for node in executed_nodes(df)}


def test_a_small_run_executes_interpreted_without_adaptive_stages_then_restores(spark) -> None:
    with temporary_conf(spark, PRODUCTION):
        with small_query_conf(spark, True):
            assert {k: spark.conf.get(k) for k in KEYS} == {
                "spark.sql.adaptive.enabled": "false",
                "spark.sql.codegen.wholeStage": "false",
                "spark.sql.codegen.factoryMode": "NO_CODEGEN",
            }
            inside = _grouped(spark)
        assert {k: spark.conf.get(k) for k in KEYS} == PRODUCTION
    assert "WholeStageCodegenExec" not in inside and "AdaptiveSparkPlanExec" not in inside
    assert "HashAggregateExec" in inside  # the plan was walked


def test_a_small_runs_fetch_with_a_row_limit_computes_every_partition_in_one_job(spark) -> None:
    """Spark computes a fetch with a row limit one partition first and the rest in a later job;
    in a small run, with one shuffle partition per core, that was one core at a time (over
    Spark Connect, every `localized` fetch)."""
    from sessionize_assets.resources.spark import default_parallelism

    assert default_parallelism(spark) >= 2  # else one partition, one job: nothing to show
    grouped = spark.range(0, 1000, numPartitions=2).groupBy((F.col("id") % 10).alias("k")).count()
    tracker = spark.sparkContext.statusTracker()
    with small_query_conf(spark, True):
        spark.sparkContext.setJobGroup("limited fetch", "a fetch with a row limit")
        try:
            rows = grouped.limit(100).collect()
        finally:
            spark.sparkContext.setJobGroup("", "")
    assert len(rows) == 10
    assert len(tracker.getJobIdsForGroup("limited fetch")) == 1


def test_a_large_run_keeps_the_session_settings(spark) -> None:
    with temporary_conf(spark, PRODUCTION):
        with small_query_conf(spark, False):
            assert {k: spark.conf.get(k) for k in KEYS} == PRODUCTION
            nodes = _grouped(spark)
    assert "WholeStageCodegenExec" in nodes


def test_a_run_is_small_when_what_it_takes_on_is_small_whatever_the_history():
    from sessionize_assets.sessions.frames import SMALL_RUN_ROWS, small_run

    assert small_run(10) and small_run(SMALL_RUN_ROWS)
    assert not small_run(SMALL_RUN_ROWS + 1)  # takes on many rows


@pytest.mark.parametrize("fetch_first", [False, True])
def test_a_result_over_the_limit_stays_whole_whichever_is_computed_first(
    spark, fetch_first
) -> None:
    from sessionize_assets.sessions.frames import localized, small_results

    rows = spark.createDataFrame([(i,) for i in range(5)], "n long")
    with small_results(fetch_first):
        small, small_rows = localized(spark, rows.filter("n < 2"), limit=2)
        large, large_rows = localized(spark, rows, limit=2)
    # At most the limit: driver-local, with the Arrow rows it was made of.
    assert small_rows is not None and sorted(small_rows.column("n").to_pylist()) == [0, 1]
    assert sorted(r.n for r in small.collect()) == [0, 1]
    # Over it: Spark keeps every row (none cut at the limit's fetch), no Arrow rows.
    assert large_rows is None
    assert sorted(r.n for r in large.collect()) == [0, 1, 2, 3, 4]
    large.unpersist()
