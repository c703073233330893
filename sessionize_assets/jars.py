"""The Delta Lake JVM jars: fetched once from Maven Central during set-up, found offline at run time."""

from __future__ import annotations

import hashlib
import os
import sys
import urllib.request
from pathlib import Path

from sessionize_assets.errors import MissingJarsError

DELTA_VERSION = "4.4.0"
SCALA_VERSION = "2.13"
MAVEN_CENTRAL = "https://repo1.maven.org/maven2"

# (group path, artifact, version). Spark's own distribution already ships the rest of
# delta-spark's runtime dependencies (parquet, jackson, antlr), so only these two are needed.
ARTIFACTS: tuple[tuple[str, str, str], ...] = (
    ("io/delta", f"delta-spark_{SCALA_VERSION}", DELTA_VERSION),
    ("io/delta", "delta-storage", DELTA_VERSION),
)

SETUP_COMMAND = "bash scripts/dev.sh setup"


def jars_dir() -> Path:
    """Where the jars live: $SESSIONIZE_JARS_DIR, else ~/.cache/sessionize_assets/jars."""
    configured = os.environ.get("SESSIONIZE_JARS_DIR")
    if configured:
        return Path(configured)
    return Path.home() / ".cache" / "sessionize_assets" / "jars"


def jar_file_names() -> list[str]:
    return [f"{artifact}-{version}.jar" for _, artifact, version in ARTIFACTS]


def delta_jar_paths() -> list[Path]:
    """The local jar files; raises MissingJarsError (one sentence, with the fix) if any is absent."""
    folder = jars_dir()
    paths = [folder / name for name in jar_file_names()]
    missing = [p.name for p in paths if not p.is_file()]
    if missing:
        raise MissingJarsError(
            f"The Delta Lake jars ({', '.join(missing)}) are not in {folder}; "
            f"run `{SETUP_COMMAND}` once with network access to fetch them from Maven Central."
        )
    return paths


def _download(url: str, target: Path) -> None:
    with urllib.request.urlopen(url, timeout=120) as response:
        data = response.read()
    with urllib.request.urlopen(url + ".sha1", timeout=60) as response:
        expected = response.read().decode().split()[0].strip()
    actual = hashlib.sha1(data).hexdigest()
    if actual != expected:
        raise RuntimeError(f"checksum mismatch for {url}: {actual} != {expected}")
    tmp = target.with_suffix(".part")
    tmp.write_bytes(data)
    tmp.replace(target)


def fetch_jars() -> list[Path]:
    """Download the jars that are missing (idempotent: present jars are reused)."""
    folder = jars_dir()
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for group, artifact, version in ARTIFACTS:
        name = f"{artifact}-{version}.jar"
        target = folder / name
        if not target.is_file():
            url = f"{MAVEN_CENTRAL}/{group}/{artifact}/{version}/{name}"
            print(f"fetching {url}", file=sys.stderr)
            _download(url, target)
        paths.append(target)
    return paths


if __name__ == "__main__":
    for path in fetch_jars():
        print(path)
