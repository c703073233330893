"""A class-data-sharing archive of the Spark driver's JVM: built once during set-up, mapped by every
later start of the embedded engine, the warm engine's server and the tests' Spark.

A JVM that starts Spark and Delta loads and verifies some 15,000 classes from the jars. Java 17
can write the classes a run loaded into an archive when it exits (`-XX:ArchiveClassesAtExit`) and
map that archive at a later start (`-XX:SharedArchiveFile`), which skips parsing and verifying
them. Measured (`python -m benchmarks.class_archive`; docs/benchmarks.md, "Session 46"): Spark's
start 5.8-6.2 s instead of 8.9-9.3 s, its first Delta write 6.4-6.8 s instead of 8.9-9.6 s.

The archive belongs to one JVM build and one set of Spark jars (the JVM itself refuses an archive
whose class path or jars changed, and then starts without it): its file name carries a
fingerprint of both, so a new Java or a new PySpark finds no archive until set-up builds one.
`SESSIONIZE_CLASS_ARCHIVE=off` neither uses nor builds one.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import NoReturn

from sessionize_assets.jars import jars_dir

SWITCH_ENV = "SESSIONIZE_CLASS_ARCHIVE"  # "off": no archive used or built
BUILD_ENV = "SESSIONIZE_CLASS_ARCHIVE_BUILD"  # set by `build`: the file the JVM archives into
# The JVM's own messages about the archive (a stale one is refused with a warning on every start;
# the archiving run warns about each class it skips) are not the user's business: a refused
# archive only means a slower start.
_QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"
_NAMED = ("-Xshare", "SharedArchiveFile", "ArchiveClassesAtExit")


def _java_home() -> Path | None:
    """The JVM `spark-submit` starts: $JAVA_HOME's, else the `java` on PATH (links resolved)."""
    configured = os.environ.get("JAVA_HOME")
    java = Path(configured) / "bin" / "java" if configured else shutil.which("java")
    if java is None or not Path(java).exists():
        return None
    return Path(java).resolve().parent.parent


def _spark_jars() -> Path | None:
    from pyspark.find_spark_home import _find_spark_home

    try:
        folder = Path(_find_spark_home()) / "jars"
    except Exception:  # noqa: BLE001 - no Spark found: Spark's own start says so
        return None
    return folder.resolve() if folder.is_dir() else None


def _stat(path: Path) -> str:
    try:
        info = path.stat()
    except OSError:
        return "-"
    return f"{info.st_size}:{info.st_mtime_ns}"


def fingerprint() -> str | None:
    """What an archive is valid for: the JVM build (its `release` file and library) and the Spark
    jars folder (its path and modification time, which changes when a jar is added or removed).
    None when either cannot be found."""
    java_home, spark_jars = _java_home(), _spark_jars()
    if java_home is None or spark_jars is None:
        return None
    release = java_home / "release"
    parts = [
        str(java_home),
        release.read_text(errors="replace") if release.is_file() else "",
        _stat(java_home / "lib" / "server" / "libjvm.so"),
        str(spark_jars),
        _stat(spark_jars),
    ]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:20]


def archive_path() -> Path | None:
    """Where the archive for this JVM and these jars is kept (beside the Delta jars)."""
    print_ = fingerprint()
    return None if print_ is None else jars_dir() / "class-archives" / f"spark-{print_}.jsa"


def names_archive(options: str) -> bool:
    """Whether JVM options already say how to share classes (theirs are then left alone)."""
    return any(name in options for name in _NAMED)


def driver_options() -> str:
    """The options that make the driver's JVM map the archive ('' when there is none or it is
    turned off); while `build` runs, the options that write it at exit."""
    if os.environ.get(SWITCH_ENV, "").lower() == "off":
        return ""
    target = os.environ.get(BUILD_ENV)
    if target:
        return f"-XX:ArchiveClassesAtExit={target} {_QUIET}"
    path = archive_path()
    if path is None or not path.is_file():
        return ""
    return f"-XX:SharedArchiveFile={path} {_QUIET}"


WORKLOAD = ["demo", "--days", "2", "--events-per-day", "300"]
"""What the archiving JVM runs (`sessionize --home TMP demo ...`): it loads the classes of a load,
a run of both branches and a verify."""


def build(quiet: bool = True, announce: bool = False) -> Path | None:
    """Build the archive unless it exists (idempotent): `WORKLOAD` in a temporary home, in a
    process whose JVM archives the classes it loaded when it exits. Returns the archive, or None
    when it is turned off or could not be built (every JVM then starts as before: the archive
    only saves time). `announce`: say on standard error when a build starts."""
    if os.environ.get(SWITCH_ENV, "").lower() == "off":
        return None
    path = archive_path()
    if path is None:
        return None
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    if announce:
        print("setup: building the JVM class archive (once, about two minutes)", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="sessionize-class-archive-") as work:
        partial = Path(work) / "spark.jsa"
        env = {**os.environ, BUILD_ENV: str(partial)}
        for name in ("SESSIONIZE_SPARK_REMOTE", "SPARK_REMOTE", "SESSIONIZE_CONFIG"):
            env.pop(name, None)
        command = [sys.executable, "-m", "sessionize_assets.class_archive", "--workload", work]
        output = subprocess.DEVNULL if quiet else None
        done = subprocess.run(command, env=env, stdout=output, stderr=output, check=False)
        if done.returncode != 0 or not partial.is_file():
            return None
        staged = path.with_suffix(f".{os.getpid()}.part")
        shutil.move(str(partial), staged)
        staged.replace(path)  # another set-up's archive of the same fingerprint is as good
    spark_jars = _spark_jars()
    path.with_suffix(".source").write_text(f"{spark_jars}\n")
    prune(path.parent)
    return path


def prune(folder: Path) -> list[Path]:
    """Delete the archives whose Spark jars folder is gone (a removed clone's `.venv`: each
    weighs about 200 MB); returns them. An archive without its `.source` file is kept."""
    removed = []
    for source in folder.glob("*.source"):
        jars = source.read_text().strip()
        if jars and not Path(jars).is_dir():
            archive = source.with_suffix(".jsa")
            archive.unlink(missing_ok=True)
            source.unlink(missing_ok=True)
            removed.append(archive)
    return removed


def _run_workload(work: str) -> NoReturn:
    """`WORKLOAD` in `work`, then the JVM stopped and waited for: it writes the archive as it
    exits, which `sessionize` itself would not wait for."""
    from pyspark import SparkContext

    from sessionize_assets.cli import leave, main

    status = 1
    try:
        status = main(["--home", str(Path(work) / "home"), *WORKLOAD])
    finally:  # also after a failure: `build` must not take a half-written archive
        context, gateway = SparkContext._active_spark_context, SparkContext._gateway
        if context is not None:
            context.stop()
        process = getattr(gateway, "proc", None)
        if process is not None:
            process.stdin.close()  # the JVM exits when its standard input closes
            process.wait(timeout=600)
    leave(status)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--workload"]:
        _run_workload(sys.argv[2])
    built = build(announce=True)
    print(built if built is not None else "no class archive (turned off or not built)")
