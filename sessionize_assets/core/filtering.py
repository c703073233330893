"""`filtered_events` for one load day (SPEC section 5), DataFrame -> DataFrame.

Every row of the load day gets exactly one outcome, so `rows read = kept + dropped per named rule`:

1. duplicate: another copy of its `event_id` was loaded first -- in an earlier load day within
   `dedupe_lookback_days` (any raw row there, filtered or not), or earlier in the same load day
   (ordered by `load_tstamp`, then `collector_tstamp`, then `dvce_created_tstamp`, then `_row_hash`);
2. app filter: `app_id` not in `app_ids` (when the list is not empty);
3. event filter: `event_name` not in `event_names` (when the list is not empty);
4. before start_date: `date(derived_tstamp)` < `start_date`.

The result depends only on what was loaded into the load day and the days before it, never on
the order in which load days were processed.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from sessionize_assets.core.schema import EVENT_DATE, LOAD_DATE, ROW_HASH

DROP_REASON = "_drop_reason"
DUPLICATE = "duplicate"
APP_FILTER = "app filter"
EVENT_FILTER = "event filter"
BEFORE_START_DATE = "before start_date"
DROP_REASONS: tuple[str, ...] = (DUPLICATE, APP_FILTER, EVENT_FILTER, BEFORE_START_DATE)

# The tie-break of deduplication within a load day: the copy loaded first wins, then ...
DEDUPE_ORDER: tuple[str, ...] = ("load_tstamp", "collector_tstamp", "dvce_created_tstamp", ROW_HASH)
# Set on the rows whose event_id needs a decision: True when an earlier load day holds it.
SEEN_BEFORE = "_seen_before"


def lookback_load_days(load_day: dt.date, dedupe_lookback_days: int) -> list[dt.date]:
    """The earlier load days a load day's duplicates are looked for in, ascending."""
    return [load_day - dt.timedelta(days=n) for n in range(dedupe_lookback_days, 0, -1)]


MINE = "_mine"  # key flags: the key is a row of the processed load days ...
HELD = "_held"  # ... and/or of the rows that may hold the copies loaded first


def window_keys(window: DataFrame, load_days: Sequence[dt.date]) -> DataFrame:
    """The keys of a window of load days read once (a load day's rows and the look-back rows
    come from one scan): `(load_date, event_id, _mine, _held)`, mine = one of `load_days`, held =
    before the last of them (what `mark_rows` is given as earlier rows by the step)."""
    last = max(load_days)
    return window.select(
        LOAD_DATE,
        "event_id",
        F.col(LOAD_DATE).isin(sorted(load_days)).cast("int").alias(MINE),
        (F.col(LOAD_DATE) < F.lit(last)).cast("int").alias(HELD),
    ).filter((F.col(MINE) == 1) | (F.col(HELD) == 1))


def ids_needing_a_decision(
    load_day_rows: DataFrame,
    earlier_rows: DataFrame | None,
    dedupe_lookback_days: int,
    keys: DataFrame | None = None,
    few_load_day_rows: bool = False,
) -> DataFrame:
    """(load_date, event_id, _seen_before) of the load day rows' ids that need a decision: copied
    within their load day (`_seen_before` False) or held by `earlier_rows` in one of the
    `dedupe_lookback_days` load days before (True). Null ids never need one.

    One shuffle of keys: everything is partitioned by `event_id`, so the count per (id, load
    day) and the look back over the id's earlier load days (a window ordered by load day) run
    where the keys land. `keys` (`window_keys`): the two inputs' keys already read in one scan.

    `few_load_day_rows`: the load day rows are few enough to broadcast their ids (the caller
    knows their count from the Delta log). The earlier rows' keys are then first narrowed to those
    ids, where they are read, so only the keys that can matter are shuffled: an id no load day
    row holds needs no decision, and an id one does keeps every earlier key it has. A new load
    day of 5,000 rows on 30 days of 200,000 shuffled 600,000 earlier keys without this."""
    look_back = earlier_rows is not None and dedupe_lookback_days > 0
    if keys is None:
        same = earlier_rows is load_day_rows
        keys = load_day_rows.select(
            LOAD_DATE, "event_id", F.lit(1).alias(MINE), F.lit(1 if same else 0).alias(HELD)
        )
        if look_back and not same:
            held = earlier_rows.select(LOAD_DATE, "event_id")
            keys = keys.unionByName(
                held.select(LOAD_DATE, "event_id", F.lit(0).alias(MINE), F.lit(1).alias(HELD))
            )
    if look_back and few_load_day_rows:
        mine = keys.filter(F.col(MINE) == 1)
        held_only = keys.filter(F.col(MINE) == 0).join(
            F.broadcast(mine.select("event_id")), "event_id", "left_semi"
        )
        keys = mine.unionByName(held_only)
    per_day = (
        keys.filter(F.col("event_id").isNotNull())
        .repartition("event_id")
        .groupBy("event_id", LOAD_DATE)
        .agg(F.sum(MINE).alias("_n"), F.max(HELD).alias(HELD))
    )
    if look_back:
        before = Window.partitionBy("event_id").orderBy(LOAD_DATE)
        latest_held = F.max(F.when(F.col(HELD) == 1, F.col(LOAD_DATE))).over(
            before.rowsBetween(Window.unboundedPreceding, -1)
        )
        seen = F.coalesce(
            latest_held >= F.date_sub(F.col(LOAD_DATE), dedupe_lookback_days), F.lit(False)
        )
    else:
        seen = F.lit(False)
    return (
        per_day.withColumn(SEEN_BEFORE, seen)
        .filter((F.col("_n") > 0) & ((F.col("_n") > 1) | F.col(SEEN_BEFORE)))
        .select(LOAD_DATE, "event_id", SEEN_BEFORE)
    )


