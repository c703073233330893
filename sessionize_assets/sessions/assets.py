"""The session branch's Dagster declarations: the `session_models` multi-asset (every enabled model
and its bookkeeping tables, one op) and the metadata of its materializations. The op takes the
processing-manifest lock and calls `sessions.run.run_session_models`; nothing else is decided here.
"""

# No `from __future__ import annotations`: Dagster reads the op's `config:` annotation as a type.
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext

from dagster import (
    AssetExecutionContext,
    AssetsDefinition,
    AssetSpec,
    Config,
    MaterializeResult,
    MetadataValue,
    multi_asset,
)

from sessionize_assets import faults
from sessionize_assets.core import sessionize as core
from sessionize_assets.core.clock import iso_or_none
from sessionize_assets.errors import SettingsError
from sessionize_assets.metadata import dagster_metadata, schema_metadata
from sessionize_assets.resources.lake import LakeResource
from sessionize_assets.resources.spark_resource import SparkDeltaResource
from sessionize_assets.resources.tables import (
    FILTERED_EVENTS,
    INCREMENTAL_MANIFEST,
    QUARANTINED_SESSIONS,
    SESSIONS,
    SESSIONS_LIFECYCLE_MANIFEST,
    SUPERSEDED_SESSIONS,
    USERS,
)
from sessionize_assets.sessions.outcome import SessionRunOutcome
from sessionize_assets.sessions.run import run_session_models
from sessionize_assets.sessions.state import ModelState, enabled_models
from sessionize_assets.sessions.tables import (
    USER_SESSION_STATS,
)
from sessionize_assets.settings import Settings, parse_day

GROUP = "session_based"
ASSET_NAME = "session_models"

LockFactory = Callable[[AssetExecutionContext, str], AbstractContextManager]


class SessionModelsConfig(Config):
    """Run configuration of `session_models` (the Launchpad's `ops: session_models: config:`)."""

    refresh: bool = False  # rebuild every session model in full from filtered_events
    yes: bool = False  # confirm a refresh (not needed with the setting allow_refresh: true)
    # A restatement (`sessionize refresh sessions --from DAY`): an ISO day; every session with an
    # event from that day on is recomputed under the settings that built the models.
    restate_from: str | None = None


REFRESH_REFUSED = (
    "A refresh rebuilds every session model from filtered_events: confirm it with `yes: true` in "
    "the run config (`sessionize refresh --yes`), or set allow_refresh: true in the settings."
)


def build_assets(
    settings: Settings,
    lock: LockFactory | None = None,
    observe: Callable[[SessionRunOutcome], None] | None = None,
) -> list[AssetsDefinition]:
    """The `session_models` multi-asset: every enabled session model and its bookkeeping tables.

    `lock(context, item)` may wrap the run in a processing-manifest lock (item "session_models").
    `observe(outcome)` receives each successful run's typed outcome (in-process callers, such as
    `sessions.materialize`, learn what the run did from it rather than from metadata).
    """
    models = enabled_models(settings)
    specs = [
        AssetSpec(
            SESSIONS,
            deps=[FILTERED_EVENTS],
            metadata=schema_metadata(SESSIONS),
            group_name=GROUP,
            kinds={"spark", "delta"},
            description="One row per session (SPEC section 6), kept current incrementally.",
        ),
        AssetSpec(
            USERS,
            deps=[SESSIONS],
            metadata=schema_metadata(USERS),
            group_name=GROUP,
            kinds={"spark", "delta"},
            description="One row per non-null user, from their sessions.",
        ),
    ]
    if USER_SESSION_STATS in models:
        specs.append(
            AssetSpec(
                USER_SESSION_STATS,
                deps=[SESSIONS],
                metadata=schema_metadata(USER_SESSION_STATS),
                group_name=GROUP,
                kinds={"spark", "delta"},
                description="Per-user session-duration statistics (an example extra session model).",
            )
        )
    specs += [
        AssetSpec(
            SESSIONS_LIFECYCLE_MANIFEST,
            deps=[FILTERED_EVENTS],
            metadata=schema_metadata(SESSIONS_LIFECYCLE_MANIFEST),
            group_name=GROUP,
            kinds={"spark", "delta"},
            description="Per session: id, user, start and end, quarantined -- finds the sessions new events touch.",
        ),
        AssetSpec(
            QUARANTINED_SESSIONS,
            deps=[SESSIONS_LIFECYCLE_MANIFEST],
            metadata=schema_metadata(QUARANTINED_SESSIONS),
            group_name=GROUP,
            kinds={"spark", "delta"},
            description="Sessions capped at max_session_days.",
        ),
        AssetSpec(
            SUPERSEDED_SESSIONS,
            deps=[SESSIONS],
            metadata=schema_metadata(SUPERSEDED_SESSIONS),
            group_name=GROUP,
            kinds={"spark", "delta"},
            description="gap mode: session ids that stopped existing (old id -> new id, reason).",
        ),
        AssetSpec(
            INCREMENTAL_MANIFEST,
            deps=[m for m in models],
            metadata=schema_metadata(INCREMENTAL_MANIFEST),
            group_name=GROUP,
            kinds={"delta"},
            description="Per session model: last_success, consumed filtered_events version, processed-through limit.",
        ),
    ]

    @multi_asset(
        name=ASSET_NAME,
        specs=specs,
        can_subset=False,
        required_resource_keys={"lake", "spark"},
        description="Snowplow-style incremental run of the session models (run limits, lifecycle manifest, quarantine).",
    )
    def session_models(context, config: SessionModelsConfig):  # noqa: ANN001, ANN202
        started = time.monotonic()
        lake: LakeResource = context.resources.lake
        if (config.refresh or config.restate_from) and not (
            config.yes or lake.settings.allow_refresh
        ):
            raise SettingsError(REFRESH_REFUSED)
        restate_from = parse_day(config.restate_from, "restate_from")
        spark: SparkDeltaResource = context.resources.spark
        session = spark.get_session()
        # The single place a processing-manifest lock wraps this run (item "session_models"); the
        # run fills the lock's payload with what `verify` replays (core/run_history.py).
        guard = lock(context, ASSET_NAME) if lock is not None else nullcontext()
        with guard as record, faults.step_of(ASSET_NAME):
            run = run_session_models(
                session,
                lake.table,
                lake.settings,
                lake.current_time(),
                context.log,
                refresh=config.refresh,
                restate_from=restate_from,
                record=record,
            )
        if observe is not None:
            observe(run)
        yield from materialize_results(run, time.monotonic() - started)

    return [session_models]


