"""sessions/modes.py: the read spans of driver-local ranges are Spark's."""

from __future__ import annotations

import datetime as dt
import random

import pyarrow as pa
import pytest

from sessionize_assets.core import read_spans
from sessionize_assets.resources.spark import arrow_frame
from sessionize_assets.sessions.modes import _read_spans, span_groups

UTC = dt.UTC
RANGES = pa.schema(
    [
        ("_user_key", pa.string()),
        ("_read_lo", pa.timestamp("us", tz="UTC")),
        ("_read_hi", pa.timestamp("us", tz="UTC")),
        ("_is_known", pa.bool_()),
    ]
)


RANGES_DDL = "_user_key string, _read_lo timestamp, _read_hi timestamp, _is_known boolean"


def _ranges(seed: int) -> pa.Table:
    """Read ranges as the modes compute them: most within an hour or two of today, some late
    ones days back, a crowded hour of more users than a span names, ends on whole hours and
    null ends."""
    rng = random.Random(seed)
    today = dt.datetime(2024, 3, 10, tzinfo=UTC)
    rows = []
    for i in range(rng.randint(0, 60)):
        lo = today - dt.timedelta(days=rng.choice([0, 0, 0, 1, 3, 12]), minutes=rng.randint(0, 600))
        if rng.random() < 0.1:
            lo = lo.replace(minute=0, second=0, microsecond=0)  # on a whole hour
        hi = lo + dt.timedelta(minutes=rng.choice([0, 30, 59, 60, 200, 2000]))
        rows.append(
            {
                "_user_key": rng.choice([f"u{i % 17}", f"u{rng.randint(0, 5)}", None]),
                "_read_lo": None if rng.random() < 0.05 else lo,
                "_read_hi": None if rng.random() < 0.05 else hi,
                "_is_known": rng.choice([True, False, None]),
            }
        )
    if seed % 2:  # one hour pair of more users than MAX_USERS_PER_SPAN + 1
        crowded = today + dt.timedelta(hours=5, minutes=7)
        rows += [
            {
                "_user_key": f"c{j:03d}",
                "_read_lo": crowded,
                "_read_hi": crowded + dt.timedelta(minutes=20),
                "_is_known": j % 3 == 0,
            }
            for j in range(read_spans.MAX_USERS_PER_SPAN + 40)
        ]
    return pa.Table.from_pylist(rows, schema=RANGES)


@pytest.mark.parametrize("seed", range(6))
def test_the_spans_of_driver_local_ranges_are_those_spark_computes(spark, seed) -> None:
    table = _ranges(seed)
    frame = arrow_frame(spark, table, schema=RANGES_DDL)
    for users in ("_user_key", None):
        by_spark = _read_spans(frame, ["_is_known"], users=users)
        by_driver = _read_spans(frame, ["_is_known"], users=users, table=table)
        assert by_driver == by_spark, (seed, users)


def test_span_groups_are_whole_hours_with_sorted_users_and_sums() -> None:
    at = dt.datetime(2024, 3, 10, 9, 0, tzinfo=UTC)
    table = pa.Table.from_pylist(
        [
            {"_user_key": "b", "_read_lo": at, "_read_hi": at, "_is_known": True},
            {
                "_user_key": "a",
                "_read_lo": at + dt.timedelta(minutes=59),
                "_read_hi": at + dt.timedelta(minutes=30),
                "_is_known": None,
            },
            {"_user_key": "c", "_read_lo": None, "_read_hi": at, "_is_known": True},
        ],
        schema=RANGES,
    )
    hour = read_spans.MICROS_PER_HOUR
    start = int(at.timestamp()) * 1_000_000
    # an end on a whole hour reaches the next one, as Spark's floor(hi / hour) + 1
    assert span_groups(table, ["_is_known"], "_user_key") == [(start, start + hour, ["a", "b"], 1)]
    assert span_groups(table) == [(start, start + hour, None)]
