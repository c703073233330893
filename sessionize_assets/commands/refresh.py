"""`sessionize refresh [MODEL ...] [--yes]`: rebuild the session models in full from
`filtered_events` (one Dagster run of `session_models` with `refresh: true`), guarded like
Snowplow's `snowplow__allow_refresh`, and record the settings they were rebuilt with."""

from __future__ import annotations

from collections.abc import Sequence

from sessionize_assets.commands.context import CommandContext
from sessionize_assets.errors import ItemLockedError, UserError
from sessionize_assets.resources.tables import DAILY_AGGREGATES, FILTERED_EVENTS
from sessionize_assets.sessions.state import enabled_models
from sessionize_assets.settings import KNOWN_SESSION_MODELS

TIME_BASED = (FILTERED_EVENTS, "days_to_process", DAILY_AGGREGATES, "attributes")


def refresh_refusal(
    models: Sequence[str], enabled: Sequence[str], yes: bool, allowed: bool
) -> str | None:
    """Why `refresh` must not run (one sentence), or None."""
    for model in models:
        if model in TIME_BASED:
            return (
                f"`refresh` rebuilds the session models only; {model} belongs to the time-based "
                f"branch: re-run its load days with `sessionize backfill --start DAY --end DAY`."
            )
        if model not in KNOWN_SESSION_MODELS:
            return f"{model} is not a model (session models: {', '.join(KNOWN_SESSION_MODELS)})."
        if model not in enabled:
            return f"{model} is not enabled (setting session_models: {', '.join(enabled)})."
    if not (yes or allowed):
        return (
            "A refresh rebuilds every session model in full from filtered_events: confirm it with "
            "--yes, or set allow_refresh: true in the settings."
        )
    return None


def refresh(ctx: CommandContext, models: Sequence[str], yes: bool) -> list[str]:
    """Rebuild the enabled session models (any named model rebuilds them all: users and
    user_session_stats are built from sessions). Returns the lines to print."""
    from sessionize_assets.commands.sessions import summarize
    from sessionize_assets.pipeline import spark_resource
    from sessionize_assets.sessions.materialize import SessionMaterializer

    enabled = enabled_models(ctx.settings)
    refused = refresh_refusal(models, enabled, yes, ctx.settings.allow_refresh)
    if refused:
        raise UserError(refused)
    materialize = SessionMaterializer(ctx.lake, spark_resource(ctx), ctx.instance)
    done = materialize(refresh=True, yes=True)
    if done.outcome is None and done.blocked:
        raise ItemLockedError(done.error or "the session models are locked by another run")
    if done.outcome is None:
        raise RefreshFailed(done.error or "the refresh run failed")
    lines = [
        f"Refreshed {', '.join(enabled)} in full from {FILTERED_EVENTS} (run {done.run_id[:8]}):"
    ]
    lines += ["  " + line for line in summarize(done.run_id, done.outcome).lines()]
    lines.append("Run `sessionize verify` to compare them with a full recompute.")
    return lines


class RefreshFailed(Exception):
    """The refresh run failed (an engine error: exit status 4)."""
