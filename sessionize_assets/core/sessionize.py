"""Sessions from events, DataFrame -> DataFrame (SPEC section 6): the single source of truth.

The same functions serve the incremental path (on the events of the sessions a run touches) and
`verify`'s full recompute (on every event), so both always agree on what a session is.

*id mode* (Snowplow): a session is the set of events sharing the session identifier (first
non-null of `session_identifier`). Its span starts at its earliest session timestamp
(`session_timestamp`, else `load_tstamp`); events more than `max_session_days` after the start are
left out and the session is quarantined. A quarantined session keeps its start (the lifecycle
manifest's, as given). A session's user is the one the lifecycle manifest holds (first seen),
else the largest non-null user identifier among its events. (That rule, in plain Python with its
named cases, is `core.lifecycle`; `sessionize_by_id` is its Spark form.)

*gap mode* (the blog, seed 002): per user (first non-null of `user_identifier`), events sorted by
`derived_tstamp` then `event_id`; a gap strictly longer than `session_gap_minutes` starts a new
chain. A chain spanning more than `max_session_days` is cut at UTC boundaries every
`max_session_days` days from 1970-01-01 and every piece is quarantined. A session's id is
sha2(user | first event's id).

Both modes leave out, and count, events before `start_date` (on the session timestamp), events sent
more than `days_late_allowed` days after they were created, and events without the key their mode
needs.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, Window, WindowSpec
from pyspark.sql import functions as F

from sessionize_assets.core.lifecycle import AFTER_MAX_SESSION_DAYS, QUARANTINED_SESSION, Case
from sessionize_assets.core.schema import EVENT_DATE, LOAD_DATE
from sessionize_assets.errors import UserError
from sessionize_assets.settings import Settings

# Working columns of prepared events.
SESSION_KEY = "_session_key"
USER_KEY = "_user_key"
SESSION_TS = "_session_ts"
SENT_LATE = "_sent_late"
REASON = "_reason"
PART = "_part"  # gap mode: an independent range of one user's events (incremental reads)

# Lifecycle columns carried next to a computed session (on the mode's ordering timestamp).
LC_START = "_lc_start"
LC_END = "_lc_end"

PREPARED_COLUMNS: tuple[str, ...] = (
    "event_id",
    "event_name",
    "page_url",
    "derived_tstamp",
    "dvce_created_tstamp",
    SESSION_KEY,
    USER_KEY,
    SESSION_TS,
    SENT_LATE,
)

SESSION_COLUMNS: tuple[str, ...] = (
    "session_identifier",
    "user_identifier",
    "start_tstamp",
    "end_tstamp",
    "total_events",
    "page_views",
    "duration_s",
    "first_page_url",
    "last_page_url",
    "session_number",
    "is_quarantined",
)
LIFECYCLE_COLUMNS: tuple[str, ...] = (
    "session_identifier",
    "user_identifier",
    "start_tstamp",
    "end_tstamp",
    "is_quarantined",
)
USER_COLUMNS: tuple[str, ...] = (
    "user_identifier",
    "first_session_start_tstamp",
    "last_session_end_tstamp",
    "sessions",
    "total_events",
    "page_views",
)
USER_SESSION_STATS_COLUMNS: tuple[str, ...] = (
    "user_identifier",
    "sessions",
    "total_duration_s",
    "mean_duration_s",
    "median_duration_s",
    "min_duration_s",
    "max_duration_s",
)

# Named rules that leave an event out of sessions (every one is counted).
BEFORE_START_DATE = "before start_date"
SENT_LATE_RULE = "sent more than days_late_allowed after created"
NO_SESSION_IDENTIFIER = "no session identifier"
NO_USER_IDENTIFIER = "no user identifier"
DUPLICATE_EVENT = "duplicate event_id"
# AFTER_MAX_SESSION_DAYS and QUARANTINED_SESSION: core.lifecycle's rule (imported above).

EXCLUSION_RULES: tuple[str, ...] = (
    BEFORE_START_DATE,
    SENT_LATE_RULE,
    NO_SESSION_IDENTIFIER,
    NO_USER_IDENTIFIER,
    DUPLICATE_EVENT,
    AFTER_MAX_SESSION_DAYS,
    QUARANTINED_SESSION,
)

MICROS_PER_DAY = 86_400_000_000
MICROS_PER_MINUTE = 60_000_000


@dataclass(frozen=True)
class Sessionized:
    """Sessions (SESSION_COLUMNS minus session_number, plus LC_START/LC_END and PART when given)
    and the events left out of them (prepared columns plus REASON)."""

    sessions: DataFrame
    excluded: DataFrame


def _key(columns: Sequence[str]) -> Column:
    """First non-null, non-empty value of the columns."""
    values = [F.when(F.col(c).cast("string") != "", F.col(c).cast("string")) for c in columns]
    return values[0] if len(values) == 1 else F.coalesce(*values)


def user_key(settings: Settings) -> Column:
    """The user key of an event: the first non-empty of `user_identifier`'s columns."""
    return _key(settings.user_identifier)


