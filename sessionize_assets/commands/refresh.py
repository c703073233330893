"""`sessionize refresh [MODEL ...] [--from DAY] [--yes]`: rebuild models under the current
settings, guarded like Snowplow's `snowplow__allow_refresh`, and record the settings they were
rebuilt with; or, with `--from DAY`, restate them from that day under the settings that built them.

- Session models (`sessions`, `users`, `user_session_stats`; the default): rebuilt in full from
  `filtered_events` (one Dagster run of `session_models` with `refresh: true`).
- Time-based models (`filtered_events`, `days_to_process`, `daily_aggregates`, `attributes`):
  every load day from the first one on is re-materialized (the `backfill` runs, tagged so their
  assets accept the changed settings), then the event days they decide and `attributes`; the
  session models then follow the rewritten `filtered_events` through its change feed (or are
  rebuilt too when named). The new definitions are recorded only at the end, so an interrupted
  refresh still refuses runs until it is run again. Each step runs once for every load day (or
  event day), whatever backfill_limit_days says, so each table changes in one commit: a reader
  sees a table's old rows until its new ones are committed (per table: Delta has no transaction
  across tables).
- `--from DAY` (a restatement, as SQLMesh's `restate --start`): time-based models re-materialize
  the load days from DAY on; session models recompute every session with an event from DAY on
  (a run whose window starts at DAY, as every run's lookback recomputes its first hours). Rows
  before DAY stay, so a change of the shaping settings is refused (`restate_refusal`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from sessionize_assets.commands.context import CommandContext
from sessionize_assets.errors import ItemLockedError, SettingsError, UserError
from sessionize_assets.resources.tables import DAILY_AGGREGATES, FILTERED_EVENTS
from sessionize_assets.sessions.state import enabled_models, read_manifest, settings_refusal
from sessionize_assets.settings import KNOWN_SESSION_MODELS

TIME_BASED = (FILTERED_EVENTS, "days_to_process", DAILY_AGGREGATES, "attributes")


def refresh_refusal(
    models: Sequence[str], enabled: Sequence[str], yes: bool, allowed: bool
) -> str | None:
    """Why `refresh` must not run (one sentence), or None."""
    for model in models:
        if model in TIME_BASED:
            continue
        if model not in KNOWN_SESSION_MODELS:
            known = ", ".join((*TIME_BASED, *KNOWN_SESSION_MODELS))
            return f"{model} is not a model (models: {known})."
        if model not in enabled:
            return f"{model} is not enabled (setting session_models: {', '.join(enabled)})."
    if not (yes or allowed):
        what = (
            "every load day of the time-based branch"
            if any(m in TIME_BASED for m in models)
            else "every session model in full from filtered_events"
        )
        return (
            f"A refresh rebuilds {what}: confirm it with --yes, or set allow_refresh: true in the "
            "settings."
        )
    return None


def refresh(
    ctx: CommandContext, models: Sequence[str], yes: bool, from_day: dt.date | None = None
) -> list[str]:
    """Rebuild the named models (any session model rebuilds them all: users and
    user_session_stats are built from sessions; any time-based model rebuilds the time-based
    branch). `from_day`: a restatement from that day under the settings that built the models
    (`restate_refusal`). Returns the lines to print."""

    enabled = enabled_models(ctx.settings)
    refused = refresh_refusal(models, enabled, yes, ctx.settings.allow_refresh)
    if refused:
        raise UserError(refused)
    if from_day is not None:
        refused = restate_refusal(ctx, models, from_day)
        if refused:
            raise SettingsError(refused)
    if any(m in TIME_BASED for m in models):
        sessions_named = [m for m in models if m not in TIME_BASED]
        return refresh_time_based(ctx, rebuild_sessions=bool(sessions_named), from_day=from_day)
    return _refresh_sessions(ctx, enabled, from_day)


def restate_refusal(ctx: CommandContext, models: Sequence[str], from_day: dt.date) -> str | None:
    """Why `refresh --from DAY` must not run (one sentence), or None: it keeps the rows before
    that day, so it restates under the settings that built the models and cannot apply a
    change of them (that is a refresh without --from)."""
    from sessionize_assets.time_based import definitions
    from sessionize_assets.time_based.tables import TimeBasedTables

    lake = ctx.lake_at(None)
    changed = settings_refusal(ctx.settings, read_manifest(lake.table))
    if changed is None and any(m in TIME_BASED for m in models):
        changed = definitions.refusal(TimeBasedTables.at(lake.table).definitions, ctx.settings)
    if changed is None:
        return None
    return (
        f"A refresh from {from_day} keeps the rows before that day, so it cannot apply a "
        f"settings change (run it without --from): {changed[0].lower()}{changed[1:]}"
    )


def _refresh_sessions(
    ctx: CommandContext, enabled: Sequence[str], from_day: dt.date | None = None
) -> list[str]:
    from sessionize_assets.commands.sessions import summarize
    from sessionize_assets.pipeline import spark_resource
    from sessionize_assets.sessions.materialize import SessionMaterializer

    materialize = SessionMaterializer(ctx.lake, spark_resource(ctx), ctx.instance)
    if from_day is None:
        done = materialize(refresh=True, yes=True)
    else:
        done = materialize(yes=True, restate_from=from_day)
    if done.outcome is None and done.blocked:
        raise ItemLockedError(done.error or "the session models are locked by another run")
    if done.outcome is None:
        raise RefreshFailed(done.error or "the refresh run failed")
    what = "in full" if from_day is None else f"for every session with an event from {from_day} on"
    lines = [
        f"Refreshed {', '.join(enabled)} {what} from {FILTERED_EVENTS} (run {done.run_id[:8]}):"
    ]
    lines += ["  " + line for line in summarize(done.run_id, done.outcome).lines()]
    lines.append("Run `sessionize verify` to compare them with a full recompute.")
    return lines


class RefreshFailed(Exception):
    """The refresh run failed (an engine error: exit status 4)."""


def refresh_time_based(
    ctx: CommandContext, rebuild_sessions: bool, from_day: dt.date | None = None
) -> list[str]:
    """Re-materialize every known load day (from the first in `events` or ever consumed, or from
    `from_day`, not before start_date, through the last) under the current settings, each step in
    one run (one commit per table), then the session models (rebuilt, or restated from
    `from_day`, when `rebuild_sessions`; else run on the feed); record the time-based
    definitions."""
    from sessionize_assets.commands.sessions import run_sessions
    from sessionize_assets.commands.time_based import backfill_time_based
    from sessionize_assets.core.model_definitions import TIME_BASED_SHAPING
    from sessionize_assets.pipeline import spark_resource
    from sessionize_assets.resources.shared_reads import sharing
    from sessionize_assets.time_based import definitions
    from sessionize_assets.time_based.state import read_state
    from sessionize_assets.time_based.tables import TimeBasedTables

    lake = ctx.lake_at(None)
    tables = TimeBasedTables.at(lake.table)
    if not rebuild_sessions and from_day is None:
        # A setting that shapes both branches (user_identifier) would stop the session run after
        # the whole rebuild: say so before it.
        refused = settings_refusal(ctx.settings, read_manifest(lake.table))
        if refused:
            raise SettingsError(
                f"{refused} The session models need it too: name both, e.g. "
                "`sessionize refresh daily_aggregates sessions --yes`."
            )
    state = read_state(tables)
    earliest = max(ctx.settings.start_date, from_day or ctx.settings.start_date)
    known = [d for d in {*state.events_fingerprints, *state.accounting} if d >= earliest]
    lines: list[str] = []
    if known:
        with sharing():
            rebuilt = backfill_time_based(
                min(known),
                max(known),
                lake,
                ctx.spark,
                ctx.instance,
                refresh=from_day is None,
                whole=True,
            )
            lines += rebuilt.lines()
            if rebuild_sessions:
                lines += _refresh_sessions(ctx, enabled_models(ctx.settings), from_day)
            else:
                sessions = run_sessions(lake, spark_resource(ctx), ctx.instance)
                lines += sessions.lines()
                if not sessions.ok and getattr(sessions, "blocked", False):
                    raise ItemLockedError(
                        getattr(sessions, "failure_reason", None) or "the session models are locked"
                    )
                if not sessions.ok:
                    raise RefreshFailed(
                        getattr(sessions, "failure_reason", None) or "the session branch failed"
                    )
    else:
        lines.append(
            "No load day to rebuild: the time-based branch holds no data"
            + (f" from {from_day} on." if from_day else " yet.")
        )
    if from_day is not None:  # the definitions did not change (`restate_refusal`)
        return lines
    definitions.record(tables.definitions, ctx.settings, list(TIME_BASED_SHAPING))
    lines.append(
        "Recorded the settings the time-based models are now built with; run `sessionize verify` "
        "to compare every table with a full recompute."
    )
    return lines
