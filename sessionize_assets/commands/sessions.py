"""The session branch from the command line: run until caught up, verify, status.

`run_sessions` materializes the `session_models` multi-asset through `dagster.materialize` on the
instance it is given (so the runs show in the UI), once per window, until the models are caught up
(`core.run_limits.caught_up`); it learns what each run did from the run's typed outcome.
`verify_sessions` recomputes sessions and users from the current `filtered_events` with the same
functions and settings and names every difference. `status_sessions` reads the small state
tables with delta-rs (no Spark).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from sessionize_assets.core import sessionize as core
from sessionize_assets.core.clock import as_utc, iso_or_none
from sessionize_assets.core.maintenance import last_data_change
from sessionize_assets.core.run_limits import RunLimits, caught_up, format_tstamp
from sessionize_assets.resources.delta import (
    delta_version,
    read_pinned,
    read_small_table,
    recent_operations,
    table_or_empty,
)
from sessionize_assets.resources.tables import (
    FILTERED_EVENTS,
    QUARANTINED_SESSIONS,
    SESSIONS,
    SESSIONS_LIFECYCLE_MANIFEST,
    USERS,
)
from sessionize_assets.sessions.modes import mode_for
from sessionize_assets.sessions.outcome import SessionRunOutcome
from sessionize_assets.sessions.replay import replay_plan, replayed_lifecycle
from sessionize_assets.sessions.state import (
    ModelState,
    current_limits,
    enabled_models,
    lake_state,
    read_manifest,
)
from sessionize_assets.sessions.tables import (
    QUARANTINED_SCHEMA,
    SESSIONS_SCHEMA,
    USER_SESSION_STATS,
    USER_SESSION_STATS_SCHEMA,
    USERS_SCHEMA,
)

if TYPE_CHECKING:  # Dagster is imported only when a run is launched (a no-op launches none)
    from sessionize_assets.lake import LakeAccess

# --- run ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelRunSummary:
    model: str
    status: str  # "ran", "skipped", "no data", "failed", "rebuilt"
    rows_read: int
    rows_written: int
    last_success: str | None
    detail: str | None = None


@dataclass(frozen=True)
class SessionRunSummary:
    """One materialization of the session models."""

    run_id: str
    state_message: str
    window_message: str
    upper_limit: dt.datetime
    models: tuple[ModelRunSummary, ...]
    warnings: tuple[str, ...] = ()

    def lines(self) -> list[str]:
        out = [f"{self.state_message}", f"{self.window_message}"]
        for m in self.models:
            text = f"  {m.model}: {m.status}"
            if m.status in ("ran", "rebuilt"):
                text += f", read {m.rows_read} rows, wrote {m.rows_written}, last_success {m.last_success}"
            if m.detail:
                text += f" ({m.detail})"
            out.append(text)
        out += [f"  warning: {w}" for w in self.warnings]
        return out


@dataclass
class RunSessionsReport:
    """What `sessionize run` did on the session branch."""

    runs: list[SessionRunSummary] = field(default_factory=list)
    caught_up: bool = False
    stopped: str | None = None
    error: str | None = None
    nothing_new: str | None = None  # why no run was needed
    blocked: bool = False  # the error is an item held by another run

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def failure_reason(self) -> str | None:
        return self.error

    def lines(self) -> list[str]:
        out = [f"Session models: {len(self.runs)} run(s)"]
        if self.nothing_new:
            out.append(self.nothing_new)
        for i, run in enumerate(self.runs, 1):
            out.append(f"run {i} ({run.run_id[:8]}):")
            out += ["  " + line for line in run.lines()]
        if self.caught_up:
            out.append("Session models are caught up to now.")
        if self.stopped:
            out.append(f"Stopped: {self.stopped}")
        if self.error:
            out.append(f"Error: {self.error}")
        return out


def summarize(run_id: str, run: SessionRunOutcome) -> SessionRunSummary:
    """The CLI's summary of one run, from its typed outcome."""
    models = tuple(
        ModelRunSummary(
            model=model,
            status=outcome.status.value,
            rows_read=outcome.total_rows_read,
            rows_written=outcome.total_rows_written,
            last_success=iso_or_none(outcome.last_success_after),
            detail=outcome.detail,
        )
        for model, outcome in run.models.items()
    )
    return SessionRunSummary(
        run_id=run_id,
        state_message=run.limits.state_message,
        window_message=run.limits.window_message,
        upper_limit=run.limits.upper_limit,
        models=models,
        warnings=tuple(w for w in "\n".join(run.warnings).splitlines() if w),
    )


