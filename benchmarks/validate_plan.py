"""How long the loader's read and validation of one landing file take on the embedded engine:
`ingest/readers.read_raw`, then `core/validate` (canonicalize, the load time filled, classify,
the valid rows), counted, several times in one process (the first is a cold JVM's).

    python -m benchmarks.validate_plan FILE [--iterations 8] [--label L] [--out DIR]

To compare two versions of the code, run it from each worktree with `PYTHONPATH=<worktree>`,
alternating. Writes `validate-plan-<label>-<UTC time>.json` into `--out` (default
`benchmarks/results`): each iteration's seconds and the median of all but the first two.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import time
from collections.abc import Sequence
from pathlib import Path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.validate_plan", description=__doc__)
    parser.add_argument("file")
    parser.add_argument("--iterations", type=int, default=8)
    parser.add_argument("--label", default="run")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = parser.parse_args(argv)

    from sessionize_assets.core import validate
    from sessionize_assets.ingest import readers
    from sessionize_assets.resources.spark import get_spark

    spark = get_spark({})
    path = Path(args.file)
    seconds = []
    for _ in range(args.iterations):
        started = time.perf_counter()
        raw, columns = readers.read_raw(spark, path)
        typed = validate.canonicalize(raw)
        filled = validate.fill_load_tstamp(typed, None, "load_tstamp", dt.datetime.now(dt.UTC))
        valid = validate.finish_valid(validate.classify(filled, 10), columns)
        valid.count()
        seconds.append(round(time.perf_counter() - started, 3))
    result = {
        "created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "file": str(path),
        "label": args.label,
        "seconds": seconds,
        "median_after_two": round(statistics.median(seconds[2:]), 3) if len(seconds) > 2 else None,
    }
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    out = Path(args.out) / f"validate-plan-{args.label}-{stamp}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
