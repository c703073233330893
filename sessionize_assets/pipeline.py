"""The whole pipeline driven from code, for `sessionize run / backfill / status / verify / manifest`
and the demo: each branch's imperative shell, on the home's Dagster instance, with one "now"."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sessionize_assets.commands.context import CommandContext
from sessionize_assets.core.clock import utc_now
from sessionize_assets.core.outcomes import (
    BranchOutcome,
    BranchStatus,
    ExitStatus,
    exit_status,
    summary_line,
)
from sessionize_assets.errors import ItemLockedError, UserError, one_sentence
from sessionize_assets.resources.shared_reads import sharing

if TYPE_CHECKING:
    from sessionize_assets.commands.failures import BranchFailure
    from sessionize_assets.commands.manifest import CursorRows
    from sessionize_assets.commands.sessions import VerifySessionsReport
    from sessionize_assets.commands.time_based import TimeBasedVerifyReport
    from sessionize_assets.core.manifest_state import ItemState
    from sessionize_assets.lake import Lake
    from sessionize_assets.resources.spark_resource import SparkDeltaResource


def _lake(ctx: CommandContext, now: dt.datetime | None = None) -> Lake:
    return ctx.lake_at(now)


def spark_resource(ctx: CommandContext) -> SparkDeltaResource:
    """The Dagster Spark resource over the process's session (started once, shared by all runs)."""
    from sessionize_assets.resources.spark_resource import SparkDeltaResource

    ctx.spark  # noqa: B018 - start the one session with the user's settings first
    return SparkDeltaResource(spark_config=dict(ctx.settings.spark))


log = logging.getLogger(__name__)


@dataclass
class PipelineReport:
    """What one `run` (or backfill) did, branch by branch, and how each branch ended."""

    sections: list[tuple[str, list[str]]] = field(default_factory=list)
    outcomes: list[BranchOutcome] = field(default_factory=list)

    def lines(self) -> list[str]:
        body = [line for _, lines in self.sections for line in lines]
        return [*body, summary_line(self.outcomes)] if self.outcomes else body

    @property
    def exit_status(self) -> ExitStatus:
        return exit_status(self.outcomes)


def _guarded_branch(
    report: PipelineReport, branch: str, body: Callable[[], Any], log_file: str
) -> Any:
    """Run one branch; a failure of it is recorded as its outcome (one sentence, the trace in the
    engine log) instead of ending the command, so the other branch still runs."""
    try:
        return body()
    except ItemLockedError as exc:
        report.outcomes.append(BranchOutcome(branch, BranchStatus.BLOCKED, str(exc)))
    except UserError:
        raise
    except Exception as exc:  # an engine error: Spark, the JVM, Delta, Dagster
        log.error("%s failed", branch, exc_info=exc)
        sentence = one_sentence(exc)
        report.outcomes.append(
            BranchOutcome(branch, BranchStatus.FAILED, f"{sentence} (full trace in {log_file})")
        )
        report.sections.append((branch, [f"{branch}: failed: {sentence}"]))
    return None


def _time_based_outcome(result: Any) -> BranchOutcome:
    status = BranchStatus.NOTHING_TO_DO if result.nothing_to_do else BranchStatus.SUCCEEDED
    return BranchOutcome("time-based branch", status)


def _sessions_outcome(result: Any, log_file: str) -> BranchOutcome:
    if result.ok:
        return BranchOutcome("session-based branch", BranchStatus.SUCCEEDED)
    reason = getattr(result, "failure_reason", None) or "a session model failed (see above)"
    if getattr(result, "blocked", False):
        return BranchOutcome("session-based branch", BranchStatus.BLOCKED, reason)
    return BranchOutcome(
        "session-based branch", BranchStatus.FAILED, f"{reason} (full trace in {log_file})"
    )


def session_branch(report: PipelineReport, ctx: CommandContext, lake: Lake, log_file: str) -> Any:
    """Run the session-based branch on `lake`; its lines and outcome (or its failure) go into
    `report`. Returns its result, None when it failed."""
    from sessionize_assets.commands.sessions import run_sessions

    sessions = _guarded_branch(
        report,
        "session-based branch",
        lambda: run_sessions(lake, lambda: spark_resource(ctx), lambda: ctx.instance),
        log_file,
    )
    if sessions is not None:
        report.sections.append(("session-based branch", sessions.lines()))
        report.outcomes.append(_sessions_outcome(sessions, log_file))
    return sessions


def run_pipeline(ctx: CommandContext, now: dt.datetime | None = None) -> PipelineReport:
    """Process everything pending in both branches, within the run limits (what the sensors do)."""
    from sessionize_assets.commands.time_based import run_time_based

    lake = _lake(ctx, now)
    report = PipelineReport()
    log_file = str(ctx.home.root / "logs" / "engine.log")
    with sharing():  # the session branch reuses the event days daily_aggregates read
        time_based = _guarded_branch(
            report,
            "time-based branch",
            lambda: run_time_based(lake, None, lambda: ctx.instance, start_spark=lambda: ctx.spark),
            log_file,
        )
        if time_based is not None:
            report.sections.append(("time-based branch", time_based.lines()))
            report.outcomes.append(_time_based_outcome(time_based))
        session_branch(report, ctx, lake, log_file)
    return report


