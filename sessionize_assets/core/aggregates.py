"""`daily_aggregates` for event days (SPEC section 5), DataFrame -> DataFrame.

One row per (user, event day), computed in full from the rows of the day that the aggregate counts
(load day <= horizon). Users whose identifier is null are kept as one row with a null
`user_identifier`, so the aggregate counts every row and the accounting invariant is exact
(`attributes` leaves them out).

Schema (stable whatever the data): `user_identifier`, `event_date`, `total_events`, `page_views`,
`first_event_tstamp`, `last_event_tstamp`, `event_counts` (map event name -> rows: a map rather
than one column per name, so a new event name never changes the table's schema), then one column
`attr_<name>` per configured attribute holding that day's partial aggregate, from which
`attributes` combines any period:

| aggregation | per-day partial `attr_<name>` | combined over days |
|---|---|---|
| count | rows (with non-null property, when one is named) | sum |
| sum | sum of the property as a number | sum |
| min / max | min / max of the property (numbers, or timestamps for timestamp columns) | min / max |
| first / last | struct(tstamp, event_id, value) of the earliest / latest row by derived_tstamp | min / max |
| distinct_list | sorted distinct values | sorted distinct union |
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.pandas.types import to_arrow_schema

from sessionize_assets.core.schema import EVENT_DATE, LOAD_DATE
from sessionize_assets.settings import AttributeDefinition

USER_IDENTIFIER = "user_identifier"
EVENT_COUNTS = "event_counts"
BASE_COLUMNS: tuple[str, ...] = (
    USER_IDENTIFIER,
    EVENT_DATE,
    "total_events",
    "page_views",
    "first_event_tstamp",
    "last_event_tstamp",
    EVENT_COUNTS,
)


def attribute_column(definition: AttributeDefinition) -> str:
    """The daily_aggregates column holding a configured attribute's per-day partial aggregate."""
    return f"attr_{definition.name}"


def user_identifier(df: DataFrame, columns: Sequence[str]) -> Column:
    """The first non-null of the `user_identifier` columns, as a string."""
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ValueError(f"user_identifier column {missing[0]!r} is not in filtered_events")
    return F.coalesce(*[F.col(c).cast("string") for c in columns])


def _comparable(df: DataFrame, column: str) -> Column:
    """A property as a value min/max can compare: timestamps, dates and numbers as they are,
    anything else as a number (values that are not numbers are ignored)."""
    kind = df.schema[column].dataType
    if isinstance(kind, T.NumericType | T.TimestampType | T.DateType):
        return F.col(column)
    return F.col(column).try_cast("double")


def _matches(definition: AttributeDefinition) -> Column:
    if definition.event_names:
        return F.col("event_name").isin(list(definition.event_names))
    return F.lit(True)


def partial_aggregate(df: DataFrame, definition: AttributeDefinition) -> Column:
    """The per-(user, day) partial aggregate of one configured attribute."""
    keep = _matches(definition)
    prop = definition.property
    if prop is not None and prop not in df.columns:
        raise ValueError(
            f"attribute {definition.name!r}: property {prop!r} is not in filtered_events"
        )
    agg = definition.aggregation
    if agg == "count":
        condition = keep if prop is None else keep & F.col(prop).isNotNull()
        return F.count(F.when(condition, F.lit(1)))
    assert prop is not None
    if agg == "sum":
        return F.sum(F.when(keep, F.col(prop).try_cast("double")))
    if agg in ("min", "max"):
        value = F.when(keep, _comparable(df, prop))
        return F.min(value) if agg == "min" else F.max(value)
    if agg in ("first", "last"):
        row = F.struct(
            F.col("derived_tstamp").alias("tstamp"),
            F.col("event_id").alias("event_id"),
            F.col(prop).cast("string").alias("value"),
        )
        value = F.when(keep & F.col(prop).isNotNull(), row)
        return F.min(value) if agg == "first" else F.max(value)
    if agg == "distinct_list":
        return F.array_sort(F.collect_set(F.when(keep, F.col(prop).cast("string"))))
    raise ValueError(f"unknown aggregation {agg!r}")


