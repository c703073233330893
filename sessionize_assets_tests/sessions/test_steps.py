"""Session steps in isolation, on real Delta tables."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from sessionize_assets.home import Home
from sessionize_assets.sessions import steps
from sessionize_assets_tests.sessions.support import event, make_settings, utc, write_load_days


def test_where_data_resumes_needs_no_query_when_the_log_bounds_every_timestamp(
    spark, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    settings = make_settings(start_date="2024-03-01")
    write_load_days(
        spark,
        home,
        {
            dt.date(2024, 3, 2): [
                event("2024-03-01T10:00:00", session="s1", loaded="2024-03-02T01:00:00"),
                event("2024-03-02T09:30:00", session="s2", loaded="2024-03-02T10:00:00"),
            ]
        },
    )
    resumes = lambda upper: steps.next_data_after(  # noqa: E731
        spark, Home(home).table, settings, utc(upper)
    )
    assert resumes("2024-03-01T00:00:00") == utc("2024-03-01T10:00:00")
    assert resumes("2024-03-01T12:00:00") == utc("2024-03-02T09:30:00")

    # At or after the newest timestamp the file statistics give, no Spark query is planned.
    def no_query(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        raise AssertionError("next_data_after read filtered_events")

    monkeypatch.setattr(steps, "read_pinned", no_query)
    assert resumes("2024-03-02T09:30:01") is None
    assert resumes("2024-03-05T00:00:00") is None
    with pytest.raises(AssertionError, match="read filtered_events"):
        resumes("2024-03-02T09:00:00")  # a row lies after it: the query decides


def _session(session_id: str, user: str | None, start: str, minutes: int, events: int) -> dict:
    begin = utc(start)
    return {
        "session_identifier": session_id,
        "user_identifier": user,
        "start_tstamp": begin,
        "end_tstamp": begin + dt.timedelta(minutes=minutes),
        "total_events": events,
        "page_views": events // 2,
        "duration_s": minutes * 60.0,
        "first_page_url": None,
        "last_page_url": None,
        "session_number": 1,
        "is_quarantined": False,
    }


def _user_model_home(spark, home: Path, model: str, stored_types: str | None = None) -> None:  # noqa: ANN001
    """`sessions` of u1-u3 (u4 has none left), and the model's stored rows: u1's as computed, u2's
    stale, u4's (to go), u3 without one; `stored_types` replaces the table's column types."""
    from pyspark.sql import functions as F

    from sessionize_assets.core import user_models
    from sessionize_assets.sessions.tables import SESSIONS_SCHEMA, USER_MODEL_SCHEMAS

    tables = Home(home)
    sessions = [
        _session("a", "u1", "2024-03-01T10:00:00", 5, 3),
        _session("b", "u1", "2024-03-02T10:00:00", 7, 4),
        _session("c", "u2", "2024-03-01T11:00:00", 1, 1),
        _session("d", "u2", "2024-03-03T11:00:00", 30, 9),
        _session("e", "u3", "2024-03-01T12:00:00", 0, 1),
        _session("f", "u9", "2024-03-01T12:00:00", 2, 2),  # not touched
    ]
    spark.createDataFrame(sessions, SESSIONS_SCHEMA).write.format("delta").save(
        tables.table("sessions")
    )
    computed = {r["user_identifier"]: r for r in user_models.user_rows(model, sessions)}
    stored = [
        computed["u1"],
        {**computed["u2"], "sessions": 1},
        {**computed["u1"], "user_identifier": "u4"},
        computed["u9"],
    ]
    frame = spark.createDataFrame(stored, USER_MODEL_SCHEMAS[model])
    if stored_types is not None:
        frame = frame.withColumn("sessions", F.col("sessions").cast(stored_types))
    frame.write.format("delta").save(tables.table(model))


@pytest.mark.parametrize("model", ["users", "user_session_stats"])
def test_a_user_model_on_the_driver_writes_what_spark_writes(spark, tmp_path: Path, model) -> None:  # noqa: ANN001
    import dataclasses

    from sessionize_assets.sessions.outcome import ModelOutcome
    from sessionize_assets_tests.sessions.support import rows_of, table

    results = {}
    for way in ("driver", "spark"):
        home = tmp_path / way
        _user_model_home(spark, home, model)
        users = spark.createDataFrame(
            [(u,) for u in ("u1", "u2", "u3", "u4")], "user_identifier string"
        )
        touched = steps.touched_users(spark, Home(home).table, users)
        assert touched.session_rows is not None  # the driver read the touched users' sessions
        if way == "spark":
            touched = dataclasses.replace(touched, session_rows=None)
        outcome = ModelOutcome(model=model)
        steps.process_user_model(spark, Home(home).table, model, touched, outcome)
        assert outcome.computed_by == way
        columns = spark.read.format("delta").load(Home(home).table(model)).columns
        results[way] = (
            rows_of(table(spark, home, model), *columns),
            outcome.rows_read,
            outcome.rows_written,
            outcome.touched,
        )
    assert results["driver"] == results["spark"]
    stored, read, written, touched_users = results["driver"]
    assert sorted(r[0] for r in stored) == ["u1", "u2", "u3", "u9"]  # u4 gone, u3 added
    assert written == {f"{model} rows written": 2, f"{model} rows deleted": 1}  # u2, u3; u4
    assert read == {"sessions of touched users": 5} and touched_users == 4


def test_a_user_model_of_other_stored_types_is_left_to_spark(spark, tmp_path: Path) -> None:
    from sessionize_assets.sessions.outcome import ModelOutcome
    from sessionize_assets_tests.sessions.support import rows_of, table

    home = tmp_path / "home"
    _user_model_home(spark, home, "users", stored_types="int")
    users = spark.createDataFrame(
        [(u,) for u in ("u1", "u2", "u3", "u4")], "user_identifier string"
    )
    touched = steps.touched_users(spark, Home(home).table, users)
    outcome = ModelOutcome(model="users")
    steps.process_user_model(spark, Home(home).table, "users", touched, outcome)
    assert outcome.computed_by == "spark"
    assert dict(table(spark, home, "users").dtypes)["sessions"] == "int"  # the table's own type
    assert rows_of(table(spark, home, "users"), "user_identifier", "sessions") == [
        ("u1", 2),
        ("u2", 2),
        ("u3", 1),
        ("u9", 1),
    ]


def _random_sessions(seed: int) -> tuple[list[dict], list[str], list[dict]]:
    """Stored sessions numbered per user, the ids a run replaces (one not stored), and the
    recomputed sessions: replaced ids unchanged or changed, new ids, stored ids the run did not
    list as replaced (a stopped run's), users moved, null users, equal starts."""
    import random

    rng = random.Random(seed)
    users = [*(f"u{k}" for k in range(6)), None]
    stored = []
    for i in range(rng.randint(0, 30)):
        start = f"2024-03-0{rng.randint(1, 4)}T{rng.choice(['01', '05', '09'])}:00:00"
        stored.append(_session(f"s{i:02}", rng.choice(users), start, rng.randint(0, 60), 2))
    per_user: dict = {}
    for row in sorted(stored, key=lambda r: (r["start_tstamp"], r["session_identifier"])):
        if row["user_identifier"] is not None:
            per_user[row["user_identifier"]] = per_user.get(row["user_identifier"], 0) + 1
            row["session_number"] = per_user[row["user_identifier"]]
        else:
            row["session_number"] = None
    replaced = [r["session_identifier"] for r in stored if rng.random() < 0.3] + ["s-gone"]
    new = []
    for row in stored:
        pick = rng.random()
        if row["session_identifier"] in replaced and pick < 0.4:
            new.append({**row})  # recomputed as it was
        elif row["session_identifier"] in replaced and pick < 0.6:
            new.append({**row, "user_identifier": rng.choice(users)})  # moved, maybe not
        elif row["session_identifier"] in replaced and pick < 0.8:
            new.append({**row, "total_events": 7})
        elif pick < 0.05:
            new.append({**row, "page_views": 99})  # written by a stopped run, not listed
    for i in range(rng.randint(0, 6)):
        start = f"2024-03-0{rng.randint(1, 4)}T05:00:00"
        new.append(_session(f"n{i}", rng.choice(users), start, rng.randint(0, 60), 1))
    for row in new:
        row["session_number"] = None
    return stored, replaced, new


@pytest.mark.parametrize("seed", range(8))
def test_replacing_sessions_on_the_driver_writes_what_spark_writes(
    spark, tmp_path: Path, seed: int
) -> None:
    import pyarrow as pa

    from sessionize_assets.core import renumbering
    from sessionize_assets.sessions.tables import SESSIONS_SCHEMA
    from sessionize_assets_tests.sessions.support import rows_of, table

    stored, replaced, new = _random_sessions(seed)
    columns = [c for c in renumbering.SESSION_COLUMNS]
    results = {}
    for way in ("driver", "spark"):
        home = tmp_path / way
        path = Home(home).table("sessions")
        spark.createDataFrame(stored, SESSIONS_SCHEMA).write.format("delta").save(path)
        new_frame = spark.createDataFrame(new, SESSIONS_SCHEMA)
        replaced_frame = spark.createDataFrame(
            [(i,) for i in replaced], "session_identifier string"
        )
        new_rows = pa.Table.from_pylist(new, schema=renumbering.sessions_schema())
        write = steps.replace_sessions(
            spark, path, new_frame, replaced_frame, new_rows if way == "driver" else None
        )
        results[way] = (
            rows_of(table(spark, home, "sessions"), *columns),
            rows_of(write.users, "user_identifier", "_from"),
            (write.written, write.fresh, write.content_changed, write.deleted, write.rows_read),
        )
        assert write.computed_by == way
    assert results["driver"] == results["spark"]