def _micros(column: str | Column) -> Column:
    return F.unix_micros(F.col(column) if isinstance(column, str) else column)


def _plus_micros(column: str | Column, micros: int) -> Column:
    return F.timestamp_micros(_micros(column) + F.lit(micros))


def required_columns(settings: Settings) -> list[str]:
    """The filtered_events columns the session branch reads."""
    columns = [
        "event_id",
        "event_name",
        "page_url",
        "derived_tstamp",
        "dvce_created_tstamp",
        "dvce_sent_tstamp",
        "load_tstamp",
        settings.session_timestamp,
        *settings.session_identifier,
        *settings.user_identifier,
    ]
    return list(dict.fromkeys(columns))


def source_columns(settings: Settings, available: Sequence[str]) -> list[str]:
    """The columns to read from filtered_events (`required_columns`, each checked to be there)."""
    missing = [c for c in required_columns(settings) if c not in available]
    if missing:
        raise UserError(
            f"filtered_events has no column `{missing[0]}`, which the session settings "
            "(session_identifier, user_identifier, session_timestamp) need."
        )
    return required_columns(settings)


def shared_columns(settings: Settings) -> list[str]:
    """Every column the session branch may read from filtered_events (the event and load days
    the reads filter on included)."""
    return list(dict.fromkeys([*required_columns(settings), EVENT_DATE, LOAD_DATE]))


def prepare_events(events: DataFrame, settings: Settings, keep: Sequence[str] = ()) -> DataFrame:
    """The few columns sessionization needs, keys and session timestamp resolved (PREPARED_COLUMNS),
    plus the `keep` columns as they are."""
    source_columns(settings, events.columns)
    late_micros = settings.days_late_allowed * MICROS_PER_DAY
    sent_late = F.coalesce(
        (_micros("dvce_sent_tstamp") - _micros("dvce_created_tstamp")) > F.lit(late_micros),
        F.lit(False),
    )
    return events.select(
        F.col("event_id").cast("string").alias("event_id"),
        F.col("event_name").cast("string").alias("event_name"),
        F.col("page_url").cast("string").alias("page_url"),
        F.col("derived_tstamp").cast("timestamp").alias("derived_tstamp"),
        F.col("dvce_created_tstamp").cast("timestamp").alias("dvce_created_tstamp"),
        _key(settings.session_identifier).alias(SESSION_KEY),
        _key(settings.user_identifier).alias(USER_KEY),
        F.coalesce(F.col(settings.session_timestamp).cast("timestamp"), F.col("load_tstamp")).alias(
            SESSION_TS
        ),
        sent_late.alias(SENT_LATE),
        *keep,
    )


def exclusion_reason(settings: Settings) -> Column:
    """Why a prepared event cannot be in any session (null: usable)."""
    start = dt.datetime.combine(settings.start_date, dt.time(), tzinfo=dt.UTC)
    key, rule = (
        (SESSION_KEY, NO_SESSION_IDENTIFIER)
        if settings.session_mode == "id"
        else (USER_KEY, NO_USER_IDENTIFIER)
    )
    return (
        F.when(F.col(SESSION_TS) < F.lit(start), F.lit(BEFORE_START_DATE))
        .when(F.col(SENT_LATE), F.lit(SENT_LATE_RULE))
        .when(F.col(key).isNull(), F.lit(rule))
    )


def with_reason(prepared: DataFrame, settings: Settings) -> DataFrame:
    """Prepared events with REASON (null for usable events)."""
    return prepared.withColumn(REASON, exclusion_reason(settings))


