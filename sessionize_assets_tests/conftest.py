"""Shared fixtures: one real Spark session per test process, temporary homes."""

from __future__ import annotations

import contextlib
import datetime as dt
import os
from pathlib import Path

import pytest
import yaml

os.environ.setdefault("PYSPARK_PYTHON", os.sys.executable)


# The tests' Spark: also the `spark` setting of homes whose runs start their own Spark (the
# browser test's UI launches runs in new processes).
TEST_SPARK = {
    "spark.master": "local[2]",
    "spark.sql.shuffle.partitions": "2",
    # Tests are many short jobs: the C1 JIT and serial GC start faster and use less CPU.
    # C1 alone gets a 48 MB code cache by default, which one CI run filled within 80 s
    # ("CodeCache is full", then "Out of space in CodeCache for adapters" failed every
    # later query of that process): a larger reserve costs address space, not memory.
    "spark.driver.extraJavaOptions": (
        "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -XX:ReservedCodeCacheSize=256m"
    ),
    # Tiny inputs: every query interpreted, no generated code to compile (the product does this
    # for its small queries, `resources/spark.small_query_conf`; the tests' setup, reads and
    # full recomputes are all small). One sessions-command test took 79 s and 91 CPU-s
    # instead of 96-115 s and 115-139 CPU-s, alternated twice (session 43). Spark computes the
    # same results either way; what only generated code does is covered at size by the
    # benchmark's comparison with DuckDB.
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.codegen.factoryMode": "NO_CODEGEN",
}


def spark_settings_yaml() -> str:
    """The `spark` setting (YAML) of a home whose commands run in processes of their own, so their
    JVMs start as the tests' own (`TEST_SPARK`)."""
    return yaml.safe_dump({"spark": dict(TEST_SPARK)})


@pytest.fixture(scope="session")
def spark():
    """The process's one Spark session (local[2], Delta enabled, UTC)."""
    from sessionize_assets.resources.spark import get_spark

    session = get_spark(dict(TEST_SPARK))
    yield session


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """An empty sessionize home folder."""
    path = tmp_path / "home"
    path.mkdir()
    return path


@contextlib.contextmanager
def preserved_environment():
    """For fixtures wider than one test that call `cli.main`: the variables it exports are put
    back afterwards (the per-test restore below snapshots the environment *after* wider fixtures
    ran, so without this they would leak into every later test)."""
    saved = dict(os.environ)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@pytest.fixture(autouse=True)
def _isolated_environment():
    """The CLI exports SESSIONIZE_HOME/CONFIG/NOW and DAGSTER_HOME for its run processes; a test
    that calls `cli.main` in-process must not leave them to the next test."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


TWO_DAYS_START = dt.date(2024, 3, 1)


def cli_now(day: int) -> list[str]:
    """`--now` half an hour into March `day`, 2024 (the clock of the `two_days` home)."""
    return ["--now", f"2024-03-0{day}T00:30:00"]


def cli_load(home: Path, landing: Path, day: int) -> None:
    """`sessionize load` of load day `day` (1 = TWO_DAYS_START) the day after, as a user would."""
    from sessionize_assets.cli import main

    folder = landing / f"load_date={TWO_DAYS_START + dt.timedelta(days=day - 1)}"
    args = [str(folder), "--load-tstamp-from", "load_tstamp"]
    assert main(["--home", str(home), *cli_now(day + 1), "load", *args]) == 0


@pytest.fixture(scope="session")
def two_days(spark, tmp_path_factory):
    """A home with load days 1 and 2 processed; the landing folder holds day 3 too. Shared by the
    test modules (exit statuses, JSON output): a test that changes it works on a copy."""
    from sessionize_assets.cli import main
    from sessionize_assets.generator import generate

    landing = tmp_path_factory.mktemp("landing")
    generate(landing, start_date=TWO_DAYS_START, days=3, events_per_day=200, seed=5)
    home = tmp_path_factory.mktemp("home")
    # Its commands in processes of their own (the exit statuses' console) start the tests' JVM.
    (home / "sessionize.yaml").write_text(f"start_date: {TWO_DAYS_START}\n" + spark_settings_yaml())
    with preserved_environment():
        cli_load(home, landing, 1)
        cli_load(home, landing, 2)
        assert main(["--home", str(home), *cli_now(3), "run"]) == 0
    return home, landing


def pytest_configure(config: pytest.Config) -> None:
    """One seed base for the whole run, drawn before pytest-xdist starts its workers (they inherit
    the environment): every test process collects the same random-history test ids."""
    from sessionize_assets_tests.seeds import ensure_seed_base

    ensure_seed_base()


# Seconds each of the slowest test files took in one full run on 2 cores (the fresh clone's run
# of session 43, on a 2 GHz AMD EPYC machine: 4344 s in all, 2204 s on the clock). The
# test command distributes whole files to two processes in collection order
# (`--dist loadfile --no-loadscope-reorder`, scripts/dev.sh): the longest go first, so the short
# ones fill in at the end and neither process waits long for the other (pytest-xdist's own
# order, by number of tests, put the long few-test files last).
SLOW_FILES = {
    "sessions/test_incremental.py": 460,
    "test_fault_matrix.py": 460,
    "sessions/test_equivalence.py": 375,
    "test_browser.py": 285,
    "ingest/test_loader.py": 235,
    "test_benchmarks_smoke.py": 215,
    "test_exit_statuses.py": 200,
    "commands/test_time_based.py": 185,
    "time_based/test_attributes_refresh.py": 160,
    "test_schedules.py": 145,
    "commands/test_refresh.py": 125,
    "sessions/test_driver_run.py": 120,
    "sensors/test_session_models.py": 110,
    "time_based/test_steps.py": 105,
    "test_pipeline_recovery.py": 90,
    "sessions/test_steps.py": 85,
    "resources/test_engine.py": 85,
    "commands/test_forget.py": 85,
    "commands/test_sessions.py": 80,
    "ingest/test_malformed_corpus.py": 65,
    "resources/test_delta.py": 65,
    "test_oracle_snowplow.py": 60,
    "resources/test_processing_manifest_race.py": 60,
    "test_demo.py": 55,
    "test_production_profile.py": 45,
    "commands/test_json_output.py": 45,
    "core/test_filtering.py": 40,
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The slowest files first (`SLOW_FILES`), the others after them in their own order; the
    tests of a file keep theirs."""
    root = Path(__file__).parent

    def weight(item: pytest.Item) -> int:
        try:
            name = Path(str(item.path)).relative_to(root).as_posix()
        except ValueError:
            return 0
        return SLOW_FILES.get(name, 0)

    items.sort(key=lambda item: -weight(item))


def pytest_report_header(config: pytest.Config) -> list[str]:
    """The run's seed base at the top of the output, so a passing run can be replayed too."""
    from sessionize_assets_tests.seeds import SEED_BASE, ensure_seed_base

    base = ensure_seed_base()
    return [f"random histories: {SEED_BASE}={base} replays this run's seeds"]


def shared_folder() -> Path:
    """The project's shared folder (spec, seeds, oracles): `$SESSIONIZE_SHARED`, else `../shared`
    beside the repository, else `/work/shared` (where a clone elsewhere finds it on this machine)."""
    env = os.environ.get("SESSIONIZE_SHARED")
    candidates = [Path(env)] if env else []
    candidates += [Path(__file__).resolve().parents[2] / "shared", Path("/work/shared")]
    return next((c for c in candidates if c.is_dir()), candidates[0])


ORACLE_DIR = shared_folder() / "oracles" / "snowplow-web-v0.15.2"
