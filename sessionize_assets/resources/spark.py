"""The Spark session with Delta Lake enabled, as a Dagster resource built on dagster-pyspark.

By default the session is an embedded engine (a JVM in this process). When a Spark Connect URL is
configured (`spark.remote` in the `spark` setting, else `$SESSIONIZE_SPARK_REMOTE`, else
`$SPARK_REMOTE`) the session is a Spark Connect client of that server instead, e.g. the warm
engine of `resources/engine.py`; `SESSIONIZE_SPARK_REMOTE=home` means the engine of the home
(`$SESSIONIZE_HOME`).
"""

from __future__ import annotations

import atexit
import ipaddress
import os
import re
import socket
import threading
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import pyarrow as pa
from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from sessionize_assets.errors import SettingsError, UserError
from sessionize_assets.resources.spark_conf import DEFAULT_SPARK_CONF, spark_conf

REMOTE_SETTING = "spark.remote"
REMOTE_ENV = ("SESSIONIZE_SPARK_REMOTE", "SPARK_REMOTE")
HOME_ENGINE = "home"  # SESSIONIZE_SPARK_REMOTE=home: the engine started for $SESSIONIZE_HOME
# Settings a Connect client cannot change: they belong to the server (its SparkConf at start).
_SERVER_ONLY_SQL = ("spark.sql.extensions", "spark.sql.catalog.", "spark.sql.warehouse.dir")


def remote_url(overrides: Mapping[str, str] | None = None) -> str | None:
    """The Spark Connect URL to use, or None for the embedded engine."""
    url = (overrides or {}).get(REMOTE_SETTING) or next(
        (os.environ[name] for name in REMOTE_ENV if os.environ.get(name)), None
    )
    if not url:
        return None
    url = str(url).strip()
    if url == HOME_ENGINE:
        from sessionize_assets.home import Home
        from sessionize_assets.resources import engine

        root = Home.from_env().root
        found = engine.remote_url(root)
        if found is None:
            raise UserError(
                f"SESSIONIZE_SPARK_REMOTE=home but no Spark engine answers for {root} "
                f"({engine.status(root).state}); start it with "
                f"`python -m sessionize_assets.resources.engine start --home {root}`"
            )
        return found
    return url


def session_conf(overrides: Mapping[str, str] | None = None) -> dict[str, str]:
    """The settings a Connect client sets on its session: the SQL and Delta ones (the rest is the
    server's; see `resources/engine.py`)."""
    conf = {**DEFAULT_SPARK_CONF, **{k: str(v) for k, v in (overrides or {}).items()}}
    return {
        k: v
        for k, v in conf.items()
        if k.startswith(("spark.sql.", "spark.databricks.")) and not k.startswith(_SERVER_ONLY_SQL)
    }


# How long the check that a Connect server listens waits for a connection.
REACHABLE_TIMEOUT_S = 5.0


def check_reachable(url: str, timeout_s: float = REACHABLE_TIMEOUT_S) -> str:
    """The host of the Connect URL `url`; raise UserError (one sentence) unless something accepts
    connections at its host and port: a client of a server that is not there retries for about
    ten minutes before it fails (pyspark's default retry policy), silently."""
    from pyspark.sql.connect.client.core import DefaultChannelBuilder

    where = "`spark.remote` in the `spark` setting, $SESSIONIZE_SPARK_REMOTE or $SPARK_REMOTE"
    try:
        endpoint = DefaultChannelBuilder(url).endpoint
        host, _, port = endpoint.rpartition(":")
        address = (host.strip("[]"), int(port))
    except Exception:  # noqa: BLE001 - pyspark's own parse errors
        shown = url.split(";", 1)[0]  # never the token its parameters may carry
        raise UserError(
            f"The Spark Connect URL {shown!r} is not of the form sc://host:port; fix it ({where})."
        ) from None
    try:
        with socket.create_connection(address, timeout=timeout_s):
            return address[0]
    except OSError as exc:
        raise UserError(
            f"No Spark Connect server answers at {endpoint} ({exc.strerror or exc}); start it "
            f"(`sessionize engine start` for the home's warm engine) or fix the URL ({where})."
        ) from None


def _remote_session(url: str, overrides: Mapping[str, str] | None) -> SparkSession:
    from pyspark.sql.connect.session import SparkSession as RemoteSparkSession

    existing = RemoteSparkSession.getActiveSession() or RemoteSparkSession._get_default_session()
    if existing is not None:
        return existing  # as the embedded engine: settings are applied once, at creation
    host = check_reachable(url)
    # As SparkSession.builder does for `remote`: pyspark.sql.functions, DeltaTable, ... then
    # build Connect objects in this process.
    os.environ["SPARK_CONNECT_MODE_ENABLED"] = "1"
    session = RemoteSparkSession.builder.remote(url).create()  # no call to the server yet
    if _is_loopback(host):
        from pyspark.sql.connect.client.retries import DefaultPolicy

        session.client.set_retry_policies([DefaultPolicy(max_retries=LOCAL_ENGINE_RETRIES)])
        # The failure is reported as one sentence (`errors.one_sentence`), not also as a warning.
        warnings.filterwarnings("ignore", message=r"\[RETRIES_EXCEEDED\]")
    settings = session_conf(overrides)
    if settings:  # as the builder's `config(map=...).create()` applies them
        session.conf._set_all(configs=settings, silent=True)
    return release_at_exit(session)


