"""attributes from daily_aggregates: lifetime and last-N-days metrics, configured definitions."""

from __future__ import annotations

import datetime as dt

import pytest

from sessionize_assets.core.aggregates import daily_aggregates
from sessionize_assets.core.attributes import attribute_columns, attributes, window_start
from sessionize_assets.settings import AttributeDefinition
from sessionize_assets_tests.core.test_aggregates import filtered
from sessionize_assets_tests.core.test_filtering import event

AS_OF = dt.date(2024, 3, 31)
DEFS = (
    AttributeDefinition(
        name="clicks_7d", aggregation="count", event_names=("link_click",), period="last_7_days"
    ),
    AttributeDefinition(name="orders", aggregation="count", event_names=("transaction",)),
    AttributeDefinition(
        name="revenue_30d", aggregation="sum", property="tr_total", period="last_30_days"
    ),
    AttributeDefinition(name="biggest_order", aggregation="max", property="tr_total"),
    AttributeDefinition(name="smallest_order", aggregation="min", property="tr_total"),
    AttributeDefinition(name="landing_page", aggregation="first", property="page_url"),
    AttributeDefinition(
        name="exit_page_7d", aggregation="last", property="page_url", period="last_7_days"
    ),
    AttributeDefinition(name="apps", aggregation="distinct_list", property="app_id"),
)


def at(day: int, hour: int = 12) -> str:
    return f"2024-03-{day:02d}T{hour:02d}:00:00"


ROWS = [
    # u1: early activity, one order a month ago, clicks this week
    event("1", at(1), at(1, 9), user="u1", app="mobile"),
    event("2", at(2), at(1, 10), user="u1", name="transaction", tr_total="100"),
    event("3", at(2), at(2, 10), user="u1", name="transaction", tr_total="20.5"),
    event("4", at(26), at(24), user="u1", name="link_click"),  # 7 days before as_of: outside 7d
    event("5", at(26), at(26), user="u1", name="link_click"),  # first day of the 7-day window
    event("6", at(31), at(31, 8), user="u1"),
    event("7", at(31), at(31, 9), user="u1", name="transaction", tr_total="5"),
    # u2: only today; plus a day after as_of that attributes must ignore (a replay's future)
    event("8", at(31), at(31, 10), user="u2", page_url=None),
    event("9", "2024-04-01T01:00:00", "2024-04-01T00:30:00", user="u2"),
    # no user at all: left out
    event("10", at(31), at(31, 11), user=None),
]


@pytest.fixture(scope="module")
def result(spark):
    daily = daily_aggregates(filtered(spark, ROWS), ["domain_userid"], DEFS)
    return {
        r.user_identifier: r.asDict() for r in attributes(daily, AS_OF, (7, 30), DEFS).collect()
    }


def test_window_start_is_inclusive() -> None:
    assert window_start(AS_OF, 1) == AS_OF
    assert window_start(AS_OF, 7) == dt.date(2024, 3, 25)


def test_columns(spark, result) -> None:
    cols = attribute_columns((7, 30), DEFS)
    assert cols[:2] == ["user_identifier", "total_events"]
    assert "page_views_last_7_days" in cols and "active_days_last_30_days" in cols
    assert cols[-1] == "as_of" and cols[-2] == "apps"
    assert set(result["u1"]) == set(cols)


def test_lifetime_and_windows(result) -> None:
    assert set(result) == {"u1", "u2"}
    u1 = result["u1"]
    assert (u1["total_events"], u1["page_views"], u1["active_days"]) == (7, 2, 5)
    assert (u1["total_events_last_7_days"], u1["active_days_last_7_days"]) == (3, 2)
    assert (u1["total_events_last_30_days"], u1["page_views_last_30_days"]) == (5, 1)  # from 03-02
    assert u1["event_counts"] == {"page_view": 2, "transaction": 3, "link_click": 2}
    assert u1["as_of"] == AS_OF
    u2 = result["u2"]
    assert (u2["total_events"], u2["total_events_last_7_days"], u2["active_days"]) == (1, 1, 1)


def test_configured_definitions(result) -> None:
    u1, u2 = result["u1"], result["u2"]
    assert u1["clicks_7d"] == 1 and u2["clicks_7d"] == 0
    assert u1["orders"] == 3
    assert u1["revenue_30d"] == pytest.approx(25.5)  # 03-02 and 03-31, not 03-01
    assert (u1["biggest_order"], u1["smallest_order"]) == (100.0, 5.0)
    assert u1["landing_page"] == "https://example.com/1"
    assert u1["exit_page_7d"] == "https://example.com/7"
    assert u1["apps"] == ["mobile", "web"]
    assert u2["revenue_30d"] is None and u2["landing_page"] is None and u2["apps"] == ["web"]


def test_names_clashing_with_built_in_columns_are_refused(spark) -> None:
    daily = daily_aggregates(filtered(spark, ROWS[:1]), ["domain_userid"], ())
    with pytest.raises(ValueError, match="total_events"):
        attributes(
            daily, AS_OF, (7,), (AttributeDefinition(name="total_events", aggregation="count"),)
        )


DAILY_SCHEMA = (
    "user_identifier string, event_date date, total_events bigint, page_views bigint, "
    "first_event_tstamp timestamp, last_event_tstamp timestamp, "
    "event_counts map<string, bigint>"
)


def _random_daily(seed: int) -> list[tuple]:
    """Daily rows with every case the Spark computation handles: null users, event days and
    counts, days after as_of, null and empty maps, null values in a map."""
    import random

    rng = random.Random(seed)
    rows = []
    for _ in range(rng.randint(0, 60)):
        day = AS_OF + dt.timedelta(days=rng.randint(-45, 2)) if rng.random() > 0.05 else None
        moment = dt.datetime(2024, 3, 1, tzinfo=dt.UTC) + dt.timedelta(
            minutes=rng.randint(0, 60_000)
        )
        counts = rng.choice(
            [
                None,
                {},
                {rng.choice("abcé"): rng.choice([1, 2, 3, None]) for _ in range(rng.randint(1, 3))},
            ]
        )
        rows.append(
            (
                rng.choice(["u1", "u2", "u3", "ü4", None]),
                day,
                rng.choice([rng.randint(0, 9), None]) if rng.random() < 0.1 else rng.randint(1, 9),
                rng.choice([rng.randint(0, 5), None]),
                rng.choice([moment, None]),
                rng.choice([moment + dt.timedelta(hours=1), None]),
                counts,
            )
        )
    return rows


@pytest.mark.parametrize("seed", range(6))
def test_the_drivers_attributes_are_sparks_on_the_same_daily_rows(spark, seed) -> None:
    from sessionize_assets.core.attributes import attributes_from_rows
    from sessionize_assets.resources.delta import same_types

    windows = (1, 7, 30)[: 1 + seed % 3]
    daily = spark.createDataFrame(_random_daily(seed), DAILY_SCHEMA)
    expected = attributes(daily, AS_OF, windows).toArrow()
    got = attributes_from_rows(daily.toArrow(), AS_OF, windows)

    def rows(table) -> list[tuple]:
        return sorted(
            tuple(sorted(v) if isinstance(v, list) else v for v in row.values())
            for row in table.to_pylist()
        )

    assert same_types(got.schema, expected.schema)  # Spark's types, nullability aside
    assert rows(got) == rows(expected)
    assert got.num_rows == len(
        {r[0] for r in _random_daily(seed) if r[0] and r[1] and r[1] <= AS_OF}
    )
