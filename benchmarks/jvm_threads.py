"""CPU seconds of running JVMs by thread group, sampled from /proc (Linux), written as JSON.

    python -m benchmarks.jvm_threads --out threads.json [--match SparkConnectServer] [--interval 2]

Every `--interval` seconds, for each process whose command line names `java` and `--match`
(default: the warm engine's server class), reads each thread's user + system time from
`/proc/<pid>/task/<tid>/stat` and rewrites `--out` with {pid: {group: seconds}}: the threads
grouped by name (the JIT's C1 and C2 compilers, executor tasks, garbage collector threads, gRPC,
Spark Connect's execution threads, ...). A thread's last sample is kept after it exits, so a
compiler thread the JVM retires still counts (up to one interval of its time is lost). Runs until
interrupted; start it before the measurement and read the file after (session 28 in
docs/benchmarks.md). Spawns no JVM (`jstat` would, on the same cores).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import time
from collections import defaultdict
from pathlib import Path

# Thread-name prefixes (or parts) that name one group; other threads are grouped by their name
# without trailing numbers.
GROUPS = (
    "C2 Compiler",
    "C1 Compiler",
    "GC Thread",
    "G1 ",
    "Executor task",
    "VM Thread",
    "grpc",
    "spark-listener",
    "SparkConnect",
)


def group_of(name: str) -> str:
    """The group of a thread name: one of GROUPS, else the name without trailing numbers."""
    bare = re.sub(r"[\d#-]+$", "", name).strip()
    for group in GROUPS:
        if bare.startswith(group) or group in bare:
            return group.strip()
    return bare


def thread_times(pid: str) -> dict[str, tuple[str, float]]:
    """{tid: (thread name, CPU seconds)} of one process (empty when it is gone)."""
    hertz = os.sysconf("SC_CLK_TCK")
    out: dict[str, tuple[str, float]] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as handle:
                stat = handle.read()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        out[tid] = (name, (int(fields[11]) + int(fields[12])) / hertz)
    return out


def matching_pids(match: str) -> list[str]:
    pids = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                command = handle.read()
        except OSError:
            continue
        if b"java" in command and match.encode() in command:
            pids.append(pid)
    return pids


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.jvm_threads", description=__doc__)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--match", default="SparkConnectServer")
    parser.add_argument("--interval", type=float, default=2.0)
    args = parser.parse_args(argv)
    seen: dict[tuple[str, str], tuple[str, float]] = {}
    try:
        while True:
            for pid in matching_pids(args.match):
                for tid, sample in thread_times(pid).items():
                    seen[(pid, tid)] = sample
            groups: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
            for (pid, _tid), (name, seconds) in seen.items():
                groups[pid][group_of(name)] += seconds
            result = {
                pid: {k: round(v, 2) for k, v in sorted(g.items(), key=lambda kv: -kv[1])}
                for pid, g in groups.items()
            }
            args.out.write_text(json.dumps(result, indent=1))
            time.sleep(args.interval)
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