def usable(prepared: DataFrame, settings: Settings) -> DataFrame:
    """The prepared events that can be in a session."""
    return prepared.filter(exclusion_reason(settings).isNull())


COPY = "_copy"


# The order of the copies of one key, the copy kept first, each column ascending, nulls last: by
# session timestamp, creation time, then every column a session takes from its events
# (`core.gap_rows` orders its copies by the same columns). Copies that tie on all of them give
# the same sessions whichever is kept, so the choice never changes a session however the rows
# were read. The session key (constant in an id-mode window, never read in gap mode) and the
# row hash are not in it: before session 49 they were (the session branch read the row hash
# for nothing else), and the gap sessions of the rebuild shuffled about 100 of their 182 bytes
# per event only to order copies by them.
COPY_ORDER: tuple[str, ...] = (
    SESSION_TS,
    "dvce_created_tstamp",
    "derived_tstamp",
    "event_name",
    "page_url",
    USER_KEY,
)


def _copy_order(*constant: str) -> list[Column]:
    """COPY_ORDER as sort columns, without the columns the key holds constant."""
    return [F.col(c).asc_nulls_last() for c in COPY_ORDER if c not in constant]


def _copies_window(partition: Sequence[str], key: Sequence[str]) -> WindowSpec:
    """Within `partition`, the rows ordered by `key` and then `_copy_order`: the copies of a key
    are neighbours, the copy kept first."""
    return Window.partitionBy(*partition).orderBy(
        *[F.col(c) for c in key], *_copy_order(*partition, *key)
    )


def _copies_marked(events: DataFrame, window: WindowSpec, key: Sequence[str]) -> DataFrame:
    """The events with COPY: true for every copy of a (partition, key) key but the first, on
    `_copies_window(partition, key)`: a row is a copy when the row before it holds the same key
    (null equal to null). The caller's own windows on the same spec run in the same sort: one
    shuffle and one sort of the events, where ranking the copies in a window of their own
    (before session 48) shuffled and sorted them once more."""
    before = F.lag(F.struct(F.lit(True).alias("_r"), *key)).over(window)
    same = before.getField("_r").isNotNull()
    for c in key:
        same = same & before.getField(c).eqNullSafe(F.col(c))
    return events.withColumn(COPY, same)


def _session_aggregates() -> list[Column]:
    first = F.min(
        F.when(F.col("page_url").isNotNull(), F.struct("derived_tstamp", "event_id", "page_url"))
    )
    last = F.max(
        F.when(F.col("page_url").isNotNull(), F.struct("derived_tstamp", "event_id", "page_url"))
    )
    return [
        F.min("derived_tstamp").alias("start_tstamp"),
        F.max("derived_tstamp").alias("end_tstamp"),
        F.count(F.lit(1)).alias("total_events"),
        F.sum(F.when(F.col("event_name") == "page_view", 1).otherwise(0))
        .cast("long")
        .alias("page_views"),
        first.getField("page_url").alias("first_page_url"),
        last.getField("page_url").alias("last_page_url"),
    ]


def _finish(sessions: DataFrame, extra: Sequence[str] = ()) -> DataFrame:
    duration = (_micros("end_tstamp") - _micros("start_tstamp")) / F.lit(1_000_000.0)
    columns = [c for c in SESSION_COLUMNS if c != "session_number"]
    return sessions.withColumn("duration_s", duration).select(*columns, LC_START, LC_END, *extra)


def _lifecycle_case() -> Column:
    """core.lifecycle.case_of on the old row joined as `_known_*` columns."""
    return (
        F.when(F.coalesce(F.col("_known_quarantined"), F.lit(False)), F.lit(Case.FROZEN.value))
        .when(F.col("_known_start").isNotNull(), F.lit(Case.OPEN.value))
        .otherwise(F.lit(Case.NEW.value))
    )


