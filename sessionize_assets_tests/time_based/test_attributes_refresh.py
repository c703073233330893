"""`attributes` refreshed from the stored table (core.attributes.refreshed, the attributes step's
users_to_recompute): only the users whose rows can differ are recomputed, and the table equals a
full recompute after every write, whatever daily_aggregates' rewrites and `as_of`'s moves."""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sessionize_assets.core import attributes as attrs
from sessionize_assets.core.aggregates import daily_aggregates
from sessionize_assets.core.schema import EVENT_DATE
from sessionize_assets.resources import delta
from sessionize_assets.resources.delta import replace_partitions
from sessionize_assets.settings import AttributeDefinition, from_mapping
from sessionize_assets.time_based import steps as time_based_steps
from sessionize_assets.time_based.steps import attributes_step
from sessionize_assets.time_based.tables import TimeBasedTables
from sessionize_assets_tests.core.test_aggregates import filtered
from sessionize_assets_tests.core.test_filtering import event

BASE = dt.date(2024, 3, 1)


def counted(day: dt.date, as_of: dt.date, periods: list[int]) -> tuple[bool, ...]:
    """How a row of `day` counts as of `as_of`: visible at all, then in each period."""
    return (day <= as_of, *(attrs.window_start(as_of, n) <= day <= as_of for n in periods))


@settings(max_examples=300, deadline=None)
@given(
    st.integers(-40, 40),
    st.integers(-40, 40),
    st.lists(st.integers(1, 30), max_size=4),
)
def test_edge_days_are_the_days_counted_differently(before: int, after: int, periods) -> None:
    a, b = BASE + dt.timedelta(days=before), BASE + dt.timedelta(days=after)
    every = [BASE + dt.timedelta(days=i) for i in range(-80, 81)]
    expected = {d for d in every if counted(d, a, periods) != counted(d, b, periods)}
    assert attrs.edge_days(a, b, periods) == expected


def test_changed_days_are_the_days_of_files_added_or_removed() -> None:
    d1, d2, d3 = (BASE + dt.timedelta(days=i) for i in range(3))
    before = [("a.parquet", d1), ("b.parquet", d2), ("c.parquet", d3)]
    after = [("a.parquet", d1), ("b2.parquet", d2), ("c.parquet", d3), ("d.parquet", d3)]
    assert attrs.changed_days(before, after) == {d2, d3}
    assert attrs.changed_days(before, before) == set()


DEFINITIONS = (
    AttributeDefinition(
        name="clicks_3d", aggregation="count", event_names=("link_click",), period="last_3_days"
    ),
    AttributeDefinition(name="revenue", aggregation="sum", property="tr_total"),
    AttributeDefinition(
        name="exit_page_4d", aggregation="last", property="page_url", period="last_4_days"
    ),
    AttributeDefinition(name="landing_page", aggregation="first", property="page_url"),
    AttributeDefinition(
        name="smallest_order_3d", aggregation="min", property="tr_total", period="last_3_days"
    ),
    AttributeDefinition(name="apps", aggregation="distinct_list", property="app_id"),
)


def _rows(df) -> dict:
    return {r["user_identifier"]: r.asDict(recursive=True) for r in df.collect()}


