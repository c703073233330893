"""One writing command per home at a time, decided before Spark starts.

`run`, `backfill` and `demo` take an exclusive lock on `<home>/command.lock` (an OS file lock:
the kernel releases it when the holding process ends, however it ends, so a killed command
never leaves it behind). A second command learns at once who holds it — command, process id,
host, since when — and either exits with that sentence (exit status 3) or, with `--wait
SECONDS`, waits that long for it. The processing manifest still guards every item underneath
(Dagster runs launched by sensors take no command lock).
"""

from __future__ import annotations

import datetime as dt
import fcntl
import json
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sessionize_assets.core.clock import utc_now
from sessionize_assets.core.manifest_state import format_age
from sessionize_assets.errors import ItemLockedError

LOCK_FILE = "command.lock"
POLL_S = 0.5


def _holder(path: Path) -> str:
    try:
        info = json.loads(path.read_text() or "{}")
    except (OSError, json.JSONDecodeError):
        info = {}
    if not info:
        return "another sessionize command"
    since = info.get("since")
    age = ""
    if since:
        age = f", for {format_age(utc_now() - dt.datetime.fromisoformat(since))}"
    return (
        f"`sessionize {info.get('command', '?')}` (process {info.get('pid', '?')} on "
        f"{info.get('host', '?')}{age})"
    )


@contextmanager
def command_lock(home_root: Path, command: str, wait_s: float = 0.0) -> Iterator[None]:
    """Hold the home's command lock for the body; raises ItemLockedError (one sentence naming
    the holder) when another command holds it for longer than `wait_s` seconds."""
    home_root.mkdir(parents=True, exist_ok=True)
    path = home_root / LOCK_FILE
    handle = open(path, "a+")  # noqa: SIM115 - closed below, after the lock is released
    try:
        deadline = time.monotonic() + max(0.0, wait_s)
        while True:
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    waited = f" after waiting {wait_s:g} s" if wait_s > 0 else ""
                    raise ItemLockedError(
                        f"This home is busy{waited}: {_holder(path)} is writing to it; "
                        f"wait for it to finish, or pass --wait SECONDS."
                    ) from None
                time.sleep(POLL_S)
        handle.seek(0)
        handle.truncate()
        handle.write(
            json.dumps(
                {
                    "command": command,
                    "pid": os.getpid(),
                    "host": socket.gethostname(),
                    "since": utc_now().isoformat(),
                }
            )
        )
        handle.flush()
        try:
            yield
        finally:
            handle.seek(0)
            handle.truncate()
            handle.flush()
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
    finally:
        handle.close()
