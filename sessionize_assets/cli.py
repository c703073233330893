"""`sessionize`: the command line. It drives the same Definitions through Dagster's APIs and records
its runs in the home's Dagster instance, so `sessionize ui` shows them.

Exit statuses (`core/outcomes.py`): 0 success, 1 differences found by `verify`, 2 a user mistake
(one sentence), 3 an item held by another run or fail-locked, 4 a failed step (one sentence; the
trace goes to `<home>/logs/engine.log`), 130 interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import os
import subprocess
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path

from sessionize_assets.commands.context import CommandContext
from sessionize_assets.core.outcomes import ExitStatus
from sessionize_assets.errors import ItemLockedError, UserError, one_sentence
from sessionize_assets.home import Home
from sessionize_assets.settings import parse_now

REPO_ROOT = Path(__file__).resolve().parent.parent


def _date(value: str) -> dt.date:
    try:
        return dt.date.fromisoformat(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a date like 2024-03-01, got {value!r}"
        ) from None


def _print(lines: Sequence[str]) -> None:
    for line in lines:
        print(line)


# ---------------------------------------------------------------- commands


def cmd_generate(ctx: CommandContext) -> int:
    from sessionize_assets.generator import generate

    a = ctx.args
    summary = generate(
        Path(a.out),
        start_date=a.start_date or ctx.settings.start_date,
        days=a.days,
        events_per_day=a.events_per_day,
        seed=a.seed,
        late_share=a.late_share,
        file_format=a.format,
        profile=a.profile,
    )
    _print(
        [
            f"wrote {summary.total_rows} rows ({summary.events} events, {summary.users} users, "
            f"{summary.late_rows} late) in {len(summary.files)} files under {a.out} "
            f"(profile {summary.profile}, seed {summary.seed})"
        ]
    )
    return 0


def cmd_load(ctx: CommandContext) -> int:
    from sessionize_assets.ingest.assets import record_load
    from sessionize_assets.ingest.loader import expand_paths, load_paths
    from sessionize_assets.resources.tables import (
        EVENTS,
        INVALID_EVENTS,
        LOAD_LOG,
        PROCESSING_MANIFEST,
    )

    a = ctx.args
    # User errors before Spark starts: a wrong path, not a folder of load days, a bad duration.
    if a.by_load_date:
        from sessionize_assets.commands.loading import day_folders
        from sessionize_assets.core.cursor import parse_duration

        parse_duration(a.lookback)
        for path in a.paths:
            day_folders(Path(path))
    expand_paths(a.paths)
    load_tstamp = parse_now(a.load_tstamp) if a.load_tstamp else None
    ctx.ensure_home()

    def load(paths: Sequence[str | Path]) -> None:
        started = dt.datetime.now(dt.UTC)
        report = load_paths(
            ctx.spark,
            paths,
            ctx.settings,
            {n: ctx.table(n) for n in (EVENTS, INVALID_EVENTS, LOAD_LOG)},
            ctx.now,
            load_tstamp=load_tstamp,
            load_tstamp_from=a.load_tstamp_from,
            manifest_path=ctx.table(PROCESSING_MANIFEST),
        )
        for line in report.lines():
            print(line, file=sys.stderr if line.startswith("WARNING") else sys.stdout)
        record_load(ctx.instance, report, started)

    if not a.by_load_date:
        load(a.paths)
        return 0
    from sessionize_assets.commands.loading import load_by_load_date
    from sessionize_assets.core.load_windows import LOAD_CURSOR_NAME
    from sessionize_assets.resources.cursor_store import CursorCheckpointStore
    from sessionize_assets.resources.tables import CURSOR_STATE

    store = CursorCheckpointStore(ctx.spark, ctx.table(CURSOR_STATE))
    _, folders = load_by_load_date(
        [Path(p) for p in a.paths],
        store.load(LOAD_CURSOR_NAME),
        load,
        store.checkpointer(LOAD_CURSOR_NAME),
        ctx.now,
        lookback=a.lookback,
    )
    _print(folders.lines())
    return 0


def _exclusive(ctx: CommandContext, command: str):  # noqa: ANN202 - a context manager
    """The home's command lock, taken before Spark starts (`resources/command_lock.py`)."""
    from sessionize_assets.resources.command_lock import command_lock

    return command_lock(ctx.home.root, command, getattr(ctx.args, "wait", 0.0) or 0.0)


