#!/usr/bin/env bash
# One entry point for a fresh clone: installs what it needs (idempotently), then runs.
#   bash scripts/dev.sh demo [args]   set up, then run the demo end to end on the embedded default
#   bash scripts/dev.sh test [args]   set up, then lint and run the test suite
#   bash scripts/dev.sh setup         only set up: .venv with pinned packages, Delta jars, class archive
#   bash scripts/dev.sh ui [args]     set up, then the Dagster UI on the demo home
#   bash scripts/dev.sh bench [args]  set up, then the benchmarks (python -m benchmarks.run)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
venv="${SESSIONIZE_VENV:-$root/.venv}"
demo_home="${SESSIONIZE_HOME:-$root/.sessionize-demo}"

find_python() {
  for candidate in python3.11 python3; do
    if command -v "$candidate" >/dev/null 2>&1 && \
       "$candidate" -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else 1)' 2>/dev/null; then
      echo "$candidate"; return 0
    fi
  done
  echo "error: Python 3.11 is needed (python3.11 or python3 on PATH)." >&2
  return 1
}

setup() {
  if ! command -v java >/dev/null 2>&1; then
    echo "error: Java 17 is needed for Spark (install openjdk-17-jre-headless)." >&2
    exit 1
  fi
  local stamp="$venv/.sessionize-setup" want
  want="$(cat pyproject.toml requirements.lock | sha256sum | cut -d' ' -f1)"
  if [ ! -x "$venv/bin/python" ]; then
    echo "setup: creating $venv" >&2
    "$(find_python)" -m venv "$venv"
  fi
  if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    echo "setup: installing pinned Python packages (first run takes a few minutes)" >&2
    "$venv/bin/python" -m pip install -q --disable-pip-version-check -c requirements.lock -e ".[dev]"
    echo "$want" > "$stamp"
  fi
  # Delta Lake jars from Maven Central into ~/.cache/sessionize_assets/jars (skipped when present).
  "$venv/bin/python" -m sessionize_assets.jars >/dev/null
  # The JVM's class archive beside the jars (skipped when present; SESSIONIZE_CLASS_ARCHIVE=off
  # skips it): every later Spark start maps it instead of loading Spark's classes one by one.
  # It says on standard error when it builds; a failed build only leaves the JVMs as they were.
  "$venv/bin/python" -m sessionize_assets.class_archive >/dev/null || true
}

command="${1:-}"
[ $# -gt 0 ] && shift
case "$command" in
  setup) setup ;;
  demo) setup; exec "$venv/bin/sessionize" --home "$demo_home" demo "$@" ;;
  ui) setup; exec "$venv/bin/sessionize" --home "$demo_home" ui "$@" ;;
  test)
    setup
    lint=0
    "$venv/bin/ruff" check sessionize_assets sessionize_assets_tests benchmarks scripts || lint=$?
    if ! command -v chromium >/dev/null 2>&1 && [ ! -x /usr/bin/chromium ]; then
      echo "note: no Chromium here (Debian's chromium package): the browser test is skipped" >&2
    fi
    if ! command -v initdb >/dev/null 2>&1 && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
      echo "note: no PostgreSQL server here (Debian's postgresql package): the production-profile test is skipped" >&2
    fi
    # Two test processes by default (CI has 2 cores; measured: 36.6 min against 44.8 min in one,
    # the tests being mostly CPU-bound): each test file runs whole in one process, so module
    # fixtures are built once; files are handed out in collection order, which conftest.py sorts
    # slowest first. SESSIONIZE_TEST_WORKERS=0 runs everything in this process.
    workers="${SESSIONIZE_TEST_WORKERS:-2}"
    parallel=()
    if [ "$workers" != 0 ] && [ "$workers" != 1 ]; then parallel=(-n "$workers" --dist loadfile --no-loadscope-reorder); fi
    tests=0
    "$venv/bin/python" -m pytest "${parallel[@]}" "$@" || tests=$?
    if [ "$lint" -ne 0 ]; then echo "ruff found problems (above)" >&2; fi
    [ "$tests" -eq 0 ] && [ "$lint" -eq 0 ]
    ;;
  bench) setup; exec "$venv/bin/python" -m benchmarks.run "$@" ;;
  *)
    echo "usage: bash scripts/dev.sh demo|test|setup|ui|bench [args]" >&2
    exit 2
    ;;
esac
