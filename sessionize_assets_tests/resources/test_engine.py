"""The warm Spark engine (resources/engine.py): one Spark Connect server per home, with Delta.

One engine is started for the whole module (a JVM start costs seconds); the tests that need no
engine (stale pid file, port in use, settings) start none."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

try:
    from pyspark.sql.connect.utils import check_dependencies

    check_dependencies()
except ImportError as exc:  # pragma: no cover - depends on the venv
    pytest.skip(
        f"Spark Connect client packages missing ({exc}): pip install grpcio grpcio-status "
        "googleapis-common-protos zstandard 'pandas<3'",
        allow_module_level=True,
    )

from sessionize_assets.errors import UserError
from sessionize_assets.resources import engine
from sessionize_assets.resources.spark import get_spark, session_conf

# Small and quick to start: one core, C1 JIT, serial GC (as the test suite's embedded engine).
ENGINE_SETTINGS = {
    "spark.master": "local[1]",
    "spark.sql.shuffle.partitions": "1",
    "spark.driver.memory": "1g",
    "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -XX:ReservedCodeCacheSize=256m",
}


@pytest.fixture(scope="module")
def engine_home(tmp_path_factory: pytest.TempPathFactory):
    home = tmp_path_factory.mktemp("engine_home")
    info = engine.start(home, ENGINE_SETTINGS, port=0)
    try:
        yield home, info
    finally:
        engine.stop(home)


def _remote_session(url: str):
    """A Connect session that leaves this process's (embedded) default session alone."""
    from pyspark.sql.connect.session import SparkSession as RemoteSparkSession

    return RemoteSparkSession.builder.remote(url).create()


def test_start_reports_a_running_engine_and_reuses_it(engine_home):
    home, info = engine_home
    current = engine.status(home)
    assert current.state == "running" and current.answering
    assert current.pid == info.pid and current.port == info.port
    assert engine.remote_url(home) == info.url
    assert info.log == home / "engine" / "engine.log" and info.log.is_file()
    state_file = home / "engine" / "engine.json"
    assert json.loads(state_file.read_text())["pid"] == info.pid
    assert state_file.stat().st_mode & 0o077 == 0  # the URL carries the token
    again = engine.start(home, ENGINE_SETTINGS)
    assert again.reused and again.pid == info.pid and again.url == info.url


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs Linux /proc")
def test_the_engine_runs_with_few_malloc_arenas(engine_home):
    """The engine's JVM runs with MALLOC_ARENA_MAX (its native memory counts against a day's
    peak): the project's value where the test's environment sets none (CI's case; a value it
    sets is expected instead, and that path is not exercised on its own)."""
    _, info = engine_home
    variables = Path(f"/proc/{info.pid}/environ").read_bytes().split(b"\0")
    want = os.environ.get("MALLOC_ARENA_MAX", engine.MALLOC_ARENA_MAX)
    assert f"MALLOC_ARENA_MAX={want}".encode() in variables