def cmd_run(ctx: CommandContext) -> int:
    from sessionize_assets.pipeline import run_pipeline

    with _exclusive(ctx, "run"):
        report = run_pipeline(ctx)
    _print(report.lines())
    return int(report.exit_status)


def cmd_maintain(ctx: CommandContext) -> int:
    from sessionize_assets.commands.maintenance import maintain

    hours = None if ctx.args.no_vacuum else ctx.args.vacuum_hours
    with _exclusive(ctx, "maintain"):
        _print(maintain(ctx, hours))
    return 0


def cmd_backfill(ctx: CommandContext) -> int:
    from sessionize_assets.pipeline import backfill_pipeline

    a = ctx.args
    if a.end < a.start:
        raise UserError(f"--end {a.end} is before --start {a.start}.")
    with _exclusive(ctx, "backfill"):
        report = backfill_pipeline(ctx, a.start, a.end, restart=a.restart)
    _print(report.lines())
    return int(report.exit_status)


def cmd_status(ctx: CommandContext) -> int:
    from sessionize_assets.pipeline import lateness_status_lines, status_lines

    if ctx.args.lateness:
        _print(lateness_status_lines(ctx, ctx.args.load_days))
        return 0

    _print(status_lines(ctx))
    return 0


def cmd_verify(ctx: CommandContext) -> int:
    from sessionize_assets.pipeline import verify_pipeline

    differences, lines = verify_pipeline(ctx)
    _print(lines)
    return 1 if differences else 0


def cmd_export(ctx: CommandContext) -> int:
    from sessionize_assets.export import export_table

    _print([export_table(None, ctx.home, ctx.args.table, Path(ctx.args.out), force=ctx.args.force)])
    return 0


def cmd_manifest(ctx: CommandContext) -> int:
    from sessionize_assets.pipeline import manifest_command

    _print(manifest_command(ctx))
    return 0


def cmd_demo(ctx: CommandContext) -> int:
    from sessionize_assets.demo import run_demo

    with _exclusive(ctx, "demo"):
        run_demo(ctx)
    return 0


def cmd_engine(ctx: CommandContext) -> int:
    """`sessionize engine start|stop|status`: the home's warm Spark engine (Spark Connect)."""
    from sessionize_assets.resources import engine

    action = ctx.args.engine_command
    if action == "start":
        info = engine.start(ctx.home.root, ctx.settings.spark, ctx.args.port)
        verb = "already running" if info.reused else "started"
        _print(
            [
                f"Spark engine {verb}: pid {info.pid}, {info.public_url}; log: {info.log}",
                "sessionize commands on this home now use it; `sessionize engine stop` stops it.",
            ]
        )
        return 0
    if action == "stop":
        _print([engine.stop(ctx.home.root)])
        return 0
    current = engine.status(ctx.home.root)
    _print([current.line()])
    return 0 if current.state == "running" else int(ExitStatus.BLOCKED)


def cmd_ui(ctx: CommandContext) -> int:
    ctx.ensure_home()
    if not ctx.args.no_engine:
        # The runs Dagster launches connect to one warm engine instead of each starting a JVM.
        from sessionize_assets.resources import engine

        try:
            info = engine.start(ctx.home.root, ctx.settings.spark)
            os.environ["SESSIONIZE_SPARK_REMOTE"] = info.url
            print(
                f"Runs use the warm Spark engine (pid {info.pid}); `sessionize engine stop` ends it."
            )
        except UserError as exc:
            print(f"note: runs use their own embedded Spark engine ({exc})")
    dagster = Path(sys.executable).with_name("dagster")
    command = [
        str(dagster) if dagster.exists() else "dagster",
        "dev",
        "-w",
        str(REPO_ROOT / "workspace.yaml"),
        "-h",
        "127.0.0.1",
        "-p",
        str(ctx.args.port),
    ]
    print(
        f"Dagster UI on http://127.0.0.1:{ctx.args.port} (home {ctx.home.root}); Ctrl-C stops it."
    )
    # From the home's Dagster folder: `dagster dev` then reads the instance file users edit
    # there (DAGSTER_HOME), not the repository's template, and says nothing about the latter.
    return subprocess.call(command, cwd=ctx.home.dagster_home, env=os.environ.copy())