def backfill_pipeline(
    ctx: CommandContext,
    start: dt.date,
    end: dt.date,
    restart: bool = False,
) -> PipelineReport:
    """Re-materialize load days start..end and everything downstream of them (both branches).

    The load days run as cursor windows checkpointed in `cursor_state` under
    `backfill/<start>/<end>`: if this backfill was interrupted, it resumes at its first unfinished
    window (unless `restart`). Once both branches are done the checkpoint is cleared, so asking for
    the same backfill again redoes it.
    """
    from sessionize_assets.commands.time_based import backfill_time_based
    from sessionize_assets.core.cursor import CursorState
    from sessionize_assets.core.load_windows import backfill_cursor_name
    from sessionize_assets.resources.cursor_store import CursorCheckpointStore
    from sessionize_assets.resources.tables import CURSOR_STATE

    lake = _lake(ctx)
    store = CursorCheckpointStore(ctx.spark, lake.table(CURSOR_STATE))
    name = backfill_cursor_name(start, end)
    saved = store.load(name).global_cursor
    report = PipelineReport()
    log_file = str(ctx.home.root / "logs" / "engine.log")
    with sharing():  # the session branch reuses the event days daily_aggregates read
        time_based = _guarded_branch(
            report,
            "time-based branch",
            lambda: backfill_time_based(
                start,
                end,
                lake,
                ctx.spark,
                ctx.instance,
                cursor=None if restart else saved,
                checkpoint=lambda cursor, run_id: store.save(
                    name, CursorState(global_cursor=cursor), run_id
                ),
            ),
            log_file,
        )
        if time_based is not None:
            report.sections.append(("time-based branch", time_based.lines()))
            report.outcomes.append(BranchOutcome("time-based branch", BranchStatus.SUCCEEDED))
        # The re-materialized load days reach sessions and users through filtered_events' feed.
        sessions = session_branch(report, ctx, lake, log_file)
    done = time_based is not None and sessions is not None and sessions.ok
    if done and (saved is not None or time_based.load_day_runs):
        store.save(name, CursorState())  # done: the next backfill of this range starts over
    return report


def _status_of(branch: str, status: Callable[[Lake], Any], lake: Lake) -> tuple[Any, str | None]:
    """(a branch's status report, None), or (None, the sentence saying its state cannot be read):
    status goes on with the other branch."""
    try:
        return status(lake), None
    except UserError:
        raise
    except Exception as exc:  # a corrupt table: say so, and show the other branch
        log.error("status: %s failed", branch, exc_info=exc)
        return None, f"the {branch}'s state cannot be read: {one_sentence(exc)}"


@dataclass
class BranchStatusData:
    """One branch in `status`: its failed runs, and its status report or why it is unreadable."""

    failure: BranchFailure | None
    report: Any  # TimeBasedStatusReport / SessionsStatus; None when unreadable
    unreadable: str | None = None

    def lines(self) -> list[str]:
        out = [self.failure.line()] if self.failure else []
        if self.report is None:
            return [*out, f"UNREADABLE: {self.unreadable}"]
        return [*out, *self.report.lines()]


@dataclass
class StatusData:
    """Everything `sessionize status` shows, read once; printed as text or as JSON."""

    time_based: BranchStatusData
    sessions: BranchStatusData
    manifest: dict[str, ItemState]
    cursors: CursorRows

    def lines(self) -> list[str]:
        from sessionize_assets.commands.manifest import cursor_lines, manifest_summary_lines

        out = ["time-based branch:", *[f"  {line}" for line in self.time_based.lines()]]
        out += ["session-based branch:", *[f"  {line}" for line in self.sessions.lines()]]
        out.append("processing manifest:")
        out += [f"  {line}" for line in manifest_summary_lines(list(self.manifest.values()))]
        out += [f"  {line}" for line in cursor_lines(self.cursors)]
        return out


def gather_status(ctx: CommandContext) -> StatusData:
    """Run-limit states and windows, pending and skipped days, failures, locks (no Spark)."""
    from sessionize_assets.commands.failures import branch_failure
    from sessionize_assets.commands.manifest import cursors_in_progress
    from sessionize_assets.commands.sessions import status_sessions
    from sessionize_assets.commands.time_based import status_time_based
    from sessionize_assets.resources.processing_manifest import item_states

    lake = _lake(ctx)
    instance = ctx.instance
    branches = []
    for branch, status in (
        ("time-based branch", status_time_based),
        ("session-based branch", status_sessions),
    ):
        failure = branch_failure(instance, branch)
        report, unreadable = _status_of(branch, status, lake)
        branches.append(BranchStatusData(failure, report, unreadable))
    return StatusData(
        time_based=branches[0],
        sessions=branches[1],
        # lock records carry the wall clock (not --now): ages and leases are measured on it
        manifest=item_states(lake.table("processing_manifest"), now=utc_now()),
        cursors=cursors_in_progress(lake.table("cursor_state")),
    )


