"""`sessionize forget USER... | --from-file F --yes`: delete users' rows from every table and
recompute what their deletion changes (the imperative shell around `core.forget`).

1. Count, then DELETE the users' rows of `events` (any `user_identifier` column holds an id) and
   of `invalid_events` (the raw text holds an id as a whole field).
2. Re-materialize, through the same Dagster assets as `backfill`, exactly the load days that held
   their rows in `events` or still hold them in `filtered_events` (a retried request redoes what a
   crashed one left), then what those reach: `daily_aggregates` of the event days counted,
   `attributes`; the session models then take the deletions from `filtered_events`' change feed.
3. Delete what is left of them in the tables that are not recomputed from events (the lifecycle
   memory of id mode, `quarantined_sessions`, `superseded_sessions`), and anything the recompute
   left (rows of load days before a start_date moved later; reported as "removed after the
   redo"), then count every table again:
   a row left anywhere fails the command (status 4) and nothing is recorded.
4. Record the request in `forget_log`: when, by whom, why, how many ids and rows per table, the
   load days redone; never the ids.

Earlier table versions and the change-data files still hold the rows until `sessionize maintain`
vacuums them (a time-travel read sees them until then); the landing files are not touched.
"""

from __future__ import annotations

import datetime as dt
import getpass
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from sessionize_assets.commands.context import CommandContext
from sessionize_assets.core import forget as core
from sessionize_assets.core.clock import utc_now
from sessionize_assets.core.outcomes import BranchOutcome, BranchStatus, ExitStatus, exit_status
from sessionize_assets.core.schema import LOAD_DATE
from sessionize_assets.errors import SettingsError, UserError
from sessionize_assets.resources.delta import exists, table_ref, upsert_small
from sessionize_assets.resources.tables import (
    ATTRIBUTES,
    DAILY_AGGREGATES,
    EVENTS,
    FILTERED_EVENTS,
    FORGET_LOG,
    INVALID_EVENTS,
    QUARANTINED_SESSIONS,
    SESSIONS,
    SESSIONS_LIFECYCLE_MANIFEST,
    SUPERSEDED_SESSIONS,
    TIME_BASED_DEFINITIONS,
    USERS,
)
from sessionize_assets.sessions.state import read_manifest, settings_refusal
from sessionize_assets.sessions.tables import USER_SESSION_STATS
from sessionize_assets.time_based import definitions

USER_COLUMN = "user_identifier"
# Recomputed from events by the pipeline: a row of a forgotten user left in one after the redo is
# removed too, but reported apart (it means the recompute missed it).
RECOMPUTED = (DAILY_AGGREGATES, ATTRIBUTES, SESSIONS, USERS, USER_SESSION_STATS)
# Not recomputed from events: the session branch's memory and logs, swept by user.
SWEPT = (SESSIONS_LIFECYCLE_MANIFEST, QUARANTINED_SESSIONS, SUPERSEDED_SESSIONS)


class ForgetIncomplete(Exception):
    """Rows of the users are still somewhere after the request (an engine problem: status 4)."""


def forget_refusal(yes: bool) -> str | None:
    """Why `forget` must not run (one sentence), or None."""
    if not yes:
        return (
            "forget deletes every row of these users from every table and cannot be undone: "
            "confirm it with --yes."
        )
    return None


@dataclass
class ForgetReport:
    """What one `forget` did."""

    users: int
    request_id: str
    deleted: dict[str, int] = field(default_factory=dict)
    load_days: list[dt.date] = field(default_factory=list)
    sections: list[list[str]] = field(default_factory=list)
    outcomes: list[BranchOutcome] = field(default_factory=list)
    removed_after_redo: dict[str, int] = field(default_factory=dict)
    recorded: bool = False

    @property
    def exit_status(self) -> ExitStatus:
        return exit_status(self.outcomes)

    def lines(self) -> list[str]:
        ids = f"{self.users} user id{'s' if self.users != 1 else ''}"
        out = [f"Forget request {self.request_id[:8]} ({ids}):"]
        for table, rows in self.deleted.items():
            out.append(f"  {table}: {rows} row{'s' if rows != 1 else ''} deleted")
        for table, rows in self.removed_after_redo.items():
            out.append(f"  {table}: {rows} row{'s' if rows != 1 else ''} removed after the redo")
        if not self.load_days:
            out.append("  No processed load day held their rows: nothing to recompute.")
        for section in self.sections:
            out += ["  " + line for line in section]
        if self.recorded:
            out.append(
                f"  Recorded in {FORGET_LOG} (counts only). Earlier table versions and change-data "
                "files keep the rows until `sessionize maintain --vacuum-hours H` deletes files "
                "unreferenced for H hours; the landing files are not touched."
            )
        else:
            out.append(
                "  Not finished: run the same forget again (it redoes what is left) once the "
                "failure above is fixed."
            )
        return out


def _count_by_load_day(spark: SparkSession, path: str, condition: str) -> dict[dt.date, int]:
    if not exists(path):
        return {}
    rows = (
        spark.read.format("delta")
        .load(path)
        .filter(F.expr(condition))
        .groupBy(LOAD_DATE)
        .count()
        .collect()
    )
    return {r[LOAD_DATE]: int(r["count"]) for r in rows if r[LOAD_DATE] is not None}


