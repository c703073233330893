"""Which users a forget request names and how their rows are found (no Spark)."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pytest
from pyspark.sql import functions as F

from sessionize_assets.core.forget import (
    FORGET_LOG_SCHEMA,
    ForgetRecord,
    ForgetRequestError,
    holds_user,
    identifier_condition,
    load_days_to_redo,
    raw_condition,
    requested_users,
)


def test_requested_users_come_from_arguments_and_a_file_sorted_each_once():
    text = "# ticket 42\nu2\n\n  u1  \nu3\n"
    assert requested_users(["u3", " u9"], text) == ["u1", "u2", "u3", "u9"]
    assert requested_users([], "u1\n") == ["u1"]


@pytest.mark.parametrize(
    ("arguments", "text", "message"),
    [
        ([], None, "at least one user id"),
        ([], "# only a comment\n", "at least one"),
        ([" "], None, "empty user id"),
    ],
)
def test_a_request_without_a_usable_id_is_one_sentence(arguments, text, message):
    with pytest.raises(ForgetRequestError, match=message):
        requested_users(arguments, text)


def test_an_id_is_found_in_raw_text_only_as_a_whole_field():
    user = "b0c11fde-cb91"
    csv_line = f'shop,web,2024-03-01 23:13:27.286,,"{user}",1,https://shop.example.com/p/{user}2'
    assert holds_user(csv_line, [user])  # a quoted CSV field
    assert holds_user(f"shop,web,,{user},1,x", [user])  # a bare CSV field
    assert holds_user(f'{{"app_id":"shop","domain_userid":"{user}","event":"page_view"}}', [user])
    assert holds_user(user, [user])
    assert not holds_user(f"shop,{user}-2,x", [user])  # inside a longer id
    assert not holds_user(f"shop,x{user},x", [user])
    assert not holds_user("shop,https://shop.example.com/item/42/reviews,x", ["42"])  # a URL
    assert not holds_user('{"page_url":"https://x.example/?u=42"}', ["42"])
    assert holds_user("a,u.1,b", ["u.1"]) and not holds_user("a,ux1,b", ["u.1"])  # `.` is literal
    assert holds_user("a,o'brien,b", ["o'brien"])


def test_conditions_quote_ids_as_sql_literals(spark):
    users = ["o'brien", "back\\slash", "plain"]
    frame = spark.createDataFrame(
        [(u, f'{{"app_id":"shop","domain_userid":"{u}"}}') for u in [*users, "other"]],
        "domain_userid string, raw string",
    )
    frame = frame.withColumn(
        "raw",
        F.when(F.col("raw").contains("back"), F.lit("x,back\\slash,y")).otherwise(F.col("raw")),
    )
    found = frame.filter(identifier_condition(["domain_userid"], users)).collect()
    assert sorted(r.domain_userid for r in found) == sorted(users)
    in_raw = frame.filter(raw_condition("raw", users)).collect()
    assert sorted(r.domain_userid for r in in_raw) == sorted(users)


def test_load_days_to_redo_are_the_processed_days_that_held_rows():
    d = dt.date(2024, 3, 1)
    events = {d: 3, d + dt.timedelta(days=1): 0, d - dt.timedelta(days=1): 2}
    filtered = {d + dt.timedelta(days=2): 1, d + dt.timedelta(days=9): 4}
    today = d + dt.timedelta(days=5)
    assert load_days_to_redo([events, filtered], d, today) == [d, d + dt.timedelta(days=2)]


def test_the_record_is_a_row_of_the_log_schema_holding_counts():
    record = ForgetRecord(
        request_id="r1",
        requested_at=dt.datetime(2024, 3, 3, tzinfo=dt.UTC),
        requested_by="ops",
        reason="ticket 42",
        users=2,
        rows_deleted={"events": 5, "sessions_lifecycle_manifest": 1},
        load_days_redone=(dt.date(2024, 3, 1),),
    )
    table = pa.Table.from_pylist([record.row()], schema=FORGET_LOG_SCHEMA)
    assert table.column_names == FORGET_LOG_SCHEMA.names
    assert table.column("rows_deleted").to_pylist() == [
        [("events", 5), ("sessions_lifecycle_manifest", 1)]
    ]
