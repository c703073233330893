"""Seeds of the random-history tests: fresh on every run, reproducible on demand.

Each test run draws new seeds (shown in the test ids, e.g. `[gap-seed=2718281828]`), so CI
explores a different history every build. The seeds derive from one random base per run
(`SESSIONIZE_SEED_BASE`, set by conftest's `pytest_configure` before pytest-xdist starts its
workers), so every test process of a run collects the same test ids. `SESSIONIZE_SEEDS=1,2,3`
replays given seeds (the ids of a failed run name them), and `SESSIONIZE_SEED_BASE=N` (printed in
the header of every test run) replays a whole run's; `SESSIONIZE_EQUIVALENCE_EXAMPLES=N` draws
N per test instead of the default (the "deep" mode of a benchmark machine).
"""

from __future__ import annotations

import hashlib
import os
import secrets

SEED_BASE = "SESSIONIZE_SEED_BASE"


def ensure_seed_base() -> str:
    """This run's random base (drawn once, then in the environment the worker processes inherit)."""
    if not os.environ.get(SEED_BASE):
        os.environ[SEED_BASE] = str(secrets.randbits(64))
    return os.environ[SEED_BASE]


def history_seeds(test: str, default_count: int = 1) -> list[int]:
    """The seeds random-history test `test` runs with: `$SESSIONIZE_SEEDS`, else fresh ones
    derived from this run's base (the same in every test process of the run)."""
    given = os.environ.get("SESSIONIZE_SEEDS", "").strip()
    if given:
        return [int(s) for s in given.split(",") if s.strip()]
    count = int(os.environ.get("SESSIONIZE_EQUIVALENCE_EXAMPLES", str(default_count)))
    base = ensure_seed_base()
    return [
        int.from_bytes(hashlib.sha256(f"{base}/{test}/{i}".encode()).digest()[:4], "big")
        for i in range(count)
    ]


def seed_id(seed: int) -> str:
    return f"seed={seed}"
