"""daily_aggregates on tiny DataFrames: per (user, event day) metrics, event counts, configured partials."""

from __future__ import annotations

import datetime as dt

import pytest

from sessionize_assets.core.aggregates import (
    BASE_COLUMNS,
    attribute_column,
    daily_aggregates,
    multiset_differences,
)
from sessionize_assets.core.filtering import kept_rows, mark_rows
from sessionize_assets.settings import AttributeDefinition
from sessionize_assets_tests.core.test_filtering import event, events_frame
from sessionize_assets_tests.core.test_filtering import ts as utc


def ts(value: str) -> dt.datetime:
    """A UTC instant as Spark returns it (naive, UTC session time zone)."""
    return utc(value).replace(tzinfo=None)


DEFS = (
    AttributeDefinition(name="clicks", aggregation="count", event_names=("link_click",)),
    AttributeDefinition(name="urls_seen", aggregation="count", property="page_url"),
    AttributeDefinition(
        name="revenue", aggregation="sum", property="tr_total", event_names=("transaction",)
    ),
    AttributeDefinition(name="min_order", aggregation="min", property="tr_total"),
    AttributeDefinition(name="max_order", aggregation="max", property="tr_total"),
    AttributeDefinition(name="latest_created", aggregation="max", property="dvce_created_tstamp"),
    AttributeDefinition(
        name="first_page", aggregation="first", property="page_url", event_names=("page_view",)
    ),
    AttributeDefinition(name="last_page", aggregation="last", property="page_url"),
    AttributeDefinition(name="apps", aggregation="distinct_list", property="app_id"),
)


def filtered(spark, rows):
    frame = events_frame(spark, rows)
    return kept_rows(mark_rows(frame, None, 0))


def test_daily_aggregates_per_user_and_day(spark) -> None:
    rows = [
        event("1", "2024-03-02T01:00:00", "2024-03-01T10:00:00", user="u1"),
        event("2", "2024-03-02T01:00:00", "2024-03-01T11:00:00", user="u1", name="link_click"),
        event("3", "2024-03-02T01:00:00", "2024-03-01T23:59:59.412", user="u1", name="link_click"),
        event("4", "2024-03-02T01:00:00", "2024-03-02T00:00:00", user="u1"),
        event("5", "2024-03-02T01:00:00", "2024-03-01T09:00:00", user=None, user_id="known"),
        event("6", "2024-03-02T01:00:00", "2024-03-01T09:30:00", user=None),
        event("7", "2024-03-02T01:00:00", "2024-03-01T09:45:00", user=None, name=None),
    ]
    out = daily_aggregates(filtered(spark, rows), ["domain_userid", "user_id"])
    assert tuple(out.columns) == BASE_COLUMNS
    got = {(r.user_identifier, r.event_date): r.asDict() for r in out.collect()}
    assert set(got) == {
        ("u1", dt.date(2024, 3, 1)),
        ("u1", dt.date(2024, 3, 2)),
        ("known", dt.date(2024, 3, 1)),
        (None, dt.date(2024, 3, 1)),  # no identifier at all: kept so every row is counted
    }
    u1 = got[("u1", dt.date(2024, 3, 1))]
    assert (u1["total_events"], u1["page_views"]) == (3, 1)
    assert u1["first_event_tstamp"] == ts("2024-03-01T10:00:00")
    assert u1["last_event_tstamp"] == ts("2024-03-01T23:59:59.412")
    assert u1["event_counts"] == {"page_view": 1, "link_click": 2}
    anon = got[(None, dt.date(2024, 3, 1))]
    assert anon["total_events"] == 2 and anon["event_counts"] == {"page_view": 1, "": 1}
    assert sum(r["total_events"] for r in got.values()) == len(rows)


def test_configured_attributes_get_per_day_partials(spark) -> None:
    rows = [
        event(
            "1", "2024-03-02T01:00:00", "2024-03-01T10:00:00", tr_total="10.5", name="transaction"
        ),
        event("2", "2024-03-02T01:00:00", "2024-03-01T11:00:00", tr_total="9", name="transaction"),
        event("3", "2024-03-02T01:00:00", "2024-03-01T12:00:00", tr_total="n/a", name="link_click"),
        event("4", "2024-03-02T01:00:00", "2024-03-01T08:00:00", app="mobile"),
        event("5", "2024-03-02T01:00:00", "2024-03-01T13:00:00", page_url=None),
    ]
    frame = filtered(spark, [{**r, "tr_total": r.get("tr_total")} for r in rows])
    out = daily_aggregates(frame, ["domain_userid"], DEFS)
    assert out.columns[len(BASE_COLUMNS) :] == [attribute_column(d) for d in DEFS]
    (row,) = out.collect()
    assert row.attr_clicks == 1
    assert row.attr_urls_seen == 4  # rows with a page_url
    assert row.attr_revenue == pytest.approx(19.5)
    assert row.attr_min_order == 9.0 and row.attr_max_order == 10.5  # numbers, "n/a" ignored
    assert row.attr_latest_created == ts("2024-03-01T13:00:00")
    assert (
        row.attr_first_page.value == "https://example.com/4"
        and row.attr_first_page.tstamp == ts("2024-03-01T08:00:00")
    )
    assert row.attr_last_page.value == "https://example.com/3"  # latest row with a page_url
    assert row.attr_apps == ["mobile", "web"]