@pytest.mark.parametrize("seed", [5, 6, 7])
def test_refreshed_attributes_equal_a_full_recompute_after_every_write(
    spark, tmp_path, monkeypatch, seed
):
    rng = random.Random(seed)
    # Every refresh is taken, however many users it recomputes (the default share would send the
    # larger ones of these small histories, where most users are new, to the full recompute);
    # seed 6's tables are written and refreshed by Spark, seed 5's by the driver, whose users'
    # rows Spark computes (configured attributes), seed 7's by the driver in plain Python (none).
    monkeypatch.setattr(time_based_steps, "REFRESH_MAX_SHARE", math.inf)
    refreshed_by, computed_by = "the driver (delta-rs)", "Spark"
    if seed == 6:
        monkeypatch.setattr(time_based_steps, "DRIVER_WRITE_ROWS", -1)
        monkeypatch.setattr(delta, "DRIVER_SCAN_ROWS", -1)
        refreshed_by = "Spark"
    definitions = () if seed == 7 else DEFINITIONS
    if seed == 7:
        computed_by = "the driver (plain Python)"
    config = dataclasses.replace(
        from_mapping({}), attribute_windows_days=(2, 5), attributes=definitions
    )
    tables = TimeBasedTables.at(lambda name: str(tmp_path / name))
    users = [f"u{i}" for i in range(30)]
    events: dict[str, dict] = {}
    as_of = BASE + dt.timedelta(days=6)
    recomputed = []
    for step in range(7):
        changed: set[dt.date] = set()
        # new events, of old users and new ones: many at first, then a few per write
        for _ in range(60 if step == 0 else rng.randint(1, 4)):
            day = BASE + dt.timedelta(days=rng.randint(0, 13))
            name = rng.choice(["page_view", "link_click", "transaction"])
            at = f"{day.isoformat()}T{rng.randint(0, 23):02d}:00:00"
            key = f"e{len(events)}-{step}"
            events[key] = event(
                key,
                at,
                user=rng.choice(users),
                name=name,
                app=rng.choice(["web", "mobile"]),
                tr_total=str(rng.choice([1, 2.5, 10])) if name == "transaction" else None,
            )
            changed.add(day)
        if step and rng.random() < 0.6:  # a user's events of one day deleted (as `forget` does)
            gone = rng.choice(list(events.values()))
            for key, row in list(events.items()):
                if row["domain_userid"] == gone["domain_userid"] and (
                    row["derived_tstamp"].date() == gone["derived_tstamp"].date()
                ):
                    del events[key]
            changed.add(gone["derived_tstamp"].date())
        daily = daily_aggregates(filtered(spark, events.values()), ["domain_userid"], definitions)
        replace_partitions(
            spark,
            daily.filter(daily[EVENT_DATE].isin(sorted(changed))),
            tables.daily_aggregates,
            EVENT_DATE,
            sorted(changed),
            [EVENT_DATE],
        )
        as_of += dt.timedelta(days=rng.choice([-2, 0, 1, 1, 3]) if step else 0)
        result = attributes_step(spark, tables, config, as_of)
        recomputed.append(result.metadata["recomputed"])
        if step:
            assert result.metadata["refreshed by"] == refreshed_by
            assert result.metadata["users' rows computed by"] == computed_by
        stored = spark.read.format("delta").load(tables.daily_aggregates)
        expected = attrs.attributes(stored, as_of, (2, 5), definitions)
        written = spark.read.format("delta").load(tables.attributes)
        got = _rows(written)
        assert got == _rows(expected), f"step {step}, as of {as_of}: {recomputed}"
        # The columns, in order, of the full recompute's types, whoever wrote the table.
        assert [(f.name, f.dataType.simpleString()) for f in written.schema] == [
            (f.name, f.dataType.simpleString()) for f in expected.schema
        ], step
    assert recomputed[0] == "in full"
    assert all(r.endswith(" users") for r in recomputed[1:]), recomputed
    # Fewer users than the table holds were recomputed at least once.
    assert any(int(r.split()[0]) < len(got) for r in recomputed[1:]), (recomputed, len(got))
    # Nothing changed: no user is recomputed, and the table is what it was.
    assert attributes_step(spark, tables, config, as_of).metadata["recomputed"] == "0 users"
    assert _rows(spark.read.format("delta").load(tables.attributes)) == got
    if not definitions:
        return
    # Another definition under the same name (other events counted): recomputed in full.
    other = dataclasses.replace(DEFINITIONS[0], event_names=("page_view",))
    changed = dataclasses.replace(config, attributes=(other, *DEFINITIONS[1:]))
    assert attributes_step(spark, tables, changed, as_of).metadata["recomputed"] == "in full"
    # Back to the first definitions: the stored table records the other ones, so in full again.
    assert attributes_step(spark, tables, config, as_of).metadata["recomputed"] == "in full"
    # A month later, every user with rows in the last periods is recomputed: more than a share of
    # 0 of the stored users is a full recompute, and with no limit it is a refresh.
    later = as_of + dt.timedelta(days=30)
    monkeypatch.setattr(time_based_steps, "REFRESH_MAX_SHARE", 0.0)
    assert attributes_step(spark, tables, config, later).metadata["recomputed"] == "in full"
    monkeypatch.setattr(time_based_steps, "REFRESH_MAX_SHARE", math.inf)
    later += dt.timedelta(days=1)
    assert attributes_step(spark, tables, config, later).metadata["recomputed"] == "0 users"
    stored = spark.read.format("delta").load(tables.daily_aggregates)
    expected = attrs.attributes(stored, later, (2, 5), DEFINITIONS)
    assert _rows(spark.read.format("delta").load(tables.attributes)) == _rows(expected)


