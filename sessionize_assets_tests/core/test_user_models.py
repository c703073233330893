"""The user-level models on the driver (`core.user_models`) against Spark's computation of the same
rows (`core.sessionize.users_from_sessions`, `user_session_stats_from_sessions`) and the MERGE
source against `sessions.frames.without_unchanged`: the same values, bit for bit."""

from __future__ import annotations

import datetime as dt
import random

import pyarrow as pa
import pytest
from pyspark.sql import functions as F

from sessionize_assets.core import sessionize as core
from sessionize_assets.core import user_models
from sessionize_assets.resources.delta import same_types
from sessionize_assets.sessions.frames import without_unchanged
from sessionize_assets.sessions.tables import SESSIONS_SCHEMA, USER_MODEL_SCHEMAS

BASE = dt.datetime(2024, 3, 1, tzinfo=dt.UTC)


def _sessions(seed: int) -> list[dict]:
    """Session rows of a few users: null users, null counts and times, equal durations, odd and
    even numbers of sessions per user, durations of sub-microsecond-exact fractions."""
    rng = random.Random(seed)
    rows = []
    for i in range(rng.randint(0, 60)):
        start = BASE + dt.timedelta(microseconds=rng.randint(0, 10**12))
        length = rng.choice([0, 1, 999_999, 1_000_001, rng.randint(0, 4 * 10**9)])
        rows.append(
            {
                "session_identifier": f"s{i}",
                "user_identifier": rng.choice([*(f"u{k}" for k in range(15)), None]),
                "start_tstamp": None if rng.random() < 0.05 else start,
                "end_tstamp": start + dt.timedelta(microseconds=length),
                "total_events": None if rng.random() < 0.05 else rng.randint(1, 50),
                "page_views": rng.randint(0, 5),
                "duration_s": length / 1e6,
                "first_page_url": None,
                "last_page_url": None,
                "session_number": 1,
                "is_quarantined": False,
            }
        )
    return rows


def _spark_rows(frame) -> list[dict]:  # noqa: ANN001
    return sorted(frame.toArrow().to_pylist(), key=lambda r: r["user_identifier"])


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("model", [user_models.USERS, user_models.USER_SESSION_STATS])
def test_the_drivers_user_rows_are_sparks(spark, model, seed) -> None:
    rows = _sessions(seed)
    sessions = spark.createDataFrame(rows, SESSIONS_SCHEMA)
    compute = (
        core.users_from_sessions
        if model == user_models.USERS
        else core.user_session_stats_from_sessions
    )
    expected = compute(sessions)
    columns = user_models.MODEL_COLUMNS[model]
    assert tuple(expected.columns) == columns
    got = user_models.user_rows(model, rows)
    assert sorted(got, key=lambda r: r["user_identifier"]) == _spark_rows(expected)
    # In Spark's types: the source schema is the table's, then `_delete`.
    schema = user_models.source_schema(model)
    assert same_types(pa.schema(list(schema)[:-1]), expected.toArrow().schema)


def test_a_median_interpolates_between_the_middle_durations(spark) -> None:
    ends = [1_000_000, 4_000_000, 2_000_001, 9_000_000]  # sorted: 1, 2.000001, 4, 9 s
    rows = [
        {
            "session_identifier": f"s{i}",
            "user_identifier": "u",
            "start_tstamp": BASE,
            "end_tstamp": BASE + dt.timedelta(microseconds=micros),
            "total_events": 1,
            "page_views": 0,
            "duration_s": micros / 1e6,
            "first_page_url": None,
            "last_page_url": None,
            "session_number": i + 1,
            "is_quarantined": False,
        }
        for i, micros in enumerate(ends)
    ]
    got = user_models.user_rows(user_models.USER_SESSION_STATS, rows)
    assert got[0]["median_duration_s"] == 3.0000005
    expected = core.user_session_stats_from_sessions(spark.createDataFrame(rows, SESSIONS_SCHEMA))
    assert got == _spark_rows(expected)


@pytest.mark.parametrize("seed", range(6))
def test_the_drivers_merge_source_is_without_unchangeds(spark, seed) -> None:
    rng = random.Random(seed)
    model = [user_models.USERS, user_models.USER_SESSION_STATS][seed % 2]
    columns = list(user_models.MODEL_COLUMNS[model])
    rows = user_models.user_rows(model, _sessions(seed))
    # Stored rows: some equal, some differing in one column, some users not stored, some stored
    # users without a row now (gone), one stored user not among the touched ones.
    stored = []
    for row in rows:
        pick = rng.random()
        if pick < 0.4:
            stored.append(dict(row))
        elif pick < 0.8:
            column = rng.choice(columns[1:])
            stored.append({**row, column: None if row[column] is not None else row["sessions"]})
    for user in ("gone1", "gone2"):
        stored.append({c: (user if c == "user_identifier" else None) for c in columns})
    touched = [r["user_identifier"] for r in rows] + ["gone1", "never-stored"]
    changed, source_rows = user_models.changed_rows(rows, touched, stored, columns)

    schema = user_models.source_schema(model)
    table_schema = USER_MODEL_SCHEMAS[model]
    gone = sorted(set(touched) - {r["user_identifier"] for r in rows})
    source = spark.createDataFrame(
        pa.Table.from_pylist(
            [{**r, "_delete": False} for r in rows]
            + [{**{c: None for c in columns}, "user_identifier": u, "_delete": True} for u in gone],
            schema=schema,
        )
    )
    expected = without_unchanged(
        source,
        spark.createDataFrame(stored, table_schema).filter(F.col("user_identifier").isin(touched)),
        "user_identifier",
        columns,
    )
    assert source_rows == source.count()
    key = lambda r: (r["user_identifier"], r["_delete"])  # noqa: E731
    assert sorted(changed, key=key) == sorted(expected.toArrow().to_pylist(), key=key)
    assert pa.Table.from_pylist(changed, schema=schema).num_rows == len(changed)


def test_a_model_that_is_not_a_user_model_is_refused() -> None:
    with pytest.raises(ValueError, match="sessions"):
        user_models.user_rows("sessions", [])
