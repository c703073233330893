"""A warm Spark engine: one long-lived local Spark Connect server per home, with Delta Lake.

`start` spawns `spark-submit --class SparkConnectServer` detached, with the Delta jars and the
same Spark settings the embedded engine uses (`resources/spark.py`), bound to 127.0.0.1 and
protected by a random token. Its log is `<home>/engine/engine.log`; its pid, port and URL (token
included) are in `<home>/engine/engine.json` (mode 0600). Clients connect with the URL
`remote_url(home)` returns, or with `SESSIONIZE_SPARK_REMOTE=home` (see `resources/spark.py`).

    python -m sessionize_assets.resources.engine start|status|stop|url [--home DIR] [--port N]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import fcntl
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from sessionize_assets.errors import UserError

log = logging.getLogger(__name__)

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
DEFAULT_PORT = 15002
HOST = "127.0.0.1"
START_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 30.0
# Settings that belong to the client or to the launcher, never to the server's SparkConf.
_CLIENT_ONLY = ("spark.remote", "spark.api.mode", "spark.jars")
# Environment a client may carry that must not leak into the server's launcher.
_CLIENT_ENV = ("SPARK_REMOTE", "SESSIONIZE_SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED")

State = Literal["running", "stale", "not started"]

# Engines this process spawned, by pid: kept so `stop` can reap them (no zombie, no
# "still running" ResourceWarning when the Popen object is collected).
_SPAWNED: dict[int, subprocess.Popen] = {}


@dataclass(frozen=True)
class EngineInfo:
    """A live engine: its process, where it listens, and its log."""

    pid: int
    port: int
    url: str  # with the token: pass it to SparkSession.builder.remote(...)
    log: Path
    started_at: str
    reused: bool = False

    @property
    def public_url(self) -> str:
        """The URL without the token (safe to print)."""
        return _public(self.url)


@dataclass(frozen=True)
class EngineStatus:
    """What `<home>/engine/engine.json` says, checked against the process and the port."""

    state: State
    home: Path
    pid: int | None = None
    port: int | None = None
    url: str | None = None
    log: Path | None = None
    started_at: str | None = None
    answering: bool = False  # the port accepts connections

    def line(self) -> str:
        if self.state == "running":
            how = "answering" if self.answering else "not answering yet"
            return (
                f"Spark engine running (pid {self.pid}, {_public(self.url or '')}, {how}, "
                f"since {self.started_at}); log: {self.log}"
            )
        if self.state == "stale":
            return (
                f"Spark engine not running: {_state_file(self.home)} names pid {self.pid}, "
                f"which is gone (stale); log: {self.log}"
            )
        return f"No Spark engine started for {self.home}."


# ------------------------------------------------------------------ paths and the state file


def engine_dir(home_dir: Path) -> Path:
    return Path(home_dir) / "engine"


def log_file(home_dir: Path) -> Path:
    return engine_dir(home_dir) / "engine.log"


def _state_file(home_dir: Path) -> Path:
    return engine_dir(home_dir) / "engine.json"


def _read_state(home_dir: Path) -> dict[str, Any] | None:
    path = _state_file(home_dir)
    try:
        state = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}  # unreadable: treated as stale
    return state if isinstance(state, dict) else {}


def _write_state(home_dir: Path, state: Mapping[str, Any]) -> None:
    """Atomically, readable by the owner only (the URL carries the token)."""
    path = _state_file(home_dir)
    tmp = path.with_suffix(".json.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(dict(state), out, indent=1, sort_keys=True)
    os.replace(tmp, path)


@contextlib.contextmanager
def _locked(home_dir: Path) -> Iterator[None]:
    """One start/stop at a time per home (concurrent `start`s share one engine)."""
    folder = engine_dir(home_dir)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "engine.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _note(home_dir: Path, message: str) -> None:
    """A line of our own in the engine log (start-up failures that happen before the JVM)."""
    path = log_file(home_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    with open(path, "a") as out:
        out.write(f"{stamp} sessionize engine: {message}\n")


def _fail(home_dir: Path, message: str) -> UserError:
    _note(home_dir, message)
    return UserError(f"{message.rstrip('.')}; engine log: {log_file(home_dir)}")


# ------------------------------------------------------------------ processes and ports


def _public(url: str) -> str:
    return url.split("/;", 1)[0]


def _is_engine_process(pid: int) -> bool:
    """The pid is alive, not a zombie, and is a Spark Connect server (not a reused pid)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False  # someone else's process: not ours
    proc = Path(f"/proc/{pid}")
    if not proc.is_dir():  # no /proc (macOS): trust the signal check
        return True
    try:
        stat = (proc / "stat").read_text()
        cmdline = (proc / "cmdline").read_bytes()
    except OSError:
        return False
    if stat.rsplit(")", 1)[-1].split()[0] in ("Z", "X"):
        return False
    return SERVER_CLASS.encode() in cmdline