def sessionize_by_id(
    events: DataFrame, settings: Settings, lifecycle: DataFrame | None = None
) -> Sessionized:
    """id mode on usable prepared events; `lifecycle` (LIFECYCLE_COLUMNS) is taken as given:
    a quarantined session keeps its start, every known session keeps its first-seen user.

    The copies of an event id are found in the sort the session's window needs anyway
    (`_copies_marked`): one shuffle and one sort of the events, where ranking them in a window
    of their own took two shuffles and three sorts."""
    marked_copies = _copies_marked(
        events, _copies_window([SESSION_KEY], ["event_id"]), ["event_id"]
    )
    kept = marked_copies.filter(~F.col(COPY)).drop(COPY)
    dupes = marked_copies.filter(F.col(COPY)).drop(COPY).withColumn(REASON, F.lit(DUPLICATE_EVENT))
    if lifecycle is not None:
        known = lifecycle.select(
            F.col("session_identifier").alias(SESSION_KEY),
            F.col("user_identifier").alias("_known_user"),
            F.col("start_tstamp").alias("_known_start"),
            F.col("is_quarantined").alias("_known_quarantined"),
        )
        kept = kept.join(F.broadcast(known), on=SESSION_KEY, how="left")
    else:
        kept = (
            kept.withColumn("_known_user", F.lit(None).cast("string"))
            .withColumn("_known_start", F.lit(None).cast("timestamp"))
            .withColumn("_known_quarantined", F.lit(None).cast("boolean"))
        )
    # core.lifecycle.next_lifecycle, case by case (checked against it in test_lifecycle.py).
    session = Window.partitionBy(SESSION_KEY)
    frozen = F.col("_case") == F.lit(Case.FROZEN.value)
    ts, cap = F.col(SESSION_TS), F.col("_cap")
    marked = (
        kept.withColumn("_case", _lifecycle_case())
        # span_start: the frozen start, else the first event
        .withColumn(
            LC_START,
            F.when(frozen, F.col("_known_start")).otherwise(F.min(SESSION_TS).over(session)),
        )
        # cap_of: start + max_session_days
        .withColumn("_cap", _plus_micros(LC_START, settings.max_session_days * MICROS_PER_DAY))
        # is_quarantined: frozen, or an event at or past the cap
        .withColumn("_quarantined", frozen | (F.max(SESSION_TS).over(session) >= cap))
        # the end: least(start + cap, the latest event), over every event (Snowplow's rule); a
        # frozen span ends at its cap (its events past the cap are not read: id_read_ranges)
        .withColumn(
            "_end", F.when(frozen, cap).otherwise(F.least(cap, F.max(SESSION_TS).over(session)))
        )
        # event_reason
        .withColumn(
            REASON,
            F.when(frozen & ((ts < F.col(LC_START)) | (ts > cap)), F.lit(QUARANTINED_SESSION)).when(
                ts > cap, F.lit(AFTER_MAX_SESSION_DAYS)
            ),
        )
    )
    included = marked.filter(F.col(REASON).isNull())
    sessions = (
        included.groupBy(SESSION_KEY)
        .agg(
            # session_user: the first-seen user, else the largest among the events kept
            F.coalesce(F.first("_known_user", ignorenulls=True), F.max(USER_KEY)).alias(
                "user_identifier"
            ),
            *_session_aggregates(),
            F.bool_or("_quarantined").alias("is_quarantined"),
            F.min(LC_START).alias(LC_START),
            F.max("_end").alias(LC_END),
        )
        .withColumnRenamed(SESSION_KEY, "session_identifier")
    )
    excluded = marked.filter(F.col(REASON).isNotNull()).select(*PREPARED_COLUMNS, REASON)
    return Sessionized(
        _finish(sessions), excluded.unionByName(dupes.select(*PREPARED_COLUMNS, REASON))
    )


