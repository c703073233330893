"""The Dagster resource over the Spark session (`resources/spark.get_spark`): its own module, so
that planning and the command line's no-op import neither Dagster nor dagster-pyspark."""

from __future__ import annotations

from dagster_pyspark import PySparkResource
from pydantic import Field
from pyspark.sql import SparkSession

from sessionize_assets.resources.spark import get_spark


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
