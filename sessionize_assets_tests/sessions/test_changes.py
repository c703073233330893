"""The change set's counts (`sessions/changes.py`): the driver's, from the rows it holds
(`change_stats`), are Spark's (`_spark_stats`) on the same rows."""

from __future__ import annotations

import datetime as dt
import random

import pyarrow as pa

from sessionize_assets.core import sessionize as core
from sessionize_assets.sessions.changes import (
    CHANGE_DDL,
    CHANGE_SCHEMA,
    _spark_stats,
    change_stats,
)
from sessionize_assets.sessions.frames import reasons_from

START = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)


def _rows(rng: random.Random, n: int) -> list[dict]:
    reasons = [None, None, None, *core.EXCLUSION_RULES, "not a rule"]
    rows = []
    for i in range(n):
        stamp = START + dt.timedelta(seconds=rng.randrange(0, 86_400 * 3), microseconds=i)
        rows.append(
            {
                "event_id": f"e{i}",
                "event_name": "page_view",
                "page_url": None,
                "derived_tstamp": stamp,
                "dvce_created_tstamp": stamp,
                core.SESSION_KEY: f"s{i % 5}",
                core.USER_KEY: f"u{i % 3}",
                core.SESSION_TS: rng.choice([stamp, stamp, None]),
                core.SENT_LATE: False,
                "_sign": rng.choice([1, 1, 0, -1, None]),
                "_window": rng.choice([0, 1, None]),
                "_feed": rng.choice([0, 1, 2, None]),
                core.REASON: rng.choice(reasons),
            }
        )
    return rows


def test_the_drivers_change_counts_are_sparks(spark) -> None:
    rng = random.Random(7)
    for n in (0, 1, 3, 40, 200):
        rows = _rows(rng, n)
        table = pa.Table.from_pylist(rows, schema=CHANGE_SCHEMA)
        theirs = _spark_stats(spark.createDataFrame(rows, CHANGE_DDL))
        ours = change_stats(table)
        for key in ("window", "feed", "processed", "min_usable"):
            assert ours[key] == theirs[key], (n, key, ours[key], theirs[key])
        assert reasons_from(ours) == reasons_from(theirs), n
        assert n < 40 or reasons_from(ours), "no rule was counted"