def run_sessions(
    lake: LakeAccess,
    spark: Any,
    instance: Any,
    max_runs: int = 1000,
    tags: dict[str, str] | None = None,
) -> RunSessionsReport:
    """Materialize the session models, window after window, until they are caught up
    (`core.run_limits.caught_up`: before the first run from the lake's state, then from each
    run's outcome).

    `spark` is the SparkDeltaResource the runs use, or a function returning it (called only when a
    run is needed: a command with nothing new starts no Spark); `instance` likewise (a command
    with nothing new opens no run storage). Stops early when a run moves
    nothing but data resumes later (a gap in the data longer than backfill_limit_days, as
    Snowplow) or fails.
    """
    report = RunSessionsReport()
    before = caught_up(lake.current_time(), lake_state(lake.settings, lake.table))
    if before.caught_up:
        report.nothing_new = before.message
        report.caught_up = True
        return report
    if callable(spark) and not hasattr(spark, "get_session"):
        spark = spark()
    if callable(instance):
        instance = instance()
    from sessionize_assets.sessions.materialize import SessionMaterializer

    materialize = SessionMaterializer(lake, spark, instance, tags)
    for _ in range(max_runs):
        done = materialize()
        if done.outcome is None:
            report.error = done.error or "the session models run failed"
            report.blocked = done.blocked
            return report
        report.runs.append(summarize(done.run_id, done.outcome))
        verdict = done.outcome.catch_up
        if verdict is not None and verdict.caught_up:
            report.caught_up = True
            return report
        if verdict is not None and verdict.stopped:
            report.stopped = verdict.message
            return report
    report.stopped = f"still behind after {max_runs} runs; run again to continue"
    return report


# --- verify -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Difference:
    """One named difference between a table and its recompute."""

    table: str
    kind: str  # "missing", "unexpected", "different", "pending", "inconsistent"
    key: str | None
    detail: str

    def line(self) -> str:
        where = f" {self.key}" if self.key else ""
        return f"{self.table}: {self.kind}{where}: {self.detail}"


@dataclass
class VerifySessionsReport:
    """Every difference between the session tables and a full recompute."""

    differences: list[Difference] = field(default_factory=list)
    compared: dict[str, int] = field(default_factory=dict)
    processed_through: dt.datetime | None = None
    waiting_rows: int = 0  # filtered_events rows past processed_through (not a difference)
    truncated: dict[str, int] = field(default_factory=dict)
    # id mode: how many recorded runs the lifecycle memory was replayed from, or why it was
    # taken as given instead (None in gap mode, which keeps no memory).
    runs_replayed: int | None = None
    lifecycle_given: str | None = None

    @property
    def ok(self) -> bool:
        return not self.differences

    def lines(self) -> list[str]:
        through = (
            format_tstamp(self.processed_through) if self.processed_through else "nothing processed"
        )
        out = [
            f"Session branch verified against a full recompute (session timestamps up to {through}):"
        ]
        for table, n in self.compared.items():
            out.append(f"  {table}: {n} rows compared")
        if self.runs_replayed is not None:
            out.append(
                f"  id mode's lifecycle memory replayed from {self.runs_replayed} recorded "
                "session run(s), oldest first"
            )
        if self.lifecycle_given:
            out.append(
                "  id mode's lifecycle memory taken as given (first-seen users, frozen "
                f"quarantines), not replayed: {self.lifecycle_given}"
            )
        if self.waiting_rows:
            after = f"after {through}" if self.processed_through else "nothing processed yet"
            out.append(
                f"  Waiting (not a difference): {self.waiting_rows} filtered_events rows ({after}); "
                "`sessionize run` processes them."
            )
        if self.ok:
            out.append("  no differences")
        for d in self.differences:
            out.append("  " + d.line())
        for table, n in self.truncated.items():
            out.append(f"  {table}: {n} more differences not listed")
        return out


def _compare(
    table: str,
    actual: DataFrame,
    expected: DataFrame,
    key: str,
    columns: tuple[str, ...],
    limit: int,
    report: VerifySessionsReport,
) -> None:
    """Full outer join on `key`; every row missing, unexpected or different is named."""
    a = actual.select(key, F.struct(*[c for c in columns if c != key]).alias("_a"))
    e = expected.select(key, F.struct(*[c for c in columns if c != key]).alias("_e"))
    joined = a.join(e, key, "full_outer")
    diff = joined.filter(~F.col("_a").eqNullSafe(F.col("_e")))
    report.compared[table] = int(joined.count())
    rows = diff.limit(limit + 1).collect()
    n = diff.count() if len(rows) > limit else len(rows)
    for r in rows[:limit]:
        if r["_a"] is None:
            report.differences.append(
                Difference(table, "missing", r[key], f"the recompute has {_fmt(r['_e'])}")
            )
        elif r["_e"] is None:
            report.differences.append(
                Difference(table, "unexpected", r[key], f"the table has {_fmt(r['_a'])}")
            )
        else:
            changed = [
                f"{c}: table {r['_a'][c]!r}, recompute {r['_e'][c]!r}"
                for c in r["_a"].asDict()
                if r["_a"][c] != r["_e"][c]
            ]
            report.differences.append(Difference(table, "different", r[key], "; ".join(changed)))
    if n > limit:
        report.truncated[table] = n - limit


