"""`attributes` from `daily_aggregates` (SPEC section 5), DataFrame -> DataFrame.

Per user (non-null `user_identifier`), over the event days up to and including `as_of`:

- lifetime: `total_events`, `page_views`, `active_days`, `first_event_tstamp`, `last_event_tstamp`,
  `event_counts` (map event name -> rows);
- for each N in `attribute_windows_days`: `total_events_last_<N>_days`, `page_views_last_<N>_days`,
  `active_days_last_<N>_days` over the N event days ending at `as_of` ([as_of - N + 1, as_of]);
- each configured attribute `<name>`, combined from the per-day partials `attr_<name>` of
  daily_aggregates over its period (`lifetime` or `last_<N>_days`);
- `as_of`.

Days after `as_of` are left out, so a replay with an earlier "now" gives what that day saw.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from collections.abc import Iterable, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    DataType,
    DateType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from sessionize_assets.core.aggregates import (
    BASE_COLUMNS,
    EVENT_COUNTS,
    USER_IDENTIFIER,
    attribute_column,
    merged_partials,
)
from sessionize_assets.core.schema import EVENT_DATE
from sessionize_assets.settings import AttributeDefinition

WINDOWED_METRICS: tuple[str, ...] = ("total_events", "page_views", "active_days")
LIFETIME_COLUMNS: tuple[str, ...] = (
    "total_events",
    "page_views",
    "active_days",
    "first_event_tstamp",
    "last_event_tstamp",
    EVENT_COUNTS,
)


def window_start(as_of: dt.date, days: int) -> dt.date:
    """The first event day of the `days` days ending at `as_of` (inclusive)."""
    return as_of - dt.timedelta(days=days - 1)


def attribute_columns(
    windows: Sequence[int], definitions: Sequence[AttributeDefinition]
) -> list[str]:
    """The columns of `attributes`, in order."""
    cols = [USER_IDENTIFIER, *LIFETIME_COLUMNS]
    cols += [f"{m}_last_{n}_days" for n in windows for m in WINDOWED_METRICS]
    cols += [d.name for d in definitions]
    return [*cols, "as_of"]


def _in_period(as_of: dt.date, days: int | None) -> Column:
    if days is None:
        return F.lit(True)
    return F.col(EVENT_DATE) >= F.lit(window_start(as_of, days))


def combine(definition: AttributeDefinition, as_of: dt.date) -> Column:
    """A configured attribute over its period, from the per-day partials."""
    partial = F.when(_in_period(as_of, definition.period_days), F.col(attribute_column(definition)))
    agg = definition.aggregation
    value = merged_partials(partial, agg)
    if agg == "count":
        return F.coalesce(value, F.lit(0))
    return value.getField("value") if agg in ("first", "last") else value


def attributes(
    daily: DataFrame,
    as_of: dt.date,
    windows: Sequence[int],
    definitions: Sequence[AttributeDefinition] = (),
) -> DataFrame:
    """One row per user from daily aggregates (rows of any event days)."""
    reserved = set(attribute_columns(windows, ()))
    clash = [d.name for d in definitions if d.name in reserved]
    if clash:
        raise ValueError(
            f"attribute name {clash[0]!r} is a built-in attributes column: choose another name"
        )
    rows = daily.filter(F.col(USER_IDENTIFIER).isNotNull() & (F.col(EVENT_DATE) <= F.lit(as_of)))
    # daily_aggregates holds one row per (user, event day): a user's rows count their active days
    # (count, not countDistinct, whose Expand would copy every row once per distinct aggregate).
    metrics = [
        F.sum("total_events").alias("total_events"),
        F.sum("page_views").alias("page_views"),
        F.count(F.lit(1)).alias("active_days"),
        F.min("first_event_tstamp").alias("first_event_tstamp"),
        F.max("last_event_tstamp").alias("last_event_tstamp"),
    ]
    for n in windows:
        recent = F.col(EVENT_DATE) >= F.lit(window_start(as_of, n))
        metrics += [
            F.coalesce(F.sum(F.when(recent, F.col("total_events"))), F.lit(0)).alias(
                f"total_events_last_{n}_days"
            ),
            F.coalesce(F.sum(F.when(recent, F.col("page_views"))), F.lit(0)).alias(
                f"page_views_last_{n}_days"
            ),
            F.count(F.when(recent, F.lit(1))).alias(f"active_days_last_{n}_days"),
        ]
    metrics += [combine(d, as_of).alias(d.name) for d in definitions]
    # The event counts in the same pass: each user's daily maps collected and added up key by key.
    metrics.append(F.collect_list(EVENT_COUNTS).alias("_maps"))
    out = (
        rows.groupBy(USER_IDENTIFIER)
        .agg(*metrics)
        .withColumn(EVENT_COUNTS, summed_maps(F.col("_maps")))
        .withColumn("as_of", F.lit(as_of))
    )
    return out.select(*attribute_columns(windows, definitions))


def attributes_from_rows(daily: pa.Table, as_of: dt.date, windows: Sequence[int]) -> pa.Table:
    """`attributes(daily, as_of, windows)` without configured attributes, in plain Python over
    daily rows the driver holds (an Arrow table of daily_aggregates' columns): the same rows in
    the Arrow types Spark's computation has (`driver_attributes_schema`; the caller compares
    them with the stored table's and leaves any difference to Spark).

    A refresh recomputes the users whose rows can differ (about 25,000 of 240,000 on a
    5,000-event day of the 30-day benchmark home); handing them to Spark cost about 1.2 s more
    there (docs/benchmarks.md, "Session 35")."""
    import pyarrow.compute as pc

    day_type = daily.schema.field(EVENT_DATE).type
    rows = daily.select(list(BASE_COLUMNS))
    rows = rows.filter(
        pc.and_(
            pc.and_(pc.is_valid(rows[USER_IDENTIFIER]), pc.is_valid(rows[EVENT_DATE])),
            pc.less_equal(rows[EVENT_DATE], pa.scalar(as_of, day_type)),
        )
    )
    lifetime = rows.group_by(USER_IDENTIFIER).aggregate(
        [
            ("total_events", "sum"),
            ("page_views", "sum"),
            ([], "count_all"),
            ("first_event_tstamp", "min"),
            ("last_event_tstamp", "max"),
        ]
    )
    users = lifetime[USER_IDENTIFIER].to_pylist()
    # Columns already in the users' order stay Arrow arrays (a timestamp made a Python object
    # costs more than the rest of a user's row).
    values: dict[str, list[Any] | pa.ChunkedArray] = {
        USER_IDENTIFIER: users,
        "total_events": lifetime["total_events_sum"],
        "page_views": lifetime["page_views_sum"],
        "active_days": lifetime["count_all"],
        "first_event_tstamp": lifetime["first_event_tstamp_min"],
        "last_event_tstamp": lifetime["last_event_tstamp_max"],
        EVENT_COUNTS: _summed_counts(rows, users),
        "as_of": [as_of] * len(users),
    }
    for n in windows:
        start = pa.scalar(window_start(as_of, n), day_type)
        recent = rows.filter(pc.greater_equal(rows[EVENT_DATE], start))
        recent = recent.group_by(USER_IDENTIFIER).aggregate(
            [("total_events", "sum"), ("page_views", "sum"), ([], "count_all")]
        )
        of_user = {
            user: (total or 0, views or 0, days)
            for user, total, views, days in zip(
                recent[USER_IDENTIFIER].to_pylist(),
                recent["total_events_sum"].to_pylist(),
                recent["page_views_sum"].to_pylist(),
                recent["count_all"].to_pylist(),
                strict=True,
            )
        }
        for i, metric in enumerate(WINDOWED_METRICS):
            values[f"{metric}_last_{n}_days"] = [of_user.get(u, (0, 0, 0))[i] for u in users]
    schema = to_arrow_schema(driver_attributes_schema(windows), timezone="UTC")
    return pa.table(
        [
            column.cast(f.type)
            if isinstance(column := values[f.name], pa.ChunkedArray)
            else pa.array(column, type=f.type)
            for f in schema
        ],
        schema=schema,
    )


def _summed_counts(rows: pa.Table, users: Sequence[str]) -> list[Any]:
    """Per user of `users`, its daily `event_counts` maps added up key by key (a null count is
    0), sorted by event name, as `summed_maps` gives them: null when every map of the user is
    null, empty when its maps are all empty."""
    import pyarrow.compute as pc

    maps = rows[EVENT_COUNTS].combine_chunks()
    owners = rows[USER_IDENTIFIER].combine_chunks()
    with_maps = set(pc.unique(pc.filter(owners, pc.is_valid(maps))).to_pylist())
    # As lists of (key, value): the list kernels take no map (and a map's `keys` ignore a slice).
    kind = maps.type
    maps = maps.cast(pa.list_(pa.struct([("key", kind.key_type), ("value", kind.item_type)])))
    entries = pc.list_flatten(maps)
    parents = pc.list_parent_indices(maps)
    flat = pa.table(
        {
            "user": pc.take(owners, parents),
            "name": entries.field(0),
            "n": pc.fill_null(entries.field(1), 0),
        }
    )
    sums = flat.group_by(["user", "name"]).aggregate([("n", "sum")])
    summed: dict[str, list[tuple[str, int]]] = {u: [] for u in with_maps}
    for user, name, n in zip(
        sums["user"].to_pylist(), sums["name"].to_pylist(), sums["n_sum"].to_pylist(), strict=True
    ):
        summed[user].append((name, n))
    return [sorted(summed[u]) if u in summed else None for u in users]


def driver_attributes_schema(windows: Sequence[int]) -> StructType:
    """The types of `attributes`' columns without configured attributes, as Spark computes
    them: what `attributes_from_rows` gives."""
    kinds: dict[str, DataType] = {
        USER_IDENTIFIER: StringType(),
        "first_event_tstamp": TimestampType(),
        "last_event_tstamp": TimestampType(),
        EVENT_COUNTS: MapType(StringType(), LongType()),
        "as_of": DateType(),
    }
    return StructType(
        [StructField(c, kinds.get(c, LongType())) for c in attribute_columns(windows, ())]
    )


def summed_maps(maps: Column) -> Column:
    """The key-by-key sum of an array of `map<string, bigint>`, keys in order (null: no map).
    A key's null values count as 0 and an array of empty maps gives `{}`; daily_aggregates' maps
    hold a count for every key and at least one key, so neither happens there."""
    empty = F.create_map().cast("map<string,bigint>")
    total = F.aggregate(
        maps,
        empty,
        lambda acc, m: F.map_zip_with(
            acc, m, lambda _k, a, b: F.coalesce(a, F.lit(0)) + F.coalesce(b, F.lit(0))
        ),
    )
    return F.when(F.size(maps) > 0, F.map_from_entries(F.array_sort(F.map_entries(total))))


# --- Refreshing attributes from the previous table ------------------------------------------------
# A user's row depends only on their daily_aggregates rows, which of them are on or before `as_of`,
# and which fall in each period. Between two writes, it can change only for users with rows in an
# event day daily_aggregates rewrote since (before or after the rewrite), or in an event day that
# enters or leaves a period as `as_of` moves (`edge_days`). Every other row is the stored one
# with the new `as_of`.


# Raised when `attributes()` computes any row differently: a stored table of an earlier
# computation is then recomputed in full, not refreshed.
COMPUTATION = 1


def same_types(stored: StructType, computed: StructType) -> bool:
    """The same column names and types, nullability aside (a table delta-rs wrote has every
    field nullable)."""

    def plain(value: Any) -> Any:
        if isinstance(value, dict):
            return {
                k: plain(v)
                for k, v in value.items()
                if k not in ("nullable", "containsNull", "valueContainsNull", "metadata")
            }
        if isinstance(value, list):
            return [plain(v) for v in value]
        return value

    return plain(stored.jsonValue()) == plain(computed.jsonValue())


def periods(windows: Sequence[int], definitions: Sequence[AttributeDefinition]) -> list[int]:
    """The N of every N-day period the attributes count over (windows and configured periods)."""
    days = {*windows, *(d.period_days for d in definitions if d.period_days is not None)}
    return sorted(days)


def definition_fingerprint(
    windows: Sequence[int], definitions: Sequence[AttributeDefinition]
) -> str:
    """What the attributes' columns are computed by, as text: a stored table written under
    another is recomputed in full."""
    return json.dumps(
        {
            "computation": COMPUTATION,
            "windows": list(windows),
            "attributes": [dataclasses.asdict(d) for d in definitions],
        },
        sort_keys=True,
        default=list,
    )


def edge_days(before: dt.date, after: dt.date, period_days: Iterable[int]) -> set[dt.date]:
    """The event days counted differently as of `after` than as of `before`: the days after the
    earlier and up to the later (visible to one only), and for each N-day period the days from
    the earlier period's first day up to the later's (in one period only)."""
    low, high = sorted((before, after))
    days = {low + dt.timedelta(days=i) for i in range(1, (high - low).days + 1)}
    for n in period_days:
        first, last = sorted((window_start(before, n), window_start(after, n)))
        days |= {first + dt.timedelta(days=i) for i in range((last - first).days)}
    return days


def changed_days(
    before: Iterable[tuple[str, dt.date | None]], after: Iterable[tuple[str, dt.date | None]]
) -> set[dt.date | None]:
    """The partitions (event days) whose files differ between two versions of a table, from each
    version's live files as (path, event day): a file added or removed in between."""
    return {day for _, day in set(before) ^ set(after)}


def refreshed(
    previous: DataFrame,
    daily: DataFrame,
    users: DataFrame,
    as_of: dt.date,
    windows: Sequence[int],
    definitions: Sequence[AttributeDefinition] = (),
) -> DataFrame:
    """`attributes(daily, as_of, ...)` from the `previous` table: the rows of `users` (one column,
    `user_identifier`) recomputed from their daily rows, every other stored row kept with the new
    `as_of`. Equal to the full recompute when `users` holds every user whose row can differ
    (see above), and `previous` was computed by the same definitions."""
    columns = attribute_columns(windows, definitions)
    chosen = F.broadcast(users.select(USER_IDENTIFIER).distinct())
    recomputed = attributes(
        daily.join(chosen, USER_IDENTIFIER, "left_semi"), as_of, windows, definitions
    )
    kept = previous.join(chosen, USER_IDENTIFIER, "left_anti").withColumn("as_of", F.lit(as_of))
    return recomputed.unionByName(kept.select(*columns))
