"""The production profile (`deploy/production/`) against a real PostgreSQL: a throwaway cluster
(Debian's `postgresql` binaries, started in a temporary folder on a free port) holds the Dagster
instance the shipped `dagster.yaml` describes; the command line loads and runs a small home on
it, the runs are read back from PostgreSQL, and a sensor ticks against the same instance.
Skipped, saying why, where the PostgreSQL server binaries are missing (`.ci/run` installs them
when it can)."""

from __future__ import annotations

import datetime as dt
import os
import pwd
import re
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from sessionize_assets_tests.conftest import TWO_DAYS_START, cli_load, cli_now

PROFILE = Path(__file__).resolve().parents[1] / "deploy" / "production"
PG_USER = "sessionize"
# Characters a URL must escape: the instance builds its connection URL from these variables.
PG_PASSWORD = "s3cret/p@ss:word"
PG_DB = "sessionize_dagster"


def _postgres_bindir() -> Path | None:
    """Where initdb and pg_ctl are: on PATH, else Debian's /usr/lib/postgresql/<version>/bin
    (the newest version first)."""
    candidates = [Path(found).parent] if (found := shutil.which("initdb")) else []
    versions = Path("/usr/lib/postgresql").glob("*/bin")
    candidates += sorted(
        versions,
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
        reverse=True,
    )
    for folder in candidates:
        if (folder / "initdb").is_file() and (folder / "pg_ctl").is_file():
            return folder
    return None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass(frozen=True)
class Postgres:
    """A running throwaway server, and the database and role the instance uses."""

    port: int
    socket_dir: str
    host: str = "127.0.0.1"
    user: str = PG_USER
    password: str = PG_PASSWORD
    db: str = PG_DB

    def environment(self) -> dict[str, str]:
        """The variables deploy/production/dagster.yaml reads (see env.example)."""
        return {
            "DAGSTER_PG_HOST": self.host,
            "DAGSTER_PG_PORT": str(self.port),
            "DAGSTER_PG_USER": self.user,
            "DAGSTER_PG_PASSWORD": self.password,
            "DAGSTER_PG_DB": self.db,
        }

    def query(self, sql: str) -> list[tuple]:
        """Rows of `sql` in the instance's database, over TCP as the instance's role."""
        import psycopg2

        connection = psycopg2.connect(
            host=self.host, port=self.port, user=self.user, password=self.password, dbname=self.db
        )
        try:
            with connection.cursor() as cursor:
                cursor.execute(sql)
                return cursor.fetchall()
        finally:
            connection.close()