def _listening_addresses(port: int) -> list[str]:
    """Local addresses (hex, as /proc/net/tcp* shows them) with a socket listening on `port`."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not Path(table).exists():
            continue
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            address, hex_port = fields[1].rsplit(":", 1)
            if fields[3] == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                found.append(address)
    return found


LOOPBACK = {
    "0100007F",  # 127.0.0.1
    "0000000000000000FFFF00000100007F",  # ::ffff:127.0.0.1
    "00000000000000000000000001000000",  # ::1
}


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="needs Linux /proc/net/tcp")
def test_engine_listens_on_loopback_only_and_wants_the_token(engine_home):
    _, info = engine_home
    addresses = _listening_addresses(info.port)
    assert addresses and set(addresses) <= LOOPBACK
    spark = _remote_session(f"sc://127.0.0.1:{info.port}")  # no token
    try:
        with pytest.raises(Exception, match="(?i)authenticat"):
            spark.sql("SELECT 1").collect()
    finally:
        spark.stop()


def test_delta_write_merge_and_history_over_the_remote_session(engine_home, tmp_path):
    _, info = engine_home
    path = str(tmp_path / "t")
    spark = _remote_session(info.url)
    try:
        spark.createDataFrame([(1, "a"), (2, "b")], "id long, v string").write.format("delta").save(
            path
        )
        source = spark.createDataFrame([(2, "B"), (3, "c")], "id long, v string")
        source.createOrReplaceTempView("engine_test_source")
        metrics = spark.sql(
            f"MERGE INTO delta.`{path}` t USING engine_test_source s ON t.id = s.id "
            "WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *"
        ).collect()[0]
        assert (metrics["num_updated_rows"], metrics["num_inserted_rows"]) == (1, 1)
        rows = spark.read.format("delta").load(path).orderBy("id").collect()
        assert [(r.id, r.v) for r in rows] == [(1, "a"), (2, "B"), (3, "c")]
        history = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").orderBy("version").collect()
        assert [h.operation for h in history] == ["WRITE", "MERGE"]
        # The engine got the project's Delta defaults (delta-rs can read what it writes).
        assert spark.conf.get("spark.sql.session.timeZone") == "UTC"
    finally:
        spark.stop()
    from deltalake import DeltaTable

    assert DeltaTable(path).version() == 1


def test_get_spark_connects_to_the_engine_named_by_the_environment(engine_home, monkeypatch):
    home, _ = engine_home
    monkeypatch.setenv("SESSIONIZE_SPARK_REMOTE", "home")
    monkeypatch.setenv("SESSIONIZE_HOME", str(home))
    spark = get_spark({"spark.sql.shuffle.partitions": "3"})
    try:
        assert type(spark).__module__ == "pyspark.sql.connect.session"
        assert spark.conf.get("spark.sql.shuffle.partitions") == "3"
        assert spark.range(4).count() == 4
        assert get_spark() is spark  # one session per process, as the embedded engine
    finally:
        spark.stop()


# A `sessionize`-like process: a Connect session with a driver-local DataFrame, then the command
# line's exit (`cli.leave`: exit handlers, then os._exit).
_CLIENT_PROCESS = """
import pyarrow as pa
from sessionize_assets.cli import leave
from sessionize_assets.resources.spark import get_spark

spark = get_spark()
spark.createDataFrame(pa.table({"x": list(range(1000))})).count()
print(spark.session_id, flush=True)
leave(0)
"""


def _client_env(**extra: str) -> dict[str, str]:
    """The environment of a client process: this one's, not in Connect mode, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if k != "SPARK_CONNECT_MODE_ENABLED"}
    return {**env, **extra}


