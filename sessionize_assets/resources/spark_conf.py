"""The Spark settings of the embedded engine and of the warm engine's server: the defaults, the
Delta jars, then the user's `spark` setting (shared by `resources/spark.py` and
`resources/engine.py`)."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from sessionize_assets.class_archive import driver_options, names_archive
from sessionize_assets.jars import delta_jar_paths

DRIVER_OPTIONS = "spark.driver.extraJavaOptions"

# Defaults for the embedded engine. Every key can be overridden by the `spark` setting, so the
# same code runs on a cluster by configuration alone (`spark.master: spark://host:7077`).
DEFAULT_SPARK_CONF: dict[str, str] = {
    "spark.master": "local[*]",
    "spark.app.name": "sessionize_assets",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    # Keep tables readable by delta-rs and other engines: no deletion vectors, no row tracking.
    "spark.databricks.delta.properties.defaults.enableDeletionVectors": "false",
    "spark.databricks.delta.properties.defaults.enableRowTracking": "false",
    "spark.databricks.delta.schema.autoMerge.enabled": "false",
    # Adaptive execution coalesces small shuffles into few partitions; 64 keeps each task's sort
    # and aggregation small on big runs (8 ran a 6 M-event sessionization out of heap).
    "spark.sql.shuffle.partitions": "64",
    "spark.sql.adaptive.enabled": "true",
    "spark.databricks.delta.snapshotPartitions": "2",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.driver.memory": "2g",
    # The throughput collector: Spark's batch work wants CPU, not short pauses. On a day of
    # 200,000 events on the warm engine it took 9-12 % off the wall time and 11-15 % off the
    # JVM's CPU against G1 (Java 17's default), with a lower peak (docs/benchmarks.md, session 28).
    # A user's own `spark.driver.extraJavaOptions` replaces this one; it is left out when the
    # environment's JVM options name a collector (`environment_names_a_collector`).
    "spark.driver.extraJavaOptions": "-XX:+UseParallelGC",
    "spark.sql.sources.partitionOverwriteMode": "dynamic",
    "spark.sql.parquet.datetimeRebaseModeInWrite": "CORRECTED",
    # Timestamps as INT64 microseconds: Parquet keeps no statistics for Spark's default INT96, so
    # no filter on a timestamp reaches the reader's row-group and page skipping
    # (`core/filtering.PARQUET_LAYOUT` sets it for filtered_events' writes whatever this says).
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.sql.legacy.timeParserPolicy": "CORRECTED",
}


# Variables the JVM reads its options from besides its command line.
JVM_OPTION_VARIABLES = ("JAVA_TOOL_OPTIONS", "JDK_JAVA_OPTIONS", "_JAVA_OPTIONS")
_COLLECTOR = re.compile(r"-XX:\+Use\w+GC\b")


def environment_names_a_collector() -> bool:
    """Whether the JVM options of the environment name a garbage collector: the JVM refuses to
    start with two ("Multiple garbage collectors selected"), so the default's is left out."""
    return any(_COLLECTOR.search(os.environ.get(v, "")) for v in JVM_OPTION_VARIABLES)


def spark_conf(overrides: Mapping[str, str] | None = None) -> dict[str, str]:
    """The effective Spark settings: defaults, the Delta jars, then the user's overrides."""
    conf = dict(DEFAULT_SPARK_CONF)
    if environment_names_a_collector():
        conf.pop(DRIVER_OPTIONS)
    jars = ",".join(str(p) for p in delta_jar_paths())
    conf["spark.jars"] = jars
    for key, value in (overrides or {}).items():
        if key == "spark.jars" and value:
            conf[key] = f"{jars},{value}"
        else:
            conf[key] = str(value)
    return with_class_archive(conf)


def with_class_archive(conf: dict[str, str]) -> dict[str, str]:
    """`conf` with the driver's JVM mapping set-up's class archive (`class_archive`), added to
    whatever `spark.driver.extraJavaOptions` holds (the default's or the user's): unless those
    options, or the environment's, already say how to share classes, or there is no archive."""
    options = conf.get(DRIVER_OPTIONS, "")
    environment = " ".join(os.environ.get(v, "") for v in JVM_OPTION_VARIABLES)
    if names_archive(options) or names_archive(environment):
        return conf
    archive = driver_options()
    if archive:
        conf[DRIVER_OPTIONS] = f"{options} {archive}".strip()
    return conf