def sessionize_by_gap(events: DataFrame, settings: Settings) -> Sessionized:
    """gap mode on usable prepared events. When the events carry PART, each (user, part) is
    sessionized on its own (incremental reads of separate ranges).

    One sort of the events does both the deduplication and the chaining (`_copies_marked`, in
    the chains' order). A copy is 0 microseconds after the row before it, so it starts no chain
    and moves no gap: dropping the copies after the chaining leaves every chain as chaining the
    kept rows alone would. A user's PART ranges never overlap in time (`gap_change_ranges`), so
    the copies of a (user, event_id, derived_tstamp) key are in one part, as when they were
    ranked over the user. (Ranking the copies in a window of their own, before session 48,
    shuffled every event once more and sorted it twice more: docs/benchmarks.md, session 48.)"""
    if PART not in events.columns:
        events = events.withColumn(PART, F.lit(0).cast("long"))
    gap_micros = settings.session_gap_minutes * MICROS_PER_MINUTE
    max_micros = settings.max_session_days * MICROS_PER_DAY
    key = ["derived_tstamp", "event_id"]
    ordered = _copies_window([USER_KEY, PART], key)
    micros = _micros("derived_tstamp")
    gap = micros - F.lag(micros).over(ordered)
    chained = _copies_marked(events, ordered, key).withColumn(
        "_chain",
        F.sum(F.when(gap.isNull() | (gap > F.lit(gap_micros)), 1).otherwise(0)).over(
            ordered.rowsBetween(Window.unboundedPreceding, Window.currentRow)
        ),
    )
    dupes = chained.filter(F.col(COPY)).withColumn(REASON, F.lit(DUPLICATE_EVENT))
    kept = chained.filter(~F.col(COPY)).drop(COPY)
    chain = Window.partitionBy(USER_KEY, PART, "_chain")
    span = F.max(micros).over(chain) - F.min(micros).over(chain)
    boundary = (micros - F.pmod(micros, F.lit(max_micros))) / F.lit(max_micros)
    pieces = kept.withColumn("_long", span > F.lit(max_micros)).withColumn(
        "_piece", F.when(F.col("_long"), boundary.cast("long")).otherwise(F.lit(None).cast("long"))
    )
    first_event = F.min(F.struct("derived_tstamp", "event_id")).getField("event_id")
    sessions = (
        pieces.groupBy(USER_KEY, PART, "_chain", "_piece")
        .agg(
            first_event.alias("_first_event"),
            *_session_aggregates(),
            F.bool_or("_long").alias("is_quarantined"),
        )
        .withColumn(
            "session_identifier",
            F.sha2(F.concat_ws("|", F.col(USER_KEY), F.col("_first_event")), 256),
        )
        .withColumn("user_identifier", F.col(USER_KEY))
        .withColumn(LC_START, F.col("start_tstamp"))
        .withColumn(LC_END, F.col("end_tstamp"))
    )
    return Sessionized(_finish(sessions, extra=(PART,)), dupes.select(*PREPARED_COLUMNS, REASON))


def sessionize(
    events: DataFrame, settings: Settings, lifecycle: DataFrame | None = None
) -> Sessionized:
    """Sessions of usable prepared events in the configured mode (lifecycle used in id mode)."""
    if settings.session_mode == "id":
        return sessionize_by_id(events, settings, lifecycle)
    return sessionize_by_gap(events, settings)


def number_sessions(sessions: DataFrame) -> DataFrame:
    """`session_number`: 1-based order of a user's sessions by start, ties by session_identifier
    (null for sessions without a user)."""
    order = Window.partitionBy("user_identifier").orderBy("start_tstamp", "session_identifier")
    number = F.when(F.col("user_identifier").isNotNull(), F.row_number().over(order))
    return sessions.withColumn("session_number", number.cast("long"))


def compute_sessions(
    events: DataFrame,
    settings: Settings,
    lifecycle: DataFrame | None = None,
    upper_limit: dt.datetime | None = None,
) -> Sessionized:
    """Full recompute from filtered_events-like rows: every event with a session timestamp at or
    after start_date (and at or before `upper_limit` when given). Sessions are numbered."""
    prepared = with_reason(prepare_events(events, settings), settings)
    if upper_limit is not None:
        prepared = prepared.filter(F.col(SESSION_TS) <= F.lit(upper_limit))
    result = sessionize(prepared.filter(F.col(REASON).isNull()).drop(REASON), settings, lifecycle)
    left_out = prepared.filter(F.col(REASON).isNotNull()).select(*PREPARED_COLUMNS, REASON)
    return Sessionized(number_sessions(result.sessions), result.excluded.unionByName(left_out))


def session_rows(sessions: DataFrame) -> DataFrame:
    """The sessions table's columns, in order."""
    return sessions.select(*SESSION_COLUMNS)


def lifecycle_rows(sessions: DataFrame) -> DataFrame:
    """The lifecycle manifest rows of computed sessions (start and end on the mode's timestamp)."""
    return sessions.select(
        "session_identifier",
        "user_identifier",
        F.col(LC_START).alias("start_tstamp"),
        F.col(LC_END).alias("end_tstamp"),
        "is_quarantined",
    )


