"""The session branch's state, read with delta-rs (no Spark, so sensors, `status` and the CLI's
"nothing new?" check can call it): which models are enabled, the `incremental_manifest` rows,
the run limits the next run would use, and what the lake says before a run (`lake_state`).
The manifest is also written here (a few rows, delta-rs: no Spark job).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from sessionize_assets import faults
from sessionize_assets.core import model_definitions
from sessionize_assets.core.clock import as_utc_or_none, midnight
from sessionize_assets.core.maintenance import last_data_change
from sessionize_assets.core.run_limits import ConsumedState, LakeState, RunLimits, run_limits
from sessionize_assets.resources.delta import (
    delta_version,
    newest_value,
    read_small_table,
    recent_operations,
)
from sessionize_assets.resources.tables import FILTERED_EVENTS, INCREMENTAL_MANIFEST, SESSIONS
from sessionize_assets.sessions.tables import MODEL_ORDER, TablePath
from sessionize_assets.settings import Settings


def enabled_models(settings: Settings) -> tuple[str, ...]:
    """The session models this configuration runs, in dependency order (`sessions` always: the
    other models are built from it)."""
    models = [m for m in MODEL_ORDER if m in settings.session_models]
    if SESSIONS not in models:
        models.insert(0, SESSIONS)
    return tuple(models)


def session_start(settings: Settings) -> dt.datetime:
    """The first instant the session branch processes (start_date at midnight UTC)."""
    return midnight(settings.start_date)


@dataclass(frozen=True)
class ModelState:
    """One incremental_manifest row."""

    model: str
    last_success: dt.datetime | None
    consumed_version: int | None
    processed_through: dt.datetime | None
    updated_at: dt.datetime | None = None
    definition: str | None = None  # the settings that built it (core.model_definitions.encode)

    def consumed(self) -> ConsumedState:
        """What the row says the model has seen (core.run_limits' view of it)."""
        return ConsumedState(self.last_success, self.consumed_version, self.processed_through)


def read_manifest(table_path: TablePath) -> dict[str, ModelState]:
    """The incremental manifest via delta-rs (no Spark): model -> state."""
    rows = read_small_table(table_path(INCREMENTAL_MANIFEST))
    return {
        r["model"]: ModelState(
            model=r["model"],
            last_success=as_utc_or_none(r.get("last_success")),
            consumed_version=int(r["consumed_version"])
            if r.get("consumed_version") is not None
            else None,
            processed_through=as_utc_or_none(r.get("processed_through")),
            updated_at=as_utc_or_none(r.get("updated_at")),
            definition=r.get("definition"),
        )
        for r in rows
    }


def settings_refusal(settings: Settings, manifest: dict[str, ModelState]) -> str | None:
    """Why a run with `settings` must not continue the models the manifest describes (one
    sentence naming the changed setting and `sessionize refresh`), or None."""
    current = model_definitions.definition(settings)
    for model in enabled_models(settings):
        state = manifest.get(model)
        changes = model_definitions.changed_settings(state.definition if state else None, current)
        if changes:
            return model_definitions.refusal(model, changes)
    return None


def limits_from(manifest: dict[str, ModelState], settings: Settings, now: dt.datetime) -> RunLimits:
    """The state and window of a run over these manifest rows."""
    return run_limits(
        {m: s.last_success for m, s in manifest.items()},
        enabled_models(settings),
        settings.start_date,
        settings.backfill_limit_days,
        settings.lookback_window_hours,
        now,
    )


def current_limits(settings: Settings, table_path: TablePath, now: dt.datetime) -> RunLimits:
    """The state and window the next run would use."""
    return limits_from(read_manifest(table_path), settings, now)


def write_manifest(path: str, states: dict[str, ModelState]) -> None:
    """Overwrite the (tiny) incremental manifest with delta-rs: no Spark job for a few rows."""
    import pyarrow as pa
    from deltalake import write_deltalake

    ordered = sorted(states.values(), key=lambda s: s.model)
    ts = pa.timestamp("us", tz="UTC")
    table = pa.table(
        {
            "model": pa.array([s.model for s in ordered], pa.string()),
            "last_success": pa.array([s.last_success for s in ordered], ts),
            "consumed_version": pa.array([s.consumed_version for s in ordered], pa.int64()),
            "processed_through": pa.array([s.processed_through for s in ordered], ts),
            "updated_at": pa.array([s.updated_at for s in ordered], ts),
            "definition": pa.array([s.definition for s in ordered], pa.string()),
        }
    )
    with faults.commit_of(path):
        # schema_mode: a manifest written before definitions were recorded gains the column
        write_deltalake(path, table, mode="overwrite", schema_mode="overwrite")


def lake_state(settings: Settings, table_path: TablePath) -> LakeState:
    """What the Delta log and the manifest say before a run (for `core.run_limits.caught_up`):
    the enabled models' manifest rows, filtered_events' version, the latest version that changed
    its data (after `maintain`'s OPTIMIZE and VACUUM commits, an earlier one) and its newest
    session timestamp from the log's file statistics (rows without one count with their
    load_tstamp)."""
    path = table_path(FILTERED_EVENTS)
    states = {m: s.consumed() for m, s in read_manifest(table_path).items()}
    version = delta_version(path)
    return LakeState(
        models=enabled_models(settings),
        states=states,
        version=version,
        data_version=None
        if version is None
        else last_data_change(recent_operations(path), version),
        newest_session_tstamp=newest_value(
            path, settings.session_timestamp, for_nulls="load_tstamp"
        ),
    )
