"""The settings that shape the models' rows, and what a change of them means (plain Python, no
Spark).

Each session model's `incremental_manifest` row records the definition it was built with; the
time-based models' definitions are in `time_based_definitions` (`TIME_BASED_SHAPING`). A run whose
settings define the model differently would write rows of the new definition next to rows of the
old one, so it stops instead, naming the setting, both values and the command that rebuilds the
model. Settings that only change how much one run does (run limits, look-back windows, Spark
options, thresholds) are not part of a definition and never stop a run.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from collections.abc import Mapping, Sequence
from typing import Any

# Settings every session model depends on, whatever the mode.
SHAPING = (
    "session_mode",
    "session_identifier",
    "user_identifier",
    "session_timestamp",
    "max_session_days",
    "days_late_allowed",
    "start_date",
)
# Settings only one mode reads.
SHAPING_IN_MODE = {"gap": ("session_gap_minutes",), "id": ()}


# The time-based models and the settings that shape their rows. `attributes` is not listed: its
# commit records the definitions it was computed with, and it is recomputed in full when they
# differ (core.attributes.definition_fingerprint), so it never mixes two definitions.
# `start_date` is not either: it bounds which load days are processed, and a processed day
# before a later start_date is not rewritten by any run (see docs/time_based.md).
TIME_BASED_SHAPING: dict[str, tuple[str, ...]] = {
    "filtered_events": ("app_ids", "event_names", "dedupe_lookback_days"),
    "daily_aggregates": ("user_identifier", "attributes"),
}


def _plain(value: Any) -> Any:
    """A settings value as JSON keeps it (tuples as lists, dates as ISO strings, an attribute
    definition as a mapping)."""
    if isinstance(value, dt.date):
        return value.isoformat()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    return value


def definition(settings: Any) -> dict[str, Any]:
    """The values of the settings that shape a session model under `settings`."""
    keys = SHAPING + SHAPING_IN_MODE.get(settings.session_mode, ())
    return {k: _plain(getattr(settings, k)) for k in keys}


# What of an attribute definition shapes `daily_aggregates`' partial (its `period` is applied by
# `attributes` only, which is recomputed in full each time).
PARTIAL_FIELDS = ("name", "aggregation", "property", "event_names")
# Settings whose order means nothing: compared as sets.
UNORDERED = ("app_ids", "event_names")


def time_based_definition(model: str, settings: Any) -> dict[str, Any]:
    """The values of the settings that shape a time-based model under `settings` (filters as
    sorted lists, attributes by name without their period: reordering a list or changing a period
    changes no row of the model)."""
    values: dict[str, Any] = {}
    for key in TIME_BASED_SHAPING[model]:
        value = getattr(settings, key)
        if key in UNORDERED:
            values[key] = sorted(_plain(value))
        elif key == "attributes":
            values[key] = sorted(
                (
                    {
                        f: sorted(_plain(getattr(a, f)))
                        if f == "event_names"
                        else _plain(getattr(a, f))
                        for f in PARTIAL_FIELDS
                    }
                    for a in value
                ),
                key=lambda a: a["name"],
            )
        else:
            values[key] = _plain(value)
    return values


def time_based_verdict(
    recorded: Mapping[str, str], settings: Any, models: Sequence[str] | None = None
) -> tuple[str | None, list[str]]:
    """(the refusal for the first model whose recorded definition differs from `settings`', the
    models with no recorded definition yet: to record as they are). `models`: those to look at
    (default: every time-based model)."""
    missing: list[str] = []
    for model in models if models is not None else TIME_BASED_SHAPING:
        current = time_based_definition(model, settings)
        if model not in recorded:
            missing.append(model)
            continue
        changes = changed_settings(recorded[model], current)
        if changes:
            return refusal(model, changes), missing
    return None, missing


def encode(values: Mapping[str, Any]) -> str:
    """A definition as the manifest stores it (stable JSON)."""
    return json.dumps(dict(values), sort_keys=True, separators=(",", ":"))


def changed_settings(
    recorded: str | None, current: Mapping[str, Any]
) -> list[tuple[str, Any, Any]]:
    """`(setting, recorded value, current value)` for every setting that differs, in the order of
    `SHAPING`; none when nothing was recorded (a table built before definitions were kept)."""
    if not recorded:
        return []
    before = json.loads(recorded)
    if before.get("session_mode") != current.get("session_mode"):
        keys = ["session_mode"]  # the other settings mean something else in the other mode
    else:
        keys = list(dict.fromkeys([*SHAPING, *sorted(set(before) | set(current))]))
    return [(k, before.get(k), current.get(k)) for k in keys if before.get(k) != current.get(k)]


def _shown(value: Any) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(_shown(v) for v in value) + "]"
    if isinstance(value, dict):
        return (
            "{"
            + ", ".join(f"{k}: {_shown(v)}" for k, v in value.items() if v not in ((), [], None))
            + "}"
        )
    return "unset" if value is None else str(value)


def refusal(model: str, changes: list[tuple[str, Any, Any]]) -> str:
    """The one sentence a run stops with when `model`'s settings changed."""
    key, old, new = changes[0]
    others = ""
    if len(changes) > 1:
        others = " (and " + ", ".join(k for k, _, _ in changes[1:]) + ")"
    return (
        f"The setting {key} changed from {_shown(old)} to {_shown(new)}{others} since {model} "
        f"was built, and its rows would mix both definitions: rebuild it with "
        f"`sessionize refresh {model} --yes`, or put the setting back."
    )
