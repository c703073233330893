"""The session branch from the command line: run until caught up, verify, status.

`run_sessions` materializes the `session_models` multi-asset through `dagster.materialize` on the
instance it is given (so the runs show in the UI), once per window, until a window reaches now.
`verify_sessions` recomputes sessions and users from the current `filtered_events` with the same
functions and settings and names every difference. `status_sessions` reads the small state
tables with delta-rs (no Spark).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from sessionize_assets.assets import sessions as assets
from sessionize_assets.core import sessionize as core
from sessionize_assets.core.run_limits import (
    ConsumedState,
    RunLimits,
    as_utc,
    format_tstamp,
    nothing_new,
)
from sessionize_assets.resources.delta import delta_version, newest_value, read_small_table
from sessionize_assets.resources.lake import LakeResource
from sessionize_assets.resources.manifest_lock import session_lock
from sessionize_assets.resources.tables import (
    FILTERED_EVENTS,
    INCREMENTAL_MANIFEST,
    QUARANTINED_SESSIONS,
    SESSIONS,
    SESSIONS_LIFECYCLE_MANIFEST,
    USERS,
)

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

    @property
    def ok(self) -> bool:
        return self.error is None

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


def _value(metadata: dict[str, Any], key: str) -> Any:
    entry = metadata.get(key)
    return getattr(entry, "value", entry)


def _summary(result: Any, settings_models: tuple[str, ...]) -> SessionRunSummary:
    by_asset: dict[str, dict[str, Any]] = {}
    for event in result.get_asset_materialization_events():
        materialization = event.event_specific_data.materialization
        by_asset[materialization.asset_key.to_user_string()] = dict(materialization.metadata)
    base = by_asset.get(INCREMENTAL_MANIFEST) or next(iter(by_asset.values()), {})
    models = []
    for model in settings_models:
        md = by_asset.get(model, {})
        if _value(md, "failed"):
            status, detail = "failed", _value(md, "failed")
        elif _value(md, "skipped"):
            status, detail = "skipped", _value(md, "skipped")
        elif _value(md, "no data"):
            status, detail = "no data", None
        elif _value(md, "full rebuild"):
            status, detail = "rebuilt", _value(md, "full rebuild")
        else:
            status, detail = "ran", None
        models.append(
            ModelRunSummary(
                model=model,
                status=status,
                rows_read=int(_value(md, "rows read") or 0),
                rows_written=int(_value(md, "rows written") or 0),
                last_success=_value(md, "last_success"),
                detail=detail,
            )
        )
    warnings = tuple(w for w in (_value(base, "warnings") or "").splitlines() if w)
    return SessionRunSummary(
        run_id=result.run_id,
        state_message=_value(base, "state_message") or "",
        window_message=_value(base, "window") or "",
        upper_limit=as_utc(dt.datetime.fromisoformat(_value(base, "upper_limit"))),
        models=tuple(models),
        warnings=warnings,
    )


def run_sessions(
    lake: LakeResource,
    spark: Any,
    instance: Any,
    max_runs: int = 1000,
    tags: dict[str, str] | None = None,
) -> RunSessionsReport:
    """Materialize the session models, window after window, until a window reaches now.

    `spark` is the SparkDeltaResource the runs use. Stops early when a run moves nothing (the
    window has no data: a gap in the data longer than backfill_limit_days, as Snowplow) or fails.
    """
    import dagster

    settings = lake.settings
    now = lake.current_time()
    models = assets.enabled_models(settings)
    definitions = assets.build_assets(settings, lock=session_lock)
    report = RunSessionsReport()
    report.nothing_new = _nothing_new(lake, models)
    if report.nothing_new:
        report.caught_up = True
        return report
    for _ in range(max_runs):
        before = assets.read_manifest(lake.table)
        limits = assets.current_limits(settings, lake.table, now)
        result = dagster.materialize(
            definitions,
            instance=instance,
            resources={"lake": lake, "spark": spark},
            raise_on_error=False,
            tags=tags or {"sessionize/lane": "sessions"},
        )
        if not result.success:
            report.error = _failure(result) or "the session models run failed"
            return report
        summary = _summary(result, models)
        report.runs.append(summary)
        after = assets.read_manifest(lake.table)
        all_ran = all(m.status in ("ran", "rebuilt", "no data") for m in summary.models)
        if limits.reaches(now) and all_ran:
            report.caught_up = True
            return report
        if after == before:  # no data in the window: nothing moved
            resumes = _next_data_after(limits.upper_limit, lake, spark)
            if resumes is None or resumes > now:
                report.caught_up = True  # nothing newer is waiting (or only future-dated rows)
            else:
                report.stopped = (
                    f"no data between {format_tstamp(limits.lower_limit)} and {format_tstamp(limits.upper_limit)} "
                    f"but data resumes at {format_tstamp(resumes)}: the gap is longer than "
                    "backfill_limit_days (Snowplow waits here too); raise backfill_limit_days to bridge it"
                )
            return report
    report.stopped = f"still behind after {max_runs} runs; run again to continue"
    return report


def _nothing_new(lake: LakeResource, models: Sequence[str]) -> str | None:
    """Why no session run is needed (None: run), from the Delta log and the manifest only."""
    path = lake.table(FILTERED_EVENTS)
    states = {
        m: ConsumedState(s.last_success, s.consumed_version, s.processed_through)
        for m, s in assets.read_manifest(lake.table).items()
    }
    newest = newest_value(path, lake.settings.session_timestamp, for_nulls="load_tstamp")
    return nothing_new(models, states, delta_version(path), newest)


def _failure(result: Any) -> str | None:
    for event in result.all_events:
        if event.is_failure and event.step_failure_data is not None:
            error = event.step_failure_data.error
            return error.message.strip().splitlines()[0] if error else None
    return None


def _next_data_after(upper: dt.datetime, lake: LakeResource, spark: Any) -> dt.datetime | None:
    """The earliest usable session timestamp after `upper` in filtered_events (None: none)."""
    session = spark.get_session() if hasattr(spark, "get_session") else spark
    path = lake.table(FILTERED_EVENTS)
    if delta_version(path) is None:
        return None
    prepared = core.usable(
        core.prepare_events(session.read.format("delta").load(path), lake.settings), lake.settings
    )
    nxt = (
        prepared.filter(F.col(core.SESSION_TS) > F.lit(upper))
        .agg(F.min(core._micros(core.SESSION_TS)))
        .collect()[0][0]
    )
    if nxt is None:
        return None
    return dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(microseconds=int(nxt))


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
    truncated: dict[str, int] = field(default_factory=dict)

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


def verify_sessions(lake: LakeResource, spark: Any, limit: int = 20) -> VerifySessionsReport:
    """Recompute sessions and users from the current filtered_events (session timestamps from
    start_date to the sessions model's processed-through limit) with the same settings; id mode
    takes quarantine and first-seen users from the lifecycle manifest as given."""
    session: SparkSession = spark.get_session() if hasattr(spark, "get_session") else spark
    settings = lake.settings
    report = VerifySessionsReport()
    manifest = assets.read_manifest(lake.table)
    models = assets.enabled_models(settings)
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
    for model in models:
        s = manifest.get(model)
        if s is None:
            continue
        if s.consumed_version is not None and s.consumed_version < version:
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
    lifecycle = None
    if settings.session_mode == "id":
        lifecycle = assets._table_or_empty(
            session, lake.table(SESSIONS_LIFECYCLE_MANIFEST), assets.LIFECYCLE_SCHEMA
        )
    if through is None:
        expected = session.createDataFrame([], assets.SESSIONS_SCHEMA)
    else:
        expected = core.session_rows(
            core.compute_sessions(snapshot, settings, lifecycle, through).sessions
        )
    expected = expected.persist()
    actual = assets._table_or_empty(session, lake.table(SESSIONS), assets.SESSIONS_SCHEMA)
    _compare(SESSIONS, actual, expected, "session_identifier", core.SESSION_COLUMNS, limit, report)
    users = assets._table_or_empty(session, lake.table(USERS), assets.USERS_SCHEMA)
    _compare(
        USERS,
        users,
        core.users_from_sessions(expected),
        "user_identifier",
        core.USER_COLUMNS,
        limit,
        report,
    )
    if assets.USER_SESSION_STATS in models:
        stats = assets._table_or_empty(
            session, lake.table(assets.USER_SESSION_STATS), assets.USER_SESSION_STATS_SCHEMA
        )
        _compare(
            assets.USER_SESSION_STATS,
            stats,
            core.user_session_stats_from_sessions(expected),
            "user_identifier",
            core.USER_SESSION_STATS_COLUMNS,
            limit,
            report,
        )
    quarantined = assets._table_or_empty(
        session, lake.table(QUARANTINED_SESSIONS), assets.QUARANTINED_SCHEMA
    )
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
    if settings.session_mode == "gap":
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


# --- status -------------------------------------------------------------------------------------


@dataclass
class SessionsStatus:
    """The session branch's state without Spark: run limits, manifest rows, pending versions."""

    limits: RunLimits
    manifest: dict[str, assets.ModelState]
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


def status_sessions(lake: LakeResource, now: dt.datetime | None = None) -> SessionsStatus:
    """Run-limit state and window of the next run, each model's last_success (delta-rs only)."""
    settings = lake.settings
    now = as_utc(now or lake.current_time())
    manifest = assets.read_manifest(lake.table)
    limits = assets.current_limits(settings, lake.table, now)
    quarantined = read_small_table(lake.table(QUARANTINED_SESSIONS), ["session_identifier"])
    return SessionsStatus(
        limits=limits,
        manifest=manifest,
        enabled_models=assets.enabled_models(settings),
        filtered_events_version=delta_version(lake.table(FILTERED_EVENTS)),
        quarantined_sessions=len(quarantined),
        now=now,
    )
