"""The Spark session with Delta Lake enabled, as a Dagster resource built on dagster-pyspark."""

from __future__ import annotations

import os
from collections.abc import Mapping

from dagster_pyspark import PySparkResource
from pydantic import Field
from pyspark.sql import SparkSession

from sessionize_assets.jars import delta_jar_paths

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
    # Small data per run: few shuffle partitions, adaptive execution coalesces the rest.
    "spark.sql.shuffle.partitions": "8",
    "spark.sql.adaptive.enabled": "true",
    "spark.databricks.delta.snapshotPartitions": "2",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.driver.memory": "2g",
    "spark.sql.sources.partitionOverwriteMode": "dynamic",
    "spark.sql.parquet.datetimeRebaseModeInWrite": "CORRECTED",
    "spark.sql.legacy.timeParserPolicy": "CORRECTED",
}


def spark_conf(overrides: Mapping[str, str] | None = None) -> dict[str, str]:
    """The effective Spark settings: defaults, the Delta jars, then the user's overrides."""
    conf = dict(DEFAULT_SPARK_CONF)
    jars = ",".join(str(p) for p in delta_jar_paths())
    conf["spark.jars"] = jars
    for key, value in (overrides or {}).items():
        if key == "spark.jars" and value:
            conf[key] = f"{jars},{value}"
        else:
            conf[key] = str(value)
    return conf


def get_spark(overrides: Mapping[str, str] | None = None) -> SparkSession:
    """The one Spark session of this process (created on first use, reused afterwards)."""
    # Bind the embedded engine to loopback; a cluster's addresses come from the settings.
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    builder = SparkSession.builder
    for key, value in spark_conf(overrides).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


class SparkDeltaResource(PySparkResource):
    """One Spark session with Delta Lake, UTC session time and `local[*]` unless configured."""

    spark_config: dict = Field(
        default_factory=dict, description="Spark settings overriding the defaults."
    )

    def setup_for_execution(self, context) -> None:  # noqa: ANN001 - Dagster's signature
        self._spark_session = get_spark(self.spark_config)

    def get_session(self) -> SparkSession:
        """The session, also outside a Dagster run (CLI, tests)."""
        if self._spark_session is None:
            self._spark_session = get_spark(self.spark_config)
        return self._spark_session