def _port_accepts(port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=timeout):
            return True
    except OSError:
        return False


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def _java(home_dir: Path) -> str:
    """The java that spark-class will use ($JAVA_HOME/bin/java, else java on PATH)."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        java = Path(java_home) / "bin" / "java"
        if not os.access(java, os.X_OK):
            raise _fail(home_dir, f"JAVA_HOME is {java_home} but {java} is not an executable")
        return str(java)
    found = shutil.which("java")
    if not found:
        raise _fail(
            home_dir,
            "Java is not installed (no java on PATH and JAVA_HOME unset); "
            "Spark needs Java 17 (openjdk-17-jre-headless)",
        )
    return found


def _spark_submit() -> Path:
    from pyspark.find_spark_home import _find_spark_home

    return Path(_find_spark_home()) / "bin" / "spark-submit"


# The engine's heap. The throughput collector keeps every page of the heap it once touched, so
# after a catch-up the engine holds its whole heap for good: with 3 GiB, a day of 200,000 events
# on 30 days of history peaked at 4.6-4.7 GiB (engine and client); with 2.25 GiB at 3.8-4.0 GiB, and
# the 6 M-event catch-up still ran in one run (docs/benchmarks.md, "Session 41"). 2 GiB ran that
# catch-up out of heap in session 8. Larger catch-ups: `spark.driver.memory` in the `spark`
# setting, or run limits that split them.
ENGINE_DRIVER_MEMORY = "2304m"
MALLOC_ARENA_MAX = "2"  # unless the environment sets it


def server_conf(spark_overrides: Mapping[str, str] | None, port: int) -> dict[str, str]:
    """The server's SparkConf: the embedded engine's (Delta, UTC, ...) plus the Connect binding."""
    from sessionize_assets.resources.spark_conf import spark_conf

    conf = spark_conf(spark_overrides)
    for key in _CLIENT_ONLY:
        conf.pop(key, None)
    if "spark.driver.memory" not in (spark_overrides or {}):
        conf["spark.driver.memory"] = ENGINE_DRIVER_MEMORY  # a whole catch-up's heap, see above
    conf.setdefault("spark.log.level", "WARN")
    conf["spark.app.name"] = f"{conf.get('spark.app.name', 'sessionize_assets')} engine"
    conf["spark.connect.grpc.binding.address"] = HOST
    conf["spark.connect.grpc.binding.port"] = str(port)
    conf["spark.connect.grpc.port.maxRetries"] = "0"  # never bind another port than the one named
    return conf


def _command(spark_overrides: Mapping[str, str] | None, port: int) -> list[str]:
    from sessionize_assets.resources.spark_conf import spark_conf

    jars = spark_conf(spark_overrides)["spark.jars"]  # Delta jars first, then the user's
    command = [str(_spark_submit()), "--class", SERVER_CLASS, "--jars", jars]
    for key, value in sorted(server_conf(spark_overrides, port).items()):
        command += ["--conf", f"{key}={value}"]
    return [*command, "spark-internal"]


def _last_error(home_dir: Path, offset: int) -> str:
    """The first line in the log since `offset` that names an exception or error (for the
    one-sentence message), else ''."""
    try:
        with open(log_file(home_dir), "rb") as handle:
            handle.seek(offset)
            text = handle.read().decode(errors="replace")
    except OSError:
        return ""
    for line in text.splitlines():
        if ("Exception" in line or "Error" in line) and not line.lstrip().startswith("at "):
            return line.strip()[:240]
    return ""


def _probe(url: str) -> None:
    """A trivial query through a throw-away Connect session. Does not touch this process's
    default session or switch the process to Connect mode (SPARK_CONNECT_MODE_ENABLED)."""
    from pyspark.sql.connect.session import SparkSession as RemoteSparkSession

    session = RemoteSparkSession(connection=url)
    try:
        rows = session.sql("SELECT 1 AS ok").collect()
        if rows[0][0] != 1:
            raise RuntimeError(f"unexpected answer {rows!r}")
    finally:
        session.stop()  # releases the server-side session too


def _check_client() -> None:
    try:
        from pyspark.sql.connect.utils import check_dependencies

        check_dependencies()
    except ImportError as exc:
        raise UserError(
            f"The Spark Connect client needs more Python packages ({exc}); install grpcio, "
            "grpcio-status, googleapis-common-protos, zstandard and pandas<3 into the venv"
        ) from None


def _kill_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def _wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        spawned = _SPAWNED.get(pid)
        if spawned is not None and spawned.poll() is not None:
            _SPAWNED.pop(pid, None)
            return True
        if not _is_engine_process(pid):
            return True
        time.sleep(0.2)
    return not _is_engine_process(pid)


# ------------------------------------------------------------------ the public functions


def status(home_dir: Path) -> EngineStatus:
    """Running (the pid is a live Connect server), stale (the file names a dead pid) or not
    started (no file)."""
    home_dir = Path(home_dir)
    state = _read_state(home_dir)
    if state is None:
        return EngineStatus(state="not started", home=home_dir)
    pid = state.get("pid")
    port = state.get("port")
    common = {
        "home": home_dir,
        "pid": pid,
        "port": port,
        "url": state.get("url"),
        "log": log_file(home_dir),
        "started_at": state.get("started_at"),
    }
    if isinstance(pid, int) and _is_engine_process(pid):
        answering = isinstance(port, int) and _port_accepts(port)
        return EngineStatus(state="running", answering=answering, **common)
    return EngineStatus(state="stale", **common)


def remote_url(home_dir: Path) -> str | None:
    """The Connect URL (token included) of the home's live engine, else None."""
    current = status(home_dir)
    if current.state == "running" and current.answering and current.url:
        return current.url
    return None


