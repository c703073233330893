"""Session modes as objects: what differs between id mode (Snowplow) and gap mode (the blog) when
a run recomputes the sessions its changes touch. `mode_for(settings)` picks one, once; the steps
only call the `SessionMode` interface.

| | id mode | gap mode |
|---|---|---|
| touched sessions | the changed events' session ids (lifecycle rows from `start_tstamp >= min(lower limit, earliest change) - session_lookback_days`) | per changed user, the lifecycle rows overlapping the changed range around each cluster of changed times |
| events read | per session, session timestamps in [min(known start, changed), max(known end, changed)] (quarantined: its frozen span) | per user and cluster, derived_tstamp in the read range (changed range +- margin) |
| sessions replaced | every touched session id | the touched lifecycle rows |
| sessions written | every recomputed session | those overlapping the changed range |
| lifecycle of a vanished session | kept (first-seen user, frozen quarantine) | deleted |
| quarantined_sessions | only grows | mirrors the quarantined pieces |
| superseded_sessions | - | ids that stopped existing, with their successor and why |
| users affected | the (first-seen) users of the touched sessions | the changed events' users |

The DataFrame transforms they use are in `core.sessionize`; the lifecycle row rule in
`core.lifecycle` (`action` takes `keeps_vanished`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import pyarrow as pa
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from sessionize_assets.core import read_spans
from sessionize_assets.core import sessionize as core
from sessionize_assets.core.clock import from_micros
from sessionize_assets.core.run_limits import RunLimits
from sessionize_assets.core.trees import fold_balanced
from sessionize_assets.resources.delta import nulls_for, table_or_empty
from sessionize_assets.resources.tables import QUARANTINED_SESSIONS, SUPERSEDED_SESSIONS
from sessionize_assets.sessions.changes import Changes
from sessionize_assets.sessions.frames import keyed_rows, localize, localized, window_filter
from sessionize_assets.sessions.tables import LIFECYCLE_SCHEMA, QUARANTINED_SCHEMA
from sessionize_assets.settings import Settings


@dataclass
class Touched:
    """The sessions a change set touches and what recomputing them needs."""

    old_lifecycle: DataFrame  # their lifecycle rows (driver-local or persisted)
    ranges: DataFrame  # the read ranges (driver-local or persisted)
    read: DataFrame  # prepared events to recompute them from (PREPARED_COLUMNS, gap: PART too)
    replaced_ids: DataFrame  # session_identifier of the sessions the recomputed ones replace
    lifecycle_rows: int  # lifecycle rows read
    # old_lifecycle's rows as the driver holds them, when it is driver-local (gap mode)
    old_lifecycle_table: pa.Table | None = None
    # rows of replaced_ids' session_identifier as the driver holds them (gap mode: old_lifecycle's)
    replaced_table: pa.Table | None = None

    def unpersist(self) -> None:
        self.ranges.unpersist()
        self.old_lifecycle.unpersist()


@dataclass(frozen=True)
class LifecycleUpdate:
    """The lifecycle manifest's MERGE source (`_delete` marks rows to remove) and its row count."""

    source: DataFrame
    rows: int


