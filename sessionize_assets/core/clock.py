"""Instants and days in UTC: the one place naive or zoned values become aware UTC datetimes.

Every table stores UTC; every rule compares UTC instants. Naive values are taken as UTC.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def as_utc(value: dt.datetime | str) -> dt.datetime:
    """An instant in UTC: a datetime or ISO 8601 text; no zone means UTC."""
    if isinstance(value, str):
        value = dt.datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    if value.tzinfo is None:
        return value.replace(tzinfo=dt.UTC)
    return value.astimezone(dt.UTC)


def as_utc_or_none(value: dt.datetime | str | None) -> dt.datetime | None:
    """`as_utc`, passing None through (nullable timestamp columns)."""
    return None if value is None else as_utc(value)


def as_date(value: Any) -> dt.date:
    """A day from a date, a datetime (its date) or ISO text (Delta partition values are text)."""
    if isinstance(value, dt.datetime):
        return value.date()
    if isinstance(value, dt.date):
        return value
    return dt.date.fromisoformat(str(value))


def midnight(day: dt.date) -> dt.datetime:
    """The first instant (UTC) of a day."""
    return dt.datetime.combine(day, dt.time.min, tzinfo=dt.UTC)


def utc_now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def to_micros(value: dt.datetime) -> int:
    """Microseconds since the epoch (naive values are UTC)."""
    delta = as_utc(value) - EPOCH
    return (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds


def from_micros(value: int | None) -> dt.datetime | None:
    """The UTC instant of microseconds since the epoch (None passes through)."""
    if value is None:
        return None
    return EPOCH + dt.timedelta(microseconds=int(value))


def iso_or_none(value: dt.datetime | None) -> str | None:
    return value.isoformat() if value is not None else None