Key = tuple[dt.date, str | None, int, int]  # (load_date, event_id, mine, held): `window_keys`'


def decisions_needed(
    keys: Iterable[Key], dedupe_lookback_days: int
) -> list[tuple[dt.date, str, bool]]:
    """`ids_needing_a_decision` in plain Python, for keys few enough to hold on the driver:
    `(load_date, event_id, seen_before)` for each (id, load day) of `keys` flagged mine that is
    copied within its load day (seen_before False) or held by a key flagged held in one of the
    `dedupe_lookback_days` load days before it (True). Null ids never need one. Sorted by id,
    then load day."""
    per_id: dict[str, dict[dt.date, list[int]]] = defaultdict(dict)
    for load_day, event_id, mine, held in keys:
        if event_id is None:
            continue
        counts = per_id[event_id].setdefault(load_day, [0, 0])
        counts[0] += mine
        counts[1] = max(counts[1], held)
    out = []
    look_back = dt.timedelta(days=dedupe_lookback_days)
    for event_id in sorted(per_id):
        latest_held: dt.date | None = None  # over the id's earlier load days
        for load_day, (copies, held) in sorted(per_id[event_id].items()):
            seen = latest_held is not None and latest_held >= load_day - look_back
            if copies > 0 and (copies > 1 or seen):
                out.append((load_day, event_id, seen))
            if held:
                latest_held = load_day
    return out


def mark_rows(
    load_day_rows: DataFrame,
    earlier_rows: DataFrame | None,
    dedupe_lookback_days: int,
    app_ids: Sequence[str] = (),
    event_names: Sequence[str] = (),
    start_date: dt.date | None = None,
    care: DataFrame | None = None,
) -> DataFrame:
    """The rows of one or more load days with `event_date` and `_drop_reason` (null: kept).

    `earlier_rows` are raw events (`load_date`, `event_id` are used) that may hold the copies
    loaded first: a row of load day L is a duplicate when `earlier_rows` has its `event_id` in a
    load day in [L - dedupe_lookback_days, L - 1]. Passing the processed load days themselves
    there too is fine (same-day copies are ranked, not matched). None: no earlier rows.

    Narrow and single-pass: the decision is made on keys. The `(load_date, event_id)` keys of
    both inputs are shuffled once, by `event_id`; per id, the load days are counted (a copy in
    the same load day) and ordered (the latest earlier load day that holds it). Only the small
    set of ids that need a decision is broadcast, and only the rows holding one are ranked by the
    window; the other rows -- nearly all of them -- keep their place, without a full-width
    shuffle (docs/benchmarks.md, "Narrow deduplication"). Passing the same DataFrame as both
    inputs (a rebuild of every load day) reads its keys once. `care`: `ids_needing_a_decision`
    computed by the caller (e.g. from `window_keys`, and kept while the rows are read twice).
    """
    if care is None:
        care = ids_needing_a_decision(load_day_rows, earlier_rows, dedupe_lookback_days)
    flagged = load_day_rows.join(F.broadcast(care), on=[LOAD_DATE, "event_id"], how="left")
    order = [F.col(c).asc_nulls_last() for c in DEDUPE_ORDER if c in load_day_rows.columns]
    rank = F.row_number().over(Window.partitionBy(LOAD_DATE, "event_id").orderBy(*order))
    ranked = flagged.filter(F.col(SEEN_BEFORE).isNotNull()).withColumn("_copy", rank)
    single = flagged.filter(F.col(SEEN_BEFORE).isNull()).withColumn("_copy", F.lit(1))
    df = single.unionByName(ranked).withColumn(EVENT_DATE, F.to_date("derived_tstamp"))
    reason = F.when(
        F.coalesce(F.col(SEEN_BEFORE), F.lit(False)) | (F.col("_copy") > 1), F.lit(DUPLICATE)
    )
    if app_ids:
        reason = reason.when(
            ~F.coalesce(F.col("app_id").isin(list(app_ids)), F.lit(False)), APP_FILTER
        )
    if event_names:
        reason = reason.when(
            ~F.coalesce(F.col("event_name").isin(list(event_names)), F.lit(False)), EVENT_FILTER
        )
    if start_date is not None:
        reason = reason.when(F.col(EVENT_DATE) < F.lit(start_date), BEFORE_START_DATE)
    columns = [c for c in load_day_rows.columns if c != EVENT_DATE] + [EVENT_DATE]
    return df.withColumn(DROP_REASON, reason).select(*columns, DROP_REASON)