def _fmt(row: Any) -> str:
    values = row.asDict()
    keep = {k: values[k] for k in list(values)[:5]}
    return ", ".join(f"{k}={v}" for k, v in keep.items())


def verify_sessions(
    lake: LakeAccess, spark: Any, limit: int = 20, replay: bool = False
) -> VerifySessionsReport:
    """Recompute sessions and users from the current filtered_events (session timestamps from
    start_date to the sessions model's processed-through limit) with the same settings. id mode
    takes its lifecycle memory (first-seen users, frozen quarantines) from the lifecycle
    manifest as given, unless `replay`: then it replays the memory from the recorded session
    runs and compares the lifecycle manifest with it, or, when the records do not allow a
    replay, says why and takes it as given (`sessions/replay.py`)."""
    session: SparkSession = spark.get_session() if hasattr(spark, "get_session") else spark
    settings = lake.settings
    report = VerifySessionsReport()
    manifest = read_manifest(lake.table)
    models = enabled_models(settings)
    version = delta_version(lake.table(FILTERED_EVENTS))
    state = manifest.get(SESSIONS)
    if version is None:
        if state is not None:
            report.differences.append(
                Difference(
                    FILTERED_EVENTS,
                    "inconsistent",
                    None,
                    "the manifest has sessions but filtered_events is gone",
                )
            )
        return report
    through = state.processed_through if state else None
    report.processed_through = through
    # What is waiting is said, so a branch that processed nothing never passes vacuously.
    events = read_pinned(
        session, lake.table(FILTERED_EVENTS), version, [settings.session_timestamp, "load_tstamp"]
    )
    if settings.session_timestamp in events.columns:
        stamp = F.coalesce(F.col(settings.session_timestamp), F.col("load_tstamp"))
        waiting = events if through is None else events.where(stamp > F.lit(through))
        report.waiting_rows = waiting.count()
    # Commits that change no row (maintain's VACUUM and OPTIMIZE) leave nothing to consume.
    data_version = last_data_change(recent_operations(lake.table(FILTERED_EVENTS)), version)
    for model in models:
        s = manifest.get(model)
        if s is None:
            continue
        if s.consumed_version is not None and s.consumed_version < data_version:
            report.differences.append(
                Difference(
                    model,
                    "pending",
                    None,
                    f"filtered_events is at version {version} but {model} consumed version "
                    f"{s.consumed_version}: run the session models first",
                )
            )
        if state and s.last_success != state.last_success:
            report.differences.append(
                Difference(
                    model,
                    "pending",
                    None,
                    f"out of sync: last_success {s.last_success}, sessions {state.last_success}",
                )
            )
    snapshot = (
        session.read.format("delta")
        .option("versionAsOf", version)
        .load(lake.table(FILTERED_EVENTS))
    )
    mode = mode_for(settings)
    lifecycle = mode.known_lifecycle(session, lake.table(SESSIONS_LIFECYCLE_MANIFEST))
    if lifecycle is not None:  # id mode: the memory is replayed when asked and possible
        lifecycle = _replayed_or_given(session, lake, lifecycle, limit, report, replay)
    if through is None:
        expected = session.createDataFrame([], SESSIONS_SCHEMA)
    else:
        expected = core.session_rows(
            core.compute_sessions(snapshot, settings, lifecycle, through).sessions
        )
    expected = expected.persist()
    actual = table_or_empty(session, lake.table(SESSIONS), SESSIONS_SCHEMA)
    _compare(SESSIONS, actual, expected, "session_identifier", core.SESSION_COLUMNS, limit, report)
    users = table_or_empty(session, lake.table(USERS), USERS_SCHEMA)
    _compare(
        USERS,
        users,
        core.users_from_sessions(expected),
        "user_identifier",
        core.USER_COLUMNS,
        limit,
        report,
    )
    if USER_SESSION_STATS in models:
        stats = table_or_empty(session, lake.table(USER_SESSION_STATS), USER_SESSION_STATS_SCHEMA)
        _compare(
            USER_SESSION_STATS,
            stats,
            core.user_session_stats_from_sessions(expected),
            "user_identifier",
            core.USER_SESSION_STATS_COLUMNS,
            limit,
            report,
        )
    quarantined = table_or_empty(session, lake.table(QUARANTINED_SESSIONS), QUARANTINED_SCHEMA)
    listed = {r[0] for r in quarantined.select("session_identifier").collect()}
    flagged = {
        r[0] for r in actual.filter(F.col("is_quarantined")).select("session_identifier").collect()
    }
    for sid in sorted(flagged - listed)[:limit]:
        report.differences.append(
            Difference(
                QUARANTINED_SESSIONS, "missing", sid, "the session is quarantined but not listed"
            )
        )
    if not mode.keeps_vanished:  # gap mode: the listing mirrors the quarantined sessions
        for sid in sorted(listed - flagged)[:limit]:
            report.differences.append(
                Difference(
                    QUARANTINED_SESSIONS,
                    "unexpected",
                    sid,
                    "listed but no quarantined session has this id",
                )
            )
    expected.unpersist()
    return report


