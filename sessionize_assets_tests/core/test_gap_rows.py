"""gap mode's steps on the driver (`core.gap_rows`) against their Spark twins in `core.sessionize`
on random rows: the same rows, value for value (timestamps to the microsecond, doubles bit for
bit)."""

from __future__ import annotations

import datetime as dt
import random

import pytest
from pyspark.sql import functions as F
from pyspark.sql import types as T

from sessionize_assets.core import gap_rows
from sessionize_assets.core import sessionize as core
from sessionize_assets.core.schema import ROW_HASH
from sessionize_assets_tests.sessions.support import PREPARED_WITH_PART, make_settings

BASE = dt.datetime(2024, 3, 1, tzinfo=dt.UTC)
MINUTE = 60_000_000
SETTINGS = dict(
    start_date="2024-02-28",
    session_mode="gap",
    session_gap_minutes=30,
    max_session_days=1,
    days_late_allowed=1,
    user_identifier=["user_id", "domain_userid"],
    session_identifier=["domain_sessionid"],
    session_timestamp="collector_tstamp",
)

RAW = T.StructType(
    [
        T.StructField("event_id", T.StringType()),
        T.StructField("event_name", T.StringType()),
        T.StructField("page_url", T.StringType()),
        T.StructField("derived_tstamp", T.TimestampType()),
        T.StructField("dvce_created_tstamp", T.TimestampType()),
        T.StructField("dvce_sent_tstamp", T.TimestampType()),
        T.StructField("load_tstamp", T.TimestampType()),
        T.StructField("collector_tstamp", T.TimestampType()),
        T.StructField("domain_sessionid", T.StringType()),
        T.StructField("user_id", T.StringType()),
        T.StructField("domain_userid", T.StringType()),
        T.StructField(ROW_HASH, T.StringType()),
    ]
)


def _at(offset_micros: int) -> dt.datetime:
    return BASE + dt.timedelta(microseconds=offset_micros)


def _raw_rows(seed: int, n: int | None = None) -> list[dict]:
    """filtered_events rows of a few users over two days: gaps at and around 30 minutes, chains
    longer than a day, duplicates of (user, event id, time) with other columns, empty and null
    identifiers, events before start_date or sent late, null session timestamps and pages."""
    rng = random.Random(seed)
    rows: list[dict] = []
    users = [f"u{k}" for k in range(6)]
    if seed % 3 != 2:  # a bot: an event every 25 minutes for 30 hours, cut at midnight
        start = rng.randint(-5 * 60, 5 * 60) * MINUTE
        for i in range(72):
            t = _at(start + i * 25 * MINUTE)
            rows.append(
                {
                    "event_id": f"bot{i}",
                    "event_name": "page_view",
                    "page_url": "/bot",
                    "derived_tstamp": t,
                    "dvce_created_tstamp": t,
                    "dvce_sent_tstamp": t,
                    "load_tstamp": t,
                    "collector_tstamp": t,
                    "domain_sessionid": "sbot",
                    "user_id": None,
                    "domain_userid": "bot",
                    ROW_HASH: None,
                }
            )
    for _ in range(n if n is not None else rng.randint(0, 120)):
        if rows and rng.random() < 0.15:  # a copy of an earlier row, some columns changed
            copy = dict(rng.choice(rows))
            copy["collector_tstamp"] = rng.choice([None, _at(rng.randint(0, 10**9))])
            copy["page_url"] = rng.choice([None, "/a", "/b"])
            copy[ROW_HASH] = rng.choice([None, f"h{rng.randint(0, 3)}"])
            rows.append(copy)
            continue
        step = rng.choice([30 * MINUTE, 30 * MINUTE + 1, 29 * MINUTE, 5 * MINUTE, 3 * 3600 * 10**6])
        base = (
            rng.choice(rows)["derived_tstamp"]
            if rows and rng.random() < 0.6
            else _at(rng.randint(-10 * 3600 * 10**6, 40 * 3600 * 10**6))
        )
        t = base + dt.timedelta(microseconds=rng.choice([step, -step, rng.randint(0, step)]))
        created = t - dt.timedelta(microseconds=rng.randint(0, 10**8))
        late = rng.random() < 0.05
        rows.append(
            {
                "event_id": f"e{rng.randint(0, 80)}",
                "event_name": rng.choice(["page_view", "page_ping", None, "link_click"]),
                "page_url": rng.choice([None, "/", "/x", "/y?q=1"]),
                "derived_tstamp": t,
                "dvce_created_tstamp": rng.choice([created, None]),
                "dvce_sent_tstamp": created + dt.timedelta(days=2) if late else created,
                "load_tstamp": t + dt.timedelta(minutes=5),
                "collector_tstamp": None if rng.random() < 0.1 else t,
                "domain_sessionid": rng.choice(["s1", "s2", None, ""]),
                "user_id": rng.choice([None, "", *users[:2]]),
                "domain_userid": rng.choice([*users, None, ""]),
                ROW_HASH: rng.choice([None, f"h{rng.randint(0, 3)}"]),
            }
        )
    return rows