def start(
    home_dir: Path,
    spark_overrides: Mapping[str, str] | None = None,
    port: int | None = None,
    *,
    timeout_s: float = START_TIMEOUT_S,
) -> EngineInfo:
    """Start the home's engine (or reuse the live one) and wait until it answers a query.

    `port` None means DEFAULT_PORT (15002), 0 a free port. Raises UserError (one sentence naming
    the log) when Java or the Delta jars are missing, the port is taken, or the server exits or
    does not answer within `timeout_s`."""
    home_dir = Path(home_dir).resolve()
    _check_client()
    with _locked(home_dir):
        current = status(home_dir)
        if current.state == "running" and current.pid is not None and current.port is not None:
            if port not in (None, 0, current.port):
                raise _fail(
                    home_dir,
                    f"The engine of {home_dir} already runs on port {current.port} "
                    f"(pid {current.pid}); stop it before starting one on port {port}",
                )
            info = EngineInfo(
                pid=current.pid,
                port=current.port,
                url=str(current.url),
                log=log_file(home_dir),
                started_at=str(current.started_at),
                reused=True,
            )
            _wait_ready(home_dir, info, None, timeout_s, 0)
            return info
        if current.state == "stale":
            _state_file(home_dir).unlink(missing_ok=True)
        return _spawn(home_dir, spark_overrides, port, timeout_s)


def _spawn(
    home_dir: Path, spark_overrides: Mapping[str, str] | None, port: int | None, timeout_s: float
) -> EngineInfo:
    from sessionize_assets.errors import MissingJarsError

    port = DEFAULT_PORT if port is None else (port or free_port())
    _java(home_dir)
    try:
        command = _command(spark_overrides, port)
    except MissingJarsError as exc:
        raise _fail(home_dir, str(exc)) from None
    if not _port_free(port):
        raise _fail(
            home_dir,
            f"Port {port} on {HOST} is already in use by another program; "
            "stop it or start the engine on another port",
        )
    token = secrets.token_urlsafe(24)
    # "localhost" (not 127.0.0.1): the client then sends the token over a local, unencrypted
    # channel; any other host name would make it insist on TLS.
    url = f"sc://localhost:{port}/;token={token}"
    env = {k: v for k, v in os.environ.items() if k not in _CLIENT_ENV}
    env["SPARK_LOCAL_IP"] = HOST
    env["SPARK_CONNECT_AUTHENTICATE_TOKEN"] = token  # not on the command line (ps shows that)
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    # Two glibc malloc arenas instead of up to 8 per core: the JVM's native allocations
    # (compression codecs, threads) kept four 64 MiB arenas resident (docs/benchmarks.md,
    # "Session 40"), and the engine's memory counts against the day's peak.
    env.setdefault("MALLOC_ARENA_MAX", MALLOC_ARENA_MAX)
    path = log_file(home_dir)
    offset = path.stat().st_size if path.exists() else 0
    _note(home_dir, f"starting on {HOST}:{port}: {' '.join(command)}")
    with open(path, "ab") as out:
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=engine_dir(home_dir),
            env=env,
            start_new_session=True,  # own process group: survives the caller, stopped as a group
        )
    _SPAWNED[process.pid] = process
    started_at = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    info = EngineInfo(pid=process.pid, port=port, url=url, log=path, started_at=started_at)
    _write_state(
        home_dir,
        {"pid": process.pid, "port": port, "url": url, "started_at": started_at, "log": str(path)},
    )
    try:
        _wait_ready(home_dir, info, process, timeout_s, offset)
    except BaseException:
        _kill_group(process.pid, signal.SIGKILL)
        with contextlib.suppress(Exception):
            process.wait(timeout=10)
        _SPAWNED.pop(process.pid, None)
        _state_file(home_dir).unlink(missing_ok=True)
        raise
    _note(home_dir, f"ready on {info.public_url} (pid {info.pid})")
    return info


