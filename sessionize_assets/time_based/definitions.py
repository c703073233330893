"""The settings each time-based model was built with (`time_based_definitions`, delta-rs), and the
refusal of a run whose settings define a model differently (`core.model_definitions`).

A definition is written only when it is missing (the model's first build, or a table built before
definitions were kept) or by `sessionize refresh`: a steady run reads one tiny table and commits
nothing here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pyarrow as pa

from sessionize_assets.core import model_definitions
from sessionize_assets.core.clock import utc_now
from sessionize_assets.errors import SettingsError
from sessionize_assets.resources.delta import exists, read_small_table, upsert_small
from sessionize_assets.settings import Settings

# Runs of `sessionize refresh` carry this tag: their assets rebuild under the new settings instead
# of refusing them.
REFRESH_TAG = "sessionize/refresh"

DEFINITIONS_SCHEMA = pa.schema(
    [
        ("model", pa.string()),
        ("definition", pa.string()),
        ("recorded_at", pa.timestamp("us", tz="UTC")),
    ]
)


def refreshing(tags: Mapping[str, str]) -> bool:
    """Is this run part of `sessionize refresh`?"""
    return tags.get(REFRESH_TAG) == "true"


def recorded(path: str) -> dict[str, str]:
    """model -> the definition it was last built with."""
    if not exists(path):
        return {}
    return {r["model"]: r["definition"] for r in read_small_table(path, ["model", "definition"])}


def refusal(path: str, settings: Settings, models: Sequence[str] | None = None) -> str | None:
    """The sentence a run of these models must stop with (their settings changed), or None."""
    return model_definitions.time_based_verdict(recorded(path), settings, models)[0]


def refuse_changed(path: str, settings: Settings, models: Sequence[str] | None = None) -> list[str]:
    """Raise SettingsError (one sentence) when a model's settings changed since it was built;
    otherwise return the models with no definition recorded yet."""
    refused, missing = model_definitions.time_based_verdict(recorded(path), settings, models)
    if refused:
        raise SettingsError(refused)
    return missing


def record(path: str, settings: Settings, models: Sequence[str]) -> None:
    """Record the models' definitions under `settings` (one commit; none when `models` is empty)."""
    if not models:
        return
    now = utc_now()
    rows = [
        {
            "model": m,
            "definition": model_definitions.encode(
                model_definitions.time_based_definition(m, settings)
            ),
            "recorded_at": now,
        }
        for m in models
    ]
    upsert_small(path, rows, DEFINITIONS_SCHEMA, "model")