def users_from_sessions(sessions: DataFrame) -> DataFrame:
    """One row per non-null user (USER_COLUMNS)."""
    return (
        sessions.filter(F.col("user_identifier").isNotNull())
        .groupBy("user_identifier")
        .agg(
            F.min("start_tstamp").alias("first_session_start_tstamp"),
            F.max("end_tstamp").alias("last_session_end_tstamp"),
            F.count(F.lit(1)).alias("sessions"),
            F.sum("total_events").cast("long").alias("total_events"),
            F.sum("page_views").cast("long").alias("page_views"),
        )
        .select(*USER_COLUMNS)
    )


def user_session_stats_from_sessions(sessions: DataFrame) -> DataFrame:
    """Per-user session-duration statistics (the example extra model), exact and order-free."""
    micros = _micros("end_tstamp") - _micros("start_tstamp")
    total = F.sum(micros)
    return (
        sessions.filter(F.col("user_identifier").isNotNull())
        .withColumn("_micros", micros)
        .groupBy("user_identifier")
        .agg(
            F.count(F.lit(1)).alias("sessions"),
            (total / F.lit(1_000_000.0)).alias("total_duration_s"),
            (total / F.count(F.lit(1)) / F.lit(1_000_000.0)).alias("mean_duration_s"),
            (F.percentile("_micros", 0.5) / F.lit(1_000_000.0)).alias("median_duration_s"),
            (F.min("_micros") / F.lit(1_000_000.0)).alias("min_duration_s"),
            (F.max("_micros") / F.lit(1_000_000.0)).alias("max_duration_s"),
        )
        .select(*USER_SESSION_STATS_COLUMNS)
    )


# --- What an incremental run must re-read -------------------------------------------------------


def id_read_ranges(
    changes: DataFrame, lifecycle: DataFrame | None, settings: Settings
) -> DataFrame:
    """id mode: per session touched by usable changed events (inserted or deleted), the range of
    session timestamps that holds all of its current events: `[_read_lo, _read_hi]` (and
    `_is_known`: the lifecycle manifest has it).

    A known session's events lie within its lifecycle span, the changed events within theirs; a
    quarantined session only ever keeps its frozen span [start, start + max_session_days].
    """
    touched = changes.groupBy(SESSION_KEY).agg(
        F.min(SESSION_TS).alias("_changed_lo"), F.max(SESSION_TS).alias("_changed_hi")
    )
    if lifecycle is None:
        return touched.select(
            SESSION_KEY,
            F.col("_changed_lo").alias("_read_lo"),
            F.col("_changed_hi").alias("_read_hi"),
            F.lit(False).alias("_is_known"),
        )
    known = lifecycle.select(
        F.col("session_identifier").alias(SESSION_KEY),
        F.col("start_tstamp").alias("_known_start"),
        F.col("end_tstamp").alias("_known_end"),
        F.col("is_quarantined").alias("_known_quarantined"),
    )
    frozen = F.coalesce(F.col("_known_quarantined"), F.lit(False))
    max_micros = settings.max_session_days * MICROS_PER_DAY
    joined = touched.join(known, on=SESSION_KEY, how="left")
    lo = F.when(frozen, F.col("_known_start")).otherwise(
        F.least(F.col("_changed_lo"), F.coalesce(F.col("_known_start"), F.col("_changed_lo")))
    )
    hi = F.when(frozen, _plus_micros("_known_start", max_micros)).otherwise(
        F.greatest(F.col("_changed_hi"), F.coalesce(F.col("_known_end"), F.col("_changed_hi")))
    )
    return joined.select(
        SESSION_KEY,
        lo.alias("_read_lo"),
        hi.alias("_read_hi"),
        F.col("_known_start").isNotNull().alias("_is_known"),
    )


def gap_reach_micros(settings: Settings) -> int:
    """How far from a changed event sessions can change: max_session_days + gap."""
    return (
        settings.max_session_days * MICROS_PER_DAY
        + settings.session_gap_minutes * MICROS_PER_MINUTE
    )


