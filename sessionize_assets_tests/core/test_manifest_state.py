"""Item states derived from records alone: every legal and illegal sequence of seed 003."""

from __future__ import annotations

import datetime as dt
import itertools

import pytest

from sessionize_assets.core.manifest_state import (
    ItemStatus,
    Record,
    RecordState,
    derive_item_state,
    derive_item_states,
    format_age,
)

T0 = dt.datetime(2024, 3, 1, 12, 0, tzinfo=dt.UTC)
ITEM = "filtered_events/2024-03-01"


class Log:
    """Builds an item's records one after the other, one minute apart."""

    def __init__(self, item: str = ITEM) -> None:
        self.item = item
        self.records: list[Record] = []
        self._ids = itertools.count(1)

    def add(
        self,
        state: RecordState,
        previous: Record | str | None = None,
        run_id: str = "run-1",
        payload: dict | str | None = None,
    ) -> Record:
        previous_id = previous.record_id if isinstance(previous, Record) else previous
        record = Record(
            record_id=f"r{next(self._ids)}",
            item_id=self.item,
            application="filtered_events",
            state=state,
            run_id=run_id,
            previous_record_id=previous_id,
            payload=payload,
            time=T0 + dt.timedelta(minutes=len(self.records)),
        )
        self.records.append(record)
        return record

    def state(self, now: dt.datetime | None = None):
        return derive_item_state(self.records, now=now, item_id=self.item)


P = RecordState


# ----------------------------------------------------------------------------- legal sequences


def test_no_records_is_free():
    state = Log().state()
    assert state.status is ItemStatus.FREE
    assert state.can_lock and state.item_id == ITEM and state.lock is None


def test_new_only_is_free():
    log = Log()
    log.add(P.NEW)
    assert log.state().status is ItemStatus.FREE


def test_processing_without_processed_is_a_lock_with_holder_and_age():
    log = Log()
    log.add(P.NEW)
    lock = log.add(P.PROCESSING, run_id="run-7")
    state = log.state(now=lock.time + dt.timedelta(minutes=90))
    assert state.status is ItemStatus.LOCKED
    assert not state.can_lock
    assert state.lock == lock
    assert state.holder_run_id == "run-7"
    assert state.holder_application == "filtered_events"
    assert state.lock_age == dt.timedelta(minutes=90)
    assert "run-7" in state.describe() and "1h 30m" in state.describe()


def test_processed_releases_the_lock():
    log = Log()
    lock = log.add(P.PROCESSING)
    done = log.add(P.PROCESSED, lock, payload={"rows": 12})
    state = log.state()
    assert state.status is ItemStatus.PROCESSED
    assert state.can_lock
    assert state.last_processed == done
    assert state.last_processed.payload == {"rows": 12}


def test_processed_item_can_be_processed_again():
    log = Log()
    first = log.add(P.PROCESSING)
    log.add(P.PROCESSED, first)
    second = log.add(P.PROCESSING, run_id="run-2")
    assert log.state().status is ItemStatus.LOCKED
    assert log.state().holder_run_id == "run-2"
    last = log.add(P.PROCESSED, second, run_id="run-2", payload='{"rows": 3}')
    assert log.state().status is ItemStatus.PROCESSED
    assert log.state().last_processed == last


def test_failed_fail_locks_until_resolved():
    log = Log()
    lock = log.add(P.PROCESSING, run_id="run-3")
    failed = log.add(P.FAILED, lock, run_id="run-3", payload={"reason": "disk full"})
    state = log.state(now=failed.time + dt.timedelta(seconds=42))
    assert state.status is ItemStatus.FAIL_LOCKED
    assert not state.can_lock
    assert state.failure == failed and state.reason == "disk full"
    assert state.holder_run_id == "run-3" and state.lock_age == dt.timedelta(seconds=42)
    log.add(P.RESOLVED, failed, run_id="op", payload={"reason": "disk cleaned"})
    state = log.state()
    assert state.status is ItemStatus.FREE and state.can_lock


def test_resolved_item_can_be_locked_and_processed_again():
    log = Log()
    lock = log.add(P.PROCESSING)
    failed = log.add(P.FAILED, lock)
    log.add(P.RESOLVED, failed)
    again = log.add(P.PROCESSING, run_id="run-2")
    assert log.state().status is ItemStatus.LOCKED
    log.add(P.PROCESSED, again, run_id="run-2")
    assert log.state().status is ItemStatus.PROCESSED


def test_abandoned_lock_then_resolved_is_free():
    """An operator abandons a crashed run's lock: Failed (abandoned) then Resolved."""
    log = Log()
    lock = log.add(P.PROCESSING, run_id="crashed")
    abandoned = log.add(P.FAILED, lock, run_id="op", payload={"reason": "abandoned"})
    assert log.state().status is ItemStatus.FAIL_LOCKED
    assert log.state().reason == "abandoned"
    log.add(P.RESOLVED, abandoned, run_id="op", payload={"reason": "re-run"})
    assert log.state().status is ItemStatus.FREE


