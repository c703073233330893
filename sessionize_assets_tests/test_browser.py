"""The Dagster UI as a user sees it: `sessionize ui` on a small home, opened in headless Chromium
(Debian's `chromium`, driven by Playwright with that executable; nothing is downloaded).

Skipped, with the reason, where no Chromium is installed (`.ci/run` installs it). What it shows:
the asset graph lists every asset, the checks the command line's runs executed have results
(the blocking one marked so), a partition's page carries its own metadata, and a range backfill
launched from the asset graph on `filtered_events` and everything downstream runs to completion
as one cascade that no sensor repeats, after which `verify` passes.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from sessionize_assets.jars import jars_dir
from sessionize_assets_tests.conftest import TEST_SPARK, cli_now

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
playwright = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
pytestmark = pytest.mark.skipif(
    not os.path.exists(CHROMIUM),
    reason="no Chromium here: install Debian's `chromium` package to run the browser test",
)
# Flags for a closed network: no background connections to Google's hosts at start-up.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
UI_START_S = 240
PAGE_S = 90


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ui_home(two_days, tmp_path_factory) -> Path:
    """A copy of the `two_days` home (load days 1 and 2 run by the command line) for the UI. The
    runs the UI launches start their own Spark: with the tests' settings (`TEST_SPARK`), they
    use a fraction of the CPU of a default JVM, which the other test process shares."""
    home = tmp_path_factory.mktemp("ui") / "home"
    shutil.copytree(two_days[0], home)
    settings = home / "sessionize.yaml"
    config = yaml.safe_load(settings.read_text())
    settings.write_text(yaml.safe_dump({**config, "spark": dict(TEST_SPARK)}))
    return home


@pytest.fixture(scope="module")
def ui(ui_home) -> Iterator[str]:
    """`sessionize ui` on `ui_home`, without the warm engine; its URL. Its output goes to
    `ui.log` beside the home. The whole process group is stopped afterwards."""
    home = ui_home
    port = _free_port()
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SESSIONIZE_", "DAGSTER_HOME", "SPARK_REMOTE"))
    }
    env["SESSIONIZE_JARS_DIR"] = str(jars_dir())
    log = open(home.parent / "ui.log", "w")  # noqa: SIM115 - closed in the finally below
    process = subprocess.Popen(
        [sys.executable, "-m", "sessionize_assets.cli", "--home", str(home), *cli_now(3)]
        + ["ui", "--no-engine", "--port", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + UI_START_S
        while True:
            try:
                with urllib.request.urlopen(f"{url}/server_info", timeout=5) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                log.flush()
                raise AssertionError(
                    "the UI did not start: " + (home.parent / "ui.log").read_text()[-3000:]
                )
            time.sleep(1)
        yield url
    finally:
        # As Ctrl-C in a terminal: SIGINT to the whole group (the command, `dagster dev`, its
        # webserver, daemon and code servers), then SIGKILL for whatever is left.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=30)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        log.close()


@pytest.fixture(scope="module")
def page(ui):
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            tab = browser.new_page(viewport={"width": 1400, "height": 1000})
            tab.set_default_timeout(PAGE_S * 1000)
            yield tab
        finally:
            browser.close()


def _open(page, url: str, *texts: str, shot: Path | None = None) -> str:
    """Open `url`, wait until every text is on the page, return the page's text."""
    page.goto(url)
    for text in texts:
        page.get_by_text(text, exact=False).first.wait_for()
    if shot is not None:
        page.screenshot(path=str(shot))
    return page.inner_text("body")


def test_the_asset_graph_lists_every_asset(ui, page, tmp_path):
    from sessionize_assets.definitions import build_definitions

    graph = build_definitions(tmp_path / "any").resolve_asset_graph()
    names = sorted(key.to_user_string() for key in graph.get_all_asset_keys())
    assert len(names) >= 13
    text = _open(page, f"{ui}/assets", "filtered_events", shot=tmp_path / "assets.png")
    missing = [n for n in names if n not in text]
    assert not missing, f"not on the assets page: {missing}"
    assert "time_based" in text and "session_based" in text  # the groups