def gap_margin_micros(settings: Settings) -> int:
    """How much more must be read around that to recompute those sessions exactly:
    max_session_days + 2 gaps (a chain cut by the read edge that reaches the changed range is
    then seen spanning more than max_session_days, so it is known to be cut)."""
    return (
        settings.max_session_days * MICROS_PER_DAY
        + 2 * settings.session_gap_minutes * MICROS_PER_MINUTE
    )


def gap_chains(lifecycle: DataFrame, settings: Settings) -> DataFrame:
    """gap mode: the chains of a lifecycle's sessions, one row each (USER_KEY, `_chain_lo`,
    `_chain_hi` in microseconds). A user's sessions less than a gap apart are pieces of one chain
    (a chain longer than max_session_days is cut into pieces); more than a gap apart, two
    chains: so the chains are exactly the runs of the user's events with no gap above
    session_gap_minutes."""
    gap = settings.session_gap_minutes * MICROS_PER_MINUTE
    rows = lifecycle.select(
        F.col("user_identifier").alias(USER_KEY),
        _micros("start_tstamp").alias("_s"),
        _micros("end_tstamp").alias("_e"),
    ).filter(F.col(USER_KEY).isNotNull())
    order = Window.partitionBy(USER_KEY).orderBy("_s", "_e")
    before = F.max("_e").over(order.rowsBetween(Window.unboundedPreceding, -1))
    starts = F.when(before.isNull() | (F.col("_s") - before > F.lit(gap)), 1).otherwise(0)
    numbered = rows.withColumn(
        "_chain",
        F.sum(starts).over(order.rowsBetween(Window.unboundedPreceding, Window.currentRow)),
    )
    return numbered.groupBy(USER_KEY, "_chain").agg(
        F.min("_s").alias("_chain_lo"), F.max("_e").alias("_chain_hi")
    )


def gap_change_ranges(
    changes: DataFrame, settings: Settings, chains: DataFrame | None = None
) -> DataFrame:
    """gap mode: per user, independent ranges (PART) around usable changed events, each with the
    range whose sessions may change `[_changed_lo, _changed_hi]` (changed events +- reach) and
    the range to re-read `[_read_lo, _read_hi]` (that +- margin, on derived_tstamp).

    Sessions wholly outside the changed range are provably the same before and after the
    changes, and those overlapping it are computed exactly from the events in the read range.
    Each cluster of changed times (a gap or less apart) gets its ranges; a user's ranges whose
    read ranges overlap (or touch) are merged, so every event is read once.

    With `chains` (`gap_chains` of the changed users' lifecycle rows) each cluster's ranges are
    narrowed to it and the old chains within a gap of it: no old event lies within a gap
    outside those chains, so sessions are recomputed exactly from there, and everything outside
    is unchanged. A late event of an old session then re-reads that session's hours, not days
    either side. The narrowed range never exceeds the margins above, where the rule above holds.
    """
    reach, margin = gap_reach_micros(settings), gap_margin_micros(settings)
    gap = settings.session_gap_minutes * MICROS_PER_MINUTE
    # Changed times a gap or less apart chain with each other whatever the old events: a cluster.
    order = Window.partitionBy(USER_KEY).orderBy("_t")
    times = changes.select(USER_KEY, _micros("derived_tstamp").alias("_t")).distinct()
    step = F.col("_t") - F.lag("_t").over(order)
    clusters = (
        times.withColumn(
            "_cluster",
            F.sum(F.when(step.isNull() | (step > F.lit(gap)), 1).otherwise(0)).over(
                order.rowsBetween(Window.unboundedPreceding, Window.currentRow)
            ),
        )
        .groupBy(USER_KEY, "_cluster")
        .agg(F.min("_t").alias("_lo"), F.max("_t").alias("_hi"))
    )
    if chains is None:
        first, last = F.lit(None).cast("long"), F.lit(None).cast("long")
    else:
        near = chains.select(F.col(USER_KEY).alias("_chain_user"), "_chain_lo", "_chain_hi").filter(
            F.col("_chain_user").isNotNull()
        )
        touching = (
            (F.col(USER_KEY) == F.col("_chain_user"))
            & (F.col("_chain_hi") >= F.col("_lo") - F.lit(gap))
            & (F.col("_chain_lo") <= F.col("_hi") + F.lit(gap))
        )
        clusters = (
            clusters.join(near, touching, "left")
            .groupBy(USER_KEY, "_cluster", "_lo", "_hi")
            .agg(F.min("_chain_lo").alias("_first"), F.max("_chain_hi").alias("_last"))
        )
        first = F.least(F.col("_lo"), F.col("_first"))
        last = F.greatest(F.col("_hi"), F.col("_last"))

    def low(width: int) -> Column:
        return F.greatest(F.col("_lo") - F.lit(width), first)

    def high(width: int) -> Column:
        return F.least(F.col("_hi") + F.lit(width), last)

    each = clusters.select(
        USER_KEY,
        low(reach).alias("_c_lo"),
        high(reach).alias("_c_hi"),
        low(reach + margin).alias("_r_lo"),
        high(reach + margin).alias("_r_hi"),
    )
    order = Window.partitionBy(USER_KEY).orderBy("_r_lo", "_r_hi")
    before = F.max("_r_hi").over(order.rowsBetween(Window.unboundedPreceding, -1))
    parts = each.withColumn(
        PART,
        F.sum(F.when(before.isNull() | (F.col("_r_lo") > before), 1).otherwise(0))
        .over(order.rowsBetween(Window.unboundedPreceding, Window.currentRow))
        .cast("long"),
    )
    return parts.groupBy(USER_KEY, PART).agg(
        F.timestamp_micros(F.min("_c_lo")).alias("_changed_lo"),
        F.timestamp_micros(F.max("_c_hi")).alias("_changed_hi"),
        F.timestamp_micros(F.min("_r_lo")).alias("_read_lo"),
        F.timestamp_micros(F.max("_r_hi")).alias("_read_hi"),
    )