def kept_rows(marked: DataFrame) -> DataFrame:
    """The rows that go into filtered_events (no drop reason)."""
    return marked.filter(F.col(DROP_REASON).isNull()).drop(DROP_REASON)


# filtered_events' layout (`clustered_by_user`): rows of the key sample per task (Spark's range
# partitioning samples 100 per output partition), picked by `xxhash64(event_id)` modulo
# SAMPLE_BUCKETS. A searched layout has at most LAYOUT_SEARCH_BOUNDS + 1 tasks, so the sample
# holds at most about 1,700 rows.
LAYOUT_SAMPLE_PER_TASK = 100
SAMPLE_BUCKETS = 1_000_000

# At most this many bounds are searched by one expression (`range_task`): Spark compiles it
# into code that grows with the bounds (16 cost about 0.3 s more than 8 on 2 M rows, 40 over a
# second, 1,024 failed to compile). More, as a catch-up of many load days has, and Spark's
# range partitioning takes over.
LAYOUT_SEARCH_BOUNDS = 16

LayoutKey = tuple[dt.date | None, dt.date | None, str | None]  # (load day, event day, user)


def _ascending(key: Sequence[object]) -> tuple[tuple[bool, object], ...]:
    """A key's sort order as Spark's ascending sort has it: nulls first, then by value (strings
    by code point, which is UTF-8's byte order)."""
    return tuple((value is not None, value) for value in key)