# Retries of a call to an engine on this machine that stopped answering (a killed JVM): three,
# about 5 s in all (five took 54 s). pyspark's default policy (15), made for remote servers,
# retries for at least ten minutes, silently; a local engine that is gone does not come back
# with the session.
LOCAL_ENGINE_RETRIES = 3


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(socket.gethostbyname(host)).is_loopback
    except (OSError, ValueError):
        return False


# How long a process's exit waits for the server to release its Connect session.
RELEASE_TIMEOUT_S = 5.0


def release_at_exit(session: SparkSession, timeout_s: float = RELEASE_TIMEOUT_S) -> SparkSession:
    """`session`, released on the server when this process exits: its `stop` waits at most
    `timeout_s` there (an engine that went away must not hold up the exit).

    The server keeps a session its client did not release for an hour after its last use, and
    with it every plan the session ran, driver-local DataFrames' rows included: a burst of days on
    one engine (one `sessionize` process, one session each) filled the engine's heap in session 51
    (docs/benchmarks.md, "Session 52"). pyspark's own exit handler releases nothing by default,
    and its one call (clearing the session's ML cache; this project caches no ML models) retries
    an unreachable server for minutes: it is replaced."""

    def release() -> None:
        releasing = threading.Thread(target=session.stop, name="release-session", daemon=True)
        releasing.start()
        releasing.join(timeout_s)

    client_exit = getattr(getattr(session, "client", None), "_on_exit", None)
    if client_exit is not None:
        atexit.unregister(client_exit)
    atexit.register(release)
    return session


def get_spark(overrides: Mapping[str, str] | None = None) -> SparkSession:
    """The one Spark session of this process (created on first use, reused afterwards): a Spark
    Connect client when a remote URL is configured (`remote_url`), else the embedded engine."""
    url = remote_url(overrides)
    if url is not None:
        return _remote_session(url, overrides)
    # Bind the embedded engine to loopback; a cluster's addresses come from the settings.
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    builder = SparkSession.builder
    for key, value in spark_conf(overrides).items():
        builder = builder.config(key, value)
    try:
        spark = builder.getOrCreate()
    except Exception as exc:  # the JVM refused a setting, or did not start
        refused = refused_setting(str(exc), overrides or {})
        if refused is None:
            raise
        raise SettingsError(refused) from exc
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def refused_setting(error: str, overrides: Mapping[str, str]) -> str | None:
    """The sentence for a Spark start-up failure caused by one of the user's `spark` settings (the
    first key the engine's error names), or None when the error names none of them."""
    verdicts = ("should", "must", "invalid", "not allowed", "cannot be", "requires")
    for key in sorted(overrides, key=len, reverse=True):
        # The line naming the key must say it is wrong (a bind failure's hint to check
        # spark.driver.bindAddress does not blame a correct setting).
        lines = [
            line.strip()
            for line in error.splitlines()
            if key in line and any(v in line.lower() for v in verdicts)
        ]
        if lines:
            reason = lines[0].removeprefix(": ")
            for prefix in (
                "java.lang.IllegalArgumentException: ",
                "org.apache.spark.SparkException: ",
            ):
                reason = reason.removeprefix(prefix)
            return (
                f"Spark refused the setting `spark.{key}`: {reason[:200]} (fix or remove it in the "
                "`spark` settings)."
            )
    return None


def default_parallelism(spark: SparkSession) -> int:
    """Spark's default parallelism, also over Spark Connect (which has no SparkContext): the
    `spark.default.parallelism` setting, else the cores `local[N]` / `local[*]` names."""
    try:
        return spark.sparkContext.defaultParallelism
    except Exception:  # noqa: BLE001 - a Connect session has no SparkContext
        pass
    configured = spark.conf.get("spark.default.parallelism", None)
    if configured and str(configured).isdigit():
        return int(configured)
    master = str(spark.conf.get("spark.master", None) or "")
    match = re.match(r"local\[(\d+|\*)", master)
    if match and match.group(1).isdigit():
        return int(match.group(1))
    return os.cpu_count() or 2