def _count(spark: SparkSession, path: str, condition: str) -> int:
    if not exists(path):
        return 0
    return spark.read.format("delta").load(path).filter(F.expr(condition)).count()


def _delete(spark: SparkSession, path: str, condition: str) -> None:
    spark.sql(f"DELETE FROM {table_ref(path)} WHERE {condition}").collect()


def forget(ctx: CommandContext, users: Sequence[str], reason: str | None) -> ForgetReport:
    """Forget `users` (see the module's docstring); the caller holds the home's command lock."""
    from sessionize_assets.commands.time_based import redo_load_days_time_based
    from sessionize_assets.pipeline import PipelineReport, _guarded_branch, session_branch
    from sessionize_assets.resources.shared_reads import sharing

    spark, settings, table = ctx.spark, ctx.settings, ctx.table
    lake = ctx.lake_at(None)
    by_identifier = core.identifier_condition(settings.user_identifier, users)
    by_raw = core.raw_condition("raw", users)
    by_user = core.identifier_condition([USER_COLUMN], users)
    report = ForgetReport(users=len(users), request_id=uuid.uuid4().hex)
    # Settings that changed since the models were built would make the recompute fail after the
    # deletion: refuse before deleting anything.
    definitions.refuse_changed(table(TIME_BASED_DEFINITIONS), settings)
    refused = settings_refusal(settings, read_manifest(table))
    if refused:
        raise SettingsError(refused)

    in_events = _count_by_load_day(spark, table(EVENTS), by_identifier)
    in_filtered = _count_by_load_day(spark, table(FILTERED_EVENTS), by_identifier)
    report.deleted[EVENTS] = sum(in_events.values())
    if report.deleted[EVENTS]:
        _delete(spark, table(EVENTS), by_identifier)
    report.deleted[INVALID_EVENTS] = _count(spark, table(INVALID_EVENTS), by_raw)
    if report.deleted[INVALID_EVENTS]:
        _delete(spark, table(INVALID_EVENTS), by_raw)
    report.deleted[FILTERED_EVENTS] = sum(in_filtered.values())
    report.load_days = core.load_days_to_redo(
        [in_events, in_filtered], settings.start_date, lake.current_time().date()
    )

    log_file = str(ctx.home.root / "logs" / "engine.log")
    branches = PipelineReport()
    if report.load_days:
        with sharing():
            redone = _guarded_branch(
                branches,
                "time-based branch",
                lambda: redo_load_days_time_based(report.load_days, lake, ctx.instance),
                log_file,
            )
            if redone is not None:
                branches.sections.append(("time-based branch", redone.lines()))
                branches.outcomes.append(BranchOutcome("time-based branch", BranchStatus.SUCCEEDED))
                session_branch(branches, ctx, lake, log_file)
    report.sections += [lines for _, lines in branches.sections]
    report.outcomes = branches.outcomes
    if report.exit_status != ExitStatus.OK:
        return report

    # filtered_events rows left after the redo are in load days no run processes any more (before
    # a start_date moved later): removed directly, like what was recomputed from them.
    for name, condition in (
        (FILTERED_EVENTS, by_identifier),
        *((n, by_user) for n in (*RECOMPUTED, *SWEPT)),
    ):
        left = _count(spark, table(name), condition)
        if left:
            _delete(spark, table(name), condition)
            if name in SWEPT:
                report.deleted[name] = left
            else:
                report.removed_after_redo[name] = left
    remaining = {
        name: rows
        for name, rows in (
            (EVENTS, _count(spark, table(EVENTS), by_identifier)),
            (FILTERED_EVENTS, _count(spark, table(FILTERED_EVENTS), by_identifier)),
            (INVALID_EVENTS, _count(spark, table(INVALID_EVENTS), by_raw)),
            *((name, _count(spark, table(name), by_user)) for name in (*RECOMPUTED, *SWEPT)),
        )
        if rows
    }
    if remaining:
        listed = ", ".join(f"{n} ({r})" for n, r in remaining.items())
        raise ForgetIncomplete(f"rows of the forgotten users are still in {listed}")
    record = core.ForgetRecord(
        request_id=report.request_id,
        requested_at=utc_now(),
        requested_by=_who(),
        reason=reason,
        users=len(users),
        rows_deleted={**report.deleted, **report.removed_after_redo},
        load_days_redone=tuple(report.load_days),
    )
    record_request(table(FORGET_LOG), record)
    report.recorded = True
    return report


def record_request(path: str, record: core.ForgetRecord) -> None:
    """Write a finished request's row into `forget_log` (created when absent)."""
    upsert_small(path, [record.row()], core.FORGET_LOG_SCHEMA, "request_id")


def _who() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no login name (a container without a passwd entry)
        return "unknown"


def read_users_file(path: str) -> str:
    """The text of `--from-file` (one sentence when it cannot be read)."""
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except OSError as exc:
        raise UserError(f"Cannot read the file of user ids {path}: {exc.strerror}.") from exc
