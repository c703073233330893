"""Seeds of the random-history tests: fresh on every run, reproducible on demand.

Each test process draws new seeds (shown in the test ids, e.g. `[gap-seed=2718281828]`), so CI
explores a different history every build. `SESSIONIZE_SEEDS=1,2,3` replays given seeds (the
ids of a failed run name them); `SESSIONIZE_EQUIVALENCE_EXAMPLES=N` draws N per test instead of
the default (the "deep" mode of a benchmark machine).
"""

from __future__ import annotations

import os
import secrets


def history_seeds(default_count: int = 1) -> list[int]:
    """The seeds a random-history test runs with: `$SESSIONIZE_SEEDS`, else fresh ones."""
    given = os.environ.get("SESSIONIZE_SEEDS", "").strip()
    if given:
        return [int(s) for s in given.split(",") if s.strip()]
    count = int(os.environ.get("SESSIONIZE_EQUIVALENCE_EXAMPLES", str(default_count)))
    return [secrets.randbits(32) for _ in range(count)]


def seed_id(seed: int) -> str:
    return f"seed={seed}"
