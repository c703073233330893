"""The CLI's way into the session assets: materialize `session_models` in process through
`dagster.materialize` on a given instance (so each run is recorded there and shows in the UI),
under the processing-manifest lock, and hand back what the run did as typed records (the run's
`SessionRunOutcome`, observed from the op) -- never by reading its metadata back.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sessionize_assets.errors import SettingsError
from sessionize_assets.resources.dead_runs import run_tags
from sessionize_assets.resources.manifest_lock import session_lock
from sessionize_assets.sessions.assets import ASSET_NAME, build_assets
from sessionize_assets.sessions.outcome import SessionRunOutcome
from sessionize_assets.sessions.state import read_manifest, settings_refusal

if TYPE_CHECKING:
    from sessionize_assets.lake import LakeAccess


@dataclass(frozen=True)
class Materialized:
    """One materialization of the session models: its run id and outcome, or why it failed."""

    run_id: str
    outcome: SessionRunOutcome | None  # None when the run failed
    error: str | None = None
    blocked: bool = False  # the run failed because an item is held by another run

    @property
    def ok(self) -> bool:
        return self.error is None and self.outcome is not None


class SessionMaterializer:
    """Materializes the session models, one run per call, with the same definitions each time."""

    def __init__(
        self,
        lake: LakeAccess,
        spark: Any,
        instance: Any,
        tags: Mapping[str, str] | None = None,
    ) -> None:
        self._lake = lake
        self._spark = spark
        self._instance = instance
        self._tags = {**(tags or {"sessionize/lane": "sessions"}), **run_tags()}
        self._seen: list[SessionRunOutcome] = []
        self._definitions = build_assets(
            lake.settings, lock=session_lock, observe=self._seen.append
        )

    def __call__(
        self, refresh: bool = False, yes: bool = False, restate_from: dt.date | None = None
    ) -> Materialized:
        """One run; `refresh` rebuilds every model in full (`yes` confirms it), `restate_from`
        recomputes every session with an event from that day on (`yes` confirms it). A run whose
        settings define the models differently from those that built them is refused here, before
        any Dagster run or Spark work (SettingsError: one sentence, exit status 2)."""
        import dagster

        if not refresh:
            refused = settings_refusal(self._lake.settings, read_manifest(self._lake.table))
            if refused:
                raise SettingsError(refused)
        self._seen.clear()
        config: dict[str, object] = {"refresh": refresh, "yes": yes}
        if restate_from is not None:
            config["restate_from"] = restate_from.isoformat()
        result = dagster.materialize(
            self._definitions,
            instance=self._instance,
            resources={"lake": self._lake.resource(), "spark": self._spark},
            raise_on_error=False,
            tags=self._tags,
            run_config={"ops": {ASSET_NAME: {"config": config}}},
        )
        if not result.success:
            message, kind = _failure(result)
            return Materialized(
                result.run_id,
                None,
                message or "the session models run failed",
                blocked=kind == "ItemLockedError",
            )
        if not self._seen:  # the op succeeded without reporting: not expected
            return Materialized(result.run_id, None, "the session models run reported no outcome")
        return Materialized(result.run_id, self._seen[-1])


def _failure(result: Any) -> tuple[str | None, str | None]:
    """(the first line of the failed step's root error, its class name), from the run's events.
    Dagster wraps the user's error: the innermost cause is the one to report."""
    for event in result.all_events:
        if event.is_failure and event.step_failure_data is not None:
            error = event.step_failure_data.error
            while error is not None and error.cause is not None:
                error = error.cause
            if error is None:
                return None, None
            lines = [line for line in error.message.strip().splitlines() if line.strip()]
            return (lines[0] if lines else error.cls_name), error.cls_name
    return None, None