# ---------------------------------------------------------------- parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sessionize",
        description="Sessions, daily aggregates and attributes kept exact while events arrive late.",
    )
    parser.add_argument("--home", help="home folder (default $SESSIONIZE_HOME, else ./.sessionize)")
    parser.add_argument(
        "--config", help="settings file (default $SESSIONIZE_CONFIG, else <home>/sessionize.yaml)"
    )
    parser.add_argument(
        "--now", help="the current time, ISO 8601 (UTC when no zone): for tests and replays"
    )
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="show Dagster's and Spark's logs on the console (default: <home>/logs/engine.log)",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("generate", help="write a realistic seeded data set as landing files")
    p.add_argument("--out", required=True)
    p.add_argument("--days", type=int, default=7)
    p.add_argument("--events-per-day", type=int, default=2000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--start-date", type=_date, default=None)
    p.add_argument("--late-share", type=float, default=0.05)
    p.add_argument(
        "--profile",
        choices=("harsh", "realistic"),
        default="harsh",
        help="late rows up to 60 days, every day touched (harsh) or mostly within hours (realistic)",
    )
    p.add_argument("--format", choices=("csv", "json", "mixed"), default="csv")
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("load", help="land files or folders into the events table")
    p.add_argument("paths", nargs="+")
    p.add_argument(
        "--by-load-date",
        action="store_true",
        help="each PATH holds load_date=YYYY-MM-DD folders: load the days from the checkpointed "
        "cursor of that source (minus --lookback) up to now, window by window",
    )
    p.add_argument(
        "--lookback",
        default="P1D",
        help="with --by-load-date: ISO 8601 duration re-listed before the cursor (default P1D)",
    )
    group = p.add_mutually_exclusive_group()
    group.add_argument("--load-tstamp", help="load time for rows without one (ISO 8601)")
    group.add_argument(
        "--load-tstamp-from", metavar="COLUMN", help="take missing load times from this column"
    )
    p.set_defaults(func=cmd_load)

    wait_help = "when another command is writing to this home, wait up to SECONDS for it"
    p = sub.add_parser("run", help="process everything pending, within the run limits")
    p.add_argument("--wait", type=float, default=0.0, metavar="SECONDS", help=wait_help)
    p.set_defaults(func=cmd_run)

    p = sub.add_parser(
        "backfill", help="re-materialize load days START..END and everything downstream"
    )
    p.add_argument("--start", type=_date, required=True)
    p.add_argument("--end", type=_date, required=True)
    p.add_argument(
        "--restart",
        action="store_true",
        help="ignore the checkpoint of an interrupted backfill of this range and start at START",
    )
    p.add_argument("--wait", type=float, default=0.0, metavar="SECONDS", help=wait_help)
    p.set_defaults(func=cmd_backfill)

    p = sub.add_parser("status", help="run-limit states, windows, pending and skipped days, locks")
    p.add_argument(
        "--lateness",
        action="store_true",
        help="only how late rows arrive: per load day the late share and p50/p95/max days late, "
        "and the rows by load day and days late (no Spark)",
    )
    p.add_argument(
        "--load-days", type=int, default=14, help="with --lateness: the last N load days (14)"
    )
    p.set_defaults(func=cmd_status)

    p = sub.add_parser(
        "verify", help="compare incremental tables with a recompute; non-zero on any difference"
    )
    p.set_defaults(func=cmd_verify)

    p = sub.add_parser("export", help="write a table as CSV or Parquet (by the file's extension)")
    p.add_argument("table")
    p.add_argument("--out", required=True)
    p.add_argument("--force", action="store_true", help="overwrite an existing file")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("manifest", help="operate the processing manifest")
    msub = p.add_subparsers(dest="manifest_command", required=True, metavar="ACTION")
    q = msub.add_parser("list", help="items and their derived state")
    q.add_argument("--state")
    q.add_argument("--item-prefix")
    q = msub.add_parser("show", help="an item's records in order and its derived state")
    q.add_argument("item")
    q = msub.add_parser(
        "resolve",
        help="release a failed item (a stale lock is abandoned first), or every item of a run",
    )
    q.add_argument("item", nargs="?")
    q.add_argument("--run", help="release every item this run holds or left fail-locked")
    q.add_argument("--reason", required=True)
    q = msub.add_parser("skip", help="mark an item skipped: nothing will process it")
    q.add_argument("item")
    q.add_argument("--reason", required=True)
    p.set_defaults(func=cmd_manifest)

    p = sub.add_parser(
        "maintain",
        help="compact every table (OPTIMIZE) and delete unreferenced old files (VACUUM), keeping "
        "what the session models' change-feed reads still need",
    )
    p.add_argument(
        "--vacuum-hours",
        type=float,
        default=168.0,
        metavar="H",
        help="delete files unreferenced for more than H hours (168, Delta's default); refused "
        "when a reader still needs them",
    )
    p.add_argument("--no-vacuum", action="store_true", help="only compact")
    p.add_argument("--wait", type=float, default=0.0, metavar="SECONDS", help=wait_help)
    p.set_defaults(func=cmd_maintain)

    p = sub.add_parser(
        "demo", help="generate data, land it day by day, run the pipeline after each load"
    )
    p.add_argument("--days", type=int, default=6)
    p.add_argument("--events-per-day", type=int, default=1500)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--wait", type=float, default=0.0, metavar="SECONDS", help=wait_help)
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser(
        "engine", help="start, stop or show the home's warm Spark engine (Spark Connect)"
    )
    esub = p.add_subparsers(dest="engine_command", required=True)
    q = esub.add_parser("start", help="start the engine (or reuse the running one)")
    q.add_argument("--port", type=int, default=None, help="default 15002; 0 picks a free port")
    esub.add_parser("stop", help="stop the engine")
    esub.add_parser("status", help="running, stale or not started (exit 0 only when running)")
    p.set_defaults(func=cmd_engine)

    p = sub.add_parser("ui", help="the Dagster UI on this home (dagster dev, bound to localhost)")
    p.add_argument("--port", type=int, default=3000)
    p.add_argument(
        "--no-engine",
        action="store_true",
        help="do not start the warm Spark engine: each run starts its own embedded Spark",
    )
    p.set_defaults(func=cmd_ui)
    return parser


QUIET_COMMANDS = {"run", "backfill", "demo", "verify", "maintain"}


@contextlib.contextmanager
def engine_logs_to_file(home: Home, enabled: bool):
    """Send Dagster's and Spark's console logs (file descriptor 2) to <home>/logs/engine.log.

    The command's own report goes to stdout; errors are printed after stderr is restored.
    """
    if not enabled:
        yield
        return
    folder = home.root / "logs"
    folder.mkdir(parents=True, exist_ok=True)
    sys.stderr.flush()
    saved = os.dup(2)
    with open(folder / "engine.log", "ab") as log:
        os.dup2(log.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore", message=".*is currently in (beta|preview).*")
    ctx = None
    try:
        ctx = CommandContext(args)
        quiet = args.command in QUIET_COMMANDS and not args.verbose
        with engine_logs_to_file(ctx.home, quiet):
            return args.func(ctx)
    except ItemLockedError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return ExitStatus.BLOCKED
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return ExitStatus.USER_ERROR
    except KeyboardInterrupt:
        return ExitStatus.INTERRUPTED
    except SystemExit:
        raise
    except BaseException as exc:  # noqa: BLE001 - an engine error (delta-rs panics are BaseException)
        return _engine_error(exc, ctx, getattr(args, "verbose", False))


def _engine_error(exc: BaseException, ctx: CommandContext | None, verbose: bool) -> int:
    """Print an unexpected error as one sentence naming where the full trace is; exit 4."""
    import traceback

    trace = "".join(traceback.format_exception(exc))
    where = "the console (--verbose)" if verbose else "stderr"
    if ctx is not None:
        folder = ctx.home.root / "logs"
        try:
            folder.mkdir(parents=True, exist_ok=True)
            with open(folder / "engine.log", "a", encoding="utf-8") as log:
                log.write(trace)
            where = str(folder / "engine.log")
        except OSError:
            pass
    if verbose or where == "stderr":
        print(trace, file=sys.stderr)
    sentence = one_sentence(exc)
    if "full trace in" not in sentence:
        sentence += f" (full trace in {where})"
    print(f"error: {sentence}", file=sys.stderr)
    return ExitStatus.FAILED


if __name__ == "__main__":
    sys.exit(main())
