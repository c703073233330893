"""The settings that shape the session models' rows, and what a change of them means (plain
Python, no Spark).

Each model's `incremental_manifest` row records the definition it was built with. A run whose
settings define the model differently would write rows of the new definition next to rows of the
old one, so it stops instead, naming the setting, both values and the command that rebuilds the
model. Settings that only change how much one run does (run limits, look-back windows, Spark
options, thresholds) are not part of a definition and never stop a run.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping
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


def _plain(value: Any) -> Any:
    """A settings value as JSON keeps it (tuples as lists, dates as ISO strings)."""
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    return value


def definition(settings: Any) -> dict[str, Any]:
    """The values of the settings that shape a session model under `settings`."""
    keys = SHAPING + SHAPING_IN_MODE.get(settings.session_mode, ())
    return {k: _plain(getattr(settings, k)) for k in keys}


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
        return "[" + ", ".join(str(v) for v in value) + "]"
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