class SessionMode(Protocol):
    """What a session mode decides; see the module's table."""

    name: str
    keeps_vanished: bool  # a touched session left without events keeps its lifecycle row

    def touched(
        self,
        spark: SparkSession,
        snapshot: DataFrame,
        lifecycle_path: str,
        changes: Changes,
        limits: RunLimits,
    ) -> Touched:
        """The lifecycle rows (of the manifest at `lifecycle_path`), read ranges and events of the
        sessions the changes touch."""
        ...

    def sessionize(self, events: DataFrame, touched: Touched) -> core.Sessionized:
        """Sessions of the usable events read (the touched lifecycle rows as given in id mode)."""
        ...

    def in_scope(self, computed: DataFrame, touched: Touched) -> DataFrame:
        """The recomputed sessions that replace the touched ones."""
        ...

    def lifecycle_update(
        self, computed: DataFrame, replaced_ids: DataFrame, fresh: int, deleted: int
    ) -> LifecycleUpdate:
        """The lifecycle MERGE for `computed` (`fresh` sessions; `deleted` replaced ids gone)."""
        ...

    def side_rows(
        self,
        quarantined_now: DataFrame,
        was_quarantined: DataFrame,
        old_lifecycle: DataFrame,
        computed: DataFrame,
        now: dt.datetime,
    ) -> list[DataFrame]:
        """Rows for quarantined_sessions / superseded_sessions beyond the newly quarantined
        sessions, in the steps' side-table layout (see `steps.write_side_tables`)."""
        ...

    def affected_users(
        self, spark: SparkSession, changes: Changes, lifecycle_path: str
    ) -> DataFrame:
        """Users whose sessions the changes can touch (user_identifier, distinct, non-null)."""
        ...

    def known_lifecycle(self, spark: SparkSession, path: str) -> DataFrame | None:
        """The lifecycle manifest a full recompute takes as given (None: it uses none)."""
        ...

    def rebuilt_lifecycle(self, new_rows: DataFrame, known: DataFrame | None) -> DataFrame:
        """The lifecycle manifest after a full recompute that produced `new_rows`."""
        ...


def side_part(df: DataFrame, table: str) -> DataFrame:
    """Side-table rows with the columns only superseded rows fill left null."""
    return (
        df.withColumn("_table", F.lit(table))
        .withColumn("_superseded", F.lit(None).cast("string"))
        .withColumn("_reason", F.lit(None).cast("string"))
    )


def _read_spans(
    ranges: DataFrame,
    sums: Sequence[str] = (),
    users: str | None = None,
    table: pa.Table | None = None,
) -> tuple[list[tuple[int, int]], list[int], list[frozenset[str] | None]]:
    """The read ranges covered by a few spans (`core.read_spans`; microseconds, empty: no range),
    the sums of the integer or boolean columns `sums` and, with the column `users`, the users
    each span is limited to (`read_spans.read_terms`: spans of few users kept apart from those
    of many, which may overlap them; without `users`, disjoint spans and None each). The ranges
    are widened to whole hours first (`span_groups`), so few rows reach the driver whatever the
    number of sessions (and at most MAX_USERS_PER_SPAN + 1 users per hour pair): by the driver
    when it holds the ranges (`table`, `ranges`' rows), else in one Spark job."""
    if table is not None:
        rows = span_groups(table, sums, users)
    else:
        hour = read_spans.MICROS_PER_HOUR
        lo = (F.floor(core._micros("_read_lo") / hour) * hour).cast("long")
        hi = ((F.floor(core._micros("_read_hi") / hour) + 1) * hour).cast("long")
        keys = (
            F.slice(F.collect_set(F.col(users)), 1, read_spans.MAX_USERS_PER_SPAN + 1)
            if users is not None
            else F.lit(None).cast("array<string>")
        )
        rows = [
            (
                int(r["_lo"]),
                int(r["_hi"]),
                r["_keys"],
                *[int(r[i + 4] or 0) for i in range(len(sums))],
            )
            for r in ranges.filter(F.col("_read_lo").isNotNull() & F.col("_read_hi").isNotNull())
            .groupBy(lo.alias("_lo"), hi.alias("_hi"))
            .agg(
                F.count(F.lit(1)).alias("_n"),
                keys.alias("_keys"),
                *[F.sum(F.col(c).cast("int")) for c in sums],
            )
            .collect()
        ]
    totals = [sum(r[3 + i] for r in rows) for i in range(len(sums))]
    if users is None:
        spans = read_spans.covering_spans((lo, hi) for lo, hi, *_ in rows)
        return spans, totals, [None] * len(spans)
    terms = read_spans.read_terms((lo, hi, keys) for lo, hi, keys, *_ in rows)
    return [(lo, hi) for lo, hi, _ in terms], totals, [named for _, _, named in terms]