def layout_bounds(sample: Iterable[LayoutKey], tasks: int) -> list[LayoutKey]:
    """The bounds that cut the sorted `sample` into `tasks` runs of about equal size: at most
    tasks - 1, ascending and distinct (a key that fills more than a run is not split, so some
    tasks may get no rows). Task i then takes the keys above bound i - 1 up to bound i."""
    ordered = sorted(sample, key=_ascending)
    picks = (ordered[max(0, (i * len(ordered)) // tasks - 1)] for i in range(1, tasks) if ordered)
    bounds: list[LayoutKey] = []
    for key in picks:
        if not bounds or _ascending(key) > _ascending(bounds[-1]):
            bounds.append(key)
    return bounds


def task_of(key: LayoutKey, bounds: Sequence[LayoutKey]) -> int:
    """`range_task` in plain Python: the number of bounds below `key`."""
    return sum(1 for bound in bounds if _ascending(bound) < _ascending(key))


# A (load day, event day) pair as one long that sorts as the pair does, nulls first
# (`day_pair`, `day_pair_column`): the load day's days since 1970 times 2^23, plus the event
# day's. Dates of years 1 to 9999 are within 2^22 days of 1970, and a null day counts as -2^22:
# no sum leaves a long, whatever order Spark adds in (its optimizer regroups the literals of a
# sum, which in ANSI mode overflowed when the pair was shifted to be positive).
_DAY0 = dt.date(1970, 1, 1)
_NO_DAY = -(2**22)
_DAYS = 2**23


def day_pair(load_day: dt.date | None, event_day: dt.date | None) -> int:
    """`day_pair_column` in plain Python."""
    load = _NO_DAY if load_day is None else (load_day - _DAY0).days
    event = _NO_DAY if event_day is None else (event_day - _DAY0).days
    return load * _DAYS + event


def day_pair_column(load_day: Column, event_day: Column) -> Column:
    """A (load day, event day) pair as one long that orders as the pair does, nulls first."""
    load = F.coalesce(F.unix_date(load_day), F.lit(_NO_DAY)).cast("long")
    event = F.coalesce(F.unix_date(event_day), F.lit(_NO_DAY)).cast("long")
    return load * F.lit(_DAYS) + event


def range_task(days: Column, user: Column, bounds: Sequence[LayoutKey]) -> Column:
    """The task of a row among `bounds` (`layout_bounds`' keys): the number of bounds below the
    row's key (`task_of`), by a binary search of nested comparisons. `days`: the row's
    `day_pair_column`; `user`: its user key (a string; nulls first). A comparison of a long and
    a string with literals, not of structs: Spark compiles a function per struct comparison."""

    def at_most(at: int) -> Column:  # the row's key <= bounds[at]
        load_day, event_day, bound_user = bounds[at]
        pair = F.lit(day_pair(load_day, event_day))
        within = user.isNull()
        if bound_user is not None:
            within = within | (user <= F.lit(bound_user))
        return (days < pair) | ((days == pair) & within)

    def search(low: int, high: int) -> Column:  # the answer is in [low, high]
        if low == high:
            return F.lit(low)
        middle = (low + high) // 2
        return F.when(at_most(middle), search(low, middle)).otherwise(search(middle + 1, high))

    return search(0, len(bounds))


def searched_layout(rows: int, rows_per_file: int) -> bool:
    """Whether `clustered_by_user` lays `rows` rows out by a searched sample (at most
    LAYOUT_SEARCH_BOUNDS + 1 tasks) rather than by Spark's range partitioning."""
    return _layout_tasks(rows, rows_per_file) - 1 <= LAYOUT_SEARCH_BOUNDS


def _layout_tasks(rows: int, rows_per_file: int) -> int:
    return max(1, -(-max(rows, 0) // max(rows_per_file, 1)))


def layout_of(rows: int, rows_per_file: int, sample_given: bool = False) -> str:
    """How `clustered_by_user` lays `rows` rows out, in words (for the step's metadata);
    `sample_given`: the caller passes it the sample (gathered by the counts' query)."""
    tasks = _layout_tasks(rows, rows_per_file)
    if tasks == 1:
        return "1 task"
    if searched_layout(rows, rows_per_file):
        gathered = " (sample gathered by the counts)" if sample_given else ""
        return f"{tasks} tasks, a sample's bounds searched{gathered}"
    return f"{tasks} tasks, Spark's range partitioning"


def picked_for_layout(rows_per_file: int) -> Column:
    """Whether a row is in `clustered_by_user`'s sample: about LAYOUT_SAMPLE_PER_TASK rows per
    file of `rows_per_file` rows, picked by a hash of `event_id` (the same rows whatever their
    order or partitioning)."""
    share = LAYOUT_SAMPLE_PER_TASK / max(rows_per_file, 1)
    below = max(1, round(min(share, 1.0) * SAMPLE_BUCKETS))
    return F.pmod(F.xxhash64("event_id"), F.lit(SAMPLE_BUCKETS)) < F.lit(below)


def clustered_by_user(
    kept: DataFrame,
    user_key: Column,
    rows: int,
    rows_per_file: int,
    sample: Sequence[LayoutKey] | None = None,
) -> DataFrame:
    """filtered_events' file layout: rows partitioned by ranges of (load day, event day, user
    key) into about `rows / rows_per_file` tasks, so a (load day, event day) partition of R rows
    is written as about R / rows_per_file files, each holding a contiguous range of users. Delta's
    per-file min/max of the user column then lets a read of a few users' events (the session
    branch's late events of old sessions) skip the other files. A small partition stays one
    file; `rows` is the number of kept rows (known before the write).

    Up to LAYOUT_SEARCH_BOUNDS + 1 tasks (a daily load), the ranges' bounds come from a sample
    of the rows' keys, the rows picked by a hash of `event_id` (`picked_for_layout`; `sample`:
    gathered by the caller, as `outcome_counts`' query does, else read here, narrow), cut into
    runs of equal size (`layout_bounds`), and each row goes to its range's task (`range_task`,
    `repartitionById`), so that layout depends only on the rows. More tasks: Spark's range
    partitioning (`repartitionByRange`), which samples the whole plan itself, reading every
    row at full width once more (docs/benchmarks.md, "Session 59").

    Within a file the rows are sorted by user, then time: written with small Parquet pages
    (`PARQUET_LAYOUT`), each page holds a short range of users, and Parquet's page index lets a
    read of a few users skip the other pages of the files it opens."""
    tasks = _layout_tasks(rows, rows_per_file)
    order = (F.col(LOAD_DATE), F.col(EVENT_DATE), user_key)
    if tasks == 1:
        spread = kept.repartition(1)
    elif not searched_layout(rows, rows_per_file):
        spread = kept.repartitionByRange(tasks, *order)
    else:
        if sample is None:
            keys = kept.filter(picked_for_layout(rows_per_file)).select(*order)
            sample = [(r[0], r[1], r[2]) for r in keys.collect()]
        bounds = layout_bounds(sample, tasks)
        days, user = F.col("_layout_days"), F.col("_layout_user")
        spread = (
            kept.withColumns(
                {"_layout_days": day_pair_column(*order[:2]), "_layout_user": user_key}
            )
            .withColumn("_layout_task", range_task(days, user, bounds))
            .drop("_layout_days", "_layout_user")
            .repartitionById(tasks, F.col("_layout_task"))
            .drop("_layout_task")
        )
    return spread.sortWithinPartitions(*order, F.col("derived_tstamp"))


# The Parquet writer settings of filtered_events' files: pages of at most 1,000 rows (Parquet's
# default is 20,000), so that the page index (min/max per page, written by default) narrows a
# few users' read to about a thousand rows per file; costs about 1% in file size. Timestamps as
# INT64 microseconds, not Spark's default INT96: Parquet keeps no statistics for INT96, so Spark
# pushes no filter on a timestamp to the reader, and a filter that ORs terms of a time span and
# users (the session branch's reads) then reached no page index at all: every page was decoded.
PARQUET_LAYOUT = {
    "parquet.page.row.count.limit": "1000",
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
}


def outcome_counts(marked: DataFrame, layout: tuple[Column, Column] | None = None) -> DataFrame:
    """(load_date, outcome, rows, max_load_tstamp): outcome is `kept` or a drop reason.

    `layout`: (user key, `picked_for_layout(...)`): the same query gathers `clustered_by_user`'s
    sample of the kept rows (`layout_sample` reads it): the rows are also grouped by
    `layout_key`, the (event_date, user) of a picked kept row (null for the other rows), so a
    (load_date, outcome) may have several rows, to be summed. A grouping key rather than a
    collected list keeps the aggregation Spark's compiled hash aggregation: a `collect_list`
    beside the counts made the query 0.3-0.5 s slower on a 200,000-row day."""
    keys = [F.col(LOAD_DATE), F.coalesce(F.col(DROP_REASON), F.lit("kept")).alias("outcome")]
    if layout is not None:
        user, picked = layout
        pair = F.struct(F.col(EVENT_DATE).alias("event_date"), user.alias("user"))
        keys.append(F.when(F.col(DROP_REASON).isNull() & picked, pair).alias("layout_key"))
    return marked.groupBy(*keys).agg(
        F.count(F.lit(1)).alias("rows"), F.max("load_tstamp").alias("max_load_tstamp")
    )


def layout_sample(outcome_rows: Iterable[Any]) -> list[LayoutKey]:
    """The (load_date, event_date, user) keys of the picked rows, one per row, from
    `outcome_counts(..., layout=...)`'s rows."""
    return [
        (row[LOAD_DATE], row["layout_key"]["event_date"], row["layout_key"]["user"])
        for row in outcome_rows
        if row["layout_key"] is not None
        for _ in range(int(row["rows"]))
    ]


def accounting(outcomes: dict[str, int]) -> dict[str, int]:
    """rows read, kept and dropped per named rule (zeros filled in); read == kept + dropped."""
    out = {"rows_read": sum(outcomes.values()), "rows_kept": outcomes.get("kept", 0)}
    for reason in DROP_REASONS:
        out[f"dropped_{reason.replace(' ', '_')}"] = outcomes.get(reason, 0)
    unknown = set(outcomes) - {"kept", *DROP_REASONS}
    if unknown:
        raise ValueError(f"unknown outcomes {sorted(unknown)}")
    return out


def load_days_reached(
    changed: DataFrame, later_rows: DataFrame, dedupe_lookback_days: int
) -> DataFrame:
    """The later load days that changes to load days reach through duplicates: (load_date).

    `changed` holds (load_date, event_id) of the changed load days' rows, before and after the
    change. A later load day L' in (L, L + dedupe_lookback_days] that holds a copy of one of L's
    `event_id`s dedupes against L, so its filtered_events must be redone.
    """
    sources = changed.select(F.col(LOAD_DATE).alias("_source_load_date"), "event_id").distinct()
    return (
        later_rows.select(LOAD_DATE, "event_id")
        .join(sources, on="event_id")
        .filter(
            (F.col(LOAD_DATE) > F.col("_source_load_date"))
            & (F.col(LOAD_DATE) <= F.date_add(F.col("_source_load_date"), dedupe_lookback_days))
        )
        .select(LOAD_DATE)
        .distinct()
    )


def duplicate_event_ids(filtered: DataFrame, dedupe_lookback_days: int) -> DataFrame:
    """Copies of one `event_id` kept in filtered_events within `dedupe_lookback_days` load days of
    each other (the same load day included): (event_id, load_date, other_load_date), with
    load_date <= other_load_date. Empty when the deduplication holds."""
    per_day = filtered.groupBy("event_id", LOAD_DATE).agg(F.count(F.lit(1)).alias("copies"))
    repeated = per_day.groupBy("event_id").agg(F.sum("copies").alias("n")).filter(F.col("n") > 1)
    days = per_day.join(repeated.select("event_id"), on="event_id", how="left_semi")
    same_day = days.filter(F.col("copies") > 1).select(
        "event_id", LOAD_DATE, F.col(LOAD_DATE).alias("other_load_date")
    )
    other = days.select("event_id", F.col(LOAD_DATE).alias("other_load_date"))
    across = (
        days.join(other, on="event_id")
        .filter(
            (F.col("other_load_date") > F.col(LOAD_DATE))
            & (F.datediff(F.col("other_load_date"), F.col(LOAD_DATE)) <= dedupe_lookback_days)
        )
        .select("event_id", LOAD_DATE, "other_load_date")
    )
    return same_day.unionByName(across)


def duplicate_copies(
    rows: Iterable[tuple[str | None, dt.date]],
    dedupe_lookback_days: int,
    load_days: tuple[dt.date, dt.date] | None = None,
) -> list[tuple[str, dt.date, dt.date]]:
    """`duplicate_event_ids` in plain Python over (event_id, load_date) rows, sorted by event_id,
    load day and other load day: (event_id, load_date, other_load_date) once per load day
    holding two copies and once per two load days within `dedupe_lookback_days` of each other.
    Null ids are never reported (Spark's join on `event_id` matches no null, and deduplication
    leaves them alone). With `load_days` (first, last), only the copies of which one is in
    those load days (`duplicate_event_ids_touching`)."""
    copies: dict[str, Counter[dt.date]] = defaultdict(Counter)
    for event_id, load_day in rows:
        if event_id is not None:
            copies[event_id][load_day] += 1
    found = []
    for event_id, days in copies.items():
        ordered = sorted(days)
        for i, day in enumerate(ordered):
            if days[day] > 1:
                found.append((event_id, day, day))
            found += [
                (event_id, day, other)
                for other in ordered[i + 1 :]
                if (other - day).days <= dedupe_lookback_days
            ]
    if load_days is not None:
        first, last = load_days
        found = [f for f in found if first <= f[1] <= last or first <= f[2] <= last]
    return sorted(found)


def duplicate_event_ids_touching(
    filtered: DataFrame, dedupe_lookback_days: int, first: dt.date, last: dt.date
) -> DataFrame:
    """`duplicate_event_ids` limited to copies where at least one is in load days first..last:
    what a run over those load days can have broken. Reads only the load days that can hold
    the other copy (first - dedupe_lookback_days .. last + dedupe_lookback_days)."""
    lookback = dt.timedelta(days=dedupe_lookback_days)
    window = filtered.filter(F.col(LOAD_DATE).between(first - lookback, last + lookback))
    found = duplicate_event_ids(window.select("event_id", LOAD_DATE), dedupe_lookback_days)
    return found.filter(
        F.col(LOAD_DATE).between(first, last) | F.col("other_load_date").between(first, last)
    )
