"""One run of every enabled session model over the window the manifest gives
(`run_session_models`): the imperative shell the `session_models` asset calls, callable without
Dagster. Run limits are computed once; each model that is not already past the window takes on
the window's rows and the change feed after its consumed version (or is rebuilt in full when it
cannot), and only a model that succeeded moves its `last_success` and consumed version. The run's
outcome says what each model did and whether the models are caught up (`core.run_limits.caught_up`).
"""

from __future__ import annotations

import datetime as dt
import logging
import time
import traceback
from typing import Any

from pyspark.sql import SparkSession

from sessionize_assets.core import model_definitions, run_history
from sessionize_assets.core import sessionize as core
from sessionize_assets.core.clock import as_utc, iso_or_none
from sessionize_assets.core.run_limits import (
    NO_DATA_WARNING,
    caught_up,
    next_last_success,
    restated,
    skips_window,
)
from sessionize_assets.errors import SettingsError
from sessionize_assets.resources import shared_reads
from sessionize_assets.resources.delta import (
    data_skipping_when_it_pays,
    delta_version,
    read_pinned,
)
from sessionize_assets.resources.spark import small_query_conf
from sessionize_assets.resources.tables import (
    FILTERED_EVENTS,
    INCREMENTAL_MANIFEST,
    SESSIONS,
    SESSIONS_LIFECYCLE_MANIFEST,
)
from sessionize_assets.sessions.changes import Changes, FeedGone, read_changes
from sessionize_assets.sessions.frames import add_counts, small_results, small_run
from sessionize_assets.sessions.modes import mode_for
from sessionize_assets.sessions.outcome import ModelOutcome, SessionModelError, SessionRunOutcome
from sessionize_assets.sessions.state import (
    ModelState,
    enabled_models,
    limits_from,
    read_manifest,
    settings_refusal,
    write_manifest,
)
from sessionize_assets.sessions.steps import (
    SessionsWrite,
    TouchedUsers,
    changed_user_names,
    max_session_ts,
    next_data_after,
    process_sessions,
    process_user_model,
    rebuild_sessions,
    rebuild_user_model,
    touched_users,
    touched_users_named,
)
from sessionize_assets.sessions.tables import TablePath
from sessionize_assets.settings import Settings


def run_session_models(
    spark: SparkSession,
    table_path: TablePath,
    settings: Settings,
    now: dt.datetime,
    log: logging.Logger | Any | None = None,
    refresh: bool = False,
    restate_from: dt.date | None = None,
    record: dict[str, Any] | None = None,
) -> SessionRunOutcome:
    """One run of every enabled session model over the window the manifest gives (the imperative
    shell the `session_models` asset calls). `refresh`: rebuild every model in full from
    filtered_events up to the upper limit, forgetting the lifecycle manifest (`sessionize
    refresh`); otherwise a run refuses settings that define the models differently from those that
    built them (`state.settings_refusal`). `restate_from` (`sessionize refresh --from DAY`): the
    window starts at that day at the latest, so every session with an event from that day on is
    recomputed from filtered_events, as a run's lookback recomputes the last hours' sessions
    (`core.run_limits.restated`). Delta's data skipping is on only where it pays
    (`data_skipping_when_it_pays` on filtered_events, sessions and the lifecycle manifest).

    `record` (the run lock's payload, kept in the processing manifest) is filled as the run goes
    with what `verify` needs to replay it (`core.run_history.record_keys`): the version read, the
    upper limit, the memory, and how far the sessions step got."""
    tables = [
        table_path(FILTERED_EVENTS),
        table_path(SESSIONS),
        table_path(SESSIONS_LIFECYCLE_MANIFEST),
    ]
    with data_skipping_when_it_pays(spark, tables, settings.spark):
        return _run_session_models(
            spark, table_path, settings, now, log, refresh, restate_from, record
        )


