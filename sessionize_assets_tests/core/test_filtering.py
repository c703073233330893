"""filtered_events for load days: deduplication order, filters, exact accounting (tiny DataFrames)."""

from __future__ import annotations

import datetime as dt
import random
from collections.abc import Iterable, Mapping
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from sessionize_assets.core.filtering import (
    APP_FILTER,
    BEFORE_START_DATE,
    DEDUPE_ORDER,
    DROP_REASON,
    DUPLICATE,
    EVENT_FILTER,
    accounting,
    decisions_needed,
    duplicate_copies,
    duplicate_event_ids,
    duplicate_event_ids_touching,
    ids_needing_a_decision,
    kept_rows,
    load_days_reached,
    lookback_load_days,
    mark_rows,
    outcome_counts,
    window_keys,
)
from sessionize_assets.core.schema import REQUIRED_COLUMNS, TIMESTAMP_COLUMNS
from sessionize_assets_tests.plans import executed_nodes, metric

EVENTS_SCHEMA = T.StructType(
    [
        T.StructField(c, T.TimestampType() if c in TIMESTAMP_COLUMNS else T.StringType())
        for c in REQUIRED_COLUMNS
    ]
    + [
        T.StructField("load_date", T.DateType()),
        T.StructField("_load_id", T.StringType()),
        T.StructField("_source_file", T.StringType()),
        T.StructField("_row_hash", T.StringType()),
    ]
)


def ts(value: str) -> dt.datetime:
    return dt.datetime.fromisoformat(value).replace(tzinfo=dt.UTC)


