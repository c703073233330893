"""gap mode's session steps in plain Python over rows the driver holds: the twins of the Spark
transforms a small gap-mode session run calls (`core.sessionize`'s `prepare_events`,
`with_reason`, `gap_chains`, `gap_change_ranges`, `overlapping`, `sessionize_by_gap` and
`superseded`), giving the same rows in the same types.

A small session run (a few thousand changed events) spent most of its time in one Spark
statement per step over driver-local data, 0.1-0.6 s each (docs/benchmarks.md, "Session 36");
these functions take milliseconds on such rows. `sessions/driver_run.py` uses them when every
input is driver-local, and Spark computes everything otherwise; `core/test_gap_rows.py`
compares each with its Spark twin on random rows.

Rows are dicts. Timestamps are aware UTC datetimes at the edges (as Arrow gives them) and whole
microseconds inside. Rows with a null `derived_tstamp` or `event_id` are not handled here
(`handles`): Spark orders nulls first and its struct minimum treats them in ways these functions
do not copy, so a run holding such a row is left to Spark.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pyarrow as pa

from sessionize_assets.core.sessionize import (
    BEFORE_START_DATE,
    COPY_ORDER,
    DUPLICATE_EVENT,
    LC_END,
    LC_START,
    MICROS_PER_DAY,
    MICROS_PER_MINUTE,
    NO_SESSION_IDENTIFIER,
    NO_USER_IDENTIFIER,
    PART,
    PREPARED_COLUMNS,
    REASON,
    SENT_LATE,
    SENT_LATE_RULE,
    SESSION_KEY,
    SESSION_TS,
    USER_KEY,
    gap_margin_micros,
    gap_reach_micros,
)
from sessionize_assets.settings import Settings

Row = dict[str, Any]

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def micros(value: dt.datetime | int | None) -> int | None:
    """Whole microseconds since the epoch (Spark's `unix_micros`) of an aware or naive-UTC
    datetime (an int is taken as microseconds already: `plain_rows`)."""
    if value is None or isinstance(value, int):
        return value
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.UTC)
    delta = value - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def plain_rows(table: pa.Table) -> list[dict[str, Any]]:
    """`table`'s rows as dicts, its timestamps as microseconds since the epoch (`micros`):
    a fifth of the time of Arrow's datetimes for a row of several timestamps."""
    columns = [
        column.cast(pa.timestamp("us", tz=field.type.tz)).cast(pa.int64())
        if pa.types.is_timestamp(field.type)
        else column
        for field, column in zip(table.schema, table.columns, strict=True)
    ]
    return pa.Table.from_arrays(columns, names=table.column_names).to_pylist()


def from_micros(value: int | None) -> dt.datetime | None:
    """`micros`' inverse: an aware UTC datetime (Spark's `timestamp_micros`)."""
    if value is None:
        return None
    return _EPOCH + dt.timedelta(microseconds=value)


def _text(value: Any) -> str | None:
    """A string column's value as Spark's `cast("string")` gives it for strings and nulls."""
    return None if value is None else str(value)


def first_key(row: Mapping[str, Any], columns: Sequence[str]) -> str | None:
    """`core.sessionize._key`: the first non-null, non-empty value of the (string) columns."""
    for column in columns:
        value = row.get(column)
        if value is not None and str(value) != "":
            return str(value)
    return None


def prepare(rows: Iterable[Mapping[str, Any]], settings: Settings) -> list[Row]:
    """`core.sessionize.prepare_events` of filtered_events rows (their identifier columns strings):
    PREPARED_COLUMNS, timestamps as microseconds, plus `_sign` and PART when the rows have them."""
    late = settings.days_late_allowed * MICROS_PER_DAY
    out = []
    for r in rows:
        sent, created = micros(r.get("dvce_sent_tstamp")), micros(r.get("dvce_created_tstamp"))
        stamp = r.get(settings.session_timestamp)
        prepared = {
            "event_id": _text(r.get("event_id")),
            "event_name": _text(r.get("event_name")),
            "page_url": _text(r.get("page_url")),
            "derived_tstamp": micros(r.get("derived_tstamp")),
            "dvce_created_tstamp": created,
            SESSION_KEY: first_key(r, settings.session_identifier),
            USER_KEY: first_key(r, settings.user_identifier),
            SESSION_TS: micros(stamp) if stamp is not None else micros(r.get("load_tstamp")),
            SENT_LATE: sent is not None and created is not None and sent - created > late,
        }
        for extra in ("_sign", PART):
            if extra in r:
                prepared[extra] = r[extra]
        out.append(prepared)
    return out


def reason(row: Mapping[str, Any], settings: Settings) -> str | None:
    """`core.sessionize.exclusion_reason` (null: usable), in either mode."""
    start = micros(dt.datetime.combine(settings.start_date, dt.time(), tzinfo=dt.UTC))
    ts = row[SESSION_TS]
    if ts is not None and ts < start:
        return BEFORE_START_DATE
    if row[SENT_LATE]:
        return SENT_LATE_RULE
    if settings.session_mode == "id":
        return NO_SESSION_IDENTIFIER if row[SESSION_KEY] is None else None
    if row[USER_KEY] is None:
        return NO_USER_IDENTIFIER
    return None


def with_reason(rows: Iterable[Row], settings: Settings) -> list[Row]:
    """`core.sessionize.with_reason`: each prepared row with REASON."""
    return [{**r, REASON: reason(r, settings)} for r in rows]


def handles(rows: Iterable[Mapping[str, Any]]) -> bool:
    """Whether these functions give Spark's rows for these prepared rows: no null
    `derived_tstamp` or `event_id`."""
    return all(r["derived_tstamp"] is not None and r["event_id"] is not None for r in rows)


def handles_lifecycle(rows: Iterable[Mapping[str, Any]]) -> bool:
    """Whether these functions give Spark's chains and ranges for these stored lifecycle rows:
    none of a null start or end (a session of events without `derived_tstamp`, which a full
    rebuild may leave; Spark's joins pass over it, these functions would compare with None)."""
    return all(r["start_tstamp"] is not None and r["end_tstamp"] is not None for r in rows)


def _nulls_last(value: Any) -> tuple:
    return (value is None, value if value is not None else 0)


def _copy_order(row: Mapping[str, Any]) -> tuple:
    """`core.sessionize.COPY_ORDER` of the copies of one key, each column nulls last."""
    return tuple(_nulls_last(row[c]) for c in COPY_ORDER)


def dedupe(events: Iterable[Row]) -> tuple[list[Row], list[Row]]:
    """gap mode's copies of a (user, event_id, derived_tstamp) key: the first copy of each key is
    kept; the others are returned as PREPARED_COLUMNS with REASON `duplicate event_id`."""
    groups: dict[tuple, list[Row]] = defaultdict(list)
    for e in events:
        groups[(e[USER_KEY], e["event_id"], e["derived_tstamp"])].append(e)
    kept, dupes = [], []
    for copies in groups.values():
        copies.sort(key=_copy_order)
        kept.append(copies[0])
        dupes.extend(
            {**{k: c[k] for k in PREPARED_COLUMNS}, REASON: DUPLICATE_EVENT} for c in copies[1:]
        )
    return kept, dupes


def _session_id(user: str, first_event: str) -> str:
    """sha2(concat_ws('|', user, first event id), 256)."""
    return hashlib.sha256(f"{user}|{first_event}".encode()).hexdigest()


def sessionize_by_gap(events: Iterable[Row], settings: Settings) -> tuple[list[Row], list[Row]]:
    """`core.sessionize.sessionize_by_gap` of usable prepared rows (`handles` them): the sessions
    (SESSION_COLUMNS but session_number, with LC_START, LC_END and PART; timestamps as aware
    datetimes) and the duplicates left out (with REASON)."""
    kept, dupes = dedupe(events)
    gap = settings.session_gap_minutes * MICROS_PER_MINUTE
    longest = settings.max_session_days * MICROS_PER_DAY
    by_part: dict[tuple, list[Row]] = defaultdict(list)
    for e in kept:
        by_part[(e[USER_KEY], e.get(PART, 0))].append(e)
    sessions = []
    for (user, part), members in by_part.items():
        members.sort(key=lambda e: (e["derived_tstamp"], e["event_id"]))
        chains: list[list[Row]] = []
        previous = None
        for e in members:
            t = e["derived_tstamp"]
            if previous is None or t - previous > gap:
                chains.append([])
            chains[-1].append(e)
            previous = t
        for chain in chains:
            long = chain[-1]["derived_tstamp"] - chain[0]["derived_tstamp"] > longest
            pieces: dict[int | None, list[Row]] = defaultdict(list)
            for e in chain:
                t = e["derived_tstamp"]
                pieces[(t - t % longest) // longest if long else None].append(e)
            for piece in pieces.values():
                sessions.append(_session(user, part, piece, long))
    return sessions, dupes


def _session(user: str, part: Any, events: list[Row], quarantined: bool) -> Row:
    """One session of a chain's piece (its events in (derived_tstamp, event_id) order)."""
    start, end = events[0]["derived_tstamp"], events[-1]["derived_tstamp"]
    pages = [e for e in events if e["page_url"] is not None]
    start_at, end_at = from_micros(start), from_micros(end)
    return {
        "session_identifier": _session_id(user, events[0]["event_id"]),
        "user_identifier": user,
        "start_tstamp": start_at,
        "end_tstamp": end_at,
        "total_events": len(events),
        "page_views": sum(1 for e in events if e["event_name"] == "page_view"),
        "duration_s": (end - start) / 1_000_000.0,
        "first_page_url": pages[0]["page_url"] if pages else None,
        "last_page_url": pages[-1]["page_url"] if pages else None,
        "is_quarantined": quarantined,
        LC_START: start_at,
        LC_END: end_at,
        PART: part,
    }


def gap_chains(lifecycle: Iterable[Mapping[str, Any]], settings: Settings) -> list[Row]:
    """`core.sessionize.gap_chains`: per user, the chains of its lifecycle rows (USER_KEY,
    `_chain` numbered from 1 in time order, `_chain_lo`, `_chain_hi` in microseconds)."""
    gap = settings.session_gap_minutes * MICROS_PER_MINUTE
    by_user: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for r in lifecycle:
        if r["user_identifier"] is not None:
            by_user[r["user_identifier"]].append(
                (micros(r["start_tstamp"]), micros(r["end_tstamp"]))
            )
    chains = []
    for user, spans in by_user.items():
        spans.sort()
        number, (lo, hi) = 1, spans[0]
        for s, e in spans[1:]:
            if s - hi > gap:
                chains.append({USER_KEY: user, "_chain": number, "_chain_lo": lo, "_chain_hi": hi})
                number, lo, hi = number + 1, s, e
            else:
                hi = max(hi, e)
        chains.append({USER_KEY: user, "_chain": number, "_chain_lo": lo, "_chain_hi": hi})
    return chains


def _least(*values: int | None) -> int | None:
    """Spark's `least`: the smallest non-null value (null when all are)."""
    present = [v for v in values if v is not None]
    return min(present) if present else None


def _greatest(*values: int | None) -> int | None:
    present = [v for v in values if v is not None]
    return max(present) if present else None


def gap_change_ranges(
    changes: Iterable[Mapping[str, Any]],
    settings: Settings,
    chains: Iterable[Mapping[str, Any]] | None = None,
) -> list[Row]:
    """`core.sessionize.gap_change_ranges` of usable changed prepared rows (their
    `derived_tstamp` in microseconds, never null): per user and PART, `_changed_lo`,
    `_changed_hi`, `_read_lo`, `_read_hi` (aware datetimes)."""
    reach, margin = gap_reach_micros(settings), gap_margin_micros(settings)
    gap = settings.session_gap_minutes * MICROS_PER_MINUTE
    times: dict[str, set[int]] = defaultdict(set)
    for c in changes:
        times[c[USER_KEY]].add(c["derived_tstamp"])
    near: dict[str, list[tuple[int, int]]] = defaultdict(list)
    if chains is not None:
        for chain in chains:
            if chain[USER_KEY] is not None:
                near[chain[USER_KEY]].append((chain["_chain_lo"], chain["_chain_hi"]))
    out = []
    for user, stamps in times.items():
        ordered = sorted(stamps)
        clusters: list[list[int]] = []
        for t in ordered:
            if not clusters or t - clusters[-1][1] > gap:
                clusters.append([t, t])
            else:
                clusters[-1][1] = t
        each = []
        for lo, hi in clusters:
            if chains is None:
                first = last = None
            else:
                touching = [
                    (clo, chi)
                    for clo, chi in near.get(user, ())
                    if chi >= lo - gap and clo <= hi + gap
                ]
                first = _least(lo, min((c[0] for c in touching), default=None))
                last = _greatest(hi, max((c[1] for c in touching), default=None))

            def low(width: int, lo: int = lo, first: int | None = first) -> int:
                return _greatest(lo - width, first)

            def high(width: int, hi: int = hi, last: int | None = last) -> int:
                return _least(hi + width, last)

            each.append(
                (
                    low(reach + margin),
                    high(reach + margin),
                    low(reach),
                    high(reach),
                )
            )
        each.sort(key=lambda x: (x[0], x[1]))
        part, before = 0, None
        merged: dict[int, list[int]] = {}
        for r_lo, r_hi, c_lo, c_hi in each:
            if before is None or r_lo > before:
                part += 1
                merged[part] = [c_lo, c_hi, r_lo, r_hi]
            else:
                m = merged[part]
                m[0], m[1] = min(m[0], c_lo), max(m[1], c_hi)
                m[2], m[3] = min(m[2], r_lo), max(m[3], r_hi)
            before = r_hi if before is None else max(before, r_hi)
        for number, (c_lo, c_hi, r_lo, r_hi) in merged.items():
            out.append(
                {
                    USER_KEY: user,
                    PART: number,
                    "_changed_lo": from_micros(c_lo),
                    "_changed_hi": from_micros(c_hi),
                    "_read_lo": from_micros(r_lo),
                    "_read_hi": from_micros(r_hi),
                }
            )
    return out


def overlapping(
    rows: Iterable[Mapping[str, Any]],
    ranges: Iterable[Mapping[str, Any]],
    on: Sequence[str],
    range_names: Mapping[str, str] | None = None,
) -> list[Row]:
    """`core.sessionize.overlapping`: each row once per range of its keys `on` that its span
    [start_tstamp, end_tstamp] overlaps ([_changed_lo, _changed_hi]); `range_names` maps a key
    of `on` to the ranges' name for it."""
    names = range_names or {}
    by_key: dict[tuple, list[Mapping[str, Any]]] = defaultdict(list)
    for r in ranges:
        by_key[tuple(r[names.get(k, k)] for k in on)].append(r)
    out = []
    for row in rows:
        key = tuple(row[k] for k in on)
        if any(v is None for v in key):
            continue
        for r in by_key.get(key, ()):
            if row["start_tstamp"] <= r["_changed_hi"] and row["end_tstamp"] >= r["_changed_lo"]:
                out.append(dict(row))
    return out


def in_read_range(
    events: Iterable[Row], ranges: Iterable[Mapping[str, Any]], upper: dt.datetime
) -> list[Row]:
    """The gap read's join: each prepared event inside a read range of its user
    ([_read_lo, _read_hi] on derived_tstamp), with that range's PART, its session timestamp at
    or before `upper`."""
    by_user: dict[str, list[tuple[int, int, int]]] = defaultdict(list)
    for r in ranges:
        by_user[r[USER_KEY]].append((micros(r["_read_lo"]), micros(r["_read_hi"]), r[PART]))
    limit = micros(upper)
    out = []
    for e in events:
        t, ts = e["derived_tstamp"], e[SESSION_TS]
        if t is None or ts is None or ts > limit:
            continue
        for lo, hi, part in by_user.get(e[USER_KEY], ()):
            if lo <= t <= hi:
                out.append({**e, PART: part})
    return out


def superseded(old: Iterable[Mapping[str, Any]], new: Iterable[Mapping[str, Any]]) -> list[Row]:
    """`core.sessionize.superseded`: each old session id no longer among the new ones, once per
    new session of its user overlapping its span (or once with none: `removed`), with the
    reason; row for row as Spark's joins give them (an old row given twice counts twice)."""
    new = list(new)
    new_ids = {n["session_identifier"] for n in new}
    by_user: dict[Any, list[Mapping[str, Any]]] = defaultdict(list)
    for n in new:
        if n["user_identifier"] is not None:
            by_user[n["user_identifier"]].append(n)
    old = list(old)

    def successors(o: Mapping[str, Any]) -> list[Mapping[str, Any]]:
        if o["user_identifier"] is None:
            return []
        return [
            n
            for n in by_user.get(o["user_identifier"], ())
            if n["start_tstamp"] <= o["end_tstamp"] and n["end_tstamp"] >= o["start_tstamp"]
        ]

    covers: dict[str, int] = defaultdict(int)
    for o in old:
        for n in successors(o):
            covers[n["session_identifier"]] += 1
    matched: list[tuple[Mapping[str, Any], Mapping[str, Any] | None]] = []
    for o in old:
        if o["session_identifier"] not in new_ids:
            matched.extend((o, n) for n in successors(o) or [None])
    found: dict[Any, int] = defaultdict(int)
    for o, n in matched:
        if n is not None:
            found[o["session_identifier"]] += 1
    out = []
    for o, n in matched:
        count = found[o["session_identifier"]]
        if n is None:
            why = "removed"
        elif count > 1 and n["is_quarantined"]:
            why = "cut at max_session_days"
        elif count > 1:
            why = "split"
        elif covers[n["session_identifier"]] > 1:
            why = "merged"
        else:
            why = "first event changed"
        out.append(
            {
                "superseded_session_identifier": o["session_identifier"],
                "session_identifier": None if n is None else n["session_identifier"],
                "user_identifier": o["user_identifier"],
                "reason": why,
            }
        )
    return out