def overlapping(rows: DataFrame, ranges: DataFrame, on: Sequence[str]) -> DataFrame:
    """The rows (with start_tstamp/end_tstamp) overlapping their range [_changed_lo, _changed_hi]."""
    joined = rows.join(F.broadcast(ranges), on=list(on), how="inner")
    hit = (F.col("start_tstamp") <= F.col("_changed_hi")) & (
        F.col("end_tstamp") >= F.col("_changed_lo")
    )
    return joined.filter(hit).select(*rows.columns)


def superseded(old: DataFrame, new: DataFrame) -> DataFrame:
    """gap mode: the replaced session ids that no longer exist, each with the session(s) that now
    hold its time span and why (merged, split, cut, first event changed, removed)."""
    new_ids = new.select(F.col("session_identifier").alias("_new_id"))
    gone = old.join(new_ids, old["session_identifier"] == new_ids["_new_id"], "left_anti")
    candidates = new.select(
        F.col("session_identifier").alias("_successor"),
        F.col("user_identifier").alias("_user"),
        F.col("start_tstamp").alias("_s"),
        F.col("end_tstamp").alias("_e"),
        F.col("is_quarantined").alias("_q"),
    )
    # How many replaced sessions each successor covers (merges).
    covered = (
        old.join(
            candidates,
            (old["user_identifier"] == candidates["_user"])
            & (candidates["_s"] <= old["end_tstamp"])
            & (candidates["_e"] >= old["start_tstamp"]),
        )
        .groupBy("_successor")
        .agg(F.count(F.lit(1)).alias("_covers"))
    )
    matched = gone.join(
        candidates,
        (gone["user_identifier"] == candidates["_user"])
        & (candidates["_s"] <= gone["end_tstamp"])
        & (candidates["_e"] >= gone["start_tstamp"]),
        "left",
    ).join(covered, "_successor", "left")
    successors = Window.partitionBy("session_identifier")
    n = F.count("_successor").over(successors)
    reason = (
        F.when(F.col("_successor").isNull(), F.lit("removed"))
        .when((n > 1) & F.coalesce(F.col("_q"), F.lit(False)), F.lit("cut at max_session_days"))
        .when(n > 1, F.lit("split"))
        .when(F.col("_covers") > 1, F.lit("merged"))
        .otherwise(F.lit("first event changed"))
    )
    return matched.select(
        F.col("session_identifier").alias("superseded_session_identifier"),
        F.col("_successor").alias("session_identifier"),
        F.col("user_identifier"),
        reason.alias("reason"),
    )