def event(
    event_id: str,
    loaded: str,
    happened: str | None = None,
    *,
    user: str | None = "u1",
    name: str = "page_view",
    app: str = "web",
    collector: str | None = None,
    created: str | None = None,
    row_hash: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """One valid `events` row (timestamps as ISO strings, UTC)."""
    happened = happened or loaded
    row = {c: None for c in REQUIRED_COLUMNS}
    row.update(
        event_id=event_id,
        app_id=app,
        platform="web",
        event_name=name,
        domain_userid=user,
        domain_sessionid=f"s-{user}",
        page_url=f"https://example.com/{event_id}",
        derived_tstamp=ts(happened),
        collector_tstamp=ts(collector or happened),
        dvce_created_tstamp=ts(created or happened),
        dvce_sent_tstamp=ts(happened),
        load_tstamp=ts(loaded),
        load_date=ts(loaded).date(),
        _load_id="test",
        _source_file="test.csv",
        _row_hash=row_hash or f"{event_id}|{loaded}|{happened}|{user}|{name}",
    )
    row.update(extra)
    return row


def events_frame(spark: SparkSession, rows: Iterable[Mapping[str, Any]]) -> DataFrame:
    """A DataFrame with the columns of the `events` table (other keys: extra string columns)."""
    rows = list(rows)
    names = EVENTS_SCHEMA.fieldNames()
    extra = sorted({k for r in rows for k in r} - set(names))
    schema = T.StructType(EVENTS_SCHEMA.fields + [T.StructField(k, T.StringType()) for k in extra])
    return spark.createDataFrame([tuple(r.get(n) for n in [*names, *extra]) for r in rows], schema)


def outcomes(marked: DataFrame) -> dict[tuple[str, str], str]:
    """(event_id, row hash) -> outcome."""
    return {(r.event_id, r._row_hash): r[DROP_REASON] or "kept" for r in marked.collect()}


L = dt.date(2024, 3, 10)


def test_lookback_load_days() -> None:
    assert lookback_load_days(L, 3) == [
        dt.date(2024, 3, 7),
        dt.date(2024, 3, 8),
        dt.date(2024, 3, 9),
    ]
    assert lookback_load_days(L, 0) == []


def test_within_a_load_day_the_copy_loaded_first_wins_then_collector_then_created_then_hash(
    spark,
) -> None:
    rows = [
        # loaded first wins, even with a later collector_tstamp
        event("a", "2024-03-10T08:00:00", collector="2024-03-10T07:59:00", row_hash="a2"),
        event("a", "2024-03-10T07:00:00", collector="2024-03-10T07:59:30", row_hash="a1"),
        # same load time: earliest collector_tstamp
        event("b", "2024-03-10T08:00:00", collector="2024-03-10T07:00:00", row_hash="b1"),
        event("b", "2024-03-10T08:00:00", collector="2024-03-10T06:00:00", row_hash="b2"),
        # same load and collector: earliest dvce_created_tstamp
        event(
            "c",
            "2024-03-10T08:00:00",
            collector="2024-03-10T07:00:00",
            created="2024-03-10T06:59:00",
            row_hash="c1",
        ),
        event(
            "c",
            "2024-03-10T08:00:00",
            collector="2024-03-10T07:00:00",
            created="2024-03-10T06:58:00",
            row_hash="c2",
        ),
        # all equal: the smallest row hash
        event("d", "2024-03-10T08:00:00", collector="2024-03-10T07:00:00", row_hash="d2"),
        event("d", "2024-03-10T08:00:00", collector="2024-03-10T07:00:00", row_hash="d1"),
        event("d", "2024-03-10T08:00:00", collector="2024-03-10T07:00:00", row_hash="d3"),
    ]
    marked = mark_rows(events_frame(spark, rows), None, 3)
    got = outcomes(marked)
    winners = {k for k, v in got.items() if v == "kept"}
    assert winners == {("a", "a1"), ("b", "b2"), ("c", "c2"), ("d", "d1")}
    assert sum(v == DUPLICATE for v in got.values()) == 5


def test_against_earlier_load_days_within_the_lookback_any_raw_copy_wins(spark) -> None:
    earlier = [
        event("x", "2024-03-07T10:00:00"),  # 3 days before: within the lookback
        event("y", "2024-03-06T10:00:00"),  # 4 days before: outside
        event("z", "2024-03-09T10:00:00", app="other"),  # filtered out there, still loaded first
        event("w", "2024-03-11T10:00:00"),  # a later load day never wins
    ]
    today = [
        event("x", "2024-03-10T01:00:00"),
        event("y", "2024-03-10T01:00:00"),
        event("z", "2024-03-10T01:00:00"),
        event("w", "2024-03-10T01:00:00"),
    ]
    marked = mark_rows(
        events_frame(spark, today), events_frame(spark, earlier + today), 3, app_ids=["web"]
    )
    got = {k[0]: v for k, v in outcomes(marked).items()}
    assert got == {"x": DUPLICATE, "y": "kept", "z": DUPLICATE, "w": "kept"}
    # No lookback: only same-day copies are duplicates.
    assert {
        v
        for v in outcomes(
            mark_rows(events_frame(spark, today), events_frame(spark, earlier), 0)
        ).values()
    } == {"kept"}


def test_filters_and_exact_accounting(spark) -> None:
    rows = [
        event("k1", "2024-03-10T01:00:00", "2024-03-09T23:59:59.412"),  # late by a moment: kept
        event("k2", "2024-03-10T01:00:00", name="link_click"),
        event("k2", "2024-03-10T01:00:01", name="link_click"),  # duplicate (of a kept row)
        event("a1", "2024-03-10T01:00:00", app="mobile"),  # app filter
        event("a2", "2024-03-10T01:00:00", app=None),  # null app_id: not in the allow-list
        event("e1", "2024-03-10T01:00:00", name="page_ping"),  # event filter
        event("s1", "2024-03-10T01:00:00", "2024-02-29T12:00:00"),  # before start_date
        event("s1", "2024-03-10T02:00:00", "2024-02-29T12:00:00"),  # duplicate wins over the rules
    ]
    marked = mark_rows(
        events_frame(spark, rows),
        None,
        3,
        app_ids=["web"],
        event_names=["page_view", "link_click"],
        start_date=dt.date(2024, 3, 1),
    ).cache()
    out = outcome_counts(marked).collect()
    assert max(r.max_load_tstamp for r in out) == ts("2024-03-10T02:00:00").replace(tzinfo=None)
    counts = {r.outcome: r.rows for r in out}
    assert counts == {"kept": 2, DUPLICATE: 2, APP_FILTER: 2, EVENT_FILTER: 1, BEFORE_START_DATE: 1}
    acc = accounting(counts)
    assert (
        acc["rows_read"]
        == len(rows)
        == acc["rows_kept"] + sum(v for k, v in acc.items() if k.startswith("dropped_"))
    )
    assert acc["dropped_before_start_date"] == 1 and acc["dropped_app_filter"] == 2
    kept = {r.event_id: r.event_date for r in kept_rows(marked).collect()}
    assert kept == {"k1": dt.date(2024, 3, 9), "k2": dt.date(2024, 3, 10)}
    assert DROP_REASON not in kept_rows(marked).columns
    # Empty allow-lists keep everything; the accounting has zeros for unused rules.
    everything = mark_rows(events_frame(spark, rows), None, 3)
    loose = accounting({r.outcome: r.rows for r in outcome_counts(everything).collect()})
    assert (
        loose["rows_kept"] == 6
        and loose["dropped_app_filter"] == 0
        and loose["dropped_duplicate"] == 2
    )


def test_marking_several_load_days_at_once_equals_marking_them_one_by_one(spark) -> None:
    rows = [
        event("a", "2024-03-08T01:00:00"),
        event("a", "2024-03-09T01:00:00"),
        event("a", "2024-03-13T01:00:00"),  # 4 days after 03-09 with lookback 3: kept again
        event("b", "2024-03-09T05:00:00"),
        event("b", "2024-03-09T04:00:00"),
        event("c", "2024-03-12T04:00:00"),
        event("c", "2024-03-10T04:00:00"),
    ]
    frame = events_frame(spark, rows)
    together = outcomes(mark_rows(frame, frame, 3))
    one_by_one: dict = {}
    for day in sorted({r["load_date"] for r in rows}):
        todays = events_frame(spark, [r for r in rows if r["load_date"] == day])
        before = events_frame(
            spark, [r for r in rows if day - dt.timedelta(days=3) <= r["load_date"] < day]
        )
        one_by_one |= outcomes(mark_rows(todays, before, 3))
        # The step's way: one window of the day and its look-back days, keys read in one scan.
        window = events_frame(
            spark, [r for r in rows if day - dt.timedelta(days=3) <= r["load_date"] <= day]
        )
        care = ids_needing_a_decision(todays, before, 3, keys=window_keys(window, [day]))
        assert outcomes(mark_rows(todays, before, 3, care=care)) == outcomes(
            mark_rows(todays, before, 3)
        )
        # A small load day's ids narrow the earlier keys first: the same decisions.
        narrowed = ids_needing_a_decision(
            todays, before, 3, keys=window_keys(window, [day]), few_load_day_rows=True
        )
        assert sorted(map(tuple, narrowed.collect())) == sorted(map(tuple, care.collect()))
    assert together == one_by_one
    assert sorted(k[0] for k, v in together.items() if v == "kept") == ["a", "a", "b", "c"]


def test_load_days_reached_by_a_change(spark) -> None:
    later = events_frame(
        spark,
        [
            event("x", "2024-03-11T01:00:00"),
            event("x", "2024-03-14T01:00:00"),  # beyond the lookback of 03-10
            event("y", "2024-03-12T01:00:00"),
            event("q", "2024-03-13T01:00:00"),  # not a copy of anything in 03-10
            event("x", "2024-03-09T01:00:00"),  # earlier: never reached
        ],
    )
    changed = events_frame(
        spark, [event("x", "2024-03-10T01:00:00"), event("y", "2024-03-10T02:00:00")]
    )
    reached = sorted(r.load_date for r in load_days_reached(changed, later, 3).collect())
    assert reached == [dt.date(2024, 3, 11), dt.date(2024, 3, 12)]
    assert load_days_reached(changed, later, 0).count() == 0


def test_duplicate_event_ids_finds_copies_within_the_lookback(spark) -> None:
    base = [
        event("ok", "2024-03-01T01:00:00"),
        event("ok", "2024-03-05T01:00:00"),  # 4 days apart: allowed with lookback 3
        event("near", "2024-03-01T01:00:00"),
        event("near", "2024-03-04T01:00:00"),
        event("same", "2024-03-02T01:00:00"),
        event("same", "2024-03-02T02:00:00"),
        event("single", "2024-03-02T02:00:00"),
    ]
    frame = events_frame(spark, base)
    got = sorted(
        (r.event_id, r.load_date.day, r.other_load_date.day)
        for r in duplicate_event_ids(frame, 3).collect()
    )
    assert got == [("near", 1, 4), ("same", 2, 2)]


def test_duplicates_touching_a_run_are_those_with_a_copy_in_its_load_days(spark) -> None:
    frame = events_frame(
        spark,
        [
            event("before", "2024-03-01T01:00:00"),  # both copies before the run's load days
            event("before", "2024-03-02T01:00:00"),
            event("into", "2024-03-03T01:00:00"),  # one copy in the run, one in the lookback
            event("into", "2024-03-05T01:00:00"),
            event("after", "2024-03-06T01:00:00"),  # a later load day copies the run's row
            event("after", "2024-03-08T01:00:00"),
            event("far", "2024-03-01T01:00:00"),  # beyond the lookback: not a duplicate
            event("far", "2024-03-06T01:00:00"),
        ],
    )
    got = sorted(
        (r.event_id, r.load_date.day, r.other_load_date.day)
        for r in duplicate_event_ids_touching(
            frame, 2, dt.date(2024, 3, 5), dt.date(2024, 3, 6)
        ).collect()
    )
    assert got == [("after", 6, 8), ("into", 3, 5)]


def test_duplicate_copies_are_those_spark_finds_on_the_same_rows(spark) -> None:
    """The driver's duplicates check (plain Python) against the Spark one, on both tests' rows."""
    rows = [
        ("ok", 1), ("ok", 5), ("near", 1), ("near", 4), ("same", 2), ("same", 2), ("single", 2),
        ("three", 1), ("three", 2), ("three", 3), ("three", 3), ("far", 1), ("far", 6),
    ]  # fmt: skip
    frame = events_frame(spark, [event(i, f"2024-03-{d:02d}T01:00:00") for i, d in rows]).select(
        "event_id", "load_date"
    )
    as_days = [(i, dt.date(2024, 3, d)) for i, d in rows]
    for window in (None, (dt.date(2024, 3, 3), dt.date(2024, 3, 3))):
        spark_found = (
            duplicate_event_ids(frame, 3)
            if window is None
            else duplicate_event_ids_touching(frame, 3, *window)
        )
        expected = sorted(
            (r.event_id, r.load_date, r.other_load_date) for r in spark_found.collect()
        )
        assert duplicate_copies(as_days, 3, window) == expected
    assert duplicate_copies(as_days, 3, (dt.date(2024, 3, 3), dt.date(2024, 3, 3))) == [
        ("three", dt.date(2024, 3, 1), dt.date(2024, 3, 3)),
        ("three", dt.date(2024, 3, 2), dt.date(2024, 3, 3)),
        ("three", dt.date(2024, 3, 3), dt.date(2024, 3, 3)),
    ]
    # Null ids are never reported, as Spark's join on event_id matches no null.
    none = [(None, dt.date(2024, 3, 2))] * 2
    assert duplicate_copies([("x", dt.date(2024, 3, 1))] * 2 + none, 0) == [
        ("x", dt.date(2024, 3, 1), dt.date(2024, 3, 1))
    ]
    nulls = spark.createDataFrame(none, "event_id string, load_date date")
    assert duplicate_event_ids(nulls, 0).count() == 0


def reference_outcomes(
    rows: list[dict[str, Any]], lookback: int, app_ids: list[str]
) -> dict[tuple[str, str], str]:
    """The rules of this module's docstring in plain Python: (event_id, row hash) -> outcome."""
    out = {}
    for r in rows:
        day = r["load_date"]
        earlier = any(
            o["event_id"] == r["event_id"]
            and day - dt.timedelta(days=lookback) <= o["load_date"] < day
            for o in rows
        )
        same_day = [o for o in rows if o["load_date"] == day and o["event_id"] == r["event_id"]]
        first = min(same_day, key=lambda o: tuple(o[c] for c in DEDUPE_ORDER))
        if earlier or first is not r:
            out[(r["event_id"], r["_row_hash"])] = DUPLICATE
        elif r["app_id"] not in app_ids:
            out[(r["event_id"], r["_row_hash"])] = APP_FILTER
        else:
            out[(r["event_id"], r["_row_hash"])] = "kept"
    return out


def random_history(seed: int, n: int = 300) -> list[dict[str, Any]]:
    """Load days 03-01..03-06 with ~40% of event ids loaded more than once (same day or later)."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        eid = f"e{rng.randrange(int(n * 0.7))}"
        loaded = dt.datetime(2024, 3, 1 + rng.randrange(6), rng.randrange(3), rng.randrange(2))
        collector = loaded - dt.timedelta(minutes=rng.randrange(3))
        rows.append(
            event(
                eid,
                loaded.isoformat(),
                collector=collector.isoformat(),
                app=rng.choice(["web", "web", "web", "mobile"]),
                row_hash=f"h{i:04d}",
            )
        )
    return rows


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_marking_equals_the_rules_in_plain_python_on_random_histories(spark, seed: int) -> None:
    rows = random_history(seed)
    frame = events_frame(spark, rows)
    got = outcomes(mark_rows(frame, frame, 2, app_ids=["web"]))
    assert got == reference_outcomes(rows, 2, ["web"])
    assert sum(v == DUPLICATE for v in got.values()) > 50  # the history does exercise the rules


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_the_drivers_decisions_are_sparks_on_the_same_keys(spark, seed: int) -> None:
    """`decisions_needed` (plain Python, for the few keys of a small load day) against
    `ids_needing_a_decision` (Spark) on random keys: ids copied within a load day, held by
    earlier load days inside and outside the look-back, null ids, several processed days."""
    rng = random.Random(seed)
    lookback = rng.choice([0, 1, 2, 3])
    days = sorted(rng.sample(range(1, 9), rng.choice([1, 2, 3])))
    processed = [dt.date(2024, 3, d) for d in days]
    last = max(processed)
    keys = []
    for _ in range(400):
        day = dt.date(2024, 3, rng.randrange(1, 10))
        if day > last:
            continue  # after the last processed day: neither mine nor held (`window_keys`)
        event_id = rng.choice([None, *(f"e{i}" for i in range(60))])
        keys.append((day, event_id, int(day in processed), int(day < last)))
    frame = spark.createDataFrame(keys, "load_date date, event_id string, _mine int, _held int")
    mine = frame.filter("_mine = 1")
    for few in (False, True):
        expected = sorted(
            (r.event_id, r.load_date, r._seen_before)
            for r in ids_needing_a_decision(
                mine, frame, lookback, keys=frame, few_load_day_rows=few
            ).collect()
        )
        got = sorted((i, d, s) for d, i, s in decisions_needed(keys, lookback))
        assert got == expected, (seed, lookback, processed, few)
    decided = decisions_needed(keys, lookback)
    # The draws exercise both kinds of decision (a copy within the day; a copy held before).
    assert any(not s for _, _, s in decided) and (lookback == 0 or any(s for _, _, s in decided))


def shuffled_rows(df: DataFrame) -> list[tuple[int, int]]:
    """(columns, records written) of every shuffle of `df`'s executed plan (run it first)."""
    return [
        (node.output().size(), metric(node, "shuffleRecordsWritten"))
        for node in executed_nodes(df)
        if node.getClass().getSimpleName() == "ShuffleExchangeExec"
    ]


def test_only_rows_whose_event_id_needs_a_decision_are_shuffled_at_full_width(spark) -> None:
    # 1,000 rows; 50 ids copied twice within the day and 30 seen in an earlier load day.
    today = [event(f"t{i}", "2024-03-10T01:00:00", row_hash=f"a{i}") for i in range(1000)]
    today += [event(f"t{i}", "2024-03-10T02:00:00", row_hash=f"b{i}") for i in range(50)]
    earlier = [event(f"t{i}", "2024-03-09T01:00:00") for i in range(900, 930)]
    frame = events_frame(spark, today)
    marked = mark_rows(frame, events_frame(spark, earlier), 3)
    marked.write.format("noop").mode("overwrite").save()
    width = len(frame.columns)
    full_width = [records for columns, records in shuffled_rows(marked) if columns >= width]
    narrow = [records for columns, records in shuffled_rows(marked) if columns < width]
    # Only the copies of the 80 ids that need a decision: 50 * 2 + 30.
    assert sum(full_width) == 130
    # The keys are shuffled once: one narrow exchange, of every key of both inputs.
    assert narrow == [len(today) + len(earlier)]
    # Marking every load day against itself (a rebuild) shuffles each key once, not twice.
    both = events_frame(spark, today + earlier)
    rebuilt = mark_rows(both, both, 3)
    rebuilt.write.format("noop").mode("overwrite").save()
    assert [n for c, n in shuffled_rows(rebuilt) if c < width] == [len(today) + len(earlier)]


def test_counting_marked_rows_reads_only_the_columns_the_marking_uses(spark, tmp_path) -> None:
    # `filtered_events_step` no longer caches the marked rows at full width: the counts must read
    # only the columns the marking uses (the write reads every column).
    today = [event(f"t{i}", "2024-03-10T01:00:00", row_hash=f"a{i}") for i in range(200)]
    today += [event(f"t{i}", "2024-03-10T02:00:00", row_hash=f"b{i}") for i in range(20)]
    earlier = [event(f"t{i}", "2024-03-09T01:00:00") for i in range(150, 170)]
    path = str(tmp_path / "events")
    events_frame(spark, today + earlier).write.partitionBy("load_date").parquet(path)
    events = spark.read.parquet(path)
    rows = events.filter(events.load_date == L)
    earlier_rows = events.filter(events.load_date < L)
    care = ids_needing_a_decision(rows, earlier_rows, 3)
    marked = mark_rows(rows, earlier_rows, 3, app_ids=["web"], care=care)

    def scanned_columns(df: DataFrame) -> set[str]:
        scans = [
            n for n in executed_nodes(df) if n.getClass().getSimpleName() == "FileSourceScanExec"
        ]
        assert scans
        return {c for n in scans for c in n.requiredSchema().fieldNames()}

    counts = outcome_counts(marked)
    by_outcome = {(r.outcome, r.rows) for r in counts.collect()}
    # t0-t19 copied within the day (the later copy dropped), t150-t169 loaded the day before.
    assert by_outcome == {("kept", 180), (DUPLICATE, 40)}
    used = {"event_id", "derived_tstamp", "app_id", *DEDUPE_ORDER}
    assert scanned_columns(counts) <= used, scanned_columns(counts) - used
    written = kept_rows(marked)
    assert len(written.collect()) == 180
    assert "page_url" in scanned_columns(written)


LAYOUT_SCHEMA = (
    "load_date date, event_date date, user string, event_id string, derived_tstamp timestamp"
)


def layout_rows(seed: int, n: int) -> list[tuple[Any, ...]]:
    """(load_date, event_date, user, event_id, derived_tstamp): two load days, three event days,
    users with nulls, ties and characters beyond ASCII (Spark orders strings by UTF-8 bytes)."""
    rnd = random.Random(seed)
    users = [
        None,
        "",
        "a",
        "b",
        "ab",
        "B",
        "é",
        "z9",
        "ß",
        "日本",
        *(f"u{i:03}" for i in range(60)),
    ]
    return [
        (
            L + dt.timedelta(days=rnd.randrange(2)),
            L - dt.timedelta(days=rnd.randrange(3)),
            rnd.choice(users),
            f"e{i}",
            dt.datetime(2024, 3, 9, rnd.randrange(24), tzinfo=dt.UTC),
        )
        for i in range(n)
    ]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_layout_bounds_cut_the_sample_into_equal_runs(seed: int) -> None:
    from sessionize_assets.core.filtering import layout_bounds, task_of

    rnd = random.Random(seed)
    tasks = rnd.randrange(2, 12)
    distinct = [(L, f"u{i:04}") for i in rnd.sample(range(5000), rnd.randrange(1, 400))]
    bounds = layout_bounds(distinct, tasks)
    assert len(bounds) <= tasks - 1
    assert bounds == sorted(set(bounds))
    runs = [0] * tasks
    for key in distinct:
        runs[task_of(key, bounds)] += 1
    assert sum(runs) == len(distinct)
    assert max(runs) <= -(-len(distinct) // tasks), runs
    # Ties: a key that fills more than a run is not split; bounds stay distinct, nulls first.
    tied = [(L, None)] * 5 + [(L, "a")] * 50 + [(L, "b")] * 5
    assert layout_bounds(tied, 4) == [(L, "a")]
    assert [task_of(k, [(L, "a")]) for k in [(L, None), (L, "a"), (L, "b")]] == [0, 0, 1]
    assert layout_bounds([], 4) == []
    assert layout_bounds([(L, "x")], 4) == [(L, "x")]


def test_the_layouts_words_name_its_tasks_and_how_they_are_cut() -> None:
    from sessionize_assets.core.filtering import LAYOUT_SEARCH_BOUNDS, layout_of

    assert layout_of(0, 100) == layout_of(100, 100, sample_given=True) == "1 task"
    assert layout_of(101, 100) == "2 tasks, a sample's bounds searched"
    searched = (LAYOUT_SEARCH_BOUNDS + 1) * 100
    assert layout_of(searched, 100, sample_given=True) == (
        f"{LAYOUT_SEARCH_BOUNDS + 1} tasks, a sample's bounds searched (sample gathered by the counts)"
    )
    assert layout_of(searched + 1, 100, sample_given=True) == (
        f"{LAYOUT_SEARCH_BOUNDS + 2} tasks, Spark's range partitioning"
    )


def test_a_day_pair_orders_as_the_pair_nulls_first() -> None:
    from sessionize_assets.core.filtering import _ascending, day_pair

    rnd = random.Random(3)
    days = [
        None,
        dt.date(1, 1, 1),
        dt.date(1969, 12, 31),
        dt.date(1970, 1, 1),
        dt.date(9999, 12, 31),
    ]
    days += [L + dt.timedelta(days=rnd.randrange(-400, 400)) for _ in range(30)]
    pairs = [(a, b) for a in days for b in days]
    assert sorted(pairs, key=lambda p: day_pair(*p)) == sorted(pairs, key=_ascending)
    assert all(-(2**63) <= day_pair(a, b) < 2**63 for a, b in pairs)


def test_range_task_is_task_of_in_spark(spark) -> None:
    """The binary search of comparisons gives each row the task `task_of` gives it, null users,
    null days and ties included, for any number of bounds."""
    from pyspark.sql import functions as F

    from sessionize_assets.core.filtering import (
        day_pair_column,
        layout_bounds,
        range_task,
        task_of,
    )

    rows = layout_rows(7, 400) + [
        (None, L, "a", "no load day", None),
        (L, None, None, "no event day", None),
        (None, None, "b", "no days", None),
        (None, dt.date(1969, 12, 31), None, "no load day, 1969", None),
        (dt.date(9999, 12, 31), dt.date(1, 1, 1), "c", "extremes", None),
        (dt.date(1, 1, 1), dt.date(9999, 12, 31), "c", "extremes reversed", None),
    ]
    frame = spark.createDataFrame(rows, LAYOUT_SCHEMA).withColumn(
        "days", day_pair_column(F.col("load_date"), F.col("event_date"))
    )
    keys = [r[:3] for r in rows]
    for tasks in (2, 3, 8, 17, 40):
        bounds = layout_bounds(random.Random(tasks).sample(keys, 60), tasks)
        task = range_task(F.col("days"), F.col("user"), bounds).alias("task")
        got = frame.select("event_id", task).collect()
        expected = {r[3]: task_of(r[:3], bounds) for r in rows}
        assert {r.event_id: r.task for r in got} == expected
        assert len(set(expected.values())) > 1


@pytest.mark.parametrize("rows_per_file", [500, 250, 20])
def test_clustered_by_user_lays_out_contiguous_ranges_that_depend_only_on_the_rows(
    spark, rows_per_file: int
) -> None:
    """Each task holds one contiguous, sorted range of (load day, event day, user) of about
    rows / rows_per_file rows. Up to LAYOUT_SEARCH_BOUNDS + 1 tasks (8 and 16 here) the tasks
    come from the searched bounds, not Spark's range partitioning (a second read of every row
    for its sample), and the same rows in another order and partitioning get the same tasks;
    200 tasks, as a catch-up may have, are Spark's range partitioning's."""
    from pyspark.sql import functions as F

    from sessionize_assets.core.filtering import (
        LAYOUT_SEARCH_BOUNDS,
        _ascending,
        clustered_by_user,
    )

    rows = layout_rows(11, 4000)
    tasks = len(rows) // rows_per_file
    searched = tasks - 1 <= LAYOUT_SEARCH_BOUNDS
    frame = spark.createDataFrame(rows, LAYOUT_SCHEMA)
    shuffled = spark.createDataFrame(random.Random(5).sample(rows, len(rows)), LAYOUT_SCHEMA)

    def tasks_of(df: DataFrame) -> list[list[tuple[Any, ...]]]:
        clustered = clustered_by_user(df.repartition(7), F.col("user"), len(rows), rows_per_file)
        plan = clustered._jdf.queryExecution().executedPlan().toString()
        assert ("rangepartitioning" not in plan.lower()) == searched
        tagged = clustered.withColumn("_task", F.spark_partition_id()).collect()
        out: list[list[tuple[Any, ...]]] = [[] for _ in range(tasks)]
        for r in tagged:
            out[r._task].append(tuple(r)[:5])
        return out

    first = tasks_of(frame)
    assert sum(map(len, first)) == len(rows)
    keys = [[_ascending(r[:3]) + (r[4],) for r in task] for task in first]
    for task in keys:
        assert task == sorted(task)  # sorted within: user, then time
    filled = [task for task in keys if task]
    for before, after in zip(filled, filled[1:], strict=False):
        assert before[-1][:3] < after[0][:3]  # contiguous ranges, ascending, no key split
    # A sample's bounds: about rows_per_file rows each (the 70 users tie within a day pair).
    assert len(filled) >= tasks * 3 // 4 if searched else len(filled) >= 60
    assert max(map(len, first)) <= 2 * max(rows_per_file, 4000 // 70)
    if searched:
        second = tasks_of(shuffled)
        assert [sorted(t, key=lambda r: r[3]) for t in first] == [
            sorted(t, key=lambda r: r[3]) for t in second
        ]


def test_the_counts_query_gathers_the_layouts_sample_from_the_kept_rows_narrow(
    spark, tmp_path
) -> None:
    """`outcome_counts(..., layout=...)` gathers the picked kept rows' keys in the counts' own
    query, reading no more columns than the marking and the user key, in Spark's compiled hash
    aggregation; `clustered_by_user` given that sample lays the rows out as it does reading its
    own sample."""
    from pyspark.sql import functions as F

    from sessionize_assets.core.filtering import (
        clustered_by_user,
        layout_sample,
        picked_for_layout,
    )

    today = [
        event(f"t{i}", "2024-03-10T01:00:00", user=f"u{i % 37:02}", row_hash=f"a{i}")
        for i in range(3000)
    ]
    today += [event(f"t{i}", "2024-03-10T02:00:00", row_hash=f"b{i}") for i in range(40)]
    today += [event(f"x{i}", "2024-03-10T01:00:00", app="mobile") for i in range(30)]
    path = str(tmp_path / "events")
    events_frame(spark, today).write.partitionBy("load_date").parquet(path)
    rows = spark.read.parquet(path)
    marked = mark_rows(rows, None, 3, app_ids=["web"])
    user = F.col("domain_userid")
    counts = outcome_counts(marked, layout=(user, picked_for_layout(250)))
    got = counts.collect()
    totals: dict[str, int] = {}
    for r in got:  # split by the picked rows' keys: summed per outcome
        totals[r.outcome] = totals.get(r.outcome, 0) + r.rows
    assert totals == {"kept": 3000, DUPLICATE: 40, APP_FILTER: 30}
    assert len(got) > 3
    sample = layout_sample(got)
    kept = kept_rows(marked)
    own = kept.filter(picked_for_layout(250)).select("load_date", "event_date", user)
    assert sorted(sample) == sorted(tuple(r) for r in own.collect())
    assert 3000 * 100 / 250 * 0.8 < len(sample) < 3000 * 100 / 250 * 1.2  # about 100 a file
    scans = [
        n for n in executed_nodes(counts) if n.getClass().getSimpleName() == "FileSourceScanExec"
    ]
    read = {c for n in scans for c in n.requiredSchema().fieldNames()}
    assert read <= {"event_id", "derived_tstamp", "app_id", "domain_userid", *DEDUPE_ORDER}, read
    # Spark's compiled hash aggregation, not an object or sort aggregation (a collected list).
    aggregations = {
        n.getClass().getSimpleName()
        for n in executed_nodes(counts)
        if "Aggregate" in str(n.getClass())
    }
    assert aggregations == {"HashAggregateExec"}, aggregations

    def tasks_of(clustered: DataFrame) -> dict[str, int]:
        tagged = clustered.withColumn("_task", F.spark_partition_id()).collect()
        return {r.event_id: r._task for r in tagged}

    given = tasks_of(clustered_by_user(kept, user, 3000, 250, sample=sample))
    assert given == tasks_of(clustered_by_user(kept, user, 3000, 250))
    assert len(set(given.values())) >= 10