def _wait_ready(
    home_dir: Path,
    info: EngineInfo,
    process: subprocess.Popen | None,
    timeout_s: float,
    offset: int,
) -> None:
    """Until the port accepts and `SELECT 1` answers; UserError if the server exits first or
    `timeout_s` passes."""
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        code = process.poll() if process is not None else None
        if code is not None or (process is None and not _is_engine_process(info.pid)):
            reason = _last_error(home_dir, offset)
            raise _fail(
                home_dir,
                f"The Spark engine exited during start-up (exit code {code})"
                + (f": {reason}" if reason else ""),
            )
        if _port_accepts(info.port):
            try:
                _probe(info.url)
                return
            except Exception as exc:  # noqa: BLE001 - still starting: the session may not be up
                last = exc
        time.sleep(0.25)
    detail = f" (last error: {str(last).strip().splitlines()[0][:160]})" if last else ""
    raise _fail(
        home_dir,
        f"The Spark engine did not answer on {HOST}:{info.port} within {timeout_s:g} s{detail}",
    )


def stop(home_dir: Path, timeout_s: float = STOP_TIMEOUT_S) -> str:
    """Stop the home's engine (SIGTERM to its process group, SIGKILL after `timeout_s`) and
    remove its state file. Returns one sentence saying what happened."""
    home_dir = Path(home_dir).resolve()
    with _locked(home_dir):
        current = status(home_dir)
        if current.state == "not started":
            return f"No Spark engine was started for {home_dir}."
        if current.state == "stale":
            _state_file(home_dir).unlink(missing_ok=True)
            return f"The Spark engine (pid {current.pid}) was not running; removed its stale file."
        pid = int(current.pid or 0)
        _kill_group(pid, signal.SIGTERM)
        how = "stopped"
        if not _wait_gone(pid, timeout_s):
            _kill_group(pid, signal.SIGKILL)
            _wait_gone(pid, 10.0)
            how = "killed (it ignored SIGTERM)"
        _state_file(home_dir).unlink(missing_ok=True)
        _note(home_dir, f"{how} pid {pid}")
        return f"Spark engine {how} (pid {pid}, {_public(current.url or '')})."


# ------------------------------------------------------------------ python -m ...engine


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sessionize_assets.resources.engine")
    parser.add_argument("action", choices=("start", "stop", "status", "url"))
    parser.add_argument("--home", help="the sessionize home (default $SESSIONIZE_HOME)")
    parser.add_argument("--config", help="settings file (its `spark` map configures the engine)")
    parser.add_argument("--port", type=int, help=f"default {DEFAULT_PORT}; 0 picks a free one")
    parser.add_argument("--timeout", type=float, default=START_TIMEOUT_S)
    args = parser.parse_args(argv)
    from sessionize_assets.home import Home

    home = Path(args.home).resolve() if args.home else Home.from_env().root
    try:
        if args.action == "start":
            from sessionize_assets.settings import load_settings

            settings = load_settings(home, args.config)
            info = start(home, settings.spark, args.port, timeout_s=args.timeout)
            verb = "already running" if info.reused else "started"
            print(f"Spark engine {verb}: pid {info.pid}, {info.public_url}; log: {info.log}")
            print(f"use it with: export SESSIONIZE_SPARK_REMOTE=home SESSIONIZE_HOME={home}")
        elif args.action == "stop":
            print(stop(home))
        elif args.action == "status":
            current = status(home)
            print(current.line())
            return 0 if current.state == "running" else 3
        else:
            url = remote_url(home)
            if url is None:
                print(status(home).line(), file=sys.stderr)
                return 3
            print(url)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