@pytest.mark.parametrize("seed", range(3))
def test_every_column_is_one_aggregation_per_user_and_day(spark, seed) -> None:
    """daily_aggregates aggregates per event name first, then merges per (user, day): every
    column equals aggregating each (user, day)'s rows at once, on rows with several names per
    (user, day), null and unparsable properties, and null event names."""
    import random

    from pyspark.sql import functions as F

    from sessionize_assets.core.aggregates import partial_aggregate, user_identifier

    rng = random.Random(seed)
    rows = []
    for i in range(60):
        happened = (
            f"2024-03-0{rng.randint(1, 2)}T{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:00"
        )
        rows.append(
            event(
                f"e{i}",
                "2024-03-03T01:00:00",
                happened,
                user=rng.choice(["u1", "u2", None]),
                name=rng.choice(["page_view", "link_click", "transaction", None]),
                app=rng.choice(["web", "mobile", None]),
                page_url=rng.choice([None, "https://a/1", "https://a/2", f"https://a/{i}"]),
                tr_total=rng.choice([None, "n/a", "1.5", "2", str(rng.randint(1, 9))]),
            )
        )
    frame = filtered(spark, rows)
    got = daily_aggregates(frame, ["domain_userid"], DEFS)
    df = frame.withColumn("user_identifier", user_identifier(frame, ["domain_userid"]))
    name = F.coalesce(F.col("event_name"), F.lit(""))
    per_name = df.groupBy("user_identifier", "event_date", name.alias("n")).count()
    counts = per_name.groupBy("user_identifier", "event_date").agg(
        F.map_from_entries(F.array_sort(F.collect_list(F.struct("n", "count")))).alias(
            "event_counts"
        )
    )
    once = df.groupBy("user_identifier", "event_date").agg(
        F.count(F.lit(1)).alias("total_events"),
        F.count(F.when(F.col("event_name") == "page_view", 1)).alias("page_views"),
        F.min("derived_tstamp").alias("first_event_tstamp"),
        F.max("derived_tstamp").alias("last_event_tstamp"),
        *[partial_aggregate(df, d).alias(attribute_column(d)) for d in DEFS],
    )
    keys = ["user_identifier", "event_date"]
    on = [once[k].eqNullSafe(counts[k]) for k in keys]  # the null user is a user too
    expected = once.join(counts, on, "left").select(
        *[once[k] for k in keys], *[c for c in got.columns if c not in keys]
    )

    def keyed(frame) -> dict:
        return {
            (r.user_identifier, r.event_date): r.asDict(recursive=True) for r in frame.collect()
        }

    assert len(keyed(got)) > 3
    assert keyed(got) == keyed(expected)


def test_missing_columns_are_named(spark) -> None:
    frame = filtered(spark, [event("1", "2024-03-02T01:00:00")])
    with pytest.raises(ValueError, match="nope"):
        daily_aggregates(frame, ["nope"])
    with pytest.raises(ValueError, match="missing_prop"):
        daily_aggregates(
            frame, ["domain_userid"], [AttributeDefinition("x", "sum", "missing_prop")]
        )


ROWS_SCHEMA = (
    "domain_userid string, user_id string, event_id string, event_name string, "
    "derived_tstamp timestamp, event_date date, load_date date"
)


def _random_rows(seed: int) -> list[tuple]:
    """filtered_events rows with null users (one or both columns), empty ids, null and other
    event names, null timestamps, load days before and after their day's horizon."""
    import random

    rng = random.Random(seed)
    first = dt.date(2024, 3, 1)
    rows = []
    for i in range(rng.randint(0, 80)):
        day = first + dt.timedelta(days=rng.randint(0, 4))
        moment = dt.datetime.combine(day, dt.time(), tzinfo=dt.UTC) + dt.timedelta(
            minutes=rng.randint(0, 1439)
        )
        rows.append(
            (
                rng.choice(["d1", "d2", "", None]),
                rng.choice(["u1", "ü2", None, None]),
                f"e{i}",
                rng.choice(["page_view", "page_view", "link_click", "", None]),
                moment if rng.random() > 0.1 else None,
                day,
                day + dt.timedelta(days=rng.randint(0, 3)),
            )
        )
    return rows