@pytest.mark.parametrize("before", ["none", "new", "processed", "fail-locked"])
def test_skipped_items_are_left_alone(before):
    log = Log()
    if before == "new":
        log.add(P.NEW)
    elif before == "processed":
        lock = log.add(P.PROCESSING)
        log.add(P.PROCESSED, lock)
    elif before == "fail-locked":
        lock = log.add(P.PROCESSING)
        log.add(P.FAILED, lock)
    log.add(P.SKIPPED, payload={"reason": "corrupt file"})
    state = log.state()
    assert state.status is ItemStatus.SKIPPED
    assert not state.can_lock
    assert state.reason == "corrupt file"


def test_records_are_folded_in_time_order_whatever_the_input_order():
    log = Log()
    lock = log.add(P.PROCESSING)
    log.add(P.PROCESSED, lock)
    log.add(P.PROCESSING, run_id="run-2")
    shuffled = list(reversed(log.records))
    state = derive_item_state(shuffled)
    assert state.status is ItemStatus.LOCKED
    assert [r.record_id for r in state.records] == ["r1", "r2", "r3"]


def test_naive_times_are_utc_and_json_payloads_are_parsed():
    record = Record.from_row(
        {
            "record_id": "x",
            "item_id": ITEM,
            "application": "a",
            "state": "Failed",
            "run_id": "r",
            "previous_record_id": "",
            "payload": '{"reason": "boom", "rows": 3}',
            "time": dt.datetime(2024, 3, 1, 12, 0),
        }
    )
    assert record.time == T0
    assert record.previous_record_id is None
    assert record.payload == {"reason": "boom", "rows": 3}
    assert record.reason == "boom"
    assert record.payload_json == '{"reason": "boom", "rows": 3}'


def test_states_of_many_items_are_grouped_by_item():
    a, b = Log("a/1"), Log("b/1")
    a.add(P.PROCESSING)
    lock = b.add(P.PROCESSING)
    b.add(P.PROCESSED, lock)
    states = derive_item_states(a.records + b.records)
    assert list(states) == ["a/1", "b/1"]
    assert states["a/1"].status is ItemStatus.LOCKED
    assert states["b/1"].status is ItemStatus.PROCESSED


def test_records_of_several_items_are_refused_for_one_item():
    a, b = Log("a/1"), Log("b/1")
    a.add(P.NEW)
    b.add(P.NEW)
    with pytest.raises(ValueError, match="several items"):
        derive_item_state(a.records + b.records)


def test_format_age():
    assert format_age(dt.timedelta(seconds=12)) == "12s"
    assert format_age(dt.timedelta(minutes=4, seconds=5)) == "4m 5s"
    assert format_age(dt.timedelta(hours=3, minutes=12)) == "3h 12m"
    assert format_age(dt.timedelta(days=2, hours=3)) == "2d 3h"
    assert format_age(dt.timedelta(seconds=-3)) == "0s"


# --------------------------------------------------------------------------- illegal sequences


def assert_invalid(log: Log, *fragments: str) -> None:
    state = log.state()
    assert state.status is ItemStatus.INVALID, state
    assert not state.can_lock
    for fragment in fragments:
        assert fragment in state.reason, (fragment, state.reason)
    assert state.reason in state.describe()


def test_failed_referring_to_processed_is_invalid():
    """The seed's example: Failed refers to Processed."""
    log = Log()
    lock = log.add(P.PROCESSING)
    done = log.add(P.PROCESSED, lock)
    bad = log.add(P.FAILED, done)
    assert_invalid(log, f"Failed record {bad.record_id}", f"Processed record {done.record_id}")


def test_processed_referring_to_failed_is_invalid():
    log = Log()
    lock = log.add(P.PROCESSING)
    failed = log.add(P.FAILED, lock)
    log.add(P.PROCESSED, failed)
    assert_invalid(log, "refers to Failed record", "must refer to a Processing record")


def test_processed_referring_to_a_missing_record_is_invalid():
    log = Log()
    log.add(P.PROCESSING)
    log.add(P.PROCESSED, "no-such-record")
    assert_invalid(log, "missing record no-such-record")


def test_processed_referring_to_nothing_is_invalid():
    log = Log()
    log.add(P.PROCESSING)
    log.add(P.PROCESSED, None)
    assert_invalid(log, "refers to no record")


def test_record_referring_to_a_later_record_is_invalid():
    log = Log()
    log.records.append(
        Record("r9", ITEM, "a", P.PROCESSED, "run", "r10", None, T0 - dt.timedelta(minutes=1))
    )
    log.records.append(Record("r10", ITEM, "a", P.PROCESSING, "run", None, None, T0))
    assert_invalid(log, "later record r10")


def test_closing_a_lock_twice_is_invalid():
    log = Log()
    lock = log.add(P.PROCESSING)
    log.add(P.PROCESSED, lock)
    log.add(P.PROCESSED, lock)
    assert_invalid(log, "which is not open")


def test_failing_a_closed_lock_is_invalid():
    log = Log()
    lock = log.add(P.PROCESSING)
    log.add(P.PROCESSED, lock)
    log.add(P.FAILED, lock)
    assert_invalid(log, "which is not open")