def materialize_results(run: SessionRunOutcome, seconds: float) -> Iterator[MaterializeResult]:
    """One MaterializeResult per asset of the multi-asset, with the run's facts as metadata."""
    base = run.run_metadata()
    for model, outcome in run.models.items():
        md = {**base, **outcome.metadata()}
        yield MaterializeResult(asset_key=model, metadata=dagster_metadata(md))
    sessions = run.models[SESSIONS]
    written = sessions.rows_written
    yield MaterializeResult(
        asset_key=SESSIONS_LIFECYCLE_MANIFEST,
        metadata=dagster_metadata(
            {
                **base,
                "rows read": sessions.rows_read.get("lifecycle rows", 0),
                "rows written": written.get("lifecycle rows", 0),
            }
        ),
    )
    yield MaterializeResult(
        asset_key=QUARANTINED_SESSIONS,
        metadata=dagster_metadata(
            {
                **base,
                "rows written": written.get("quarantined sessions added", 0)
                + written.get("quarantined sessions removed", 0),
                "sessions added": written.get("quarantined sessions added", 0),
                "sessions removed": written.get("quarantined sessions removed", 0),
                "events ignored: quarantined session": sessions.excluded.get(
                    core.QUARANTINED_SESSION, 0
                ),
                "events ignored: after max_session_days": sessions.excluded.get(
                    core.AFTER_MAX_SESSION_DAYS, 0
                ),
            }
        ),
    )
    yield MaterializeResult(
        asset_key=SUPERSEDED_SESSIONS,
        metadata=dagster_metadata({**base, "rows written": written.get("superseded ids", 0)}),
    )
    yield MaterializeResult(
        asset_key=INCREMENTAL_MANIFEST,
        metadata=dagster_metadata(
            {
                **base,
                "rows written": len(run.manifest) if run.moved else 0,
                "seconds": round(seconds, 3),
                "manifest": MetadataValue.md(manifest_markdown(run.manifest)),
            }
        ),
    )


def manifest_markdown(manifest: dict[str, ModelState]) -> str:
    """The manifest as a Markdown table (the incremental_manifest asset's metadata)."""
    lines = ["| model | last_success | consumed version | processed through |", "|---|---|---|---|"]
    for s in sorted(manifest.values(), key=lambda s: s.model):
        lines.append(
            f"| {s.model} | {iso_or_none(s.last_success)} | {s.consumed_version} | {iso_or_none(s.processed_through)} |"
        )
    return "\n".join(lines)
