import subprocess
import sys

import pytest
from dagster_deltalake import DeltaTableResource, LocalConfig

from sessionize_assets import jars
from sessionize_assets.errors import MissingJarsError
from sessionize_assets.resources.spark import spark_conf
from sessionize_assets.resources.spark_conf import JVM_OPTION_VARIABLES


def test_session_has_delta_utc_and_user_overrides(spark):
    assert spark.conf.get("spark.sql.session.timeZone") == "UTC"
    assert "DeltaSparkSessionExtension" in spark.conf.get("spark.sql.extensions")
    conf = spark_conf({"spark.master": "spark://cluster:7077", "spark.executor.memory": "8g"})
    assert conf["spark.master"] == "spark://cluster:7077"
    assert conf["spark.executor.memory"] == "8g"
    assert conf["spark.databricks.delta.properties.defaults.enableDeletionVectors"] == "false"


def test_the_driver_jvm_runs_the_throughput_collector_unless_the_user_names_options(monkeypatch):
    """The embedded engine and the warm engine's server both launch their JVM with
    `spark.driver.extraJavaOptions`; a user's value replaces the default whole (the class
    archive's options, added to either, are tested in test_class_archive.py)."""
    from sessionize_assets.resources import engine

    monkeypatch.setenv("SESSIONIZE_CLASS_ARCHIVE", "off")

    assert spark_conf()["spark.driver.extraJavaOptions"] == "-XX:+UseParallelGC"
    command = engine._command(None, 15002)
    assert "spark.driver.extraJavaOptions=-XX:+UseParallelGC" in command
    mine = {"spark.driver.extraJavaOptions": "-XX:+UseSerialGC"}
    assert spark_conf(mine)["spark.driver.extraJavaOptions"] == "-XX:+UseSerialGC"
    assert "spark.driver.extraJavaOptions=-XX:+UseSerialGC" in engine._command(mine, 15002)


def test_a_collector_named_in_the_environment_leaves_the_default_out(monkeypatch):
    """Two collectors stop the JVM before it starts: the environment's wins."""
    monkeypatch.setenv("SESSIONIZE_CLASS_ARCHIVE", "off")
    for variable in JVM_OPTION_VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("JAVA_TOOL_OPTIONS", "-Xss4m")
    assert spark_conf()["spark.driver.extraJavaOptions"] == "-XX:+UseParallelGC"
    monkeypatch.setenv("JDK_JAVA_OPTIONS", "-Xss4m -XX:+UseSerialGC")
    assert "spark.driver.extraJavaOptions" not in spark_conf()
    mine = {"spark.driver.extraJavaOptions": "-Xss8m"}
    assert spark_conf(mine)["spark.driver.extraJavaOptions"] == "-Xss8m"


def test_spark_written_table_reads_back_through_delta_rs(spark, tmp_path):
    path = str(tmp_path / "roundtrip")
    frame = spark.createDataFrame(
        [("e1", "2024-03-01 10:00:00"), ("e2", "2024-03-02 11:30:00.250")],
        "event_id string, ts string",
    ).selectExpr("event_id", "to_timestamp(ts) as ts", "to_date(ts) as load_date")
    frame.write.format("delta").partitionBy("load_date").save(path)
    spark.sql(f"UPDATE delta.`{path}` SET event_id = 'e2b' WHERE event_id = 'e2'")

    table = DeltaTableResource(url=path, storage_options=LocalConfig()).load()
    rows = sorted(table.to_pyarrow_table().to_pylist(), key=lambda r: r["event_id"])
    assert [r["event_id"] for r in rows] == ["e1", "e2b"]
    assert str(rows[1]["ts"]).startswith("2024-03-02 11:30:00.25")
    assert table.version() == 1
    assert "deletionVectors" not in (table.protocol().reader_features or [])


def test_missing_jars_is_one_sentence_naming_the_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("SESSIONIZE_JARS_DIR", str(tmp_path / "nothing"))
    with pytest.raises(MissingJarsError) as info:
        jars.delta_jar_paths()
    message = str(info.value)
    assert "bash scripts/dev.sh setup" in message and "\n" not in message


def test_cli_reports_missing_jars_without_traceback(tmp_path):
    env = {
        "SESSIONIZE_JARS_DIR": str(tmp_path / "nothing"),
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
    }
    data = tmp_path / "e.csv"
    data.write_text("event_id,collector_tstamp\ne1,2024-03-01 10:00:00\n")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "sessionize_assets.cli",
            "--home",
            str(tmp_path / "h"),
            "load",
            str(data),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "scripts/dev.sh setup" in result.stderr


def test_a_start_up_error_names_the_users_setting_it_comes_from():
    from sessionize_assets.resources.spark import refused_setting

    error = (
        "An error occurred while calling None.org.apache.spark.api.java.JavaSparkContext.\n"
        ": java.lang.IllegalArgumentException: spark.memory.fraction should be between 0 and 1"
    )
    sentence = refused_setting(
        error, {"spark.memory.fraction": "5", "spark.sql.shuffle.partitions": "8"}
    )
    assert sentence == (
        "Spark refused the setting `spark.spark.memory.fraction`: spark.memory.fraction should be "
        "between 0 and 1 (fix or remove it in the `spark` settings)."
    )
    assert refused_setting("JAVA_GATEWAY_EXITED", {"spark.memory.fraction": "5"}) is None
    bind = (
        "java.net.BindException: Cannot assign requested address: Service 'sparkDriver' failed "
        "after 16 retries! Consider explicitly setting the appropriate binding address for the "
        "service 'sparkDriver' (for example spark.driver.bindAddress for SparkDriver)"
    )
    assert refused_setting(bind, {"spark.driver.bindAddress": "127.0.0.1"}) is None
    assert refused_setting(error, {}) is None


def test_an_arrow_table_with_empty_batches_becomes_every_row(spark):
    """`arrow_frame` keeps every row of a table whose batches include empty ones, anywhere:
    pyspark 4.2's classic `createDataFrame` loses the batches after an empty one."""
    import pyarrow as pa

    from sessionize_assets.resources.spark import arrow_frame

    def table(*chunks: list[int]) -> pa.Table:
        schema = pa.schema([("x", pa.int64())])
        return pa.Table.from_batches(
            [pa.record_batch([pa.array(c, pa.int64())], schema=schema) for c in chunks], schema
        )

    holed = table([1], [], [2], [], [3, 4])
    assert spark.createDataFrame(holed).count() < 4  # what the guard is for
    for data, rows in ((holed, [1, 2, 3, 4]), (table(), []), (table([]), []), (table([5]), [5])):
        for schema in (None, "x long"):
            got = sorted(r.x for r in arrow_frame(spark, data, schema).collect())
            assert got == rows, (data, schema)
    # No batch at all, with a timestamp column (pyspark cannot convert a column of no chunks).
    stamps = pa.schema(
        [("t", pa.timestamp("us", tz="UTC")), ("m", pa.map_(pa.string(), pa.int64()))]
    )
    empty = pa.Table.from_batches([], schema=stamps)
    assert arrow_frame(spark, empty).count() == 0
    assert arrow_frame(spark, empty, "t timestamp, m map<string,bigint>").count() == 0