def test_two_open_locks_are_invalid():
    """What a lost race would leave if locks were a check followed by a blind append."""
    log = Log()
    first = log.add(P.PROCESSING, run_id="a")
    log.add(P.PROCESSING, run_id="b")
    assert_invalid(log, "takes a lock", f"Processing record {first.record_id} holds it")


def test_locking_a_fail_locked_item_is_invalid():
    log = Log()
    lock = log.add(P.PROCESSING)
    log.add(P.FAILED, lock)
    log.add(P.PROCESSING, run_id="b")
    assert_invalid(log, "is unresolved")


@pytest.mark.parametrize("wrong", [P.PROCESSING, P.PROCESSED, P.NEW])
def test_resolved_referring_to_anything_but_failed_is_invalid(wrong):
    log = Log()
    if wrong is P.NEW:
        target = log.add(P.NEW)
    else:
        target = log.add(P.PROCESSING)
        if wrong is P.PROCESSED:
            target = log.add(P.PROCESSED, target)
    log.add(P.RESOLVED, target)
    assert_invalid(log, f"refers to {wrong.value} record", "must refer to a Failed record")


def test_resolving_twice_is_invalid():
    log = Log()
    lock = log.add(P.PROCESSING)
    failed = log.add(P.FAILED, lock)
    log.add(P.RESOLVED, failed)
    log.add(P.RESOLVED, failed)
    assert_invalid(log, "which is not open")


def test_resolved_without_reference_is_invalid():
    log = Log()
    log.add(P.RESOLVED)
    assert_invalid(log, "refers to no record")


def test_any_record_after_skipped_is_invalid():
    log = Log()
    log.add(P.SKIPPED)
    log.add(P.PROCESSING)
    assert_invalid(log, "after the item was skipped")


def test_skipping_a_locked_item_is_invalid():
    log = Log()
    log.add(P.PROCESSING)
    log.add(P.SKIPPED)
    assert_invalid(log, "skips the item while")


def test_new_that_is_not_first_is_invalid():
    log = Log()
    log.add(P.NEW)
    log.add(P.NEW)
    assert_invalid(log, "not the item's first record")


@pytest.mark.parametrize("state", [P.NEW, P.PROCESSING, P.SKIPPED])
def test_records_that_must_refer_to_nothing_but_do_are_invalid(state):
    log = Log()
    first = log.add(P.PROCESSING)
    log.add(P.PROCESSED, first)
    log.add(state, first)
    assert_invalid(log, "must refer to no record")


def test_duplicate_record_ids_are_invalid():
    log = Log()
    lock = log.add(P.PROCESSING)
    log.records.append(
        Record(lock.record_id, ITEM, "a", P.NEW, "run", None, None, T0 + dt.timedelta(hours=1))
    )
    assert_invalid(log, "appears twice")


def test_invalid_items_report_every_problem():
    log = Log()
    log.add(P.PROCESSED, "ghost-1")
    log.add(P.RESOLVED, "ghost-2")
    state = log.state()
    assert state.status is ItemStatus.INVALID
    assert len(state.problems) == 2
    assert "ghost-1" in state.reason and "ghost-2" in state.reason


# ------------------------------------------------------------------------ self-healing locks

_T0 = dt.datetime(2024, 3, 1, 12, tzinfo=dt.UTC)


def _lock(holder: dict | None, run_id: str = "r1") -> Record:
    return Record(
        record_id="lock-1",
        item_id="filtered_events/2024-03-01",
        application="dagster",
        state=RecordState.PROCESSING,
        run_id=run_id,
        previous_record_id=None,
        payload={"holder": holder} if holder is not None else None,
        time=_T0,
    )


@pytest.mark.parametrize(
    ("holder", "alive", "status", "age_hours", "expected"),
    [
        # alive on this host, run still going, young: keep waiting
        ({"host": "h1", "pid": 10}, True, "STARTED", 1, None),
        # dead process on this host
        ({"host": "h1", "pid": 10}, False, None, 1, "its process 10 on h1 is gone"),
        # another host: its process cannot be checked, the run status can
        ({"host": "h2", "pid": 10}, False, "FAILURE", 1, "its Dagster run r1 ended (FAILURE)"),
        ({"host": "h2", "pid": 10}, False, "CANCELED", 1, "its Dagster run r1 ended (CANCELED)"),
        ({"host": "h2", "pid": 10}, False, None, 1, None),
        # a lock written before holders were recorded: only the lease applies
        (None, False, None, 1, None),
        (None, False, None, 25, "it is older than the lease (1d 0h)"),
    ],
)
def test_holder_gone(holder, alive, status, age_hours, expected) -> None:
    from sessionize_assets.core.manifest_state import holder_gone

    got = holder_gone(
        _lock(holder),
        _T0 + dt.timedelta(hours=age_hours),
        "h1",
        pid_alive=lambda _pid: alive,
        run_status=lambda _run: status,
    )
    assert got == expected