@pytest.mark.parametrize("seed", range(6))
def test_the_drivers_daily_aggregates_are_sparks_on_the_same_rows(spark, seed) -> None:
    import pyarrow as pa
    from pyspark.sql import functions as F

    from sessionize_assets.core.aggregates import daily_aggregates_from_rows
    from sessionize_assets.resources.delta import same_types

    users = [["domain_userid"], ["user_id", "domain_userid"]][seed % 2]
    first = dt.date(2024, 3, 1)
    # Days 0-3 have horizons (load day + 0..2); day 4 has none: its rows are not counted.
    horizons = {
        first + dt.timedelta(days=d): first + dt.timedelta(days=d + d % 3) for d in range(4)
    }
    rows = spark.createDataFrame(_random_rows(seed), ROWS_SCHEMA)
    counted = rows.filter(
        F.col("event_date").isin(list(horizons))
        & (
            F.col("load_date")
            <= F.element_at(
                F.create_map(*[F.lit(x) for kv in horizons.items() for x in kv]),
                F.col("event_date"),
            )
        )
    )
    expected = daily_aggregates(counted, users).toArrow()
    at = dt.datetime(2024, 3, 9, 1, 2, 3, tzinfo=dt.UTC)
    got = daily_aggregates_from_rows(rows.toArrow(), users, horizons, at)
    # Spark's types (nullability aside), then the step's bookkeeping columns.
    schema = pa.schema(
        [
            *expected.schema,
            pa.field("_horizon_load_date", pa.date32()),
            pa.field("_aggregated_at", pa.timestamp("us", tz="UTC")),
        ]
    )
    assert same_types(got.schema, schema)

    def base(table) -> list[tuple]:
        return sorted(
            (tuple(row[c] for c in BASE_COLUMNS) for row in table.to_pylist()),
            key=repr,
        )

    assert base(got) == base(expected)
    assert all(
        r["_horizon_load_date"] == horizons[r["event_date"]] and r["_aggregated_at"] == at
        for r in got.to_pylist()
    )


def test_the_drivers_daily_aggregates_refuse_a_user_column_that_is_not_a_string() -> None:
    import pyarrow as pa

    from sessionize_assets.core.aggregates import daily_aggregates_from_rows

    rows = pa.table({"user_number": pa.array([1], pa.int64())})
    with pytest.raises(TypeError, match="user_number"):
        daily_aggregates_from_rows(rows, ["user_number"], {}, dt.datetime.now(dt.UTC))


def test_multiset_differences_count_what_except_all_counts_each_way(spark) -> None:
    """One aggregation gives, per key, what `exceptAll` each way grouped by the key counts:
    copies counted (a row stored twice and recomputed once is one row only stored), nulls equal
    to nulls, keys that agree left out."""
    schema = "day string, user string, n int"
    stored = spark.createDataFrame(
        [
            ("d1", "a", 1),
            ("d1", "a", 1),  # one copy too many
            ("d1", None, 2),  # equal, null included
            ("d2", "b", 3),  # differs in n
            ("d3", "c", 4),  # equal
            ("d4", "e", 5),  # only stored
        ],
        schema,
    )
    recomputed = spark.createDataFrame(
        [
            ("d1", "a", 1),
            ("d1", None, 2),
            ("d2", "b", 30),
            ("d3", "c", 4),
            ("d5", "f", 6),  # only recomputed
            ("d5", "f", 6),
        ],
        schema,
    ).select("n", "user", "day")  # another column order: matched by name
    found = {
        r["day"]: (r["only_stored"], r["only_recomputed"])
        for r in multiset_differences(stored, recomputed, "day").collect()
    }
    expected = {}
    for frame, other, side in ((stored, recomputed, 0), (recomputed, stored, 1)):
        for r in frame.exceptAll(other.select(*frame.columns)).groupBy("day").count().collect():
            expected.setdefault(r["day"], [0, 0])[side] = r["count"]
    assert found == {day: tuple(counts) for day, counts in expected.items()}
    assert found == {"d1": (1, 0), "d2": (1, 1), "d4": (1, 0), "d5": (0, 2)}
