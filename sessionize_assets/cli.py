"""`sessionize`: the command line. It drives the same Definitions through Dagster's APIs and records
its runs in the home's Dagster instance, so `sessionize ui` shows them.

Exit statuses (`core/outcomes.py`): 0 success, 1 differences found by `verify`, 2 a user mistake
(one sentence), 3 an item held by another run or fail-locked, 4 a failed step (one sentence; the
trace goes to `<home>/logs/engine.log`), 130 interrupted.

With `--json` (status, verify, manifest list|show, load) stdout holds one JSON document, errors
included (`commands/json_output.py`, docs/json.md); everything else goes to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import os
import subprocess
import sys
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn

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


def _json(ctx: CommandContext) -> bool:
    return bool(getattr(ctx.args, "json", False))


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
    from sessionize_assets.commands import json_output
    from sessionize_assets.ingest.assets import record_load
    from sessionize_assets.ingest.loader import LoadReport, expand_paths, load_paths
    from sessionize_assets.resources.tables import (
        EVENTS,
        INVALID_EVENTS,
        LOAD_LOG,
        PROCESSING_MANIFEST,
    )

    a = ctx.args
    # User errors before Spark starts: a wrong path, not a folder of load days, a bad duration.
    if a.run and _json(ctx):
        raise UserError(
            "--run cannot be combined with --json: the JSON document describes the load only; "
            "run `sessionize run` after the load instead."
        )
    if a.by_load_date:
        from sessionize_assets.commands.loading import day_folders
        from sessionize_assets.core.cursor import parse_duration

        parse_duration(a.lookback)
        for path in a.paths:
            day_folders(Path(path))
    expand_paths(a.paths)
    load_tstamp = parse_now(a.load_tstamp) if a.load_tstamp else None
    ctx.ensure_home()

    reports: list[LoadReport] = []  # every batch's (with --by-load-date, every window's)

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
        reports.append(report)
        for line in report.lines():
            if line.startswith("WARNING"):
                print(line, file=sys.stderr)
            elif not _json(ctx):
                print(line)
        record_load(ctx.instance, report, started)

    if not a.by_load_date:
        load(a.paths)
        if _json(ctx):
            ctx.document = json_output.load(reports, None)
        return cmd_run(ctx) if a.run else 0
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
    if _json(ctx):
        ctx.document = json_output.load(reports, folders)
    else:
        _print(folders.lines())
    return cmd_run(ctx) if a.run else 0


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


def cmd_refresh(ctx: CommandContext) -> int:
    from sessionize_assets.commands.refresh import refresh

    with _exclusive(ctx, "refresh"):
        _print(refresh(ctx, ctx.args.models, ctx.args.yes, ctx.args.from_day))
    return 0


def cmd_forget(ctx: CommandContext) -> int:
    from sessionize_assets.commands.forget import forget, forget_refusal, read_users_file
    from sessionize_assets.core.forget import ForgetRequestError, requested_users

    a = ctx.args
    text = read_users_file(a.from_file) if a.from_file else None
    try:
        users = requested_users(a.users, text)
    except ForgetRequestError as exc:
        raise UserError(str(exc)) from exc
    refused = forget_refusal(a.yes)
    if refused:
        raise UserError(refused)
    with _exclusive(ctx, "forget"):
        report = forget(ctx, users, a.reason)
    _print(report.lines())
    return int(report.exit_status)


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
    from sessionize_assets.commands import json_output
    from sessionize_assets.pipeline import gather_status, lateness_counts, lateness_status_lines

    if ctx.args.lateness:
        if _json(ctx):
            ctx.document = json_output.lateness(lateness_counts(ctx), ctx.args.load_days)
        else:
            _print(lateness_status_lines(ctx, ctx.args.load_days))
        return 0
    data = gather_status(ctx)
    if _json(ctx):
        ctx.document = json_output.status(data)
    else:
        _print(data.lines())
    return 0


def cmd_verify(ctx: CommandContext) -> int:
    from sessionize_assets.commands import json_output
    from sessionize_assets.pipeline import verify_reports

    result = verify_reports(ctx)
    if _json(ctx):
        ctx.document = json_output.verify(result)
    else:
        _print(result.lines())
    return int(ExitStatus.DIFFERENCES) if result.differences else 0


def cmd_export(ctx: CommandContext) -> int:
    from sessionize_assets.export import export_table

    _print([export_table(None, ctx.home, ctx.args.table, Path(ctx.args.out), force=ctx.args.force)])
    return 0


def cmd_manifest(ctx: CommandContext) -> int:
    from sessionize_assets.commands import json_output, manifest
    from sessionize_assets.pipeline import manifest_command
    from sessionize_assets.resources.tables import PROCESSING_MANIFEST

    a = ctx.args
    if not _json(ctx):
        _print(manifest_command(ctx))
        return 0
    path = ctx.lake.table(PROCESSING_MANIFEST)
    if a.manifest_command == "list":
        # lock records carry the wall clock (not --now): their ages are measured on it too
        states = manifest.manifest_states(path, a.state, a.item_prefix)
        ctx.document = json_output.manifest_list(
            states, manifest.parse_status(a.state), a.item_prefix
        )
    else:
        state = manifest.item_with_records(path, a.item)
        ctx.document = json_output.manifest_show(state)
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

JSON_HELP = "print one JSON document on stdout, errors included (docs/json.md)"


class ParserError(Exception):
    """An argument argparse rejects: `main` prints it (and its JSON document with --json)."""

    def __init__(self, parser: argparse.ArgumentParser, message: str) -> None:
        super().__init__(message)
        self.parser = parser
        self.message = message


class _Parser(argparse.ArgumentParser):
    """argparse's parser (its subcommands' too), its errors raised for `main` to print."""

    def error(self, message: str) -> NoReturn:
        raise ParserError(self, message)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
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
    p.add_argument(
        "--run",
        action="store_true",
        help="then process everything pending, as `sessionize run` does, in this same process "
        "(Python, Spark's session and Dagster's instance start once); the exit status is the run's",
    )
    p.add_argument("--json", action="store_true", help=JSON_HELP)
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
    p.add_argument("--json", action="store_true", help=JSON_HELP)
    p.set_defaults(func=cmd_status)

    p = sub.add_parser(
        "verify", help="compare incremental tables with a recompute; non-zero on any difference"
    )
    p.add_argument(
        "--replay",
        action="store_true",
        help="id mode: replay the lifecycle memory (first-seen users, frozen quarantines) from "
        "the recorded session runs instead of taking the lifecycle manifest as given (about one "
        "recompute per run)",
    )
    p.add_argument("--json", action="store_true", help=JSON_HELP)
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
    q.add_argument("--json", action="store_true", help=JSON_HELP)
    q = msub.add_parser("show", help="an item's records in order and its derived state")
    q.add_argument("item")
    q.add_argument("--json", action="store_true", help=JSON_HELP)
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
        "refresh",
        help="rebuild models under the current settings (after a settings change)",
    )
    p.add_argument(
        "models",
        nargs="*",
        metavar="MODEL",
        help="sessions, users or user_session_stats: any of them rebuilds every enabled session "
        "model (the default); filtered_events, days_to_process, daily_aggregates or attributes: "
        "any of them re-materializes every load day of the time-based branch",
    )
    p.add_argument(
        "--from",
        dest="from_day",
        type=_date,
        metavar="DAY",
        help="restate from this day (ISO date) under the settings that built the models: load "
        "days from DAY on, sessions with an event from DAY on; rows before DAY stay",
    )
    p.add_argument(
        "--yes", action="store_true", help="confirm (not needed with allow_refresh: true)"
    )
    p.add_argument("--wait", type=float, default=0.0, metavar="SECONDS", help=wait_help)
    p.set_defaults(func=cmd_refresh)

    p = sub.add_parser(
        "forget",
        help="delete users' rows from every table, recompute what that changes, record the "
        "request (counts only)",
    )
    p.add_argument("users", nargs="*", metavar="USER", help="user ids (user_identifier values)")
    p.add_argument(
        "--from-file", metavar="F", help="a file of user ids, one per line (# starts a comment)"
    )
    p.add_argument("--reason", help="why (kept in forget_log, e.g. a ticket number)")
    p.add_argument("--yes", action="store_true", help="confirm: the deletion cannot be undone")
    p.add_argument("--wait", type=float, default=0.0, metavar="SECONDS", help=wait_help)
    p.set_defaults(func=cmd_forget)

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


QUIET_COMMANDS = {"run", "backfill", "demo", "verify", "maintain", "refresh", "forget"}


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


@contextlib.contextmanager
def stdout_to_stderr(enabled: bool) -> Iterator[None]:
    """With --json: whatever is written to stdout while the command runs (Python, Spark's JVM,
    Dagster) goes to stderr instead, so stdout holds the JSON document alone."""
    if not enabled:
        yield
        return
    sys.stdout.flush()
    saved_stream, saved_fd = sys.stdout, os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    try:
        yield
    finally:
        sys.stderr.flush()
        sys.stdout = saved_stream
        os.dup2(saved_fd, 1)
        os.close(saved_fd)


def json_schema(args: argparse.Namespace) -> str | None:
    """The schema of the command's JSON document (`sessionize/<this>`), None without --json."""
    if not getattr(args, "json", False):
        return None
    if args.command == "manifest":
        return f"manifest-{args.manifest_command}"
    if args.command == "status" and args.lateness:
        return "status-lateness"
    return args.command