@pytest.fixture(scope="module")
def postgres(request):
    """A PostgreSQL cluster in a temporary folder: unix socket there, TCP on a free loopback
    port, password (SCRAM) authentication over TCP. initdb refuses root, so as root the server
    runs as the `postgres` user. Stopped, and its folder removed, in a finalizer."""
    pytest.importorskip("psycopg2", reason="psycopg2-binary (a dev dependency) is not installed")
    pytest.importorskip("dagster_postgres", reason="dagster-postgres is not installed")
    bindir = _postgres_bindir()
    if bindir is None:
        pytest.skip(
            "no PostgreSQL server binaries (initdb, pg_ctl on PATH or in "
            "/usr/lib/postgresql/<version>/bin): install Debian's `postgresql` package"
        )
    as_user: list[str] = []
    owner = None
    if os.geteuid() == 0:
        try:
            owner = pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("running as root and there is no `postgres` user to run initdb as")
        runuser = shutil.which("runuser")
        if runuser is None:
            pytest.skip("running as root and there is no `runuser` to run initdb as `postgres`")
        as_user = [runuser, "-u", "postgres", "--"]

    # Under /tmp, not pytest's tmp_path: the socket path must stay short (about 100 bytes) and
    # the `postgres` user cannot enter root's 0700 pytest folders.
    root = Path(tempfile.mkdtemp(prefix="sessionize-pg-"))
    data, log = root / "data", root / "server.log"
    if owner is not None:
        os.chown(root, owner.pw_uid, owner.pw_gid)
    environment = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C"}

    def pg(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(
            [*as_user, *args],
            cwd=root,
            env=environment,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def stop() -> None:
        try:
            if (data / "postmaster.pid").exists():
                stopped = pg(str(bindir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop")
                if stopped.returncode != 0:
                    pg(str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(root, ignore_errors=True)

    request.addfinalizer(stop)  # registered before anything starts: always runs

    created = pg(
        str(bindir / "initdb"),
        "-D",
        str(data),
        "-U",
        "postgres",
        "--auth-local=trust",
        "--auth-host=scram-sha-256",
        "--no-locale",
        "-E",
        "UTF8",
        "--no-sync",
    )
    assert created.returncode == 0, created.stdout + created.stderr
    port = _free_port()
    options = (
        f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off "
        "-c synchronous_commit=off -c full_page_writes=off -c shared_buffers=16MB "
        "-c max_connections=50"
    )
    pg_ctl = str(bindir / "pg_ctl")
    started = pg(pg_ctl, "-D", str(data), "-l", str(log), "-w", "-t", "60", "-o", options, "start")
    assert started.returncode == 0, (
        started.stdout + started.stderr + (log.read_text() if log.exists() else "")
    )

    import psycopg2

    # As the superuser over the unix socket (trust): the instance's role and database.
    admin = psycopg2.connect(host=str(root), port=port, user="postgres", dbname="postgres")
    admin.autocommit = True
    with admin.cursor() as cursor:
        cursor.execute(f"CREATE ROLE {PG_USER} LOGIN PASSWORD %s", (PG_PASSWORD,))
        cursor.execute(f"CREATE DATABASE {PG_DB} OWNER {PG_USER}")
    admin.close()
    return Postgres(port=port, socket_dir=str(root))


def _env_references(node) -> set[str]:
    """Every `{env: NAME}` in a parsed YAML document."""
    if isinstance(node, dict):
        if set(node) == {"env"}:
            return {node["env"]}
        return set().union(*(_env_references(v) for v in node.values()))
    if isinstance(node, list):
        return set().union(*(_env_references(v) for v in node))
    return set()


def test_the_profile_files_are_valid_and_name_their_variables(tmp_path, monkeypatch):
    from sessionize_assets.errors import UserError
    from sessionize_assets.resources.spark import remote_url
    from sessionize_assets.settings import load_settings

    example = {}
    for line in (PROFILE / "env.example").read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            name, _, value = line.partition("=")
            example[name.strip()] = value.strip()
    instance_file = yaml.safe_load((PROFILE / "dagster.yaml").read_text())
    used = _env_references(instance_file)
    assert used == set(Postgres(port=5432, socket_dir="").environment())
    assert used <= set(example), f"env.example lacks {sorted(used - set(example))}"
    assert example["SESSIONIZE_WAREHOUSE"].startswith("s3a://")  # example only (deviations.md)

    # The settings example is valid as shipped and points Spark at the home's warm engine.
    settings = load_settings(tmp_path, PROFILE / "sessionize.yaml", today=dt.date(2024, 3, 2))
    assert settings.spark["spark.remote"] == "home"
    assert "spark.master" not in settings.spark
    # "home" is understood (the running engine of $SESSIONIZE_HOME), not taken for a URL: with
    # no engine running, one sentence naming the home.
    monkeypatch.setenv("SESSIONIZE_HOME", str(tmp_path))
    monkeypatch.delenv("SESSIONIZE_SPARK_REMOTE", raising=False)
    with pytest.raises(UserError, match=re.escape(str(tmp_path.resolve()))):
        remote_url(settings.spark)


def test_the_production_instance_records_the_pipeline_in_postgres(
    postgres, spark, tmp_path, monkeypatch
):
    from dagster import (
        AssetKey,
        DagsterInstance,
        RunsFilter,
        SensorResult,
        build_sensor_context,
    )
    from dagster._core.run_coordinator import QueuedRunCoordinator
    from dagster_postgres import (
        PostgresEventLogStorage,
        PostgresRunStorage,
        PostgresScheduleStorage,
    )

    from sessionize_assets.cli import main
    from sessionize_assets.generator import generate
    from sessionize_assets.resources.lake import LakeResource
    from sessionize_assets.sensors.new_loads import build_sensors
    from sessionize_assets.settings import load_settings

    for name, value in postgres.environment().items():
        monkeypatch.setenv(name, value)
    landing = tmp_path / "landing"
    generate(landing, start_date=TWO_DAYS_START, days=2, events_per_day=150, seed=5)
    home = tmp_path / "home"
    # The suite's settings (embedded Spark, local warehouse): the shipped sessionize.yaml needs a
    # warm engine and object storage; the instance file is the shipped one, unchanged.
    (home / "dagster").mkdir(parents=True)
    (home / "sessionize.yaml").write_text(f"start_date: {TWO_DAYS_START}\n")
    shutil.copyfile(PROFILE / "dagster.yaml", home / "dagster" / "dagster.yaml")
    monkeypatch.setenv("DAGSTER_HOME", str(home / "dagster"))

    # (a) The shipped file loads: every storage is PostgreSQL, the run queue has its limits.
    with DagsterInstance.get() as instance:
        assert isinstance(instance.run_storage, PostgresRunStorage)
        assert isinstance(instance.event_log_storage, PostgresEventLogStorage)
        assert isinstance(instance.schedule_storage, PostgresScheduleStorage)
        assert isinstance(instance.run_coordinator, QueuedRunCoordinator)
        queue = instance.get_concurrency_config().run_queue_config
        assert queue.max_concurrent_runs == 3
        limits = {limit["key"]: limit for limit in queue.tag_concurrency_limits}
        assert limits["sessionize/lane"]["limit"] == 1
        assert limits["sessionize/lane"]["value"] == {"applyLimitPerUniqueValue": True}
        assert limits["sessionize/kind"] == {
            "key": "sessionize/kind",
            "value": "maintenance",
            "limit": 1,
        }
        tables = {row[0] for row in postgres.query("SELECT tablename FROM pg_tables")}
        assert {"runs", "event_logs", "jobs", "job_ticks"} <= tables  # created on first use

    # (b) The command line on that instance: load day 1, run both branches.
    cli_load(home, landing, 1)
    assert main(["--home", str(home), *cli_now(2), "run"]) == 0
    runs = postgres.query("SELECT run_id, status FROM runs")
    assert runs and {status for _, status in runs} == {"SUCCESS"}, runs
    with DagsterInstance.get() as instance:
        recorded = instance.get_runs()
        assert {r.run_id for r in recorded} == {run_id for run_id, _ in runs}
        partitions = {r.tags.get("dagster/partition") for r in recorded}
        assert "2024-03-01" in partitions, [r.tags for r in recorded]
        # Both branches ran, each in its lane (the tags the run queue limits, and `status` reads).
        assert {r.tags.get("sessionize/lane") for r in recorded} == {"time_based", "sessions"}
        assert instance.get_runs(filters=RunsFilter(tags={"sessionize/lane": "sessions"}))
        loaded = instance.get_latest_materialization_event(AssetKey("events"))
        assert loaded is not None and loaded.asset_materialization.partition == "2024-03-01"
    assert main(["--home", str(home), *cli_now(2), "status"]) == 0  # reads the runs back
    # Nothing went to SQLite files beside the instance file.
    assert not list((home / "dagster").rglob("*.db")), list((home / "dagster").rglob("*"))

    # (c) Load day 2 lands: one tick of the new-loads sensor, on the same instance, asks for it.
    cli_load(home, landing, 2)
    settings = load_settings(home, today=dt.date(2024, 3, 3))
    (sensor,) = build_sensors(settings)
    lake = LakeResource(home=str(home), now="2024-03-03T00:30:00")
    with DagsterInstance.get() as instance:
        with build_sensor_context(instance=instance, resources={"lake": lake}) as context:
            result = sensor(context)
    assert isinstance(result, SensorResult)
    assert [r.partition_key for r in result.run_requests] == ["2024-03-02"]
    assert result.run_requests[0].tags == {"sessionize/lane": "time_based"}
    assert '"2024-03-02"' in result.cursor
    # The load's materialization is in PostgreSQL too (events, partition 2024-03-02).
    partitions = postgres.query(
        "SELECT DISTINCT partition FROM event_logs WHERE asset_key = '[\"events\"]'"
    )
    assert {p for (p,) in partitions} >= {"2024-03-01", "2024-03-02"}
