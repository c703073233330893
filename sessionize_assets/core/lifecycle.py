"""The sessions lifecycle manifest's update rule, in plain Python (no Spark).

One row per session in `sessions_lifecycle_manifest`: user, start, end (on the mode's ordering
timestamp) and whether it is quarantined. When a run recomputes a session it decides the
session's new row from its old row (or none) and the session's events, in one of three named
cases:

| case | old row | start | quarantined | an event is left out when |
|---|---|---|---|---|
| `new` | none | its first event | an event at or past start + max_session_days | it is past start + max_session_days (`after max_session_days`) |
| `open` | not quarantined | its first event (a late event may move it earlier) | same | same |
| `frozen` | quarantined | the old start, frozen | always | it is before the start or past the cap (`quarantined session`) |

The end is Snowplow's `least(start + max_session_days, latest event)` over all the session's
events (so a session with an event past the cap ends exactly at the cap, not at its last event
within it); a frozen session's span stays [start, start + max_session_days] (it was quarantined
by an event at or past that cap, and the events past it are never read again: the end is the
cap, not the last event within it, session 15). The user is the old row's (first seen) when it
has one, else the largest user identifier among the events kept. This is id mode's rule;
`core.sessionize.sessionize_by_id` is its Spark form, built from the same cases, and the two are
checked against each other on one table of cases (`test_lifecycle.py`). Gap mode's rows are the
computed sessions themselves (chains cut at fixed boundaries; no old row is used).

Then the MERGE on the manifest, per session a run touched (`action`): a recomputed session's row
is inserted or updated; a touched session left without events keeps its row in id mode (the
manifest remembers every session it has seen: first-seen user, frozen quarantine) and goes in
gap mode (the manifest mirrors the current sessions).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

# Why an event of a session is left out of it (named rules, counted in metadata).
AFTER_MAX_SESSION_DAYS = "after max_session_days"
QUARANTINED_SESSION = "quarantined session"


class Case(StrEnum):
    """Which rule a recomputed session follows, from its old lifecycle row."""

    NEW = "new"  # no row: the span starts at the first event
    OPEN = "open"  # a row, not quarantined: as new, but the first-seen user is kept
    FROZEN = "frozen"  # a quarantined row: start and cap are frozen, events outside are ignored


class Action(StrEnum):
    """What the lifecycle MERGE does with one touched session's row."""

    INSERT = "insert"
    UPDATE = "update"
    KEEP = "keep"
    DELETE = "delete"
    NOTHING = "nothing"


@dataclass(frozen=True)
class LifecycleRow:
    """One sessions_lifecycle_manifest row (without its session id)."""

    user_identifier: str | None
    start_tstamp: dt.datetime
    end_tstamp: dt.datetime
    is_quarantined: bool


@dataclass(frozen=True)
class Event:
    """One (deduplicated, usable) event of the session: its session timestamp and user."""

    tstamp: dt.datetime
    user: str | None = None


@dataclass(frozen=True)
class Decision:
    """A recomputed session's case, its new row (None: no event is kept) and, per event in the
    order given, why it is left out (None: kept)."""

    case: Case
    row: LifecycleRow | None
    reasons: tuple[str | None, ...]


def case_of(old: LifecycleRow | None) -> Case:
    """The case a session with this old row follows."""
    if old is None:
        return Case.NEW
    return Case.FROZEN if old.is_quarantined else Case.OPEN


def span_start(case: Case, old: LifecycleRow | None, first_event: dt.datetime) -> dt.datetime:
    """Where the session's span starts: the frozen start, else its first event."""
    if case == Case.FROZEN:
        assert old is not None
        return old.start_tstamp
    return first_event


def cap_of(start: dt.datetime, max_session_days: int) -> dt.datetime:
    """The last instant of the span: start + max_session_days (an event there is kept)."""
    return start + dt.timedelta(days=max_session_days)


def is_quarantined(case: Case, last_event: dt.datetime, cap: dt.datetime) -> bool:
    """Frozen sessions stay quarantined; others are when an event reaches the cap."""
    return case == Case.FROZEN or last_event >= cap


def event_reason(
    case: Case, tstamp: dt.datetime, start: dt.datetime, cap: dt.datetime
) -> str | None:
    """Why an event is left out of the session (None: kept)."""
    if case == Case.FROZEN and (tstamp < start or tstamp > cap):
        return QUARANTINED_SESSION
    if tstamp > cap:
        return AFTER_MAX_SESSION_DAYS
    return None


def session_user(old: LifecycleRow | None, kept_users: Sequence[str | None]) -> str | None:
    """The first-seen user when the old row has one, else the largest among the kept events."""
    if old is not None and old.user_identifier is not None:
        return old.user_identifier
    users = [u for u in kept_users if u is not None]
    return max(users) if users else None


def next_lifecycle(
    old: LifecycleRow | None, events: Sequence[Event], max_session_days: int
) -> Decision:
    """The new lifecycle row of a session recomputed from all its events (id mode)."""
    case = case_of(old)
    if not events:
        return Decision(case, None, ())
    times = [e.tstamp for e in events]
    start = span_start(case, old, min(times))
    cap = cap_of(start, max_session_days)
    reasons = tuple(event_reason(case, t, start, cap) for t in times)
    kept = [e for e, reason in zip(events, reasons, strict=True) if reason is None]
    if not kept:
        return Decision(case, None, reasons)
    row = LifecycleRow(
        user_identifier=session_user(old, [e.user for e in kept]),
        start_tstamp=start,
        # Snowplow: least(start + cap, max tstamp); a frozen span ends at its cap
        end_tstamp=cap if case == Case.FROZEN else min(cap, max(times)),
        is_quarantined=is_quarantined(case, max(times), cap),
    )
    return Decision(case, row, reasons)


def action(had_row: bool, has_row: bool, keeps_vanished: bool) -> Action:
    """The MERGE's action for one touched session: `had_row` (in the manifest before the run),
    `has_row` (recomputed with at least one event), `keeps_vanished` (id mode: a session left
    without events keeps its row; gap mode: it goes)."""
    if has_row:
        return Action.UPDATE if had_row else Action.INSERT
    if not had_row:
        return Action.NOTHING
    return Action.KEEP if keeps_vanished else Action.DELETE