def _json_schema_of_argv(argv: Sequence[str]) -> str | None:
    """For arguments argparse rejected: the schema when --json was asked of a command that has
    it, else None (argparse's own message only)."""
    if "--json" not in argv:
        return None
    words = [w for w in argv if not w.startswith("-")]
    for i, word in enumerate(words):
        if word in ("status", "verify", "load"):
            return "status-lateness" if word == "status" and "--lateness" in argv else word
        if word == "manifest":
            action = words[i + 1] if i + 1 < len(words) else None
            return f"manifest-{action}" if action in ("list", "show") else None
    return None


def _print_document(
    schema: str, status: int, content: dict[str, Any] | None = None, error: str | None = None
) -> None:
    from sessionize_assets.commands.json_output import ERROR_KINDS, document, dumps

    failure = (ERROR_KINDS[int(status)], error) if error is not None else None
    print(dumps(document(schema, status, content, failure)), flush=True)


def _failed(status: ExitStatus, sentence: str, schema: str | None) -> int:
    """End with an error: its sentence on stderr, and its JSON document on stdout with --json."""
    if status is not ExitStatus.INTERRUPTED:
        print(f"error: {sentence}", file=sys.stderr)
    if schema is not None:
        _print_document(schema, status, error=sentence)
    return status


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = parser.parse_args(argv)
    except ParserError as exc:
        schema = _json_schema_of_argv(argv)
        if schema is None:  # argparse's own behaviour: usage, the message, exit 2
            exc.parser.print_usage(sys.stderr)
            exc.parser.exit(2, f"{exc.parser.prog}: error: {exc.message}\n")
        print(f"{exc.parser.prog}: error: {exc.message}", file=sys.stderr)
        _print_document(schema, ExitStatus.USER_ERROR, error=f"{exc.parser.prog}: {exc.message}")
        return ExitStatus.USER_ERROR
    warnings.filterwarnings("ignore", message=".*is currently in (beta|preview).*")
    schema = json_schema(args)
    ctx = None
    try:
        ctx = CommandContext(args)
        quiet = args.command in QUIET_COMMANDS and not args.verbose
        with engine_logs_to_file(ctx.home, quiet), stdout_to_stderr(schema is not None):
            status = args.func(ctx)
        if schema is not None:
            _print_document(schema, status, ctx.document or {})
        return status
    except ItemLockedError as exc:
        return _failed(ExitStatus.BLOCKED, str(exc), schema)
    except UserError as exc:
        return _failed(ExitStatus.USER_ERROR, str(exc), schema)
    except KeyboardInterrupt:
        return _failed(ExitStatus.INTERRUPTED, "interrupted", schema)
    except SystemExit:
        raise
    except BaseException as exc:  # noqa: BLE001 - an engine error (delta-rs panics are BaseException)
        sentence = _engine_error(exc, ctx, getattr(args, "verbose", False))
        return _failed(ExitStatus.FAILED, sentence, schema)


def _engine_error(exc: BaseException, ctx: CommandContext | None, verbose: bool) -> str:
    """An unexpected error as one sentence naming where the full trace is (written there)."""
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
    return sentence


def run() -> NoReturn:
    """The `sessionize` command: `main`, then leave without the interpreter's native teardown.

    pyarrow and delta-rs keep native worker threads; when the interpreter's teardown destroys
    their pools while a worker is still alive, the process aborts with "terminate called without
    an active exception" and exit status -6 after the command has done its work (apache/arrow
    #34314, delta-io/delta-rs #2184; seen here after `status`). So the command waits for its own
    threads, runs Python's exit handlers (logging, pyspark's JVM), flushes and exits at once."""
    try:
        status = main()
    except SystemExit as exc:  # argparse's --help and usage errors
        if isinstance(exc.code, str):
            print(exc.code, file=sys.stderr)
        status = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    leave(status)


def leave(status: int) -> NoReturn:
    """Exit with `status` after Python's exit handlers, skipping the native teardown."""
    import atexit
    import threading

    try:
        for thread in threading.enumerate():
            if thread is not threading.main_thread() and not thread.daemon:
                thread.join()
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(int(status))


if __name__ == "__main__":
    run()