def _spark_prepared(spark, rows, settings):  # noqa: ANN001, ANN202
    frame = spark.createDataFrame(rows, RAW)
    return core.with_reason(core.prepare_events(frame, settings), settings)


def _in_micros(row: dict) -> dict:
    """A Spark row with its timestamp columns as microseconds (the driver's internal unit)."""
    return {k: gap_rows.micros(v) if isinstance(v, dt.datetime) else v for k, v in row.items()}


def _key(row: dict) -> tuple:
    return tuple((k, v is None, str(v)) for k, v in sorted(row.items()))


def _same(got: list[dict], expected: list[dict]) -> None:
    assert sorted(got, key=_key) == sorted(expected, key=_key)


@pytest.mark.parametrize("seed", range(4))
def test_prepared_rows_and_their_reasons_are_sparks(spark, seed) -> None:
    settings = make_settings(**SETTINGS)
    rows = _raw_rows(seed)
    expected = [_in_micros(r) for r in _spark_prepared(spark, rows, settings).toArrow().to_pylist()]
    got = gap_rows.with_reason(gap_rows.prepare(rows, settings), settings)
    _same(got, expected)
    assert any(r[core.REASON] for r in got) or not rows


def _usable(spark, seed, settings, parts: bool = False):  # noqa: ANN001, ANN202
    """Usable prepared rows (driver rows and the Spark frame), PART drawn per user when asked."""
    rng = random.Random(seed + 1000)
    prepared = [
        r
        for r in gap_rows.with_reason(gap_rows.prepare(_raw_rows(seed), settings), settings)
        if r[core.REASON] is None
    ]
    # PART as the incremental read draws it: one user's parts are separate spans of time
    # (`core.gap_change_ranges` merges read ranges that overlap), here cut at a drawn time.
    times = sorted({r["derived_tstamp"] for r in prepared})
    cuts = {r[core.USER_KEY]: rng.choice(times) for r in prepared} if times else {}
    for r in prepared:
        r.pop(core.REASON)
        if parts:
            r[core.PART] = 1 if r["derived_tstamp"] < cuts[r[core.USER_KEY]] else 2
    frame = (
        _spark_prepared(spark, _raw_rows(seed), settings)
        .filter(F.col(core.REASON).isNull())
        .drop(core.REASON)
    )
    if parts:
        # the same PART per row: join the drawn parts back on every prepared column
        keyed = [
            {**{k: gap_rows.from_micros(v) if k in _TIMES else v for k, v in r.items()}}
            for r in prepared
        ]
        frame = spark.createDataFrame(keyed, PREPARED_WITH_PART)
    return prepared, frame


_TIMES = {"derived_tstamp", "dvce_created_tstamp", core.SESSION_TS}


@pytest.mark.parametrize("parts", [False, True])
@pytest.mark.parametrize("seed", range(5))
def test_gap_sessions_and_their_duplicates_are_sparks(spark, seed, parts) -> None:
    settings = make_settings(**SETTINGS)
    prepared, frame = _usable(spark, seed, settings, parts)
    assert gap_rows.handles(prepared)
    result = core.sessionize_by_gap(frame, settings)
    sessions, dupes = gap_rows.sessionize_by_gap(prepared, settings)
    expected = result.sessions.toArrow().to_pylist()
    _same(sessions, expected)
    _same(dupes, [_in_micros(r) for r in result.excluded.toArrow().to_pylist()])
    if seed == 0 and not parts:  # the draws hold quarantined pieces and duplicates
        assert any(s["is_quarantined"] for s in sessions) and dupes