def source_columns(
    user_identifier_columns: Sequence[str], definitions: Sequence[AttributeDefinition] = ()
) -> list[str]:
    """The filtered_events columns `daily_aggregates` reads (the load day too, for horizons)."""
    columns = [*user_identifier_columns, "event_id", "event_name", "derived_tstamp"]
    columns += [d.property for d in definitions if d.property is not None]
    return list(dict.fromkeys([*columns, EVENT_DATE, LOAD_DATE]))


def daily_aggregates(
    rows: DataFrame,
    user_identifier_columns: Sequence[str],
    definitions: Sequence[AttributeDefinition] = (),
) -> DataFrame:
    """One row per (user, event day) of `rows` (filtered_events rows, any number of event days).

    One scan and no join: the rows are aggregated per (user, day, event name) -- the counts the
    `event_counts` map needs, with every other aggregate's partial -- and those rows per (user,
    day), each partial merged by the rule that combines it (`merged_partials`). Before session 49
    the counts per name and the other aggregates were two aggregations of the rows, joined: two
    scans, a third shuffle and a sort-merge join."""
    user = user_identifier(rows, user_identifier_columns)
    df = rows.withColumn(USER_IDENTIFIER, user)
    keys = [USER_IDENTIFIER, EVENT_DATE]
    per_name = df.groupBy(*keys, F.coalesce(F.col("event_name"), F.lit("")).alias("_name")).agg(
        F.count(F.lit(1)).alias("_rows"),
        F.min("derived_tstamp").alias("_first"),
        F.max("derived_tstamp").alias("_last"),
        *[partial_aggregate(df, d).alias(attribute_column(d)) for d in definitions],
    )
    # `event_name` null and "" both count under "" (as before); neither is a page view.
    views = F.when(F.col("_name") == "page_view", F.col("_rows")).otherwise(F.lit(0))
    return per_name.groupBy(*keys).agg(
        F.sum("_rows").alias("total_events"),
        F.sum(views).alias("page_views"),
        F.min("_first").alias("first_event_tstamp"),
        F.max("_last").alias("last_event_tstamp"),
        F.map_from_entries(F.array_sort(F.collect_list(F.struct("_name", "_rows")))).alias(
            EVENT_COUNTS
        ),
        *[
            merged_partials(F.col(attribute_column(d)), d.aggregation).alias(attribute_column(d))
            for d in definitions
        ],
    )


def merged_partials(column: Column, agg: str) -> Column:
    """The aggregate merging `partial_aggregate`s of one attribute (aggregation `agg`) over
    parts of some rows into their partial: counts and sums added, minima and maxima (first and
    last are minima and maxima of structs) taken again, distinct lists united. Used for the parts
    of a (user, day) and, by `attributes`, for the days of a period."""
    if agg in ("count", "sum"):
        return F.sum(column)
    if agg in ("min", "first"):
        return F.min(column)
    if agg in ("max", "last"):
        return F.max(column)
    if agg == "distinct_list":
        return F.array_sort(F.array_distinct(F.flatten(F.collect_list(column))))
    raise ValueError(f"unknown aggregation {agg!r}")


# The types of `daily_aggregates`' base columns and of the step's bookkeeping columns, as Spark
# computes them: what `daily_aggregates_from_rows` gives.
DRIVER_DAILY_SCHEMA = T.StructType(
    [
        T.StructField(USER_IDENTIFIER, T.StringType()),
        T.StructField(EVENT_DATE, T.DateType()),
        T.StructField("total_events", T.LongType()),
        T.StructField("page_views", T.LongType()),
        T.StructField("first_event_tstamp", T.TimestampType()),
        T.StructField("last_event_tstamp", T.TimestampType()),
        T.StructField(EVENT_COUNTS, T.MapType(T.StringType(), T.LongType())),
        T.StructField("_horizon_load_date", T.DateType()),
        T.StructField("_aggregated_at", T.TimestampType()),
    ]
)