def test_the_checks_run_by_the_command_line_have_results(ui, page, tmp_path):
    text = _open(
        page,
        f"{ui}/assets/daily_aggregates?view=checks",
        "accounting_invariant",
        "Evaluation result",
        shot=tmp_path / "accounting.png",
    )
    assert "This is a blocking asset check." in text
    assert "Passed" in text and "event days checked" in text
    text = _open(
        page,
        f"{ui}/assets/filtered_events?view=checks",
        "no_duplicate_event_ids",
        "Evaluation result",
        shot=tmp_path / "duplicates.png",
    )
    assert "Passed" in text
    assert "load days 2024-03-01..2024-03-02" in text  # scoped to the run's load days


def test_a_partition_page_carries_that_partitions_metadata(ui, page, tmp_path):
    """The home's `run` took load days 1 and 2 in one run: the partition's latest
    materialization is its own figures (`metadata.partition_figures`), not the run's totals."""
    text = _open(
        page,
        f"{ui}/assets/filtered_events?view=partitions&partition=2024-03-02",
        "Latest materialization",
        "dropped duplicate",
        shot=tmp_path / "partition.png",
    )
    assert "Materialized (2)" in text  # load days 1 and 2 of the home
    # One run, two events: the run's own (its totals in JSON) and the partition's figures.
    assert "View all historical events (2)" in text
    assert "rows written" in text and "rows_kept" not in text


# A sensor's skip as the daemon logs it (colour codes removed first).
SENSOR_SKIP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) \+0000 .*Sensor (\w+) skipped: (.*)$")
ANSI = re.compile(r"\x1b\[[0-9;]*m")
SENSORS = ("new_loads_sensor", "late_days_sensor", "session_models_sensor")
BACKFILL_S = 900
CASCADE = (
    "filtered_events",
    "days_to_process",
    "daily_aggregates",
    "daily_aggregation_manifest",
    "attributes",
    "sessions",
    "users",
)


def _sensor_skips(log: Path) -> list[tuple[float, str, str]]:
    """(time, sensor, reason) of every skip the daemon has logged so far."""
    out = []
    for line in log.read_text(errors="replace").splitlines():
        match = SENSOR_SKIP.match(ANSI.sub("", line))
        if match:
            when = dt.datetime.fromisoformat(match.group(1)).replace(tzinfo=dt.UTC)
            out.append((when.timestamp(), match.group(2), match.group(3)))
    return out


def _launch_backfill(page, url: str, partitions: str, expected: int, shot: Path) -> str:
    """As a user would: the global lineage filtered to `filtered_events` and everything
    downstream, "Materialize all", a range typed into the partition selection, "Launch
    backfill". The backfill's id, from the confirmation."""
    page.goto(f"{url}/asset-groups~key%3Afiltered_events%2B/")
    page.get_by_text("Materialize all").first.wait_for()
    # Dagster's newsletter prompt opens a moment after a page loads, once per browser.
    with contextlib.suppress(playwright.TimeoutError):
        page.get_by_role("button", name="Skip").click(timeout=8000)
    page.get_by_text("Materialize all").first.click()
    dialog = page.get_by_role("dialog")
    dialog.get_by_text("Launch runs to materialize").wait_for()
    # The dialog shows the last 90 days of the real clock; the test home's days are older.
    dialog.get_by_text("Show all partitions").click()
    dialog.get_by_text("Show all partitions").wait_for(state="detached")
    field = dialog.locator("input").first
    field.fill(partitions)
    field.press("Enter")
    dialog.get_by_text(f"{expected} partitions", exact=True).wait_for()
    page.screenshot(path=str(shot))
    page.get_by_role("button", name="Launch backfill").click()
    created = page.get_by_text(re.compile(r"Created backfill \w+")).first
    created.wait_for()
    return created.inner_text().split()[-1]