def _run_session_models(
    spark: SparkSession,
    table_path: TablePath,
    settings: Settings,
    now: dt.datetime,
    log: logging.Logger | Any | None,
    refresh: bool,
    restate_from: dt.date | None,
    record: dict[str, Any] | None,
) -> SessionRunOutcome:
    log = log or logging.getLogger(__name__)
    record = {} if record is None else record
    now = as_utc(now)
    models = enabled_models(settings)
    mode = mode_for(settings)
    manifest = read_manifest(table_path)
    if not refresh:
        refused = settings_refusal(settings, manifest)
        if refused:
            raise SettingsError(refused)
    limits = limits_from(manifest, settings, now)
    if restate_from is not None:
        limits = restated(limits, restate_from)
    for line in limits.log_lines():
        log.info(line)
    fe_path = table_path(FILTERED_EVENTS)
    version = delta_version(fe_path)
    record.update(run_history.record_keys(version, limits.upper_limit, forgets_memory=refresh))
    outcomes = {
        m: ModelOutcome(
            model=m,
            last_success_before=manifest[m].last_success if m in manifest else None,
            last_success_after=manifest[m].last_success if m in manifest else None,
            consumed_version_before=manifest[m].consumed_version if m in manifest else None,
            consumed_version_after=manifest[m].consumed_version if m in manifest else None,
        )
        for m in models
    }
    run = SessionRunOutcome(
        limits=limits, snapshot_version=version, models=outcomes, manifest=dict(manifest)
    )
    if version is None:
        warning = NO_DATA_WARNING.format(table=FILTERED_EVENTS)
        log.warning(warning)
        run.warnings.append(warning)
        for o in outcomes.values():
            o.no_data = True
        run.catch_up = caught_up(
            now,
            run.last_run(),
            resumes_at=lambda: next_data_after(spark, table_path, settings, limits.upper_limit),
        )
        return run

    # The event days the time-based branch just read at this version come from memory when both
    # run in one command (resources/shared_reads.py); the rest from storage.
    snapshot = shared_reads.table_at(
        fe_path,
        version,
        lambda: read_pinned(spark, fe_path, version, core.shared_columns(settings)),
        core.shared_columns(settings),
    )
    changes_by_version: dict[int | None, Changes] = {}
    touched_by_version: dict[int | None, TouchedUsers] = {}
    sessions_write: SessionsWrite | None = None
    failed: str | None = None
    try:
        for model in models:
            outcome = outcomes[model]
            state = manifest.get(model)
            if (
                not refresh
                and restate_from is None
                and skips_window(state.last_success if state else None, limits)
            ):
                outcome.skipped_reason = (
                    f"already past this window (last_success {state.last_success.isoformat()} "
                    f">= upper limit {limits.upper_limit.isoformat()})"
                )
                log.info(f"{model}: {outcome.skipped_reason}")
                continue
            if failed:
                outcome.skipped_reason = f"not run: {failed} failed"
                continue
            started = time.monotonic()
            consumed = state.consumed_version if state else None
            try:
                rebuild = _rebuild_reason(spark, table_path, model, state, version)
                if refresh and model == SESSIONS:
                    rebuild = "refresh requested: rebuilding sessions in full from filtered_events"
                if rebuild is None and model != SESSIONS and outcomes[SESSIONS].full_rebuild_reason:
                    rebuild = f"sessions were rebuilt in full; rebuilding {model} in full"
                changes = None
                if rebuild is None:
                    try:
                        if consumed not in changes_by_version:
                            changes_by_version[consumed] = read_changes(
                                spark, fe_path, snapshot, settings, limits, version, consumed
                            )
                        changes = changes_by_version[consumed]
                    except FeedGone as gone:
                        rebuild = (
                            f"the change data feed of filtered_events no longer covers version "
                            f"{consumed + 1 if consumed is not None else 0} ({gone}); rebuilding {model} in full"
                        )
                if rebuild is not None:
                    log.warning(f"{model}: {rebuild}")
                    run.warnings.append(f"{model}: {rebuild}")
                    outcome.full_rebuild_reason = rebuild
                    if model == SESSIONS:
                        record[run_history.SESSIONS_KEY] = run_history.STARTED
                        rebuild_sessions(
                            spark,
                            table_path,
                            settings,
                            mode,
                            snapshot,
                            limits.upper_limit,
                            now,
                            outcome,
                            forget_lifecycle=refresh,
                        )
                    else:
                        rebuild_user_model(spark, table_path, model, outcome)
                    processed = max_session_ts(snapshot, settings, limits)
                    outcome.ran = True
                    if model == SESSIONS:
                        record[run_history.SESSIONS_KEY] = run_history.RAN
                    _advance(outcome, processed, version)
                    continue
                assert changes is not None
                outcome.rows_read["window rows"] = changes.window_rows
                outcome.rows_read["change feed rows"] = changes.feed_rows
                if not changes.found_data:
                    warning = NO_DATA_WARNING.format(table=FILTERED_EVENTS)
                    log.warning(f"{model}: {warning}")
                    if warning not in run.warnings:
                        run.warnings.append(warning)
                    outcome.no_data = True
                    continue
                add_counts(outcome.excluded, changes.excluded)
                small = small_run(changes.window_rows + changes.feed_rows)
                with small_query_conf(spark, small), small_results(small):
                    if model == SESSIONS:
                        record[run_history.SESSIONS_KEY] = run_history.STARTED
                        sessions_write = process_sessions(
                            spark,
                            table_path,
                            settings,
                            mode,
                            limits,
                            snapshot,
                            changes,
                            now,
                            outcome,
                            version=version,
                        )
                    else:
                        # The change set's users too, not only those whose sessions this run
                        # replaced: after a run stopped between its sessions commit and the
                        # manifest, a session it deleted is no longer in the table, so its user
                        # is in no replaced row, and only the change set still names them.
                        # The same users for every user model of one change set: read once.
                        if consumed not in touched_by_version:
                            named = changed_user_names(mode, changes, sessions_write)
                            if named is not None:  # the driver holds them all
                                touched_by_version[consumed] = touched_users_named(
                                    spark, table_path, named
                                )
                            else:
                                users = mode.affected_users(
                                    spark, changes, table_path(SESSIONS_LIFECYCLE_MANIFEST)
                                )
                                if sessions_write is not None:
                                    users = users.unionByName(
                                        sessions_write.users.select("user_identifier")
                                    ).distinct()
                                touched_by_version[consumed] = touched_users(
                                    spark, table_path, users
                                )
                        touched = touched_by_version[consumed]
                        process_user_model(spark, table_path, model, touched, outcome)
                outcome.ran = True
                if model == SESSIONS:
                    record[run_history.SESSIONS_KEY] = run_history.RAN
                _advance(outcome, changes.processed_max, version)
            except Exception as exc:
                outcome.failed = (
                    f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                )
                log.error(f"{model} failed: {outcome.failed}\n{traceback.format_exc()}")
                failed = model
            finally:
                outcome.seconds = time.monotonic() - started
                if outcome.ran:
                    log.info(
                        f"{model}: read {outcome.total_rows_read} rows, wrote {outcome.total_rows_written}, "
                        f"touched {outcome.touched}; last_success {iso_or_none(outcome.last_success_after)}"
                    )
    finally:
        for touched in touched_by_version.values():
            touched.unpersist()
        for changes in changes_by_version.values():
            changes.unpersist()
        if sessions_write is not None:
            sessions_write.users.unpersist()

    new_manifest = dict(manifest)
    for model, outcome in outcomes.items():
        if outcome.ran and outcome.last_success_after is not None:
            new_manifest[model] = ModelState(
                model=model,
                last_success=outcome.last_success_after,
                consumed_version=outcome.consumed_version_after,
                processed_through=limits.upper_limit,
                updated_at=now,
                definition=model_definitions.encode(model_definitions.definition(settings)),
            )
    run.manifest_changed = new_manifest != manifest
    if run.manifest_changed:
        write_manifest(table_path(INCREMENTAL_MANIFEST), new_manifest)
    run.manifest = new_manifest
    run.next_limits = limits_from(new_manifest, settings, now)
    if failed:
        raise SessionModelError(failed, outcomes[failed].failed or "", run)
    run.catch_up = caught_up(
        now,
        run.last_run(),
        resumes_at=lambda: next_data_after(spark, table_path, settings, limits.upper_limit),
    )
    return run


def _advance(outcome: ModelOutcome, processed: dt.datetime | None, version: int) -> None:
    """Move last_success forward (never back) and record the consumed version."""
    after = next_last_success(outcome.last_success_before, processed, succeeded=True)
    outcome.last_success_after = after
    if after is not None:
        outcome.consumed_version_after = version


def _rebuild_reason(
    spark: SparkSession, table_path: TablePath, model: str, state: ModelState | None, version: int
) -> str | None:
    """Why a model cannot continue incrementally (None: it can)."""
    if state is None or state.consumed_version is None:
        return None
    if delta_version(table_path(model)) is None:
        return f"{model} has a manifest row but no table; rebuilding it in full"
    if version < state.consumed_version:
        return (
            f"filtered_events is at version {version}, before the consumed version "
            f"{state.consumed_version} (table replaced?); rebuilding {model} in full"
        )
    return None
