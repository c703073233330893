"""The Dagster UI as a user sees it: `sessionize ui` on a small home, opened in headless Chromium
(Debian's `chromium`, driven by Playwright with that executable; nothing is downloaded).

Skipped, with the reason, where no Chromium is installed (`.ci/run` installs it). What it shows:
the asset graph lists every asset, the checks the command line's runs executed have results
(the blocking one marked so), and a partition's page carries its own metadata.
"""

from __future__ import annotations

import contextlib
import os
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

from sessionize_assets.jars import jars_dir
from sessionize_assets_tests.conftest import cli_now

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
def ui(two_days, tmp_path_factory) -> Iterator[str]:
    """`sessionize ui` on a copy of the `two_days` home (load days 1 and 2 run by the command
    line), without the warm engine; its URL. The whole process group is stopped afterwards."""
    home = tmp_path_factory.mktemp("ui") / "home"
    shutil.copytree(two_days[0], home)
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
    text = _open(
        page,
        f"{ui}/assets/filtered_events?view=partitions&partition=2024-03-02",
        "Latest materialization",
        "accounting per load day",
        shot=tmp_path / "partition.png",
    )
    assert "Materialized (2)" in text  # load days 1 and 2 of the home
    assert "rows_kept" in text
