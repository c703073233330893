"""The user-level models (`users`, `user_session_stats`) of a few users, in plain Python over
session rows the driver holds, and the MERGE source that changes the stored rows: the same
values, in the same Arrow types, as Spark's `core.sessionize.users_from_sessions` /
`user_session_stats_from_sessions` and `sessions.frames.without_unchanged` give.

A small session run recomputes the user rows of a few thousand users; through Spark that was
five queries of 0.1-0.6 s each over driver-local data (docs/benchmarks.md, "Session 36").
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql import types as T
from pyspark.sql.pandas.types import to_arrow_schema

from sessionize_assets.core.clock import to_micros
from sessionize_assets.core.sessionize import USER_COLUMNS, USER_SESSION_STATS_COLUMNS

USERS = "users"
USER_SESSION_STATS = "user_session_stats"
KEY = "user_identifier"

# The models' columns in the types Spark computes them in (the tables' own types).
_TYPES: dict[str, T.DataType] = {
    KEY: T.StringType(),
    "first_session_start_tstamp": T.TimestampType(),
    "last_session_end_tstamp": T.TimestampType(),
    "sessions": T.LongType(),
    "total_events": T.LongType(),
    "page_views": T.LongType(),
    "total_duration_s": T.DoubleType(),
    "mean_duration_s": T.DoubleType(),
    "median_duration_s": T.DoubleType(),
    "min_duration_s": T.DoubleType(),
    "max_duration_s": T.DoubleType(),
}
MODEL_COLUMNS: dict[str, tuple[str, ...]] = {
    USERS: USER_COLUMNS,
    USER_SESSION_STATS: USER_SESSION_STATS_COLUMNS,
}


def source_schema(model: str) -> pa.Schema:
    """The Arrow schema of a model's MERGE source: its columns, then `_delete`."""
    fields = [T.StructField(c, _TYPES[c]) for c in MODEL_COLUMNS[model]]
    fields.append(T.StructField("_delete", T.BooleanType()))
    return to_arrow_schema(T.StructType(fields), timezone="UTC")


def _sum(values: list[int]) -> int | None:
    return sum(values) if values else None


def _median(values: list[int]) -> float | None:
    """Spark's `percentile(x, 0.5)`: linear interpolation between the two middle values."""
    if not values:
        return None
    ordered = sorted(values)
    position = (len(ordered) - 1) * 0.5
    lower, higher = math.floor(position), math.ceil(position)
    if lower == higher or ordered[lower] == ordered[higher]:
        return float(ordered[lower])
    return (higher - position) * float(ordered[lower]) + (position - lower) * float(ordered[higher])


def _seconds(micros: int | float | None) -> float | None:
    return None if micros is None else float(micros) / 1_000_000.0


def user_rows(model: str, sessions: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The model's rows of the users of `sessions` (session rows as dicts; users whose
    identifier is null are left out), one per user."""
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for row in sessions:
        if row[KEY] is not None:
            groups.setdefault(row[KEY], []).append(row)
    if model == USERS:
        return [_user(user, rows) for user, rows in groups.items()]
    if model == USER_SESSION_STATS:
        return [_stats(user, rows) for user, rows in groups.items()]
    raise ValueError(f"not a user model: {model!r}")


def _user(user: str, rows: list[Mapping[str, Any]]) -> dict[str, Any]:
    starts = [r["start_tstamp"] for r in rows if r["start_tstamp"] is not None]
    ends = [r["end_tstamp"] for r in rows if r["end_tstamp"] is not None]
    return {
        KEY: user,
        "first_session_start_tstamp": min(starts) if starts else None,
        "last_session_end_tstamp": max(ends) if ends else None,
        "sessions": len(rows),
        "total_events": _sum([r["total_events"] for r in rows if r["total_events"] is not None]),
        "page_views": _sum([r["page_views"] for r in rows if r["page_views"] is not None]),
    }


def _stats(user: str, rows: list[Mapping[str, Any]]) -> dict[str, Any]:
    durations = [
        to_micros(r["end_tstamp"]) - to_micros(r["start_tstamp"])
        for r in rows
        if r["start_tstamp"] is not None and r["end_tstamp"] is not None
    ]
    total = _sum(durations)
    return {
        KEY: user,
        "sessions": len(rows),
        "total_duration_s": _seconds(total),
        # Spark divides the sum by the count as doubles, then by a million.
        "mean_duration_s": None if total is None else float(total) / float(len(rows)) / 1e6,
        "median_duration_s": _seconds(_median(durations)),
        "min_duration_s": _seconds(min(durations) if durations else None),
        "max_duration_s": _seconds(max(durations) if durations else None),
    }


def same_value(value: Any, other: Any) -> bool:
    """Spark's null-safe equality (`<=>`, and a struct's field by field): nulls are equal, so
    are two NaNs, and 0.0 equals -0.0."""
    if value is None or other is None:
        return value is None and other is None
    if isinstance(value, float) and isinstance(other, float):
        return value == other or (math.isnan(value) and math.isnan(other))
    return value == other


def changed_rows(
    rows: Sequence[Mapping[str, Any]],
    users: Iterable[str],
    stored: Iterable[Mapping[str, Any]],
    columns: Sequence[str],
) -> tuple[list[dict[str, Any]], int]:
    """The MERGE source that brings the stored rows of `users` to `rows` (`columns`, then
    `_delete`): each row that differs from its stored row (null-safe on every column) or has
    none, and a removal for each stored user of `users` left without a row; with the count of
    rows of the full source (`rows` plus one removal per user of `users` without a row, stored
    or not), which is the number of users the run touched."""
    computed = {r[KEY] for r in rows}
    gone = sorted({u for u in users if u is not None} - computed)
    by_user: dict[str, list[Mapping[str, Any]]] = {}
    for row in stored:
        by_user.setdefault(row[KEY], []).append(row)
    changed = [
        {**{c: row[c] for c in columns}, "_delete": False}
        for row in rows
        if not any(
            all(same_value(row[c], s[c]) for c in columns) for s in by_user.get(row[KEY], [])
        )
    ]
    changed += [
        {**{c: (user if c == KEY else None) for c in columns}, "_delete": True}
        for user in gone
        if user in by_user
    ]
    return changed, len(rows) + len(gone)