def fetch_arrow(df: DataFrame) -> tuple[pa.Table, StructType]:
    """`df`'s rows as Arrow (as `toArrow` gives them) and its schema, in one round trip over
    Spark Connect.

    Connect's `toArrow` first asks the server for the schema, an analysis of the whole plan (its
    Delta scans' snapshots included), and a later `df.schema` asks again; the execution's own
    response carries the schema. In a small session run, those two analyses per driver-local
    result took about 2 s of the driver's time (docs/benchmarks.md, "Session 32"). A classic
    session's schema is known without a round trip."""
    to_table = getattr(df, "_to_table", None)  # pyspark.sql.connect.dataframe.DataFrame
    if to_table is None:
        return df.toArrow(), df.schema
    table, schema = to_table()
    if not isinstance(schema, StructType):  # not sent: asked for, the query is not run again
        schema = df.schema
    # The types `toArrow` gives (it casts the same way, with the schema it asked for).
    arrow = to_arrow_schema(schema, error_on_duplicated_field_names_in_struct=True, timezone="UTC")
    return table.cast(arrow), schema


def arrow_frame(spark: SparkSession, table: pa.Table, schema: Any = None) -> DataFrame:
    """A driver-local DataFrame of the Arrow `table` (`schema`: as `createDataFrame` takes it).

    The table's empty record batches are dropped first: pyspark 4.2's classic `createDataFrame`
    keeps only the batches before the first empty one that follows a non-empty one (batches of
    1, 0 and 1 rows give a DataFrame of 1 row), and a delta-rs scan filtered in memory, or a
    table put together from parts, can hold empty batches anywhere. A table of no rows without
    `schema` gets its Arrow schema's: Spark Connect infers none from no rows."""
    batches = [b for b in table.to_batches() if b.num_rows]
    if not batches:  # one empty batch: a column of no chunks fails the timestamp conversion
        batches = [
            pa.record_batch([pa.array([], type=f.type) for f in table.schema], schema=table.schema)
        ]
        if schema is None:  # Spark Connect infers no schema from no rows: it is Arrow's
            from pyspark.sql.pandas.types import from_arrow_schema

            try:
                schema = from_arrow_schema(table.schema)
            except (TypeError, ValueError, NotImplementedError):
                schema = None
    return spark.createDataFrame(pa.Table.from_batches(batches, schema=table.schema), schema=schema)


def persist_compact(
    spark: SparkSession, df: DataFrame, level: StorageLevel | None = None
) -> DataFrame:
    """`df` persisted (unpersist when done) in at most one partition per core.

    A persisted plan keeps the partitions it was computed in: adaptive execution does not coalesce
    a cached plan's shuffle partitions, and a scan keeps one partition per file split. Every later
    read of the cache is then that many tasks, each with its fixed cost, however few rows it holds:
    the session models' change set (one partition per file of the run window's event day, 68 on
    the 30-day benchmark home) cost about 1.5 s of task time per read. Coalesced (no shuffle), the
    result is computed by at most one task per core, which on `local[N]` is no less parallel."""
    kept = df.coalesce(max(1, default_parallelism(spark)))
    return kept.persist(level) if level is not None else kept.persist()


@contextmanager
def temporary_conf(spark: SparkSession, settings: Mapping[str, str]) -> Iterator[None]:
    """`settings` set on the Spark session for the duration of the block, then restored.

    Spark hands a session's settings to the Hadoop configuration of its file writers, so this
    is how one write gets its own Parquet settings (`parquet.*`), also over Spark Connect. The
    session's other work in the meantime sees them too: the project writes one table at a time."""
    previous = {key: spark.conf.get(key, None) for key in settings}
    try:
        for key, value in settings.items():
            spark.conf.set(key, value)
        yield
    finally:
        for key, value in previous.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)


# Spark's expression factories (`spark.sql.codegen.factoryMode`): NO_CODEGEN interprets every
# expression; Spark's default, FALLBACK, compiles them (and interprets when compiling fails).
SMALL_QUERY_EXPRESSIONS = "NO_CODEGEN"


@contextmanager
def small_query_conf(spark: SparkSession, enabled: bool) -> Iterator[None]:
    """Turn adaptive execution and code generation (whole-stage and per expression) off and use
    one shuffle partition per core while `enabled`, restoring the session's settings afterwards.

    A small run's queries each compile their generated code afresh (their literals differ from
    run to run), which costs more than running them interpreted: on the recovery test's history
    (`local[2]`), the second run is about 9 % faster in three alternating pairs. Up to a few
    million rows, interpreted and generated code measured within noise of each other
    (docs/benchmarks.md, "Session 18"). Expressions interpreted too (session 43): a 5,000-event
    day on the headline home's warm engine took a median 9.5 JVM CPU-s instead of 14.2 (ten days
    against nine, alternated; docs/benchmarks.md, "Session 43")."""
    if not enabled:
        yield
        return
    cores = str(max(1, default_parallelism(spark)))
    wanted = {
        "spark.sql.adaptive.enabled": "false",
        "spark.sql.shuffle.partitions": cores,
        "spark.sql.codegen.wholeStage": "false",
        "spark.sql.codegen.factoryMode": SMALL_QUERY_EXPRESSIONS,
        # A fetch with a row limit (`localized`, the driver's writes) computes one partition
        # first and the rest in a second job: with one shuffle partition per core, one core at
        # a time. Every partition at once instead.
        "spark.sql.limit.initialNumPartitions": cores,
    }
    with temporary_conf(spark, wanted):
        yield
