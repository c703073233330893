"""An independent reference model of the derived tables, in plain Python (issue 19).

The random-history tests compare what the incremental runs left in the lake with what these
functions compute from scratch out of the rows the test loaded. Nothing here imports the
project's code (only its `Settings`, for the values): no Spark, no DataFrame, no shared helper.
The rules are written again from the specification (`../shared/SPEC.md` sections 5 and 6) and
`docs/time_based.md` / `docs/sessions.md`, so a bug in the product's rule is not also in the
oracle. Rows are dicts; timestamps are aware UTC datetimes (naive ones are taken as UTC).

Covered (docs/testing.md):

- `filtered_events(raw, settings)`: validated `events` rows -> kept rows with `event_date`;
- `daily_aggregates(rows, settings)`: one row per (user, event day), the time-based aggregate;
- `days_to_process_in_order(rows, settings)`: the decisions and horizons of a catch-up that
  decides each load day once, in order;
- `LoadDayHistory` with `days_to_process_after_run` / `days_to_process_after_backfill`: the same
  decisions run by run, re-decisions of grown and reached load days included (what each load
  day's `filtered_events` held when it was decided, and which load days a run takes, in order);
- `gap_sessions(rows, settings)` and `id_sessions(rows, settings, lifecycle)`: the `sessions`
  table (numbered); `users(sessions)`; `user_session_stats(sessions)`; `gap_lifecycle(sessions)`.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sessionize_assets.settings import Settings

Row = dict[str, Any]

EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
MICRO = dt.timedelta(microseconds=1)
DAY_MICROS = 86_400 * 1_000_000
MINUTE_MICROS = 60 * 1_000_000


# --- values --------------------------------------------------------------------------------------


def utc(value: dt.datetime | None) -> dt.datetime | None:
    """An aware UTC datetime (naive values are UTC), or None."""
    if value is None:
        return None
    return value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value.astimezone(dt.UTC)


def micros(value: dt.datetime | None) -> int | None:
    """Microseconds since 1970-01-01 UTC."""
    return None if value is None else (utc(value) - EPOCH) // MICRO


def from_micros(value: int) -> dt.datetime:
    return EPOCH + dt.timedelta(microseconds=value)


def _nulls_last(*values: Any) -> tuple:
    """A sort key ordering each value ascending with None after everything (SQL NULLS LAST)."""
    return tuple((v is None, v if v is not None else 0) for v in values)


def _first_non_empty(row: Mapping[str, Any], columns: Sequence[str]) -> str | None:
    """The first value of the columns that is neither null nor the empty string, as a string."""
    for column in columns:
        value = row.get(column)
        if value is not None and str(value) != "":
            return str(value)
    return None


# --- filtered_events (SPEC section 5) ------------------------------------------------------------


def filtered_events(raw: Iterable[Mapping[str, Any]], settings: Settings) -> list[Row]:
    """The rows `filtered_events` keeps from every raw `events` row loaded so far.

    A raw row of load day L is dropped, in this order of reasons, when
    1. another raw row with its `event_id` was loaded in one of the `dedupe_lookback_days` load
       days before L (whatever became of that row), or in L itself ahead of it by
       (`load_tstamp`, `collector_tstamp`, `dvce_created_tstamp`, `_row_hash`), nulls last;
    2. `app_ids` is not empty and does not hold its `app_id`;
    3. `event_names` is not empty and does not hold its `event_name`;
    4. its event day (UTC date of `derived_tstamp`) is before `start_date`.
    Kept rows are the raw row plus `event_date`.
    """
    rows = [dict(r) for r in raw]
    by_id: dict[Any, list[Row]] = defaultdict(list)
    for r in rows:
        by_id[r["event_id"]].append(r)

    def rank(r: Row) -> tuple:
        return _nulls_last(
            micros(r.get("load_tstamp")),
            micros(r.get("collector_tstamp")),
            micros(r.get("dvce_created_tstamp")),
            r.get("_row_hash"),
        )

    lookback = dt.timedelta(days=settings.dedupe_lookback_days)
    kept = []
    for r in rows:
        day = r["load_date"]
        copies = [c for c in by_id[r["event_id"]] if c is not r]
        earlier_day = any(day - lookback <= c["load_date"] < day for c in copies)
        ahead_same_day = any(c["load_date"] == day and rank(c) < rank(r) for c in copies)
        if earlier_day or ahead_same_day:
            continue
        if settings.app_ids and r.get("app_id") not in settings.app_ids:
            continue
        if settings.event_names and r.get("event_name") not in settings.event_names:
            continue
        derived = utc(r.get("derived_tstamp"))
        event_date = None if derived is None else derived.date()
        if event_date is not None and event_date < settings.start_date:
            continue
        kept.append({**r, "event_date": event_date})
    return kept


# --- daily_aggregates (SPEC section 5) -----------------------------------------------------------


def daily_aggregates(
    rows: Iterable[Mapping[str, Any]],
    settings: Settings,
    horizons: Mapping[dt.date, dt.date | None] | None = None,
) -> list[Row]:
    """One row per (user, event day) of kept rows: the first non-null `user_identifier` column
    (null users are one row), `total_events`, `page_views`, first/last `derived_tstamp` and
    `event_counts` (event name -> rows, a null name under ""). With `horizons`, event day D
    counts only its rows with load day <= horizons[D] (no horizon: none of them)."""
    groups: dict[tuple, list[Mapping[str, Any]]] = defaultdict(list)
    for r in rows:
        day = r["event_date"]
        if horizons is not None:
            horizon = horizons.get(day)
            if horizon is None or r["load_date"] > horizon:
                continue
        user = next((str(r[c]) for c in settings.user_identifier if r.get(c) is not None), None)
        groups[(user, day)].append(r)
    out = []
    for (user, day), members in groups.items():
        counts: dict[str, int] = defaultdict(int)
        for m in members:
            counts[m.get("event_name") or ""] += 1
        times = [utc(m["derived_tstamp"]) for m in members if m.get("derived_tstamp") is not None]
        out.append(
            {
                "user_identifier": user,
                "event_date": day,
                "total_events": len(members),
                "page_views": sum(m.get("event_name") == "page_view" for m in members),
                "first_event_tstamp": min(times) if times else None,
                "last_event_tstamp": max(times) if times else None,
                "event_counts": dict(counts),
            }
        )
    return out


def days_to_process_in_order(
    rows: Iterable[Mapping[str, Any]], settings: Settings
) -> tuple[list[Row], dict[dt.date, dt.date]]:
    """SPEC section 5's decisions of a catch-up that decides every load day once, in ascending
    order (a first run, or one with no load into an already decided load day): per (load day L,
    event day D) that L's kept rows touch, `rows`, `is_late`, `horizon_before`, `pending` and
    `decision`; and horizon(D) after the last load day.

    - L <= horizon(D): process (D's rows of L were counted already);
    - D >= L: process (on time, or ahead within the clock-skew tolerance);
    - D < L: process when L - D <= `reprocess_days` and pending(D) >= `min_rows_to_process`,
      where pending(D) = rows of D with horizon(D) < load day <= L; else skip.
    horizon(D) is the last load day that decided "process" for D.
    """
    counts: dict[tuple[dt.date, dt.date], int] = defaultdict(int)
    for r in rows:
        counts[(r["load_date"], r["event_date"])] += 1
    horizon: dict[dt.date, dt.date] = {}
    out: list[Row] = []
    for load_day in sorted({load for load, _ in counts}):
        for event_day in sorted({day for load, day in counts if load == load_day}):
            before = horizon.get(event_day)
            pending = sum(
                n
                for (load, day), n in counts.items()
                if day == event_day and (before is None or load > before) and load <= load_day
            )
            late_by = (load_day - event_day).days
            process = (
                (before is not None and load_day <= before)
                or event_day >= load_day
                or (late_by <= settings.reprocess_days and pending >= settings.min_rows_to_process)
            )
            if process and (before is None or load_day > before):
                horizon[event_day] = load_day
            out.append(
                {
                    "load_date": load_day,
                    "event_date": event_day,
                    "rows": counts[(load_day, event_day)],
                    "is_late": event_day < load_day,
                    "horizon_before": before,
                    "pending": pending,
                    "decision": "process" if process else "skip",
                }
            )
    return out, horizon


# --- days_to_process run by run (SPEC section 5, docs/time_based.md) ----------------------------


@dataclass
class LoadDayHistory:
    """What the reference remembers of the load-day models between the runs of a history, so
    that `days_to_process` can be decided run by run (re-decisions included), not only for a
    first catch-up:

    - `raw`: every `events` row landed so far;
    - `consumed[L]`: how many raw rows of L `filtered_events(L)` last consumed (a load day is
      pending when more landed since), None once a change to an earlier load day's duplicates
      reached it (pending until redone); no entry: never materialized with data;
    - `kept[L]`: the rows `filtered_events(L)` holds, as its last materialization kept them from
      the raw rows landed then (a pending load day keeps its old rows until it is redone, and
      later decisions count them);
    - `decisions[(L, D)]`: the stored `days_to_process` rows.
    """

    raw: list[Row] = field(default_factory=list)
    consumed: dict[dt.date, int | None] = field(default_factory=dict)
    kept: dict[dt.date, list[Row]] = field(default_factory=dict)
    decisions: dict[tuple[dt.date, dt.date], Row] = field(default_factory=dict)


def _days(first: dt.date, last: dt.date) -> list[dt.date]:
    return [first + dt.timedelta(days=i) for i in range((last - first).days + 1)]


def _runs_of(days: Iterable[dt.date], most: int) -> list[list[dt.date]]:
    """Sorted days cut into runs of consecutive days, each at most `most` days long (one Dagster
    run of filtered_events + days_to_process each)."""
    runs: list[list[dt.date]] = []
    for day in sorted(set(days)):
        if runs and day == runs[-1][-1] + dt.timedelta(days=1) and len(runs[-1]) < most:
            runs[-1].append(day)
        else:
            runs.append([day])
    return runs


def _raw_per_load_day(history: LoadDayHistory) -> dict[dt.date, list[Row]]:
    out: dict[dt.date, list[Row]] = defaultdict(list)
    for r in history.raw:
        out[r["load_date"]].append(r)
    return out


def pending_load_days(history: LoadDayHistory, settings: Settings) -> list[dt.date]:
    """Load days (from `start_date` on) whose raw rows differ from what filtered_events last
    consumed (new or grown), or that a change to an earlier load day reached."""
    landed = _raw_per_load_day(history)
    grown = {d for d, rows in landed.items() if history.consumed.get(d, -1) != len(rows)}
    reached = {d for d, n in history.consumed.items() if n is None}
    return sorted(d for d in grown | reached if d >= settings.start_date)


def decided_horizons(history: LoadDayHistory) -> dict[dt.date, dt.date]:
    """horizon(D): the latest load day whose stored decision for D is "process" (no keyhole
    repair in these histories, so the aggregate's horizon is the decided one once it ran)."""
    out: dict[dt.date, dt.date] = {}
    for (load_day, event_day), r in history.decisions.items():
        if r["decision"] == "process" and (event_day not in out or load_day > out[event_day]):
            out[event_day] = load_day
    return out


def decision_rows(history: LoadDayHistory) -> list[Row]:
    """The stored `days_to_process` rows, by (load day, event day)."""
    return [dict(history.decisions[k]) for k in sorted(history.decisions)]


def kept_rows(history: LoadDayHistory) -> list[Row]:
    """The rows filtered_events holds (each load day as last materialized)."""
    return [r for day in sorted(history.kept) for r in history.kept[day]]


def _materialize(history: LoadDayHistory, settings: Settings, days: Sequence[dt.date]) -> None:
    """One run of filtered_events + days_to_process over the consecutive load `days`.

    filtered_events first, for every day of the run: each day's rows are kept from the raw rows
    landed so far (`filtered_events`). A day of the run whose raw rows changed (or that was never
    materialized, or was reached) reaches the later, already materialized load days outside the
    run within `dedupe_lookback_days` after it whose raw rows share an `event_id` with its raw or
    previously kept rows: they become pending, their kept rows unchanged until redone
    (docs/time_based.md, "filtered_events").

    Then days_to_process decides the run's load days in ascending order, each seeing the
    decisions before it (SPEC section 5), over what filtered_events holds now (the stale rows of
    pending load days included): for L, every event day D its kept rows touch, and every D its
    previous decisions listed with L <= horizon(D) (its counted rows are gone: re-aggregate, with
    0 rows), where horizon(D) is the latest "process" among the stored decisions (L's previous
    ones included) and those made so far in this run:
    - L <= horizon(D): process (L's rows were counted already);
    - D >= L: process;
    - D < L: process when L - D <= reprocess_days and pending(D) >= min_rows_to_process, with
      pending(D) = rows of D with horizon(D) < load day <= L; else skip.
    The run's load days' decisions replace their stored ones.
    """
    lookback = dt.timedelta(days=settings.dedupe_lookback_days)
    landed = _raw_per_load_day(history)
    before = dict(history.consumed)
    changed = [d for d in days if d not in before or before[d] != len(landed.get(d, []))]
    ids = {
        d: {r["event_id"] for r in landed.get(d, ())}
        | {r["event_id"] for r in history.kept.get(d, ())}
        for d in changed
    }
    kept_now: dict[dt.date, list[Row]] = defaultdict(list)
    for r in filtered_events(history.raw, settings):
        kept_now[r["load_date"]].append(r)
    for day in days:
        history.kept[day] = kept_now.get(day, [])
        if day in landed or day in before:  # a load day without data leaves no record
            history.consumed[day] = len(landed.get(day, []))
    for later in before:
        if later in days:
            continue
        later_ids = {r["event_id"] for r in landed.get(later, ())}
        if any(c < later <= c + lookback and later_ids & (ids[c] - {None}) for c in changed):
            history.consumed[later] = None

    counts: dict[tuple[dt.date, dt.date], int] = defaultdict(int)
    for load_day, rows in history.kept.items():
        for r in rows:
            counts[(load_day, r["event_date"])] += 1
    horizon = decided_horizons(history)
    previous: dict[dt.date, set[dt.date]] = defaultdict(set)
    for load_day, event_day in history.decisions:
        previous[load_day].add(event_day)
    made: dict[tuple[dt.date, dt.date], Row] = {}
    for load_day in sorted(days):
        touched = {d for (load, d), n in counts.items() if load == load_day and n > 0}
        counted = {d for d in previous[load_day] if d in horizon and load_day <= horizon[d]}
        for event_day in sorted(touched | counted):
            before_horizon = horizon.get(event_day)
            pending = sum(
                n
                for (load, day), n in counts.items()
                if day == event_day
                and (before_horizon is None or load > before_horizon)
                and load <= load_day
            )
            late_by = (load_day - event_day).days
            process = (
                (before_horizon is not None and load_day <= before_horizon)
                or event_day >= load_day
                or (late_by <= settings.reprocess_days and pending >= settings.min_rows_to_process)
            )
            if process and (before_horizon is None or load_day > before_horizon):
                horizon[event_day] = load_day
            made[(load_day, event_day)] = {
                "load_date": load_day,
                "event_date": event_day,
                "rows": counts.get((load_day, event_day), 0),
                "is_late": event_day < load_day,
                "horizon_before": before_horizon,
                "pending": pending,
                "decision": "process" if process else "skip",
            }
    redone = set(days)
    history.decisions = {k: v for k, v in history.decisions.items() if k[0] not in redone}
    history.decisions.update(made)


def _redo_reached(
    history: LoadDayHistory,
    settings: Settings,
    processed: Sequence[dt.date],
    left_for_later: Iterable[dt.date],
    today: dt.date,
) -> None:
    """After a run's (or a backfill's) own load days: redo, in rounds, the pending load days after
    the first of the days done so far and at most `dedupe_lookback_days` after the last (not in
    `left_for_later`, not after `today`), each round in runs of consecutive days, ascending, until
    none is left. A day redone earlier is redone again when a later redo reaches it again
    (docs/time_based.md: a run takes 4, 6 and 7, 4 reaches 5, 5's redo reaches 6: 5, then 6)."""
    if not processed:
        return
    lookback = dt.timedelta(days=settings.dedupe_lookback_days)
    left = set(left_for_later)
    done = list(processed)
    for _ in range((today - min(processed)).days + 2):
        reached = [
            d
            for d in pending_load_days(history, settings)
            if d not in left and min(done) < d <= max(done) + lookback and d <= today
        ]
        if not reached:
            return
        for run in _runs_of(reached, settings.backfill_limit_days):
            _materialize(history, settings, run)
        done += reached
    raise AssertionError("the reference's redo of reached load days did not settle")


def days_to_process_after_run(
    history: LoadDayHistory,
    landed: Iterable[Mapping[str, Any]],
    settings: Settings,
    today: dt.date,
) -> tuple[list[Row], dict[dt.date, dt.date]]:
    """`run` of the time-based branch after the raw rows `landed` since the previous call:
    (the stored `days_to_process` rows, horizon(D) per event day), `history` updated in place.

    The run takes the pending load days (up to `today`) in ascending order, in runs of at most
    `backfill_limit_days` consecutive days (`_materialize`), then redoes the load days those
    reached (`_redo_reached`); its event days are then aggregated up to their horizons. Modelled
    only where the run limits take every pending load day (at most `backfill_limit_days` + 1,
    all inside the load window: the histories' load days fit), else it refuses.
    """
    history.raw.extend(dict(r) for r in landed)
    pending = [d for d in pending_load_days(history, settings) if d <= today]
    if len(pending) > settings.backfill_limit_days + 1:
        raise ValueError("the reference does not model run limits that defer load days")
    for run in _runs_of(pending, settings.backfill_limit_days):
        _materialize(history, settings, run)
    _redo_reached(history, settings, pending, (), today)
    return decision_rows(history), decided_horizons(history)


def days_to_process_after_backfill(
    history: LoadDayHistory,
    landed: Iterable[Mapping[str, Any]],
    settings: Settings,
    first: dt.date,
    last: dt.date,
    today: dt.date,
) -> tuple[list[Row], dict[dt.date, dt.date]]:
    """`backfill` of load days first .. last after the raw rows `landed` since the previous call,
    like `days_to_process_after_run`.

    Every load day from max(first, start_date) to min(last, today), pending or not, with data or
    not, in windows of `backfill_limit_days` days from the first (`_materialize`); then the
    pending load days after the range its changes reach, and what they reach
    (`_redo_reached`, the range's own days left alone). Pending load days before the range or
    beyond that reach stay pending for the next run.
    """
    history.raw.extend(dict(r) for r in landed)
    start, end = max(first, settings.start_date), min(last, today)
    if start <= end:
        days = _days(start, end)
        step = settings.backfill_limit_days
        for i in range(0, len(days), step):
            _materialize(history, settings, days[i : i + step])
        _redo_reached(history, settings, [start, end], days, today)
    return decision_rows(history), decided_horizons(history)


def attributes(
    daily: Iterable[Mapping[str, Any]], as_of: dt.date, windows: Sequence[int]
) -> list[Row]:
    """One row per non-null user over the daily rows of event days <= `as_of`: lifetime totals,
    active days, first/last event time, merged event counts, and for each N in `windows` the
    totals and active days of the N event days ending at `as_of` (built-in columns only)."""
    per_user: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for r in daily:
        if r["user_identifier"] is not None and r["event_date"] <= as_of:
            per_user[r["user_identifier"]].append(r)
    out = []
    for user, days in per_user.items():
        counts: dict[str, int] = defaultdict(int)
        for d in days:
            for name, rows in d["event_counts"].items():
                counts[name] += rows
        firsts = [d["first_event_tstamp"] for d in days if d["first_event_tstamp"] is not None]
        lasts = [d["last_event_tstamp"] for d in days if d["last_event_tstamp"] is not None]
        row: Row = {
            "user_identifier": user,
            "total_events": sum(d["total_events"] for d in days),
            "page_views": sum(d["page_views"] for d in days),
            "active_days": len({d["event_date"] for d in days}),
            "first_event_tstamp": min(firsts) if firsts else None,
            "last_event_tstamp": max(lasts) if lasts else None,
            "event_counts": dict(counts),
        }
        for n in windows:
            recent = [d for d in days if d["event_date"] > as_of - dt.timedelta(days=n)]
            row[f"total_events_last_{n}_days"] = sum(d["total_events"] for d in recent)
            row[f"page_views_last_{n}_days"] = sum(d["page_views"] for d in recent)
            row[f"active_days_last_{n}_days"] = len({d["event_date"] for d in recent})
        row["as_of"] = as_of
        out.append(row)
    return out


# --- sessions (SPEC section 6) -------------------------------------------------------------------


def _session_micros(row: Mapping[str, Any], settings: Settings) -> int | None:
    """A row's session timestamp, else its load time, in microseconds."""
    ts = row.get(settings.session_timestamp)
    return micros(ts if ts is not None else row.get("load_tstamp"))


def _usable(rows: Iterable[Mapping[str, Any]], settings: Settings, key_columns: Sequence[str]):
    """The events a session can hold, each as a small dict: session timestamp (else load time)
    at or after start_date, not sent more than days_late_allowed after it was created, and with
    the key the mode needs."""
    start = micros(dt.datetime.combine(settings.start_date, dt.time(), tzinfo=dt.UTC))
    late = settings.days_late_allowed * DAY_MICROS
    out = []
    for r in rows:
        ts = _session_micros(r, settings)
        sent, created = micros(r.get("dvce_sent_tstamp")), micros(r.get("dvce_created_tstamp"))
        if ts is None or ts < start:
            continue
        if sent is not None and created is not None and sent - created > late:
            continue
        e = {
            "event_id": r.get("event_id"),
            "event_name": r.get("event_name"),
            "page_url": r.get("page_url"),
            "derived": micros(r.get("derived_tstamp")),
            "created": created,
            "ts": ts,
            "user": _first_non_empty(r, settings.user_identifier),
            "session": _first_non_empty(r, settings.session_identifier),
            "tie": r.get("_row_hash"),
        }
        if _first_non_empty(r, key_columns) is None:
            continue
        out.append(e)
    return out


def _dedupe(events: list[Row], key: Callable[[Row], tuple]) -> list[Row]:
    """The first copy per key, by session timestamp, creation time, then every column read."""
    best: dict[tuple, Row] = {}

    def order(e: Row) -> tuple:
        return _nulls_last(
            e["ts"],
            e["created"],
            e["derived"],
            e["event_name"],
            e["page_url"],
            e["user"],
            e["session"],
            e["tie"],
        )

    for e in events:
        k = key(e)
        if k not in best or order(e) < order(best[k]):
            best[k] = e
    return list(best.values())


def _session_row(session_id: str, user: str | None, events: list[Row], quarantined: bool) -> Row:
    start = min(e["derived"] for e in events)
    end = max(e["derived"] for e in events)
    with_url = sorted(
        (e for e in events if e["page_url"] is not None),
        key=lambda e: _nulls_last(e["derived"], e["event_id"], e["page_url"]),
    )
    return {
        "session_identifier": session_id,
        "user_identifier": user,
        "start_tstamp": from_micros(start),
        "end_tstamp": from_micros(end),
        "total_events": len(events),
        "page_views": sum(e["event_name"] == "page_view" for e in events),
        "duration_s": (end - start) / 1_000_000.0,
        "first_page_url": with_url[0]["page_url"] if with_url else None,
        "last_page_url": with_url[-1]["page_url"] if with_url else None,
        "is_quarantined": quarantined,
    }


def _numbered(sessions: list[Row]) -> list[Row]:
    """session_number: 1-based per user by (start, session_identifier); null without a user."""
    per_user: dict[str, list[Row]] = defaultdict(list)
    for s in sessions:
        s["session_number"] = None
        if s["user_identifier"] is not None:
            per_user[s["user_identifier"]].append(s)
    for members in per_user.values():
        members.sort(key=lambda s: (s["start_tstamp"], s["session_identifier"]))
        for n, s in enumerate(members, start=1):
            s["session_number"] = n
    return sessions


def gap_sessions(rows: Iterable[Mapping[str, Any]], settings: Settings) -> list[Row]:
    """gap mode from scratch: per user, events by (derived_tstamp, event_id) (one copy per user,
    event_id and derived_tstamp); a gap strictly longer than session_gap_minutes starts a chain;
    a chain spanning more than max_session_days is cut into pieces at every multiple of
    max_session_days since 1970-01-01 UTC, each piece quarantined. id = sha256(user|first id)."""
    events = _usable(rows, settings, settings.user_identifier)
    events = _dedupe(events, lambda e: (e["user"], e["event_id"], e["derived"]))
    gap = settings.session_gap_minutes * MINUTE_MICROS
    cap = settings.max_session_days * DAY_MICROS
    per_user: dict[str, list[Row]] = defaultdict(list)
    for e in events:
        per_user[e["user"]].append(e)
    sessions = []
    for user, mine in per_user.items():
        mine.sort(key=lambda e: (e["derived"], e["event_id"]))
        chains: list[list[Row]] = []
        for e in mine:
            if chains and e["derived"] - chains[-1][-1]["derived"] <= gap:
                chains[-1].append(e)
            else:
                chains.append([e])
        for chain in chains:
            long = chain[-1]["derived"] - chain[0]["derived"] > cap
            pieces: dict[int, list[Row]] = defaultdict(list)
            for e in chain:
                pieces[e["derived"] // cap if long else 0].append(e)
            for piece in pieces.values():
                first = piece[0]["event_id"]  # the chain is in (derived, event_id) order
                text = user if first is None else f"{user}|{first}"
                sid = hashlib.sha256(text.encode()).hexdigest()
                sessions.append(_session_row(sid, user, piece, long))
    return _numbered(sessions)


def id_sessions(
    rows: Iterable[Mapping[str, Any]],
    settings: Settings,
    lifecycle: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[Row]:
    """id mode from scratch, with the lifecycle manifest's memory taken as given (as the spec's
    invariant does): `lifecycle[session id]` = {user_identifier, start_tstamp, is_quarantined}.

    Per session id (one copy per session and event_id): the span starts at the earliest session
    timestamp (a quarantined session: at its recorded start); the cap is start +
    max_session_days; the session is quarantined when recorded so or when an event is at or past
    the cap; events past the cap (and, if recorded quarantined, before the start) are left out.
    The user is the recorded one, else the largest user among the events kept."""
    lifecycle = lifecycle or {}
    events = _usable(rows, settings, settings.session_identifier)
    events = _dedupe(events, lambda e: (e["session"], e["event_id"]))
    cap_micros = settings.max_session_days * DAY_MICROS
    per_session: dict[str, list[Row]] = defaultdict(list)
    for e in events:
        per_session[e["session"]].append(e)
    sessions = []
    for sid, mine in per_session.items():
        known = lifecycle.get(sid)
        frozen = bool(known and known.get("is_quarantined"))
        start = micros(known["start_tstamp"]) if frozen else min(e["ts"] for e in mine)
        cap = start + cap_micros
        quarantined = frozen or max(e["ts"] for e in mine) >= cap
        kept = [e for e in mine if e["ts"] <= cap and not (frozen and e["ts"] < start)]
        if not kept:
            continue
        users_seen = [e["user"] for e in kept if e["user"] is not None]
        user = (known or {}).get("user_identifier") or (max(users_seen) if users_seen else None)
        sessions.append(_session_row(sid, user, kept, quarantined))
    return _numbered(sessions)


def visible_to_run(
    rows: Iterable[Mapping[str, Any]], settings: Settings, upper_limit: dt.datetime
) -> list[Mapping[str, Any]]:
    """The rows a run of the session models with window upper limit `upper_limit` sessionizes:
    those whose session timestamp (else load time) is at or before it."""
    upper = micros(upper_limit)
    return [r for r in rows if (ts := _session_micros(r, settings)) is not None and ts <= upper]


def id_lifecycle_after_run(
    memory: dict[str, Row],
    rows: Iterable[Mapping[str, Any]],
    settings: Settings,
    upper_limit: dt.datetime,
) -> None:
    """id mode's lifecycle memory, one run at a time (issue 19: the memory is modelled, not read
    from the product's manifest). `rows` are filtered_events as the run saw them; the run sees
    the events with a session timestamp up to its window's `upper_limit`.

    Every session with such an event is decided from its old row in `memory` (updated in place):
    a quarantined row keeps its start (events before it or past its cap are left out), otherwise
    the start is the first event; quarantined once an event is at or past start +
    max_session_days; the end is least(start + max_session_days, latest event), a quarantined
    row's its cap (its frozen span [start, start + max_session_days]); the user is the
    old row's, else the largest user among the events kept. A session left with no event kept
    keeps its old row. Deciding a session the run did not touch changes nothing (its events and
    old row are the ones its last decision saw), so every visible session is decided."""
    upper = micros(upper_limit)
    events = [e for e in _usable(rows, settings, settings.session_identifier) if e["ts"] <= upper]
    events = _dedupe(events, lambda e: (e["session"], e["event_id"]))
    cap_micros = settings.max_session_days * DAY_MICROS
    per_session: dict[str, list[Row]] = defaultdict(list)
    for e in events:
        per_session[e["session"]].append(e)
    for sid, mine in per_session.items():
        known = memory.get(sid)
        frozen = bool(known and known["is_quarantined"])
        start = micros(known["start_tstamp"]) if frozen else min(e["ts"] for e in mine)
        cap = start + cap_micros
        latest = max(e["ts"] for e in mine)
        kept = [e for e in mine if e["ts"] <= cap and not (frozen and e["ts"] < start)]
        if not kept:
            continue
        users_seen = [e["user"] for e in kept if e["user"] is not None]
        memory[sid] = {
            "user_identifier": (known or {}).get("user_identifier")
            or (max(users_seen) if users_seen else None),
            "start_tstamp": from_micros(start),
            "end_tstamp": from_micros(cap if frozen else min(cap, latest)),
            "is_quarantined": frozen or latest >= cap,
        }


def users(sessions: Iterable[Mapping[str, Any]]) -> list[Row]:
    """One row per non-null user of the sessions."""
    per_user: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for s in sessions:
        if s["user_identifier"] is not None:
            per_user[s["user_identifier"]].append(s)
    return [
        {
            "user_identifier": user,
            "first_session_start_tstamp": min(s["start_tstamp"] for s in mine),
            "last_session_end_tstamp": max(s["end_tstamp"] for s in mine),
            "sessions": len(mine),
            "total_events": sum(s["total_events"] for s in mine),
            "page_views": sum(s["page_views"] for s in mine),
        }
        for user, mine in per_user.items()
    ]


def _median(values: Sequence[int]) -> float:
    """The median with linear interpolation between the two middle values (SQL `percentile`)."""
    ordered = sorted(values)
    position = 0.5 * (len(ordered) - 1)
    lower, upper = math.floor(position), math.ceil(position)
    if lower == upper:
        return float(ordered[lower])
    return (upper - position) * ordered[lower] + (position - lower) * ordered[upper]


def user_session_stats(sessions: Iterable[Mapping[str, Any]]) -> list[Row]:
    """One row per non-null user of the sessions: session count and duration statistics in
    seconds (durations end - start, counted in microseconds), rounded to the microsecond."""
    per_user: dict[str, list[int]] = defaultdict(list)
    for s in sessions:
        if s["user_identifier"] is not None:
            per_user[s["user_identifier"]].append(
                micros(s["end_tstamp"]) - micros(s["start_tstamp"])
            )
    return [
        {
            "user_identifier": user,
            "sessions": len(durations),
            "total_duration_s": round(sum(durations) / 1e6, 6),
            "mean_duration_s": round(sum(durations) / len(durations) / 1e6, 6),
            "median_duration_s": round(_median(durations) / 1e6, 6),
            "min_duration_s": round(min(durations) / 1e6, 6),
            "max_duration_s": round(max(durations) / 1e6, 6),
        }
        for user, durations in per_user.items()
    ]


def rounded(rows: Iterable[Mapping[str, Any]], digits: int = 6) -> list[Row]:
    """Rows with their float values rounded (stored doubles against the reference's)."""
    return [
        {k: round(v, digits) if isinstance(v, float) else v for k, v in r.items()} for r in rows
    ]


def gap_lifecycle(sessions: Iterable[Mapping[str, Any]]) -> list[Row]:
    """gap mode's lifecycle manifest mirrors the sessions (start and end on derived_tstamp)."""
    return [
        {
            k: s[k]
            for k in (
                "session_identifier",
                "user_identifier",
                "start_tstamp",
                "end_tstamp",
                "is_quarantined",
            )
        }
        for s in sessions
    ]


def gap_superseded(old: Iterable[Mapping[str, Any]], new: Iterable[Mapping[str, Any]]) -> list[Row]:
    """gap mode's superseded_sessions rows of one run, from the sessions before it (`old`) and
    after it (`new`): every old id gone from `new`, once per new session of its user whose span
    overlaps its own (ends included; none: one row without a successor), with the reason --
    `removed` (no successor), `cut at max_session_days` (several successors, this one
    quarantined), `split` (several), `merged` (the successor overlaps several old sessions),
    else `first event changed`."""
    old, new = list(old), list(new)
    new_ids = {s["session_identifier"] for s in new}

    def overlap(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
        return (
            a["user_identifier"] is not None
            and a["user_identifier"] == b["user_identifier"]
            and b["start_tstamp"] <= a["end_tstamp"]
            and b["end_tstamp"] >= a["start_tstamp"]
        )

    covers = {s["session_identifier"]: sum(overlap(o, s) for o in old) for s in new}
    rows = []
    for gone in (o for o in old if o["session_identifier"] not in new_ids):
        successors = [s for s in new if overlap(gone, s)]
        for s in successors or [None]:
            if s is None:
                reason = "removed"
            elif len(successors) > 1:
                reason = "cut at max_session_days" if s["is_quarantined"] else "split"
            elif covers[s["session_identifier"]] > 1:
                reason = "merged"
            else:
                reason = "first event changed"
            rows.append(
                {
                    "superseded_session_identifier": gone["session_identifier"],
                    "session_identifier": None if s is None else s["session_identifier"],
                    "user_identifier": gone["user_identifier"],
                    "reason": reason,
                }
            )
    return rows


def quarantined_sessions(lifecycle: Iterable[Mapping[str, Any]], settings: Settings) -> list[Row]:
    """quarantined_sessions from the lifecycle rows (gap mode: the quarantined pieces; id mode:
    every session the lifecycle memory holds as quarantined, since that table only grows): id,
    user, start and the cap, start + max_session_days (when each was quarantined is left out: it
    is the clock of the run that saw it)."""
    cap = dt.timedelta(days=settings.max_session_days)
    return [
        {
            "session_identifier": row["session_identifier"],
            "user_identifier": row["user_identifier"],
            "start_tstamp": row["start_tstamp"],
            "capped_at": row["start_tstamp"] + cap,
        }
        for row in lifecycle
        if row["is_quarantined"]
    ]


# --- comparing with the lake ---------------------------------------------------------------------


def delta_rows(
    path: str, columns: Sequence[str] | None = None, missing_is_empty: bool = False
) -> list[Row]:
    """A Delta table's rows as dicts (delta-rs: no Spark job), timestamps as aware UTC.
    `missing_is_empty`: a table not created yet has no rows (a comparison with a reference that
    expects rows still fails)."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    if missing_is_empty:
        try:
            DeltaTable(path)
        except TableNotFoundError:
            return []
    table = DeltaTable(path).to_pyarrow_table(columns=list(columns) if columns else None)
    return [normalize(r) for r in table.to_pylist()]


def normalize(row: Mapping[str, Any]) -> Row:
    """Values made comparable: datetimes aware UTC, map columns (lists of pairs) as dicts."""
    out = {}
    for k, v in row.items():
        if isinstance(v, dt.datetime):
            v = utc(v)
        elif isinstance(v, list) and v and all(isinstance(p, tuple) and len(p) == 2 for p in v):
            v = dict(v)
        out[k] = v
    return out


def differences(
    name: str,
    stored: Iterable[Mapping[str, Any]],
    expected: Iterable[Mapping[str, Any]],
    key: Sequence[str],
    columns: Sequence[str] | None = None,
    limit: int = 10,
) -> list[str]:
    """Row-by-row differences by key (on `columns`, default: the expected rows' columns), as
    sentences naming the table, the key and the columns; empty when the tables are equal."""
    expected = [dict(r) for r in expected]
    stored = [dict(r) for r in stored]
    columns = list(columns or (expected[0].keys() if expected else ()))

    def index(rows: list[Row], side: str) -> dict[tuple, Row]:
        out: dict[tuple, Row] = {}
        for r in rows:
            k = tuple(r.get(c) for c in key)
            if k in out:
                found.append(f"{name}: key {k} appears twice in the {side} rows")
            out[k] = r
        return out

    found: list[str] = []
    got, want = index(stored, "stored"), index(expected, "reference")
    for k in sorted(set(want) - set(got), key=repr):
        found.append(f"{name}: missing {k} (reference: {want[k]})")
    for k in sorted(set(got) - set(want), key=repr):
        found.append(f"{name}: unexpected {k} (stored: {got[k]})")
    for k in sorted(set(got) & set(want), key=repr):
        diff = {
            c: (got[k].get(c), want[k].get(c)) for c in columns if got[k].get(c) != want[k].get(c)
        }
        if diff:
            found.append(f"{name}: {k} differs (stored, reference): {diff}")
    if len(found) > limit:
        found = found[:limit] + [f"... and {len(found) - limit} more"]
    return found