def _lifecycle(seed: int) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for i in range(rng.randint(0, 40)):
        start = _at(rng.randint(0, 48 * 60) * MINUTE + rng.choice([0, 1]))
        rows.append(
            {
                "session_identifier": f"s{i}",
                "user_identifier": rng.choice(["u0", "u1", "u2", None]),
                "start_tstamp": start,
                "end_tstamp": start + dt.timedelta(minutes=rng.choice([0, 10, 29, 30, 31, 200])),
                "is_quarantined": rng.random() < 0.1,
            }
        )
    return rows


LIFECYCLE = (
    "session_identifier string, user_identifier string, start_tstamp timestamp, "
    "end_tstamp timestamp, is_quarantined boolean"
)


@pytest.mark.parametrize("seed", range(5))
def test_chains_and_change_ranges_are_sparks(spark, seed) -> None:
    settings = make_settings(**SETTINGS)
    lifecycle = _lifecycle(seed)
    chains_frame = core.gap_chains(spark.createDataFrame(lifecycle, LIFECYCLE), settings)
    chains = gap_rows.gap_chains(lifecycle, settings)
    _same(chains, chains_frame.toArrow().to_pylist())
    prepared, frame = _usable(spark, seed, settings)
    for given, given_frame in ((None, None), (chains, chains_frame)):
        expected = core.gap_change_ranges(frame, settings, given_frame).toArrow().to_pylist()
        got = gap_rows.gap_change_ranges(prepared, settings, given)
        _same(got, expected)
    ranges = gap_rows.gap_change_ranges(prepared, settings, chains)
    if ranges:  # the rows a lifecycle and computed sessions keep of them
        ranges_frame = spark.createDataFrame(ranges).withColumnRenamed(
            core.USER_KEY, "user_identifier"
        )
        expected = core.overlapping(
            spark.createDataFrame(lifecycle, LIFECYCLE), ranges_frame, on=["user_identifier"]
        )
        got = gap_rows.overlapping(
            lifecycle, ranges, ["user_identifier"], {"user_identifier": core.USER_KEY}
        )
        _same(got, expected.toArrow().to_pylist())


@pytest.mark.parametrize("seed", range(5))
def test_the_gap_read_and_the_superseded_ids_are_sparks(spark, seed) -> None:
    settings = make_settings(**SETTINGS)
    prepared, frame = _usable(spark, seed, settings)
    lifecycle = _lifecycle(seed)
    ranges = gap_rows.gap_change_ranges(prepared[: len(prepared) // 2], settings)
    upper = _at(30 * 3600 * 10**6)
    if ranges:
        ranges_frame = spark.createDataFrame(ranges)
        expected = (
            frame.join(ranges_frame, core.USER_KEY, "inner")
            .filter(F.col("derived_tstamp").between(F.col("_read_lo"), F.col("_read_hi")))
            .filter(F.col(core.SESSION_TS) <= F.lit(upper))
            .select(*core.PREPARED_COLUMNS, core.PART)
        )
        got = gap_rows.in_read_range(prepared, ranges, upper)
        _same(got, [_in_micros(r) for r in expected.toArrow().to_pylist()])
    sessions, _ = gap_rows.sessionize_by_gap(prepared, settings)
    new = [{k: s[k] for k in core.LIFECYCLE_COLUMNS} for s in sessions]
    # old: the lifecycle rows, some sessions recomputed unchanged (kept), one row given twice
    old = lifecycle + new[: len(new) // 3] + lifecycle[:1]
    expected = core.superseded(
        spark.createDataFrame(old, LIFECYCLE).select(
            "session_identifier", "user_identifier", "start_tstamp", "end_tstamp"
        ),
        spark.createDataFrame(new, LIFECYCLE),
    )
    got = gap_rows.superseded(old, new)
    _same(got, expected.toArrow().to_pylist())
