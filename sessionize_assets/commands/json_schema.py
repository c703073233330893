"""JSON Schemas (draft 2020-12) of the `--json` documents, version 1 (docs/json.md).

`schema_of(name)` is the schema of the document `sessionize/<name>`; the same schemas are committed
as `docs/json-schema/<name>.json` (written by `python -m sessionize_assets.commands.json_schema`,
checked by a test), so monitoring can validate what it consumes. Every documented field is required (a
missing value is `null`, never an absent field), and unknown fields are allowed: within a
version fields are only added. An error document (exit status 2, 3, 4 or 130) holds the envelope
alone, so each schema accepts either the envelope with an error or the full content.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from sessionize_assets.commands.json_output import ERROR_KINDS, SCHEMA_VERSION

DRAFT = "https://json-schema.org/draft/2020-12/schema"

STRING: dict[str, Any] = {"type": "string"}
INTEGER: dict[str, Any] = {"type": "integer"}
BOOLEAN: dict[str, Any] = {"type": "boolean"}
NUMBER: dict[str, Any] = {"type": "number"}
DATE: dict[str, Any] = {"type": "string", "pattern": r"^\d{4}-\d{2}-\d{2}$"}
INSTANT: dict[str, Any] = {
    "type": "string",
    "pattern": r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?\+00:00$",
}
DATES: dict[str, Any] = {"type": "array", "items": DATE}


def nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [schema, {"type": "null"}]}


def obj(fields: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """An object holding every one of `fields` (others allowed)."""
    return {"type": "object", "required": list(fields), "properties": fields}


def array_of(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "array", "items": schema}


def map_of(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "additionalProperties": schema}


def one_of(*values: str) -> dict[str, Any]:
    return {"type": "string", "enum": list(values)}


ITEM_STATES = ("free", "locked", "fail-locked", "skipped", "processed", "invalid")
ITEM = obj(
    {
        "item_id": STRING,
        "state": one_of(*ITEM_STATES),
        "holder_run_id": nullable(STRING),
        "application": nullable(STRING),
        "lock_age_seconds": nullable(INTEGER),
        "last_record_at": nullable(INSTANT),
        "record_count": INTEGER,
        "reason": nullable(STRING),
    }
)


def _window(end_inclusive: bool) -> dict[str, Any]:
    return obj({"start": INSTANT, "end": INSTANT, "end_inclusive": {"const": end_inclusive}})


def _run_limits(states: tuple[str, ...], end_inclusive: bool, **more: Any) -> dict[str, Any]:
    return obj(
        {
            "state": one_of(*states),
            "message": STRING,
            "window": _window(end_inclusive),
            **more,
        }
    )


FAILURE = nullable(
    obj({"runs": INTEGER, "since": INSTANT, "latest_run_id": STRING, "error": STRING})
)


def _branch(fields: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """A branch of `status`: readable (every field), or unreadable (a sentence, the fields null)."""
    base = {"failure": FAILURE}
    readable = obj({**base, "unreadable": {"type": "null"}, **fields})
    unreadable = obj({**base, "unreadable": STRING, **{k: {"type": "null"} for k in fields}})
    return {"anyOf": [readable, unreadable]}


TIME_BASED_STATUS = _branch(
    {
        "run_limits": _run_limits(("first_run", "out_of_sync", "standard"), False),
        "next_run": obj(
            {"load_days": DATES, "earlier_load_days": DATES, "deferred_load_days": DATES}
        ),
        "pending_filtered_load_days": DATES,
        "pending_decision_load_days": DATES,
        "event_days_awaiting_aggregation": DATES,
        "pending_event_days": array_of(
            obj(
                {
                    "event_date": DATE,
                    "pending_rows": INTEGER,
                    "rows_aggregated": INTEGER,
                    "horizon": nullable(DATE),
                    "rows_skipped_so_far": INTEGER,
                }
            )
        ),
        "pending_rows": INTEGER,
        "skipped": obj({"event_days": INTEGER, "rows": INTEGER}),
        "unaccounted_event_days": DATES,
        "attributes_stale": BOOLEAN,
    }
)
SESSION_BASED_STATUS = _branch(
    {
        "run_limits": _run_limits(
            ("first_run", "out_of_sync", "standard", "new_model"),
            True,
            window_reaches_now=BOOLEAN,
        ),
        "models": array_of(
            obj(
                {
                    "model": STRING,
                    "in_manifest": BOOLEAN,
                    "last_success": nullable(INSTANT),
                    "consumed_version": nullable(INTEGER),
                    "processed_through": nullable(INSTANT),
                    "pending_versions": INTEGER,
                }
            )
        ),
        "filtered_events_version": nullable(INTEGER),
        "quarantined_sessions": INTEGER,
    }
)

CONTENT: dict[str, dict[str, dict[str, Any]]] = {
    "status": {
        "time_based": TIME_BASED_STATUS,
        "session_based": SESSION_BASED_STATUS,
        "processing_manifest": obj(
            {
                "items": INTEGER,
                "by_state": obj(dict.fromkeys(ITEM_STATES, INTEGER)),
                "attention": array_of(ITEM),
            }
        ),
        "cursor_checkpoints": array_of(
            obj(
                {
                    "name": STRING,
                    "done_before": nullable(INSTANT),
                    "partitions": map_of(nullable(INSTANT)),
                    "run_id": nullable(STRING),
                    "checkpoint_time": INSTANT,
                }
            )
        ),
    },
    "status-lateness": {
        "load_days": array_of(
            obj(
                {
                    "load_day": DATE,
                    "rows": INTEGER,
                    "late_rows": INTEGER,
                    "late_share": NUMBER | {"minimum": 0, "maximum": 1},
                    "p50_days": INTEGER,
                    "p95_days": INTEGER,
                    "max_days": INTEGER,
                    "rows_by_days_late": {
                        "type": "object",
                        "propertyNames": {"pattern": r"^-?\d+$"},
                        "additionalProperties": INTEGER,
                    },
                }
            )
        )
    },
    "verify": {
        "ok": BOOLEAN,
        "differences": INTEGER,
        "checks": array_of(
            obj(
                {
                    "branch": one_of("time_based", "session_based"),
                    "table": STRING,
                    "check": one_of(
                        "accounting", "duplicates", "recompute", "consistency", "listing"
                    ),
                    "rows_compared": nullable(INTEGER),
                    "differences": INTEGER,
                    "not_listed": INTEGER,
                    "details": array_of(
                        obj(
                            {
                                "table": STRING,
                                "kind": nullable(
                                    one_of(
                                        "missing",
                                        "unexpected",
                                        "different",
                                        "pending",
                                        "inconsistent",
                                    )
                                ),
                                "key": nullable(STRING),
                                "detail": STRING,
                            }
                        )
                    ),
                }
            )
        ),
        "time_based": obj(
            {
                "event_days_checked": INTEGER,
                "pending_rows": map_of(INTEGER),
                "pending_load_days": DATES,
            }
        ),
        "session_based": obj(
            {
                "processed_through": nullable(INSTANT),
                "waiting_rows": INTEGER,
                "lifecycle_runs_replayed": nullable(INTEGER),
                "lifecycle_taken_as_given": nullable(STRING),
            }
        ),
    },
    "manifest-list": {
        "filter": obj({"state": nullable(one_of(*ITEM_STATES)), "item_prefix": nullable(STRING)}),
        "items": array_of(ITEM),
    },
    "manifest-show": {
        "item": {"allOf": [ITEM, obj({"description": STRING})]},
        "records": array_of(
            obj(
                {
                    "time": INSTANT,
                    "state": one_of(
                        "New", "Processing", "Processed", "Failed", "Resolved", "Skipped"
                    ),
                    "application": nullable(STRING),
                    "run_id": nullable(STRING),
                    "record_id": STRING,
                    "previous_record_id": nullable(STRING),
                    "payload": nullable({"type": "object"}),
                }
            )
        ),
    },
    "load": {
        "files": array_of(
            obj(
                {
                    "path": STRING,
                    "sha256": STRING,
                    "load_id": nullable(STRING),
                    "status": one_of("loaded", "skipped"),
                    "skipped_reason": nullable(STRING),
                    "rows_read": INTEGER,
                    "rows_kept": INTEGER,
                    "rows_rejected": INTEGER,
                    "rows_by_load_day": map_of(INTEGER),
                    "rejected_by_reason": map_of(INTEGER),
                }
            )
        ),
        "totals": obj(
            dict.fromkeys(
                ("files", "files_loaded", "files_skipped", "rows_read", "rows_kept"),
                INTEGER,
            )
            | {"rows_rejected": INTEGER}
        ),
        "load_days": DATES,
        "by_load_date": nullable(
            obj(
                {
                    "windows": array_of(
                        obj(
                            {"source": STRING, "start": INSTANT, "end": INSTANT, "load_days": DATES}
                        )
                    ),
                    "checkpoints": INTEGER,
                    "cursor": one_of("per_source", "global"),
                }
            )
        ),
    },
}

NAMES: tuple[str, ...] = tuple(CONTENT)


def schema_of(name: str) -> dict[str, Any]:
    """The JSON Schema of `sessionize/<name>` documents (`NAMES`)."""
    if name not in CONTENT:
        raise KeyError(f"no --json document is named {name!r}; known: {', '.join(NAMES)}")
    envelope = {
        "schema": {"const": f"sessionize/{name}"},
        "version": {"const": SCHEMA_VERSION},
        "exit_status": {"type": "integer", "enum": [0, 1, *sorted(ERROR_KINDS)]},
    }
    error = obj({"kind": one_of(*ERROR_KINDS.values()), "message": STRING})
    ran = obj({**envelope, "error": {"type": "null"}, **CONTENT[name]})
    ran["properties"]["exit_status"] = {"type": "integer", "enum": [0, 1]}
    failed = obj({**envelope, "error": error})
    failed["properties"]["exit_status"] = {"type": "integer", "enum": sorted(ERROR_KINDS)}
    return {
        "$schema": DRAFT,
        "title": f"sessionize/{name}, version {SCHEMA_VERSION}",
        "oneOf": [ran, failed],
    }


def write_all(folder: Path) -> list[Path]:
    """Write every schema as `<folder>/<name>.json` (the committed copies in docs/json-schema)."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name in NAMES:
        path = folder / f"{name}.json"
        path.write_text(rendered(name))
        written.append(path)
    return written


def rendered(name: str) -> str:
    """The schema of `name` as the committed file holds it."""
    return json.dumps(schema_of(name), indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":
    for written in write_all(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/json-schema")):
        print(written)