def test_a_range_backfill_from_the_ui_is_one_cascade_no_sensor_repeats(ui, ui_home, page, tmp_path):
    """The 2-day backfill of issue 16, replayed: one Dagster backfill materializes the load days,
    their decisions, the event days they map to (with the decided horizons, not as a keyhole
    repair), attributes, the manifest and the session models; while it runs the sensors wait and
    say so; after it ends each sensor finds nothing to do; `verify` passes."""
    from dagster import AssetKey, AssetRecordsFilter, DagsterInstance, RunsFilter
    from dagster._core.execution.backfill import BulkActionStatus

    from sessionize_assets.cli import main
    from sessionize_assets.metadata import FIGURES_TAG

    log = ui_home.parent / "ui.log"
    started = time.time()
    backfill_id = _launch_backfill(
        page, ui, "[2024-03-01...2024-03-02]", 2, shot=tmp_path / "launch.png"
    )
    with DagsterInstance.from_ref(_instance_ref(ui_home)) as instance:
        deadline = time.monotonic() + BACKFILL_S
        while True:
            backfill = instance.get_backfill(backfill_id)
            if backfill.status not in (BulkActionStatus.REQUESTED, BulkActionStatus.CANCELING):
                break
            assert time.monotonic() < deadline, f"backfill {backfill_id} still {backfill.status}"
            time.sleep(5)
        assert backfill.status == BulkActionStatus.COMPLETED_SUCCESS, backfill.status
        ended = backfill.backfill_end_timestamp or time.time()
        in_backfill = {
            r.run_id
            for r in instance.get_runs(filters=RunsFilter(tags={"dagster/backfill": backfill_id}))
        }
        for name in CASCADE:
            latest = instance.get_latest_materialization_event(AssetKey(name))
            assert latest is not None and latest.run_id in in_backfill, name
        # Aggregated up to the decided horizons (a keyhole repair would say so), and each
        # partition's latest materialization carries its own figures for the partition plots.
        records = instance.fetch_materializations(
            AssetRecordsFilter(asset_key=AssetKey("daily_aggregates")), limit=10
        ).records
        ours = [r.asset_materialization for r in records if r.run_id in in_backfill]
        modes = {m.metadata["mode"].value for m in ours if "mode" in m.metadata}
        assert modes == {"up to the decided horizon"}, modes
        latest = [m for m in ours if FIGURES_TAG in (m.tags or {})]
        assert {m.partition for m in latest} == {"2024-03-01", "2024-03-02"}
        assert all("rows read" in m.metadata for m in latest)

        # Every sensor ticks again after the end and finds nothing to do; no run but the
        # backfill's was launched since it started.
        deadline = time.monotonic() + 180
        while True:
            # A tick that began before the end may log its wait just after it: not counted.
            after = {
                name
                for when, name, reason in _sensor_skips(log)
                if when > ended and not reason.startswith("Backfill ")
            }
            if after >= set(SENSORS):
                break
            assert time.monotonic() < deadline, f"sensors that did not tick after: {after}"
            time.sleep(5)
        since = instance.get_runs(filters=RunsFilter(created_after=_utc(started)))
        assert {r.run_id for r in since} == in_backfill, [r.tags for r in since]
    skips = _sensor_skips(log)
    waited = {name for when, name, reason in skips if reason.startswith(f"Backfill {backfill_id}")}
    assert waited, "no sensor ticked while the backfill ran"
    # The backfill's page: every asset of the cascade, 100% completed.
    text = _open(
        page, f"{ui}/runs/b/{backfill_id}", "incremental_manifest", shot=tmp_path / "backfill.png"
    )
    assert all(name in text for name in CASCADE), text[:2000]
    assert "Succeeded" in text and "2024-03-01...2024-03-02" in text
    # Plots: each partition's own figures are numbers the UI plots (labels as a one-partition
    # run's). Plots -> Partitions charts the latest 120 partitions of the real clock, where this
    # 2024 home has none, so the test reads Plots -> Events; the demo's days end yesterday and
    # show under Partitions (docs/time_based.md).
    for asset, label in (
        ("daily_aggregates", "pending rows (not counted yet)"),
        ("filtered_events", "dropped duplicate"),
    ):
        page.goto(f"{ui}/assets/{asset}?view=overview")
        page.get_by_text("Plots", exact=True).first.click()
        page.get_by_role("button", name="Events").click()
        page.get_by_text(label, exact=True).first.wait_for()
        page.screenshot(path=str(tmp_path / f"plots-{asset}.png"))
    assert main(["--home", str(ui_home), *cli_now(3), "verify"]) == 0


def _instance_ref(home: Path):
    from dagster._core.instance.ref import InstanceRef

    return InstanceRef.from_dir(str(home / "dagster"))


def _utc(timestamp: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(timestamp, tz=dt.UTC)