def span_groups(
    table: pa.Table, sums: Sequence[str] = (), users: str | None = None
) -> list[tuple[int, int, list[str] | None, *tuple[int, ...]]]:
    """`_read_spans`' Spark grouping of driver-local ranges, in plain Python: per pair of whole
    hours `(lo, hi)` around ranges' `[_read_lo, _read_hi]` (ranges with a null end left out),
    the first MAX_USERS_PER_SPAN + 1 of the users of `users` in sorted order (Spark's
    `collect_set` keeps an arbitrary such slice; more than MAX_USERS_PER_SPAN users make a span
    read every user either way; None without `users`), and the sum of each column of `sums`."""
    hour = read_spans.MICROS_PER_HOUR
    micros = {
        c: table.column(c).cast(pa.timestamp("us", tz="UTC")).cast(pa.int64()).to_pylist()
        for c in ("_read_lo", "_read_hi")
    }
    names = table.column(users).to_pylist() if users is not None else None
    added = [table.column(c).to_pylist() for c in sums]
    groups: dict[tuple[int, int], tuple[set[str], list[int]]] = {}
    for i, (lo, hi) in enumerate(zip(micros["_read_lo"], micros["_read_hi"], strict=True)):
        if lo is None or hi is None:
            continue
        found, totals = groups.setdefault(
            ((lo // hour) * hour, (hi // hour + 1) * hour), (set(), [0] * len(sums))
        )
        if names is not None and names[i] is not None:
            found.add(names[i])
        for j, values in enumerate(added):
            totals[j] += int(values[i] or 0)
    limit = read_spans.MAX_USERS_PER_SPAN + 1
    return [
        (lo, hi, sorted(found)[:limit] if users is not None else None, *totals)
        for (lo, hi), (found, totals) in sorted(groups.items())
    ]


def any_of(tests: list[Column]) -> Column:
    """The OR of `tests`, nested log2(n) deep (`core/trees.py`: a chain of a few hundred ORs, 100
    users on two user columns, is too deep for Spark Connect's protobuf decoder)."""
    return fold_balanced(tests, lambda a, b: a | b)


def spans_filter(
    spans: list[tuple[int, int]],
    within: Callable[[dt.datetime, dt.datetime], Column],
    upper: dt.datetime | None = None,
    members: list[frozenset[str] | None] | None = None,
    of_users: UserFilter | Callable[[frozenset[str]], Column] | None = None,
) -> Column | None:
    """Rows inside any span: `within(lo, hi)` per span, OR-ed; with `upper`, spans are cut there
    and those starting after it dropped; with `members` and `of_users`, a span that names its
    users also asks for `of_users(its users)`. None: no span left.

    With a `UserFilter`, the spans that name users are also guarded by one set lookup of every
    named user per user column (`UserFilter.any_user`): a row of another user, most rows of the
    files such a read opens, is refused there instead of being tested against every named span
    (its time, and its users where the time falls in the span). Spark tests the filter on every
    row it reads; on the 30 x 200,000 benchmark home the touched read's stage took about 5 s less
    of 19-21 s with the guard (docs/benchmarks.md, "Session 55"). The guard does not change which
    rows pass, and the named spans stay in the filter for Delta's and Parquet's skipping."""
    open_parts, named_parts, everyone = [], [], set()
    for i, (lo, hi) in enumerate(spans):
        start, end = from_micros(lo), from_micros(hi)
        if upper is not None:
            if start > upper:
                continue
            end = min(end, upper)
        part = within(start, end)
        named = members[i] if members is not None else None
        if named is not None and of_users is not None:
            named_parts.append(part & of_users(named))
            everyone |= named
        else:
            open_parts.append(part)
    if named_parts and isinstance(of_users, UserFilter) and everyone:
        named_parts = [of_users.any_user(frozenset(everyone)) & any_of(named_parts)]
    parts = open_parts + named_parts
    if not parts:
        return None
    return any_of(parts)


class UserFilter:
    """The rows of some users, as equalities on the raw user columns Delta's file statistics
    describe (`filtered_events` files hold contiguous ranges of users): a superset of the rows
    whose user key (the first non-empty of `user_identifier`'s columns) is one of them. Called
    with users, the OR of equalities (what Parquet and Delta skip on); `any_user(users)`, the same
    rows as one set lookup per column (what is cheap to test row by row)."""

    def __init__(self, settings: Settings, columns: dict[str, str]) -> None:
        names = [c for c in settings.user_identifier if columns.get(c) == "string"]
        # a non-string user column: no file skipping, every row passes
        self.names = names if len(names) == len(settings.user_identifier) else None

    def __call__(self, users: frozenset[str]) -> Column:
        if self.names is None:
            return F.lit(True)
        if not users:
            return F.lit(False)
        return any_of([F.col(c) == F.lit(u) for c in self.names for u in sorted(users)])

    def any_user(self, users: frozenset[str]) -> Column:
        if self.names is None:
            return F.lit(True)
        if not users:
            return F.lit(False)
        return any_of([F.col(c).isin(sorted(users)) for c in self.names])


def user_filter(settings: Settings, columns: dict[str, str]) -> UserFilter:
    """The `UserFilter` of `settings`' user columns among `columns` (name -> Spark type)."""
    return UserFilter(settings, columns)


class IdMode:
    """id mode: a session is the events sharing a session id; its lifecycle row is its memory."""

    name = "id"
    keeps_vanished = True

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def touched(
        self,
        spark: SparkSession,
        snapshot: DataFrame,
        lifecycle_path: str,
        changes: Changes,
        limits: RunLimits,
    ) -> Touched:
        settings, changed, upper = self.settings, changes.usable, limits.upper_limit
        earliest = min(limits.lower_limit, changes.min_usable or limits.lower_limit)
        bound = earliest - dt.timedelta(days=settings.session_lookback_days)
        keys = changed.select(F.col(core.SESSION_KEY).alias("session_identifier")).distinct()
        lifecycle = keyed_rows(
            spark, lifecycle_path, LIFECYCLE_SCHEMA, {"session_identifier": keys}
        )
        old_lifecycle = localize(
            spark,
            lifecycle.filter(F.col("start_tstamp") >= F.lit(bound)).join(
                keys, "session_identifier", "left_semi"
            ),
        )
        ranges, ranges_table = localized(
            spark, core.id_read_ranges(changed, old_lifecycle, settings)
        )
        spans, (known,), _ = _read_spans(ranges, ["_is_known"], table=ranges_table)
        inside = spans_filter(spans, lambda lo, hi: window_filter(settings, lo, hi), upper)
        if inside is None:  # nothing usable changed (or only after the upper limit)
            read = changed.select(*core.PREPARED_COLUMNS).limit(0)
        else:
            columns = core.source_columns(settings, snapshot.columns)
            events = core.prepare_events(snapshot.filter(inside).select(*columns), settings)
            read = (
                events.join(ranges, core.SESSION_KEY, "inner")
                .filter(F.col(core.SESSION_TS).between(F.col("_read_lo"), F.col("_read_hi")))
                .filter(F.col(core.SESSION_TS) <= F.lit(upper))
                .select(*core.PREPARED_COLUMNS)
            )
        return Touched(
            old_lifecycle=old_lifecycle,
            ranges=ranges,
            read=read,
            replaced_ids=ranges.select(F.col(core.SESSION_KEY).alias("session_identifier")),
            lifecycle_rows=int(known or 0),
        )

    def sessionize(self, events: DataFrame, touched: Touched) -> core.Sessionized:
        return core.sessionize_by_id(events, self.settings, touched.old_lifecycle)

    def in_scope(self, computed: DataFrame, touched: Touched) -> DataFrame:
        return computed

    def lifecycle_update(
        self, computed: DataFrame, replaced_ids: DataFrame, fresh: int, deleted: int
    ) -> LifecycleUpdate:
        # insert or update every recomputed session; a vanished one keeps its row
        return LifecycleUpdate(
            core.lifecycle_rows(computed).withColumn("_delete", F.lit(False)), fresh
        )

    def side_rows(
        self,
        quarantined_now: DataFrame,
        was_quarantined: DataFrame,
        old_lifecycle: DataFrame,
        computed: DataFrame,
        now: dt.datetime,
    ) -> list[DataFrame]:
        return []  # quarantined_sessions only grows; no ids are superseded

    def affected_users(
        self, spark: SparkSession, changes: Changes, lifecycle_path: str
    ) -> DataFrame:
        keys = changes.usable.select(F.col(core.SESSION_KEY).alias("session_identifier")).distinct()
        lifecycle = keyed_rows(
            spark, lifecycle_path, LIFECYCLE_SCHEMA, {"session_identifier": keys}
        )
        users = lifecycle.join(keys, "session_identifier", "left_semi").select("user_identifier")
        return users.filter(F.col("user_identifier").isNotNull()).distinct()

    def known_lifecycle(self, spark: SparkSession, path: str) -> DataFrame | None:
        return table_or_empty(spark, path, LIFECYCLE_SCHEMA)

    def rebuilt_lifecycle(self, new_rows: DataFrame, known: DataFrame | None) -> DataFrame:
        if known is None:  # a refresh: no memory of sessions that vanished
            return new_rows
        kept = known.join(new_rows.select("session_identifier"), "session_identifier", "left_anti")
        return new_rows.unionByName(kept)


class GapMode:
    """gap mode: sessions are chains of one user's events; the lifecycle mirrors the sessions."""

    name = "gap"
    keeps_vanished = False

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    @staticmethod
    def _user_ranges(ranges: DataFrame) -> DataFrame:
        return ranges.withColumnRenamed(core.USER_KEY, "user_identifier")

    def touched(
        self,
        spark: SparkSession,
        snapshot: DataFrame,
        lifecycle_path: str,
        changes: Changes,
        limits: RunLimits,
    ) -> Touched:
        settings, changed, upper = self.settings, changes.usable, limits.upper_limit
        # The changed users' lifecycle rows, read once: their chains of sessions bound each read
        # to the sessions it can touch, and the touched rows are taken from them.
        users = changed.select(F.col(core.USER_KEY).alias("user_identifier")).distinct()
        lifecycle = keyed_rows(spark, lifecycle_path, LIFECYCLE_SCHEMA, {"user_identifier": users})
        theirs = localize(spark, lifecycle.join(users, "user_identifier", "left_semi"))
        chains = core.gap_chains(theirs, settings)
        ranges, ranges_table = localized(spark, core.gap_change_ranges(changed, settings, chains))
        old_lifecycle, old_table = localized(
            spark, core.overlapping(theirs, self._user_ranges(ranges), on=["user_identifier"])
        )
        # The spans, and the users of each: a span with few users (late events of old sessions)
        # also filters on them, so Delta opens only the files of those users' range.
        spans, _, members = _read_spans(ranges, users=core.USER_KEY, table=ranges_table)
        inside = spans_filter(
            spans,
            lambda lo, hi: F.col("derived_tstamp").between(F.lit(lo), F.lit(hi)),
            members=members,
            of_users=user_filter(settings, dict(snapshot.dtypes)),
        )
        lifecycle_rows = old_table.num_rows if old_table is not None else old_lifecycle.count()
        theirs.unpersist()  # ranges and old_lifecycle are computed (and kept) by now
        if inside is None:  # nothing usable changed (or only after the upper limit)
            read = (
                changed.select(*core.PREPARED_COLUMNS)
                .limit(0)
                .withColumn(core.PART, F.lit(0).cast("long"))
            )
        else:
            columns = core.source_columns(settings, snapshot.columns)
            events = core.prepare_events(snapshot.filter(inside).select(*columns), settings)
            read = (
                events.join(ranges, core.USER_KEY, "inner")
                .filter(F.col("derived_tstamp").between(F.col("_read_lo"), F.col("_read_hi")))
                .filter(F.col(core.SESSION_TS) <= F.lit(upper))
                .select(*core.PREPARED_COLUMNS, core.PART)
            )
        return Touched(
            old_lifecycle=old_lifecycle,
            ranges=ranges,
            read=read,
            replaced_ids=old_lifecycle.select("session_identifier"),
            lifecycle_rows=lifecycle_rows,
            old_lifecycle_table=old_table,
            replaced_table=old_table,
        )

    def sessionize(self, events: DataFrame, touched: Touched) -> core.Sessionized:
        return core.sessionize_by_gap(events, self.settings)

    def in_scope(self, computed: DataFrame, touched: Touched) -> DataFrame:
        return core.overlapping(
            computed, self._user_ranges(touched.ranges), on=["user_identifier", core.PART]
        )

    def lifecycle_update(
        self, computed: DataFrame, replaced_ids: DataFrame, fresh: int, deleted: int
    ) -> LifecycleUpdate:
        # insert or update every recomputed session; a replaced id that no longer exists goes
        gone = replaced_ids.join(
            computed.select("session_identifier"), "session_identifier", "left_anti"
        )
        source = (
            core.lifecycle_rows(computed)
            .withColumn("_delete", F.lit(False))
            .unionByName(
                gone.select(
                    "session_identifier", *nulls_for(LIFECYCLE_SCHEMA, "session_identifier")
                ).withColumn("_delete", F.lit(True))
            )
        )
        return LifecycleUpdate(source, fresh + deleted)

    def side_rows(
        self,
        quarantined_now: DataFrame,
        was_quarantined: DataFrame,
        old_lifecycle: DataFrame,
        computed: DataFrame,
        now: dt.datetime,
    ) -> list[DataFrame]:
        # quarantined_sessions mirrors the quarantined pieces: pieces no longer quarantined go
        removed = was_quarantined.join(
            quarantined_now.select("session_identifier"), "session_identifier", "left_anti"
        ).select(
            "session_identifier",
            *nulls_for(QUARANTINED_SCHEMA, "session_identifier"),
            F.lit(True).alias("_delete"),
        )
        superseded = core.superseded(
            old_lifecycle.select(
                "session_identifier", "user_identifier", "start_tstamp", "end_tstamp"
            ),
            computed.select(
                "session_identifier",
                "user_identifier",
                "start_tstamp",
                "end_tstamp",
                "is_quarantined",
            ),
        ).select(
            F.col("session_identifier"),
            "user_identifier",
            F.lit(None).cast("timestamp").alias("start_tstamp"),
            F.lit(None).cast("timestamp").alias("capped_at"),
            F.lit(now).alias("quarantined_at"),
            F.lit(False).alias("_delete"),
            F.lit(SUPERSEDED_SESSIONS).alias("_table"),
            F.col("superseded_session_identifier").alias("_superseded"),
            F.col("reason").alias("_reason"),
        )
        return [side_part(removed, QUARANTINED_SESSIONS), superseded]

    def affected_users(
        self, spark: SparkSession, changes: Changes, lifecycle_path: str
    ) -> DataFrame:
        users = changes.usable.select(F.col(core.USER_KEY).alias("user_identifier"))
        return users.filter(F.col("user_identifier").isNotNull()).distinct()

    def known_lifecycle(self, spark: SparkSession, path: str) -> DataFrame | None:
        return None

    def rebuilt_lifecycle(self, new_rows: DataFrame, known: DataFrame | None) -> DataFrame:
        return new_rows


def mode_for(settings: Settings) -> SessionMode:
    """The configured mode (settings are validated: `id` or `gap`)."""
    return IdMode(settings) if settings.session_mode == "id" else GapMode(settings)
