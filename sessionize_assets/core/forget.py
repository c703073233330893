"""`sessionize forget`: which users a request names, and how their rows are found (pure Python).

A request names user ids (arguments, or a file of one id per line). A row of `events` or
`filtered_events` is the user's when any of the `user_identifier` columns holds one of the ids (so
a row keyed by `user_id` that also carries the forgotten `domain_userid` goes too); a row of a
derived table when its `user_identifier` is one of them; a row of `invalid_events` when its raw
text holds an id as a whole field (between CSV/JSON separators: not inside a longer id or a URL;
an id holding a double quote or a backslash is not found in JSON text, which escapes them). The
request's record keeps counts, never the ids.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa

# What may surround a whole field in raw text: the start or end of the text, or a separator of
# CSV and JSON text (comma, semicolon, pipe, tab, space, double quote). `abc` is not found inside
# `abc-1`, `xabc` or a URL path `/abc/`.
SEPARATORS = ',;|\t "'


class ForgetRequestError(ValueError):
    """The request names no usable id (one sentence)."""


def requested_users(arguments: Sequence[str], file_text: str | None = None) -> list[str]:
    """The ids a request names: the arguments, then the file's lines (blank lines and lines
    starting with `#` left out), each stripped; sorted, each once."""
    found: list[str] = [a.strip() for a in arguments]
    if file_text is not None:
        found += [
            line.strip()
            for line in file_text.splitlines()
            if line.strip() and not line.strip().startswith("#")
        ]
    if any(not user for user in found):
        raise ForgetRequestError("An empty user id was given: every id must be non-empty.")
    users = sorted(set(found))
    if not users:
        raise ForgetRequestError("Name at least one user id, or a file of ids with --from-file.")
    return users


def _sql_text(value: str) -> str:
    text = value.replace("\\", "\\\\").replace("'", "\\'")
    return f"'{text}'"


def identifier_condition(columns: Sequence[str], users: Sequence[str]) -> str:
    """SQL: any of the identifier `columns` holds one of `users`."""
    listed = ", ".join(_sql_text(u) for u in users)
    return "(" + " OR ".join(f"`{c}` IN ({listed})" for c in columns) + ")"


def _java_escaped(user: str) -> str:
    """The id as a regular expression matching itself (ASCII punctuation escaped; Java and
    Python read the result the same way)."""
    return "".join(f"\\{ch}" if ch.isascii() and not ch.isalnum() else ch for ch in user)


def raw_pattern(users: Sequence[str]) -> str:
    """A regular expression (Java's `RLIKE`, Python's `re`) finding any id as a whole field."""
    alternatives = "|".join(_java_escaped(u) for u in users)
    return f"(^|[{SEPARATORS}])({alternatives})([{SEPARATORS}]|$)"


def raw_condition(column: str, users: Sequence[str]) -> str:
    """SQL: the raw text column holds one of `users` as a whole field."""
    return f"`{column}` RLIKE {_sql_text(raw_pattern(users))}"


def holds_user(raw: str, users: Sequence[str]) -> bool:
    """The Python reading of `raw_condition` (for tests and small inputs)."""
    return re.search(raw_pattern(users), raw) is not None


FORGET_LOG_SCHEMA = pa.schema(
    [
        ("request_id", pa.string()),
        ("requested_at", pa.timestamp("us", tz="UTC")),
        ("requested_by", pa.string()),
        ("reason", pa.string()),
        ("users", pa.int64()),
        ("rows_deleted", pa.map_(pa.string(), pa.int64())),
        ("load_days_redone", pa.list_(pa.date32())),
    ]
)


@dataclass(frozen=True)
class ForgetRecord:
    """One row of `forget_log`: who asked, when, how many ids and rows; never the ids."""

    request_id: str
    requested_at: dt.datetime
    requested_by: str
    reason: str | None
    users: int
    rows_deleted: Mapping[str, int]
    load_days_redone: tuple[dt.date, ...]

    def row(self) -> dict[str, object]:
        return {
            "request_id": self.request_id,
            "requested_at": self.requested_at,
            "requested_by": self.requested_by,
            "reason": self.reason,
            "users": self.users,
            "rows_deleted": sorted(self.rows_deleted.items()),
            "load_days_redone": list(self.load_days_redone),
        }


def load_days_to_redo(
    counts: Iterable[Mapping[dt.date, int]], start_date: dt.date, today: dt.date
) -> list[dt.date]:
    """The load days whose `filtered_events` must be re-materialized: every load day that held a
    row of the users in `events` or still holds one in `filtered_events` (so a request retried
    after a crash redoes what the first attempt left), from `start_date` through `today`."""
    days = {day for count in counts for day, rows in count.items() if rows > 0}
    return sorted(d for d in days if start_date <= d <= today)