def _replayed_or_given(
    session: SparkSession,
    lake: LakeAccess,
    stored: DataFrame,
    limit: int,
    report: VerifySessionsReport,
    replay: bool,
) -> DataFrame:
    """id mode's lifecycle memory for the recompute: when `replay`, replayed from the recorded
    session runs and compared with the stored manifest (`sessions/replay.py`); else, or when the
    records do not allow a replay, the stored manifest taken as given (the report says why)."""
    # The stored rows are counted only for a replay (they decide whether no recorded run is a
    # refusal); without one, the records alone say how many runs --replay would take.
    plan = replay_plan(lake.table, stored.count() if replay else 0, versions=replay)
    if not plan.possible:
        report.lifecycle_given = plan.refusal
        return stored
    if not replay:
        report.lifecycle_given = (
            f"`sessionize verify --replay` replays the {len(plan.runs)} recorded session run(s) "
            "instead, about one recompute each"
        )
        return stored
    report.runs_replayed = len(plan.runs)
    memory = replayed_lifecycle(session, lake.table, lake.settings, plan)
    _compare(
        SESSIONS_LIFECYCLE_MANIFEST,
        stored,
        memory,
        "session_identifier",
        core.LIFECYCLE_COLUMNS,
        limit,
        report,
    )
    return memory


# --- status -------------------------------------------------------------------------------------


@dataclass
class SessionsStatus:
    """The session branch's state without Spark: run limits, manifest rows, pending versions."""

    limits: RunLimits
    manifest: dict[str, ModelState]
    enabled_models: tuple[str, ...]
    filtered_events_version: int | None
    quarantined_sessions: int
    now: dt.datetime

    @property
    def pending_versions(self) -> dict[str, int]:
        """Per model, how many filtered_events versions it has not consumed."""
        if self.filtered_events_version is None:
            return {}
        out = {}
        for model in self.enabled_models:
            s = self.manifest.get(model)
            consumed = s.consumed_version if s and s.consumed_version is not None else -1
            out[model] = max(self.filtered_events_version - consumed, 0)
        return out

    def lines(self) -> list[str]:
        out = [
            "Session branch:",
            f"  {self.limits.state_message}",
            f"  next run: {self.limits.window_message}",
        ]
        if self.limits.reaches(self.now):
            out.append("  the next window reaches now")
        pending = self.pending_versions
        for model in self.enabled_models:
            s = self.manifest.get(model)
            if s is None:
                out.append(f"  {model}: not in the manifest yet (will backfill from start_date)")
                continue
            out.append(
                f"  {model}: last_success {format_tstamp(s.last_success) if s.last_success else '-'}, "
                f"consumed filtered_events version {s.consumed_version}, "
                f"{pending.get(model, 0)} newer version(s) pending"
            )
        out.append(f"  quarantined sessions: {self.quarantined_sessions}")
        return out


def status_sessions(lake: LakeAccess, now: dt.datetime | None = None) -> SessionsStatus:
    """Run-limit state and window of the next run, each model's last_success (delta-rs only)."""
    settings = lake.settings
    now = as_utc(now or lake.current_time())
    manifest = read_manifest(lake.table)
    limits = current_limits(settings, lake.table, now)
    quarantined = read_small_table(lake.table(QUARANTINED_SESSIONS), ["session_identifier"])
    return SessionsStatus(
        limits=limits,
        manifest=manifest,
        enabled_models=enabled_models(settings),
        filtered_events_version=delta_version(lake.table(FILTERED_EVENTS)),
        quarantined_sessions=len(quarantined),
        now=now,
    )
