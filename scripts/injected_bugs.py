"""Inject one bug at a time into a copy of the project and see whether the random equivalence tests
catch it (issue 19: "a deliberately injected bug in each rule is caught within CI's seeds").

    .venv/bin/python scripts/injected_bugs.py [--only NAME ...] [--out results.json]

Each bug is a one-place textual change of the product code (the snippet must occur exactly once,
so a refactoring that moves it makes this script fail loudly rather than test nothing). The
change is applied to a copy of the tracked files in a temporary folder, never to this checkout,
and the bug's tests run there with `python -m pytest` (the copy comes first on the import path,
ahead of the editable install). First a baseline without any bug must pass: otherwise nothing
below it means anything. The seeds are those of one CI run (`SESSIONIZE_SEED_BASE`, drawn here
unless given, and printed); `SESSIONIZE_SEEDS` and `SESSIONIZE_EQUIVALENCE_EXAMPLES` pass through.
A bug is "caught" when its tests fail (pytest's status 1; every test runs, and the failed ones
are listed); any other status is reported as an error. Results go to stdout and, with --out, to a JSON file.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

TIME_BASED = [
    "sessionize_assets_tests/commands/test_time_based.py"
    "::test_accounting_invariant_and_full_recompute_after_random_histories"
]
SESSIONS = ["sessionize_assets_tests/sessions/test_equivalence.py"]


@dataclass(frozen=True)
class Bug:
    name: str
    rule: str
    path: str
    old: str
    new: str
    tests: Sequence[str]


BUGS = [
    Bug(
        "dedupe-window-one-day-short",
        "dedupe window: a duplicate exactly dedupe_lookback_days load days later is kept",
        "sessionize_assets/core/filtering.py",
        "latest_held >= F.date_sub(F.col(LOAD_DATE), dedupe_lookback_days)",
        "latest_held >= F.date_sub(F.col(LOAD_DATE), dedupe_lookback_days - 1)",
        TIME_BASED,
    ),
    Bug(
        "horizon-reprocess-days-exclusive",
        "horizon: a day exactly reprocess_days late is skipped instead of re-aggregated",
        "sessionize_assets/core/late_days.py",
        "    if lateness > reprocess_days:\n",
        "    if lateness >= reprocess_days:\n",
        TIME_BASED,
    ),
    Bug(
        "pending-not-reset-at-horizon",
        "pending reset: the horizon load day's rows stay pending after they were aggregated",
        "sessionize_assets/core/late_days.py",
        "and (horizon is None or load_day > horizon)",
        "and (horizon is None or load_day >= horizon)",
        TIME_BASED,
    ),
    Bug(
        "gap-merge-threshold-doubled",
        "gap merge (rule): events up to two gaps apart are merged into one session",
        "sessionize_assets/core/sessionize.py",
        "F.sum(F.when(gap.isNull() | (gap > F.lit(gap_micros)), 1)",
        "F.sum(F.when(gap.isNull() | (gap > F.lit(2 * gap_micros)), 1)",
        SESSIONS,
    ),
    Bug(
        "gap-merge-neighbour-chain-missed",
        "gap merge (incremental): an old chain within a gap of a late event, but not"
        " overlapping it, is not re-read, so the late event does not merge with it",
        "sessionize_assets/core/sessionize.py",
        '& (F.col("_chain_hi") >= F.col("_lo") - F.lit(gap))',
        '& (F.col("_chain_hi") >= F.col("_lo") - F.lit(gap // 2))',
        # The random histories miss it (the run window's look-back re-reads recent chains anyway);
        # the targeted test moves the window past them first.
        [
            *SESSIONS,
            "sessionize_assets_tests/sessions/test_incremental.py"
            "::test_a_late_event_within_a_gap_of_two_chains_merges_them_both",
        ],
    ),
    Bug(
        "cap-one-day-late",
        "cap (id mode): a session is cut max_session_days + 1 after its start",
        "sessionize_assets/core/sessionize.py",
        "_plus_micros(LC_START, settings.max_session_days * MICROS_PER_DAY)",
        "_plus_micros(LC_START, (settings.max_session_days + 1) * MICROS_PER_DAY)",
        SESSIONS,
    ),
    Bug(
        "first-seen-user-forgotten",
        "first-seen user (id mode): a known session takes the largest user of its events",
        "sessionize_assets/core/sessionize.py",
        'F.coalesce(F.first("_known_user", ignorenulls=True), F.max(USER_KEY))',
        "F.max(USER_KEY)",
        SESSIONS,
    ),
    Bug(
        "quarantine-not-frozen",
        "quarantine (id mode): a quarantined session is not kept frozen on later runs",
        "sessionize_assets/core/sessionize.py",
        '.withColumn("_quarantined", frozen | (F.max(SESSION_TS).over(session) >= cap))',
        '.withColumn("_quarantined", F.max(SESSION_TS).over(session) >= cap)',
        SESSIONS,
    ),
]


def copy_project(into: Path) -> None:
    """The tracked files of this checkout (with their working-tree content) into `into`."""
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, check=True, capture_output=True
    ).stdout.split(b"\0")
    for name in filter(None, listed):
        source = ROOT / name.decode()
        if source.is_file():
            target = into / name.decode()
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)


def inject(copy: Path, bug: Bug) -> None:
    path = copy / bug.path
    text = path.read_text()
    if text.count(bug.old) != 1:
        raise SystemExit(
            f"{bug.name}: the snippet occurs {text.count(bug.old)} times in {bug.path}"
            " (expected once); update the bug to the current code."
        )
    path.write_text(text.replace(bug.old, bug.new))


def run_tests(
    copy: Path, tests: Sequence[str], env: dict[str, str], log: Path
) -> tuple[int, float]:
    started = time.time()
    with log.open("w") as out:
        status = subprocess.call(
            [sys.executable, "-m", "pytest", "-q", "-rf", "-p", "no:cacheprovider", *tests],
            cwd=copy,
            env=env | {"PYTHONPATH": str(copy)},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    return status, round(time.time() - started, 1)


def failed_tests(log: Path) -> list[str]:
    """The test ids pytest's short summary names as failed (`-rf`)."""
    return [
        line.split()[1].split("::", 1)[-1]
        for line in log.read_text(errors="replace").splitlines()
        if line.startswith("FAILED ")
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", help="bug names (default: all)")
    parser.add_argument("--out", type=Path, help="write the results as JSON")
    parser.add_argument("--logs", type=Path, help="keep each pytest log in this folder")
    parser.add_argument("--no-baseline", action="store_true", help="skip the run without a bug")
    args = parser.parse_args(argv)
    bugs = [b for b in BUGS if not args.only or b.name in args.only]
    env = dict(os.environ)
    env.setdefault("SESSIONIZE_SEED_BASE", str(secrets.randbits(64)))
    print(f"SESSIONIZE_SEED_BASE={env['SESSIONIZE_SEED_BASE']}", flush=True)
    logs = args.logs or Path(tempfile.mkdtemp(prefix="injected-bugs-logs-"))
    logs.mkdir(parents=True, exist_ok=True)
    results: list[dict] = []
    runs = ([] if args.no_baseline else [None]) + bugs
    for bug in runs:
        with tempfile.TemporaryDirectory(prefix="injected-bug-") as folder:
            copy = Path(folder)
            copy_project(copy)
            name = bug.name if bug else "baseline"
            tests = bug.tests if bug else sorted({t for b in bugs for t in b.tests})
            if bug:
                inject(copy, bug)
            status, seconds = run_tests(copy, tests, env, logs / f"{name}.log")
        outcome = (
            ("passed" if status == 0 else "FAILED")
            if bug is None
            else {0: "NOT CAUGHT", 1: "caught"}.get(status, f"error (pytest status {status})")
        )
        results.append(
            {
                "bug": name,
                "rule": bug.rule if bug else "no bug",
                "tests": list(tests),
                "outcome": outcome,
                "failed": failed_tests(logs / f"{name}.log"),
                "seconds": seconds,
                "log": str(logs / f"{name}.log"),
            }
        )
        print(f"{name:36} {outcome:12} {seconds:7.1f} s", flush=True)
        for test in results[-1]["failed"]:
            print(f"    failed: {test}", flush=True)
        if bug is None and status != 0:
            print(f"the baseline fails: see {logs / 'baseline.log'}", file=sys.stderr)
            break
    if args.out:
        args.out.write_text(
            json.dumps({"seed_base": env["SESSIONIZE_SEED_BASE"], "results": results}, indent=2)
            + "\n"
        )
    baseline_ok = args.no_baseline or results[0]["outcome"] == "passed"
    return (
        0
        if baseline_ok and all(r["outcome"] == "caught" for r in results if r["bug"] != "baseline")
        else 1
    )


if __name__ == "__main__":
    raise SystemExit(main())
