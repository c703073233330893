"""Where a JVM's executor threads spend their CPU, from a Java Flight Recorder recording.

    jcmd <engine pid> JFR.start name=day settings=profile
    python -m benchmarks.bigday ... --keep-engine           # the measured day
    jcmd <engine pid> JFR.stop name=day filename=day.jfr
    python -m benchmarks.jfr_profile day.jfr --out profile.json

(Dumping into the file a recording was started with writes its chunk twice; `samples` drops the
repeats, which `summarize` reports as `repeated_samples_dropped`.)

Reads the recording's execution samples (`jfr print --events jdk.ExecutionSample`, the JDK's own
tool, streamed as text) and counts them: every thread by group (`jvm_threads.group_of`), and the
samples of Spark's executor threads by the kind of task (a write, a shuffle map, a result) and
what the innermost frames do (building or reading an in-memory cache, encoding Parquet, parsing
CSV, sorting, writing shuffle files, generated code, ...). JFR samples running Java threads about
every 10-20 ms, so counts are proportional to CPU; the JIT compilers and the garbage collector are
not Java threads and are not sampled (`jvm_threads` measures those). Session 29 in
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from benchmarks.jvm_threads import group_of

EXECUTOR = "Executor task"

# (activity, how many innermost frames to look at, parts of a frame that name it). The innermost
# frame that names one wins, rule order breaks a tie: inner frames name what the task is doing at
# the moment; the frames further out are the operators that called it.
ACTIVITIES: tuple[tuple[str, int, tuple[str, ...]], ...] = (
    (
        "decode Parquet",
        12,
        (
            "VectorizedParquetRecordReader",
            "VectorizedColumnReader",
            "VectorizedRleValuesReader",
            "ParquetFileReader",
            "ColumnReaderImpl",
            "ValuesReader",
            "Decompressor",
            "ParquetRowConverter",
        ),
    ),
    ("encode Parquet", 12, ("org.apache.parquet.", "ParquetWriteSupport")),
    (
        "Java deserialization (cache blocks read from disk, tasks)",
        60,
        ("java.io.ObjectInputStream",),
    ),
    ("build or read an in-memory cache", 12, ("org.apache.spark.sql.execution.columnar.",)),
    ("parse CSV", 12, ("com.univocity.", ".csv.")),
    ("sort", 12, ("UnsafeExternalSorter", "UnsafeInMemorySorter", "TimSort", "RadixSort")),
    ("write shuffle files", 15, ("ShuffleExternalSorter", "ShuffleWriter", "ShuffleMapOutput")),
    ("generated code", 3, ("GeneratedClass",)),
    ("load classes", 10, ("java.util.zip.ZipFile", "ClassLoader.")),
    ("hash (SHA-2)", 3, ("sun.security.provider.SHA",)),
    ("aggregate or join on hashes", 6, ("BytesToBytesMap", "HashAggregate", "HashedRelation")),
    ("Delta file statistics", 12, ("StatisticsCollection", "DeltaJobStatisticsTracker")),
    ("regular expressions", 3, ("java.util.regex.",)),
)


def task_kind(frames: Sequence[str], truncated: bool = False) -> str:
    """A write task (Spark's file writer), a shuffle map task, or a result task; `unknown` when
    the stack was cut (`jfr`'s depth) before a frame that tells."""
    stack = " ".join(frames)
    if "FileFormatWriter" in stack:
        return "write"
    if "ShuffleMapTask" in stack:
        return "shuffle map"
    if "ResultTask" in stack or not truncated:
        return "result"
    return "unknown (stack cut)"


def activity(frames: Sequence[str]) -> str:
    """What an executor sample's innermost frames do (`frames`: innermost first): the activity
    of the innermost frame that names one within its depth (rule order breaks a tie)."""
    for index, frame in enumerate(frames):
        for name, depth, parts in ACTIVITIES:
            if index < depth and any(part in frame for part in parts):
                return name
    return "other"


@dataclass
class Sample:
    thread: str
    frames: list[str]  # innermost first
    truncated: bool = False  # `jfr` cut the stack at its depth (`...`)


def _thread_name(value: str) -> str:
    """The name in `"<name>" (javaThreadId = N)`; names are printed unescaped, so the name ends
    at the last `" (`."""
    if not value.startswith('"'):
        return value
    end = value.rfind('" (')
    return value[1:end] if end > 0 else value.strip('"')


def samples(lines: Iterable[str], repeats: Counter[str] | None = None) -> Iterator[Sample]:
    """Each `jdk.ExecutionSample` in `jfr print`'s text, once: a sample seen before (same time,
    thread and frames: a recording dumped twice into one file) is counted in `repeats`."""
    seen: set[tuple[str, str, tuple[str, ...]]] = set()
    start, thread, frames, in_stack, truncated = "", None, [], False, False
    for raw in lines:
        line = raw.strip()
        if line.startswith("jdk.ExecutionSample"):
            start, thread, frames, in_stack, truncated = "", None, [], False, False
        elif line.startswith("startTime = "):
            start = line[len("startTime = ") :]
        elif line.startswith("sampledThread = "):
            thread = _thread_name(line[len("sampledThread = ") :])
        elif line.startswith("stackTrace = ["):
            in_stack = True
        elif in_stack and line == "]":
            in_stack = False
        elif in_stack and line == "...":
            truncated = True
        elif in_stack and line:
            frames.append(line.split("(", 1)[0])
        elif line == "}" and thread is not None:
            key = (start, thread, tuple(frames))
            if key in seen:
                if repeats is not None:
                    repeats["samples"] += 1
            else:
                seen.add(key)
                yield Sample(thread, frames, truncated)
            thread = None


def summarize(lines: Iterable[str]) -> dict:
    """Counts of `jfr print`'s samples by thread group, and of the executor threads' samples by
    task kind and activity."""
    threads: Counter[str] = Counter()
    executor: Counter[tuple[str, str]] = Counter()
    top: Counter[str] = Counter()
    repeats: Counter[str] = Counter()
    for sample in samples(lines, repeats):
        group = group_of(sample.thread)
        threads[group] += 1
        if group != EXECUTOR:
            continue
        frames = sample.frames
        executor[(task_kind(frames, sample.truncated), activity(frames))] += 1
        if frames:
            top[frames[0]] += 1
    total = sum(executor.values())
    by_activity: Counter[str] = Counter()
    for (_, name), n in executor.items():
        by_activity[name] += n
    return {
        "samples": sum(threads.values()),
        "repeated_samples_dropped": repeats["samples"],
        "threads": dict(threads.most_common()),
        "executor_samples": total,
        "executor_by_activity": dict(by_activity.most_common()),
        "executor_by_task_and_activity": [
            {"task": kind, "activity": name, "samples": n, "share": round(n / max(total, 1), 4)}
            for (kind, name), n in executor.most_common()
        ],
        "executor_top_frames": [{"frame": f, "samples": n} for f, n in top.most_common(25)],
    }


def read_recording(path: Path) -> dict:
    """Summarize a recording through the JDK's `jfr` tool (streamed, not held in memory)."""
    command = ["jfr", "print", "--events", "jdk.ExecutionSample", "--stack-depth", "200", str(path)]
    try:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    except FileNotFoundError:
        raise SystemExit(
            "jfr_profile needs the JDK's `jfr` tool on PATH (Java 11 or later)."
        ) from None
    assert process.stdout is not None
    summary = summarize(process.stdout)
    if process.wait() != 0:
        raise SystemExit(f"`jfr print` could not read {path} (exit {process.returncode}).")
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("recording", type=Path)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if not args.recording.is_file():
        print(f"no recording at {args.recording}", file=sys.stderr)
        return 2
    summary = read_recording(args.recording)
    text = json.dumps({"recording": str(args.recording), **summary}, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    total = summary["executor_samples"] or 1
    for name, n in summary["executor_by_activity"].items():
        print(f"{n:7d} {100 * n / total:5.1f} %  {name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
