"""Replacing recomputed sessions in `sessions` and renumbering their users' later sessions, in
plain Python over rows the driver holds: the MERGE source and counts `sessions.steps.
replace_sessions` computes with Spark, the same rows and numbers (`replacement`).

A small session run replaces a few thousand sessions; through Spark that was three queries
and a fetch over driver-local data, about 2 s of a 5,000-event day on the 30-day benchmark
home (docs/benchmarks.md, "Session 36").
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql import types as T
from pyspark.sql.pandas.types import to_arrow_schema

from sessionize_assets.core.sessionize import SESSION_COLUMNS
from sessionize_assets.core.user_models import same_value

CONTENT = tuple(c for c in SESSION_COLUMNS if c not in ("session_identifier", "session_number"))
_TYPES = {
    "session_identifier": T.StringType(),
    "user_identifier": T.StringType(),
    "start_tstamp": T.TimestampType(),
    "end_tstamp": T.TimestampType(),
    "total_events": T.LongType(),
    "page_views": T.LongType(),
    "duration_s": T.DoubleType(),
    "first_page_url": T.StringType(),
    "last_page_url": T.StringType(),
    "session_number": T.LongType(),
    "is_quarantined": T.BooleanType(),
}


def sessions_schema(with_delete: bool = False) -> pa.Schema:
    """The Arrow types of the sessions table (Spark's), with the MERGE source's `_delete` last
    when asked."""
    fields = [T.StructField(c, _TYPES[c]) for c in SESSION_COLUMNS]
    if with_delete:
        fields.append(T.StructField("_delete", T.BooleanType()))
    return to_arrow_schema(T.StructType(fields), timezone="UTC")


@dataclass(frozen=True)
class Replacement:
    """The MERGE source (rows of SESSION_COLUMNS and `_delete`, only those that change the
    table), the users whose sessions changed with the start from which theirs are renumbered,
    and the counts `replace_sessions` reports."""

    source: list[dict[str, Any]]
    users: dict[str, dt.datetime | None]
    written: int
    deleted: int
    fresh: int
    content_changed: int
    rows_read: int


def _order(row: Mapping[str, Any]) -> tuple:
    """`number_sessions`' order: start (nulls first), then session_identifier."""
    start = row["start_tstamp"]
    return (start is not None, start or dt.datetime.min, row["session_identifier"])


def replacement(
    new: Sequence[Mapping[str, Any]],
    replaced_ids: Iterable[str],
    stored: Iterable[Mapping[str, Any]],
) -> Replacement:
    """Replace the sessions `replaced_ids` by `new` (not numbered) and renumber their users'
    sessions from the earliest replaced or new one on; `stored`: at least the stored rows of
    the replaced and new ids and every stored session of their users (more rows are ignored).

    Earlier sessions keep their numbers (the largest of them is the count before); a stored
    session whose id is replaced or recomputed is not kept, whatever `replaced_ids` says (a run
    stopped between its sessions and lifecycle commits left some in the table); a replaced id
    with no new session is deleted; a row goes into the source only when it is new, its content
    changed or its number did."""
    replaced = {i for i in replaced_ids if i is not None}
    new_ids = {r["session_identifier"] for r in new}
    stored = list(stored)
    by_id = {r["session_identifier"]: r for r in stored}
    starts: dict[str, list[dt.datetime]] = {}
    for row in [*(by_id[i] for i in replaced if i in by_id), *new]:
        if row["user_identifier"] is not None:
            bucket = starts.setdefault(row["user_identifier"], [])
            if row["start_tstamp"] is not None:
                bucket.append(row["start_tstamp"])
    users = {u: (min(s) if s else None) for u, s in starts.items()}
    recomputed = replaced | new_ids
    before: dict[str, int] = {}
    kept: list[dict[str, Any]] = []
    for row in stored:
        user = row["user_identifier"]
        if user not in users or row["session_identifier"] in recomputed:
            continue
        start, since = row["start_tstamp"], users[user]
        if start is None or since is None:
            continue  # compared with a null: neither earlier nor later (as in Spark)
        if start < since:
            if row["session_number"] is not None:
                before[user] = max(before.get(user, row["session_number"]), row["session_number"])
        else:
            kept.append({**row, "_old": row["session_number"], "_fresh": False, "_same": True})
    fresh = []
    for row in new:
        old = by_id.get(row["session_identifier"])
        same = old is not None and all(same_value(row[c], old[c]) for c in CONTENT)
        fresh.append(
            {
                **{c: row[c] for c in SESSION_COLUMNS if c != "session_number"},
                "session_number": None,
                "_old": None if old is None else old["session_number"],
                "_fresh": True,
                "_same": same,
            }
        )
    by_user: dict[str, list[dict[str, Any]]] = {}
    for row in [*kept, *fresh]:
        if row["user_identifier"] is not None:
            by_user.setdefault(row["user_identifier"], []).append(row)
    for user, rows in by_user.items():
        for number, row in enumerate(sorted(rows, key=_order), start=1):
            row["session_number"] = number + before.get(user, 0)
    source = []
    written = 0
    for row in [*kept, *fresh]:
        if not row["_same"] or not same_value(row["_old"], row["session_number"]):
            written += 1
            source.append({**{c: row[c] for c in SESSION_COLUMNS}, "_delete": False})
    deletes = sorted(replaced - new_ids)
    source += [
        {
            **{c: (i if c == "session_identifier" else None) for c in SESSION_COLUMNS},
            "_delete": True,
        }
        for i in deletes
    ]
    users_before = {r["user_identifier"] for r in kept + fresh if r["user_identifier"] in before}
    return Replacement(
        source=source,
        users=users,
        written=written,
        deleted=len(deletes),
        fresh=len(fresh),
        content_changed=sum(not r["_same"] for r in fresh),
        rows_read=len(kept) + len(users_before),
    )