def daily_aggregates_from_rows(
    rows: pa.Table,
    user_identifier_columns: Sequence[str],
    horizons: Mapping[dt.date, dt.date],
    aggregated_at: dt.datetime,
) -> pa.Table:
    """`daily_aggregates(rows, user_identifier_columns)` without configured attributes, in plain
    Python over filtered_events rows the driver holds, counting a row only when its event day
    has a horizon in `horizons` and its load day is at or before it, with the bookkeeping
    columns `_horizon_load_date` and `_aggregated_at`: daily_aggregates' rows of those days, in
    the Arrow types Spark's computation has (`DRIVER_DAILY_SCHEMA`; the caller's write compares
    them with the stored table's and leaves any difference to Spark). The user is the first
    non-null of the `user_identifier_columns`, which must be strings here (Spark casts other
    types).

    A small load day's event days hold a few thousand rows; handing them to Spark cost about
    0.6 s more on the 30-day benchmark home (docs/benchmarks.md, "Session 35")."""
    for column in user_identifier_columns:
        kind = rows.schema.field(column).type
        if not (
            pa.types.is_string(kind)
            or pa.types.is_large_string(kind)
            or pa.types.is_string_view(kind)
        ):
            raise TypeError(f"user_identifier column {column!r} is {kind}, not a string")
    names = [*user_identifier_columns, "event_name", "derived_tstamp", EVENT_DATE, LOAD_DATE]
    data = rows.select(list(dict.fromkeys(names))).to_pydict()
    groups: dict[tuple[str | None, dt.date], dict[str, Any]] = {}
    users = zip(*(data[c] for c in user_identifier_columns), strict=True)
    for ids, name, tstamp, day, load_day in zip(
        users,
        data["event_name"],
        data["derived_tstamp"],
        data[EVENT_DATE],
        data[LOAD_DATE],
        strict=True,
    ):
        horizon = horizons.get(day)
        if horizon is None or load_day is None or load_day > horizon:
            continue
        user = next((u for u in ids if u is not None), None)
        group = groups.get((user, day))
        if group is None:
            group = groups[(user, day)] = {
                "n": 0,
                "views": 0,
                "first": None,
                "last": None,
                "names": {},
            }
        group["n"] += 1
        group["views"] += name == "page_view"
        if tstamp is not None:
            if group["first"] is None or tstamp < group["first"]:
                group["first"] = tstamp
            if group["last"] is None or tstamp > group["last"]:
                group["last"] = tstamp
        key = "" if name is None else name
        group["names"][key] = group["names"].get(key, 0) + 1
    schema = to_arrow_schema(DRIVER_DAILY_SCHEMA, timezone="UTC")
    columns: dict[str, list[Any]] = {f.name: [] for f in schema}
    for (user, day), group in groups.items():
        values = {
            USER_IDENTIFIER: user,
            EVENT_DATE: day,
            "total_events": group["n"],
            "page_views": group["views"],
            "first_event_tstamp": group["first"],
            "last_event_tstamp": group["last"],
            EVENT_COUNTS: sorted(group["names"].items()),
            "_horizon_load_date": horizons[day],
            "_aggregated_at": aggregated_at,
        }
        for name, column in columns.items():
            column.append(values[name])
    return pa.table([pa.array(columns[f.name], type=f.type) for f in schema], schema=schema)


def comparable(df: DataFrame) -> DataFrame:
    """The same rows with map columns as sorted arrays of entries, so that set operations
    (exceptAll, for row-by-row comparisons) accept them."""
    cols = [
        F.array_sort(F.map_entries(F.col(f.name))).alias(f.name)
        if isinstance(f.dataType, T.MapType)
        else F.col(f.name)
        for f in df.schema.fields
    ]
    return df.select(*cols)


def multiset_differences(stored: DataFrame, recomputed: DataFrame, key: str) -> DataFrame:
    """(`key`, only_stored, only_recomputed) for each value of `key` where the two frames differ:
    how many of `stored`'s rows the recompute lacks and how many of the recompute's rows `stored`
    lacks, copies counted (what `exceptAll` each way, grouped by `key`, counts). One aggregation
    over both frames (`comparable` ones: no map columns), so each side is computed once; two
    `exceptAll`s computed the recompute twice."""
    side = "_verify_side"
    columns = stored.columns
    both = stored.withColumn(side, F.lit(1)).unionByName(
        recomputed.select(*columns).withColumn(side, F.lit(-1))
    )
    excess = both.groupBy(*columns).agg(F.sum(side).alias("_excess"))
    return (
        excess.filter(F.col("_excess") != 0)
        .groupBy(key)
        .agg(
            F.sum(F.greatest(F.col("_excess"), F.lit(0))).alias("only_stored"),
            F.sum(F.greatest(-F.col("_excess"), F.lit(0))).alias("only_recomputed"),
        )
    )