def test_same_types_ignores_nullability_only() -> None:
    from pyspark.sql import types as T

    def schema(value: T.DataType, nullable: bool) -> T.StructType:
        return T.StructType([T.StructField("m", value, nullable)])

    counts = T.MapType(T.StringType(), T.LongType(), valueContainsNull=False)
    loose = T.MapType(T.StringType(), T.LongType(), valueContainsNull=True)
    assert attrs.same_types(schema(counts, False), schema(loose, True))
    assert not attrs.same_types(
        schema(counts, True), schema(T.MapType(T.StringType(), T.IntegerType()), True)
    )
    assert not attrs.same_types(schema(T.LongType(), True), schema(T.DoubleType(), True))


@pytest.mark.parametrize("stored_total", ["int64", "double"])
def test_a_refresh_on_the_driver_keeps_to_the_stored_types(spark, tmp_path, stored_total) -> None:
    """The plain-Python rows are Spark's types: a stored attributes table of other types (here
    `total_events` as double) is not refreshed on the driver (None: Spark recomputes it)."""
    import pyarrow as pa
    from deltalake import write_deltalake
    from pyspark.sql.pandas.types import to_arrow_schema

    from sessionize_assets.core.aggregates import DRIVER_DAILY_SCHEMA

    as_of, windows = BASE, (2,)
    tables = TimeBasedTables.at(lambda name: str(tmp_path / name))
    daily_types = to_arrow_schema(DRIVER_DAILY_SCHEMA, timezone="UTC")
    daily = pa.table(
        {
            "user_identifier": ["u1", "u2"],
            "event_date": [BASE, BASE],
            "total_events": [3, 4],
            "page_views": [1, 0],
            "first_event_tstamp": [dt.datetime(2024, 3, 1, 9, tzinfo=dt.UTC)] * 2,
            "last_event_tstamp": [dt.datetime(2024, 3, 1, 10, tzinfo=dt.UTC)] * 2,
            "event_counts": [[("page_view", 3)], [("link_click", 4)]],
            "_horizon_load_date": [BASE, BASE],
            "_aggregated_at": [dt.datetime(2024, 3, 2, tzinfo=dt.UTC)] * 2,
        },
        schema=daily_types,
    )
    write_deltalake(tables.daily_aggregates, daily)
    computed = attrs.attributes_from_rows(daily, as_of, windows)
    stored = computed.cast(
        pa.schema(
            [
                pa.field(f.name, pa.float64() if f.name == "total_events" else f.type)
                if stored_total == "double"
                else f
                for f in computed.schema
            ]
        )
    )
    write_deltalake(tables.attributes, stored)
    refreshed = time_based_steps.refreshed_on_driver(
        spark, tables, 0, 0, ["u1"], as_of, windows, ()
    )
    if stored_total == "double":
        assert refreshed is None
    else:
        assert refreshed is not None and refreshed[1] == "the driver (plain Python)"
        assert sorted(refreshed[0].column("total_events").to_pylist()) == [3, 4]