def status_lines(ctx: CommandContext) -> list[str]:
    """Run-limit states and windows, pending and skipped days, locks (no Spark)."""
    return gather_status(ctx).lines()


def lateness_counts(ctx: CommandContext) -> dict[tuple[dt.date, dt.date], int]:
    """Rows of filtered_events by (load day, event day), from its Delta log (no Spark)."""
    from sessionize_assets.time_based.state import partition_counts

    _, counts = partition_counts(_lake(ctx).table("filtered_events"))
    return counts


def lateness_status_lines(ctx: CommandContext, load_days: int = 14) -> list[str]:
    """`status --lateness`: the lateness of the last load days, from filtered_events' Delta log."""
    from sessionize_assets.core.lateness import lateness_lines

    return lateness_lines(lateness_counts(ctx), last_load_days=load_days)


class BranchUnreadableError(Exception):
    """A branch's tables cannot be read (a corrupt Delta log, a missing file): one sentence."""


def _verified(branch: str, body: Callable[[], Any], log_file: str) -> Any:
    try:
        return body()
    except UserError:
        raise
    except Exception as exc:  # an engine error reading the branch's tables
        log.error("verify: %s failed", branch, exc_info=exc)
        raise BranchUnreadableError(
            f"verify could not read the {branch}: {one_sentence(exc)} (full trace in {log_file})"
        ) from None


@dataclass
class VerifyResult:
    """Both branches' verify reports; printed as text or as JSON."""

    time_based: TimeBasedVerifyReport
    sessions: VerifySessionsReport

    @property
    def differences(self) -> list[Any]:
        return [*self.time_based.differences, *self.sessions.differences]

    def lines(self) -> list[str]:
        differences = self.differences
        lines = ["time-based branch:", *[f"  {x}" for x in self.time_based.lines()]]
        lines += ["session-based branch:", *[f"  {x}" for x in self.sessions.lines()]]
        lines.append(
            "verify: OK" if not differences else f"verify: {len(differences)} difference(s)"
        )
        return lines


def small_history(events_path: str) -> bool:
    """Whether `verify` recomputes under the small-query configuration (interpreted, without
    adaptive execution): `events` holds at most `sessions.frames.SMALL_RUN_ROWS` rows by its
    Delta log. A missing table or a file without a row count is not small."""
    from sessionize_assets.resources.delta import delta_table, exists, live_rows
    from sessionize_assets.sessions.frames import small_run

    if not exists(events_path):
        return False
    rows = live_rows(delta_table(events_path))
    return rows is not None and small_run(rows)


def verify_reports(ctx: CommandContext, replay: bool | None = None) -> VerifyResult:
    """Every incremental table against a recompute (`replay`: id mode's memory replayed from the
    recorded runs; None: the command's `--replay`). A branch whose tables cannot be read raises
    BranchUnreadableError (one sentence naming the branch)."""
    if replay is None:
        replay = bool(getattr(ctx.args, "replay", False))
    from sessionize_assets.commands.sessions import verify_sessions
    from sessionize_assets.commands.time_based import verify_time_based
    from sessionize_assets.resources.delta import data_skipping_when_it_pays
    from sessionize_assets.resources.spark import small_query_conf

    lake = _lake(ctx)
    log_file = str(ctx.home.root / "logs" / "engine.log")
    largest = [lake.table(t) for t in ("events", "filtered_events", "sessions")]
    small = small_history(lake.table("events"))
    with (
        data_skipping_when_it_pays(ctx.spark, largest, ctx.settings.spark),
        small_query_conf(ctx.spark, small),
    ):
        time_based = _verified(
            "time-based branch", lambda: verify_time_based(lake, ctx.spark), log_file
        )
        sessions = _verified(
            "session-based branch (sessions, users and their manifests)",
            lambda: verify_sessions(lake, ctx.spark, replay=replay),
            log_file,
        )
    return VerifyResult(time_based, sessions)


def verify_pipeline(ctx: CommandContext) -> tuple[list[Any], list[str]]:
    """(differences, report lines) for every incremental table against a recompute."""
    result = verify_reports(ctx)
    return result.differences, result.lines()


def manifest_command(ctx: CommandContext) -> list[str]:
    """`sessionize manifest list/show/resolve/skip`."""
    from sessionize_assets.commands import manifest
    from sessionize_assets.resources.processing_manifest import ProcessingManifest

    a = ctx.args
    path = _lake(ctx).table("processing_manifest")
    if a.manifest_command == "list":
        return [manifest.list_items(path, state=a.state, item_prefix=a.item_prefix)]
    if a.manifest_command == "show":
        return [manifest.show_item(path, a.item)]
    writer = ProcessingManifest(ctx.spark, path)
    if a.manifest_command == "resolve":
        if (a.item is None) == (a.run is None):
            raise UserError("Give either an ITEM or --run RUN to `manifest resolve`, not both.")
        if a.run is not None:
            return [manifest.resolve_run(writer, a.run, a.reason)]
        return [manifest.resolve_item(writer, a.item, a.reason)]
    return [manifest.skip_item(writer, a.item, a.reason)]