def test_a_process_releases_its_connect_session_when_it_exits(engine_home):
    """The server keeps a session its client did not release (and every plan it ran) for an
    hour; a process releases its own at exit, so the session is closed once the process is
    gone."""
    _, info = engine_home
    done = subprocess.run(
        [sys.executable, "-c", _CLIENT_PROCESS],
        env=_client_env(SESSIONIZE_SPARK_REMOTE=info.url),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    session_id = done.stdout.split()[-1]
    again = _remote_session(f"{info.url};session_id={session_id}")
    try:
        with pytest.raises(Exception, match="SESSION_CLOSED"):
            again.sql("SELECT 1").collect()
    finally:
        again.stop()


def test_an_engine_that_went_away_does_not_hold_up_a_process_exit():
    """Releasing the session waits at most RELEASE_TIMEOUT_S (pyspark's own release retries an
    unreachable server for minutes)."""
    port = engine.free_port()
    # A session created without settings calls no server; releasing it does.
    script = f"""
from pyspark.sql.connect.session import SparkSession
from sessionize_assets.cli import leave
from sessionize_assets.resources.spark import release_at_exit

release_at_exit(SparkSession.builder.remote("sc://127.0.0.1:{port}").create())
leave(0)
"""
    started = time.monotonic()
    subprocess.run([sys.executable, "-c", script], timeout=90, check=True)
    assert time.monotonic() - started < 30


def test_a_filter_naming_hundreds_of_users_and_a_64_file_union_pass_over_connect(
    engine_home, monkeypatch
):
    """Found at 200,000 events a day: the session read named 100 users on two user columns, and
    the OR-chain of 200 equalities failed in Spark Connect's protobuf decoder. The filters and the
    loader's union are now nested log2(n) deep (core/trees.py)."""
    from pyspark.sql import functions as F

    from sessionize_assets.ingest.loader import _union
    from sessionize_assets.sessions.modes import user_filter
    from sessionize_assets.settings import from_mapping

    _, info = engine_home
    monkeypatch.setenv("SPARK_CONNECT_MODE_ENABLED", "1")  # as get_spark does for a remote session
    spark = _remote_session(info.url)
    try:
        df = spark.createDataFrame(
            [("u1", None), (None, "u149"), ("v", "w")], "user_id string, domain_userid string"
        )
        settings = from_mapping({"user_identifier": ["user_id", "domain_userid"]})
        of_users = user_filter(settings, dict(df.dtypes))
        users = frozenset(f"u{i}" for i in range(150))  # 300 equalities
        assert df.filter(of_users(users)).count() == 2
        with pytest.raises(Exception, match="Error parsing message|recursion|nest"):
            chain = F.lit(False)
            for user in sorted(users):  # the left fold it replaced
                chain = chain | (F.col("user_id") == F.lit(user))
                chain = chain | (F.col("domain_userid") == F.lit(user))
            df.filter(chain).count()
        assert _union([df] * 64).count() == 3 * 64
    finally:
        spark.stop()


def test_rows_fetched_over_connect_bring_their_schema_without_asking_for_it(
    engine_home, monkeypatch
):
    """`fetch_arrow` gives what `toArrow` and `schema` give (the types of every kind of column a
    session table holds), without the schema analysis `toArrow` asks the server for first; and a
    driver-local result of `localize` keeps the rows and the schema."""
    import datetime as dt
    from decimal import Decimal

    from sessionize_assets.resources.spark import fetch_arrow
    from sessionize_assets.sessions.frames import localize

    _, info = engine_home
    monkeypatch.setenv("SPARK_CONNECT_MODE_ENABLED", "1")
    spark = _remote_session(info.url)
    try:
        at = dt.datetime(2024, 3, 1, 12, 30, tzinfo=dt.UTC)

        def fresh():  # a new DataFrame each time: none carries a schema asked for before
            return spark.createDataFrame(
                [
                    (
                        "a",
                        1,
                        at,
                        dt.date(2024, 3, 1),
                        {"x": 2},
                        ["p"],
                        (1, "q"),
                        Decimal("1.5"),
                        True,
                    ),
                    (None, None, None, None, None, None, None, None, None),
                ],
                "k string, n long, ts timestamp, d date, m map<string,bigint>, l array<string>, "
                "s struct<i:int,t:string>, dec decimal(10,2), b boolean",
            ).filter("k is null or n > 0")

        expected = fresh()
        expected_table, expected_schema = expected.toArrow(), expected.schema
        asked = []
        analyze = spark.client.schema
        monkeypatch.setattr(spark.client, "schema", lambda plan: asked.append(1) or analyze(plan))
        table, schema = fetch_arrow(fresh())
        assert asked == []
        assert schema == expected_schema
        assert table.equals(expected_table)
        fresh().toArrow()
        assert len(asked) == 1  # what toArrow asks, and fetch_arrow does not
        local = localize(spark, fresh())
        assert len(asked) == 1
        assert local.schema == expected_schema
        assert sorted(local.collect(), key=str) == sorted(expected.collect(), key=str)
    finally:
        spark.stop()


def test_bigday_refuses_settings_a_running_engine_would_ignore(engine_home, tmp_path, capsys):
    """A benchmark day on a home whose engine runs (left by `--keep-engine`) cannot give that
    engine new settings, nor run beside it without one: both are refused before generating."""
    from benchmarks import bigday

    home, _ = engine_home
    (tmp_path / "homes").mkdir()
    (tmp_path / "homes" / "d001").symlink_to(home, target_is_directory=True)
    for extra, reason in (
        (["--spark-conf", "spark.sql.shuffle.partitions=3"], "--spark-conf would not reach it"),
        (["--engine", "off"], "--engine off would share the machine with it"),
    ):
        assert bigday.main(["--work", str(tmp_path), "--home", "d001", *extra]) == 2
        err = capsys.readouterr().err
        assert "the home's engine runs already" in err and reason in err
    assert not (tmp_path / "bigday-1000000").exists()


def test_a_small_gap_run_on_the_driver_over_connect_writes_what_spark_writes(
    engine_home, spark, tmp_path, monkeypatch
):
    """`sessions/driver_run.py` over Spark Connect (the warm engine): its driver-local frames
    include empty ones (no side rows), which Connect cannot infer a schema for; one random
    history's tables after each run equal the embedded Spark steps' (`test_driver_run.py`), up
    to the first run the driver took (the later runs are `test_driver_run.py`'s: the same code
    on another session, at a minute a run here)."""
    import random

    from sessionize_assets_tests.sessions.support import make_settings, run, write_load_days
    from sessionize_assets_tests.sessions.test_driver_run import (
        _counts,
        _route,
        _tables,
        driver_spy,
    )
    from sessionize_assets_tests.sessions.test_equivalence import random_history

    _, info = engine_home
    remote = _remote_session(info.url)
    settings = make_settings(
        start_date="2021-03-01",
        session_mode="gap",
        backfill_limit_days=4,
        max_session_days=2,
        session_gap_minutes=60,
    )
    taken: list[bool] = []
    spied = driver_spy(taken)

    homes = {"connect": tmp_path / "connect", "spark": tmp_path / "spark"}
    try:
        for step in random_history(random.Random(11), "gap"):
            if step[0] not in ("load", "run"):
                continue
            results = {}
            for way, home in homes.items():
                session = remote if way == "connect" else spark
                home.mkdir(exist_ok=True)
                # pyspark's functions build Connect columns only in Connect mode (get_spark sets
                # it for a remote session); the test's writer of filtered_events is classic
                connect = way == "connect" and step[0] == "run"
                if connect:
                    monkeypatch.setenv("SPARK_CONNECT_MODE_ENABLED", "1")
                else:
                    monkeypatch.delenv("SPARK_CONNECT_MODE_ENABLED", raising=False)
                if step[0] == "load":
                    write_load_days(spark, home, step[1])
                    continue
                _route(monkeypatch, "driver" if way == "connect" else "spark", spied)
                results[way] = (
                    _counts(run(session, home, settings, step[1])),
                    _tables(session, home),
                )
            if results:
                assert results["connect"] == results["spark"], f"after the run as of {step[1]}"
                if any(taken):
                    break
    finally:
        monkeypatch.delenv("SPARK_CONNECT_MODE_ENABLED", raising=False)
        remote.stop()
    assert any(taken), "the driver took none of the runs"


def test_stop_ends_the_engine(engine_home):
    home, info = engine_home
    message = engine.stop(home)
    assert f"pid {info.pid}" in message
    assert engine.status(home).state == "not started"
    assert engine.remote_url(home) is None
    assert engine.stop(home).startswith("No Spark engine")


# ----------------------------------------------------------------------- no engine needed


def test_a_dead_pid_file_reads_as_stale(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    folder = tmp_path / "engine"
    folder.mkdir()
    (folder / "engine.json").write_text(
        json.dumps({"pid": dead.pid, "port": 1, "url": "sc://localhost:1/;token=x"})
    )
    current = engine.status(tmp_path)
    assert current.state == "stale" and current.pid == dead.pid
    assert "stale" in current.line()
    assert engine.remote_url(tmp_path) is None
    # A live pid that is not a Connect server (pid reuse) is stale too.
    (folder / "engine.json").write_text(json.dumps({"pid": os.getpid(), "port": 1}))
    assert engine.status(tmp_path).state == "stale"
    assert "stale" in engine.stop(tmp_path)
    assert engine.status(tmp_path).state == "not started"


def test_a_port_in_use_is_one_sentence_naming_the_log(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(UserError) as info:
            engine.start(tmp_path, {}, port=port)
    message = str(info.value)
    assert f"Port {port}" in message and str(tmp_path / "engine" / "engine.log") in message
    assert "\n" not in message
    assert engine.status(tmp_path).state == "not started"


def test_missing_java_is_one_sentence(tmp_path, monkeypatch):
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(UserError, match="Java") as info:
        engine.start(tmp_path, {}, port=0)
    assert "engine.log" in str(info.value) and "\n" not in str(info.value)


def test_missing_jars_is_one_sentence(tmp_path, monkeypatch):
    monkeypatch.setenv("SESSIONIZE_JARS_DIR", str(tmp_path / "nothing"))
    with pytest.raises(UserError, match="Delta Lake jars") as info:
        engine.start(tmp_path, {}, port=0)
    assert "engine.log" in str(info.value)


def test_home_engine_that_is_not_running_is_a_user_error(tmp_path, monkeypatch):
    monkeypatch.setenv("SESSIONIZE_SPARK_REMOTE", "home")
    monkeypatch.setenv("SESSIONIZE_HOME", str(tmp_path))
    with pytest.raises(UserError, match="no Spark engine answers"):
        get_spark()


def test_a_connect_url_nothing_answers_at_is_one_sentence(tmp_path):
    """Not ten minutes of pyspark's retries: the command says where nothing answers and exits."""
    port = engine.free_port()
    # The command line: one sentence on stderr, a non-zero exit, in seconds (first: a process
    # of its own fails by its timeout where the call below would wait for minutes).
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "day.csv").write_text("event_id\ne1\n")
    config = tmp_path / "sessionize.yaml"
    config.write_text(f"spark:\n  spark.remote: sc://127.0.0.1:{port}\n")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "sessionize_assets.cli",
            "--home",
            str(tmp_path / "home"),
            "--config",
            str(config),
            "load",
            str(tmp_path / "data"),
        ],
        env=_client_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == [
        f"error: No Spark Connect server answers at 127.0.0.1:{port} (Connection refused); start it "
        "(`sessionize engine start` for the home's warm engine) or fix the URL (`spark.remote` in "
        "the `spark` setting, $SESSIONIZE_SPARK_REMOTE or $SPARK_REMOTE)."
    ]
    # The session's function, for a URL nothing answers at and for one that is not a URL.
    with pytest.raises(UserError, match=f"No Spark Connect server answers at 127.0.0.1:{port} "):
        get_spark({"spark.remote": f"sc://127.0.0.1:{port}/;token=secret"})
    with pytest.raises(
        UserError, match="'http://127.0.0.1:1' is not of the form sc://host:port"
    ) as bad:
        get_spark({"spark.remote": "http://127.0.0.1:1;token=secret"})
    assert "secret" not in str(bad.value)


def test_a_local_engine_that_stops_answering_fails_the_command_in_seconds_in_one_sentence():
    """A server on this machine that accepts connections and drops them (as a killed engine's
    port would, or a restarted one that no longer knows the session): pyspark's own policy
    retries for at least ten minutes; a local engine's client gives up after a few retries."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)

    def drop_every_connection() -> None:
        with contextlib.suppress(OSError):
            while True:
                server.accept()[0].close()

    threading.Thread(target=drop_every_connection, daemon=True).start()
    script = f"""
from sessionize_assets.errors import one_sentence
from sessionize_assets.resources.spark import get_spark

try:
    get_spark({{"spark.remote": "sc://127.0.0.1:{server.getsockname()[1]}"}})
except Exception as exc:
    print(one_sentence(exc))
"""
    started = time.monotonic()
    try:
        done = subprocess.run(
            [sys.executable, "-c", script],
            env=_client_env(),
            capture_output=True,
            text=True,
            timeout=150,
        )
    finally:
        server.close()
    assert time.monotonic() - started < 90
    assert done.stdout.startswith("The Spark Connect server stopped answering (")
    assert "sessionize engine status" in done.stdout and "RETRIES_EXCEEDED" not in done.stderr


def test_a_remote_session_gets_only_the_settings_a_client_may_change():
    conf = session_conf({"spark.master": "local[2]", "spark.sql.shuffle.partitions": "5"})
    assert conf["spark.sql.shuffle.partitions"] == "5"
    assert conf["spark.sql.session.timeZone"] == "UTC"
    assert "spark.databricks.delta.properties.defaults.enableDeletionVectors" in conf
    for server_only in ("spark.master", "spark.sql.extensions", "spark.driver.memory"):
        assert server_only not in conf
    assert not any(k.startswith("spark.sql.catalog.") for k in conf)
