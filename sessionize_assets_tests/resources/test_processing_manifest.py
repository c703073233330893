"""The processing manifest on a real Delta table: locks, failures, operators, readers, cursors."""

from __future__ import annotations

import datetime as dt
import threading
import time

import pytest

from sessionize_assets.core.cursor import CursorConfig, CursorState, run_slices
from sessionize_assets.core.manifest_state import ItemStatus, RecordState
from sessionize_assets.errors import ItemLockedError, UserError
from sessionize_assets.resources.cursor_store import (
    CursorCheckpointStore,
    CursorConflictError,
    read_cursor_history,
    read_cursor_state,
)
from sessionize_assets.resources.processing_manifest import (
    BUCKETS,
    LockLostError,
    ManifestStateError,
    ProcessingManifest,
    asset_item,
    item_bucket,
    item_state,
    item_states,
    last_processed_payload,
    read_records,
    this_holder,
)


class Clock:
    """A settable UTC clock (record times and lock ages without sleeping)."""

    def __init__(self, start: dt.datetime) -> None:
        self.now = start

    def __call__(self) -> dt.datetime:
        return self.now

    def tick(self, **delta: float) -> dt.datetime:
        self.now += dt.timedelta(**delta)
        return self.now


T0 = dt.datetime(2024, 3, 1, 12, 0, tzinfo=dt.UTC)
ITEM = asset_item("filtered_events", "2024-03-01")


@pytest.fixture
def clock() -> Clock:
    return Clock(T0)


@pytest.fixture
def manifest(spark, home, clock) -> ProcessingManifest:
    return ProcessingManifest(spark, str(home / "warehouse" / "processing_manifest"), clock=clock)


def test_lock_complete_and_read_back_without_spark(manifest, clock):
    assert ITEM == "filtered_events/2024-03-01" and asset_item("attributes") == "attributes"
    lock = manifest.lock(ITEM, "filtered_events", "run-1", payload={"load_day": "2024-03-01"})
    assert lock.state is RecordState.PROCESSING and lock.previous_record_id is None

    state = item_state(manifest.path, ITEM, now=clock.tick(minutes=5))
    assert state.status is ItemStatus.LOCKED
    assert state.holder_run_id == "run-1"
    assert state.lock_age == dt.timedelta(minutes=5)

    done = manifest.complete(lock, payload={"rows_written": 42})
    assert done.previous_record_id == lock.record_id
    assert item_state(manifest.path, ITEM).status is ItemStatus.PROCESSED
    assert last_processed_payload(manifest.path, ITEM) == {"rows_written": 42}
    assert last_processed_payload(manifest.path, "filtered_events/2024-03-02") is None

    records = read_records(manifest.path, item=ITEM)
    assert [r.state for r in records] == [RecordState.PROCESSING, RecordState.PROCESSED]
    # A Processing record names its holder, so a lock whose process died can be healed.
    assert records[0].payload == {"load_day": "2024-03-01", "holder": this_holder()}
    assert records[0].time == T0


def test_second_lock_fails_with_one_sentence_naming_item_and_holder(manifest, clock):
    manifest.lock(ITEM, "filtered_events", "run-1")
    clock.tick(seconds=30)
    with pytest.raises(ItemLockedError) as raised:
        manifest.lock(ITEM, "filtered_events", "run-2")
    message = str(raised.value)
    assert ITEM in message and "run-1" in message and "run-2" in message
    assert "30s" in message
    assert message.count(". ") == 0 and message.endswith(".")
    assert isinstance(raised.value, UserError)
    # The refused lock wrote nothing.
    assert len(read_records(manifest.path, item=ITEM)) == 1


def test_processed_item_can_be_locked_again_and_times_stay_ordered(manifest, clock):
    first = manifest.lock(ITEM, "a", "run-1")
    manifest.complete(first)
    clock.now = T0 - dt.timedelta(hours=1)  # a clock that went backwards
    second = manifest.lock(ITEM, "a", "run-2")
    assert second.time > first.time
    state = item_state(manifest.path, ITEM)
    assert state.status is ItemStatus.LOCKED and state.holder_run_id == "run-2"


def test_failure_fail_locks_until_resolved(manifest):
    lock = manifest.lock(ITEM, "a", "run-1")
    failed = manifest.fail(lock, "Spark ran out of memory")
    assert failed.previous_record_id == lock.record_id
    state = item_state(manifest.path, ITEM)
    assert state.status is ItemStatus.FAIL_LOCKED
    assert state.reason == "Spark ran out of memory"
    with pytest.raises(ItemLockedError, match="fail-locked"):
        manifest.lock(ITEM, "a", "run-2")
    resolved = manifest.resolve(ITEM, "memory raised")
    assert resolved.previous_record_id == failed.record_id
    assert manifest.state(ITEM).status is ItemStatus.FREE
    manifest.lock(ITEM, "a", "run-2")


def test_abandon_then_resolve_releases_a_stale_lock(manifest, clock):
    lock = manifest.lock(ITEM, "a", "crashed-run")
    with pytest.raises(ManifestStateError, match="not someone-else"):
        manifest.abandon(ITEM, holder_run_id="someone-else")
    abandoned = manifest.abandon(ITEM, run_id="op-1")
    assert abandoned.state is RecordState.FAILED
    assert abandoned.previous_record_id == lock.record_id
    assert abandoned.payload == {"reason": "abandoned", "abandoned_run_id": "crashed-run"}
    assert item_state(manifest.path, ITEM).status is ItemStatus.FAIL_LOCKED
    manifest.resolve(ITEM, "re-run after crash")
    assert manifest.lock(ITEM, "a", "run-2").run_id == "run-2"
    # The crashed run waking up cannot close a lock it no longer holds.
    with pytest.raises(LockLostError, match="crashed-run no longer holds"):
        manifest.complete(lock)


def test_operator_actions_refuse_illegal_states(manifest):
    with pytest.raises(ManifestStateError, match="no lock to abandon"):
        manifest.abandon(ITEM)
    with pytest.raises(ManifestStateError, match="no failure to resolve"):
        manifest.resolve(ITEM, "nothing")
    manifest.lock(ITEM, "a", "run-1")
    with pytest.raises(ItemLockedError, match="cannot be skipped"):
        manifest.skip(ITEM, "bad file")
    assert [r.state for r in read_records(manifest.path, item=ITEM)] == [RecordState.PROCESSING]


def test_skipped_items_are_left_alone(manifest):
    assert manifest.discover(ITEM, "loader", "run-0", {"file": "a.tsv"}) is not None
    assert manifest.discover(ITEM, "loader", "run-0") is None  # already known
    manifest.skip(ITEM, "corrupt landing file")
    state = item_state(manifest.path, ITEM)
    assert state.status is ItemStatus.SKIPPED and state.reason == "corrupt landing file"
    with pytest.raises(ItemLockedError, match="skipped"):
        manifest.lock(ITEM, "a", "run-1")


def test_processing_context_completes_with_the_payload(manifest):
    with manifest.processing(ITEM, "filtered_events", "run-1") as payload:
        assert item_state(manifest.path, ITEM).status is ItemStatus.LOCKED
        payload["rows_read"] = 10
    assert last_processed_payload(manifest.path, ITEM) == {"rows_read": 10}
    assert item_state(manifest.path, ITEM).status is ItemStatus.PROCESSED


def test_processing_context_fails_with_the_exception_text_and_reraises(manifest):
    with pytest.raises(ZeroDivisionError):
        with manifest.processing(ITEM, "filtered_events", "run-1") as payload:
            payload["rows_read"] = 10
            _ = 1 / 0
    state = item_state(manifest.path, ITEM)
    assert state.status is ItemStatus.FAIL_LOCKED
    assert state.reason == "ZeroDivisionError: division by zero"
    assert state.failure.payload["rows_read"] == 10
    with pytest.raises(ItemLockedError):
        with manifest.processing(ITEM, "filtered_events", "run-2"):
            pytest.fail("must not run while fail-locked")


class StaleReader(ProcessingManifest):
    """A writer whose first snapshot lags the table by one version (another writer committed
    between its read and its append)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.reads = 0

    def _snapshot(self, items):
        from sessionize_assets.resources.manifest_table import open_table, records_by_item

        self.reads += 1
        if self.reads > 1:
            return super()._snapshot(items)
        table = open_table(self.path)
        table.load_as_version(table.version() - 1)
        return table, records_by_item(table, items)


def test_a_stale_read_cannot_append_past_the_item_history(manifest, spark, clock):
    """The lock is an append at exactly the next version, not a check then a blind append."""
    manifest.lock(ITEM, "a", "run-1")
    stale = StaleReader(spark, manifest.path, clock=clock)
    with pytest.raises(ItemLockedError, match="run-1"):
        stale.lock(ITEM, "a", "run-2")
    assert stale.conflicts == 1 and stale.reads == 2
    state = item_state(manifest.path, ITEM)
    assert state.status is ItemStatus.LOCKED and len(state.records) == 1


def test_a_stale_batch_writes_nothing_and_the_retry_is_refused(manifest, spark, clock):
    """The first snapshot misses run-1's lock on one item of the batch: the append is refused
    as a whole (no record for the free item either), and the retry sees run-1 and refuses."""
    manifest.lock(DAYS[0], "warm", "run-0")
    manifest.lock(DAYS[1], "a", "run-1")
    before = _version(manifest.path)
    stale = StaleReader(spark, manifest.path, clock=clock)
    with pytest.raises(ItemLockedError, match="run-1"):
        stale.lock_many(DAYS[2:4] + DAYS[1:2], "b", "run-2")
    assert stale.conflicts == 1
    assert _version(manifest.path) == before
    assert not item_state(manifest.path, DAYS[2]).records
    stale.lock_many(DAYS[2:4], "c", "run-3")  # the free items were never taken


def test_concurrent_threads_exactly_one_lock_wins(manifest, spark, clock):
    """Two writers in one Spark session (Delta transactions are per writer): one wins."""
    manifest.ensure_table()
    items = [f"threads/{i}" for i in range(3)]
    outcomes: dict[str, list[str]] = {item: [] for item in items}
    # A timeout: one crashed contender breaks the barrier instead of hanging CI.
    barrier = threading.Barrier(2, timeout=120)

    def contender(run_id: str) -> None:
        writer = ProcessingManifest(spark, manifest.path, clock=clock)
        for item in items:
            barrier.wait()
            try:
                writer.lock(item, "a", run_id)
                outcomes[item].append(f"won:{run_id}")
            except ItemLockedError as error:
                assert item in str(error)
                outcomes[item].append(f"lost:{run_id}")

    threads = [threading.Thread(target=contender, args=(f"run-{n}",), daemon=True) for n in (1, 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert not any(thread.is_alive() for thread in threads), "a contender hung"
    states = item_states(manifest.path, prefix="threads/")
    for item in items:
        wins = [o for o in outcomes[item] if o.startswith("won:")]
        assert len(wins) == 1 and len(outcomes[item]) == 2, outcomes
        assert states[item].status is ItemStatus.LOCKED
        assert states[item].holder_run_id == wins[0].removeprefix("won:")


def test_table_is_partitioned_by_bucket_and_readable_by_delta_rs(manifest):
    from deltalake import DeltaTable

    manifest.lock("a/1", "a", "r")
    table = DeltaTable(manifest.path)
    assert table.metadata().partition_columns == ["item_bucket"]
    config = table.metadata().configuration
    assert config["delta.appendOnly"] == "true"
    assert config.get("delta.enableDeletionVectors", "false") == "false"
    assert config["sessionize.manifest.buckets"] == str(BUCKETS)
    assert table.protocol().min_reader_version == 1
    assert 0 <= item_bucket("a/1") < BUCKETS and item_bucket("a/1") == item_bucket("a/1")
    rows = table.to_pyarrow_table().to_pylist()
    assert rows[0]["item_bucket"] == item_bucket("a/1")


def test_readers_filter_by_prefix_and_tolerate_a_missing_table(manifest, home):
    assert read_records(str(home / "nothing")) == []
    assert item_states(str(home / "nothing")) == {}
    assert item_state(str(home / "nothing"), ITEM).status is ItemStatus.FREE
    manifest.lock("sessions/2024-03-01", "s", "r")
    manifest.lock("filtered_events/2024-03-01", "f", "r")
    assert list(item_states(manifest.path, prefix="sessions/")) == ["sessions/2024-03-01"]
    assert len(read_records(manifest.path)) == 2


def test_the_manifest_compacts_itself_as_records_pile_up_and_keeps_every_record(manifest, clock):
    """Every record is a file in its bucket; the writer bin-packs them once the table is
    `fragmented`, so reads stay a few files a bucket however long the history."""
    from deltalake import DeltaTable

    from sessionize_assets.core.maintenance import FRAGMENTED_SLACK_FILES

    for _ in range(FRAGMENTED_SLACK_FILES + 2):  # one bucket: fragmented past 2 + slack files
        clock.tick(seconds=1)
        manifest.complete(manifest.lock(ITEM, "a", "r"))
    table = DeltaTable(manifest.path)
    assert "OPTIMIZE" in [c["operation"] for c in table.history()]
    assert len(table.file_uris()) <= 2 + FRAGMENTED_SLACK_FILES
    records = read_records(manifest.path, item=ITEM)
    assert len(records) == 2 * (FRAGMENTED_SLACK_FILES + 2)
    assert [r.state for r in records[-2:]] == [RecordState.PROCESSING, RecordState.PROCESSED]
    assert item_state(manifest.path, ITEM).status is ItemStatus.PROCESSED


# ------------------------------------------------------------------------- cursor checkpoints


def test_cursor_checkpoints_resume_a_failed_run(spark, home, clock):
    path = str(home / "warehouse" / "cursor_state")
    store = CursorCheckpointStore(spark, path, clock=clock)
    config = CursorConfig(start="2022-01-01", end="2022-01-04", step="P1D")
    now = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
    done: list[str] = []

    def process(piece) -> None:
        if piece.window.start.day == 3:
            raise RuntimeError("third window failed")
        done.append(piece.window.start.date().isoformat())

    with pytest.raises(RuntimeError):
        run_slices(
            config, store.load("catch_up"), process, store.checkpointer("catch_up", "r1"), now
        )
    assert read_cursor_state(path, "catch_up").global_cursor == dt.datetime(
        2022, 1, 3, tzinfo=dt.UTC
    )

    resumed = CursorCheckpointStore(spark, path, clock=clock)
    final = run_slices(
        config,
        resumed.load("catch_up"),
        lambda piece: done.append(piece.window.start.date().isoformat()),
        resumed.checkpointer("catch_up", "r2"),
        now,
    )
    assert done == ["2022-01-01", "2022-01-02", "2022-01-03"]
    assert read_cursor_state(path, "catch_up") == final
    history = read_cursor_history(path, "catch_up")
    assert [h["sequence"] for h in history] == [1, 2, 3]
    assert [h["run_id"] for h in history] == ["r1", "r1", "r2"]
    assert read_cursor_state(path, "other") == CursorState()


def test_a_stale_cursor_writer_cannot_move_the_cursor(spark, home):
    path = str(home / "warehouse" / "cursor_state")
    first = CursorCheckpointStore(spark, path)
    second = CursorCheckpointStore(spark, path)
    first.load("c")
    second.load("c")
    later = CursorState(global_cursor=dt.datetime(2022, 1, 5, tzinfo=dt.UTC))
    first.save("c", later, "run-1")
    with pytest.raises(CursorConflictError, match="run-1"):
        second.save("c", CursorState(global_cursor=dt.datetime(2022, 1, 2, tzinfo=dt.UTC)), "run-2")
    assert read_cursor_state(path, "c") == later


# ------------------------------------------------------------------ several items in one commit

DAYS = [asset_item("daily_aggregates", f"2024-03-0{d}") for d in range(1, 6)]


def _version(path: str) -> int:
    from deltalake import DeltaTable

    return DeltaTable(path).version()


def test_processing_many_locks_and_completes_in_two_commits(manifest):
    manifest.ensure_table()
    before = _version(manifest.path)
    with manifest.processing_many(DAYS, "daily_aggregates", "run-1") as payloads:
        assert _version(manifest.path) == before + 1
        states = item_states(manifest.path, prefix="daily_aggregates/")
        assert all(states[d].status is ItemStatus.LOCKED for d in DAYS)
        assert {states[d].holder_run_id for d in DAYS} == {"run-1"}
        for n, payload in enumerate(payloads):
            payload["rows"] = n
    assert _version(manifest.path) == before + 2
    for n, day in enumerate(DAYS):
        assert item_state(manifest.path, day).status is ItemStatus.PROCESSED
        assert last_processed_payload(manifest.path, day) == {"rows": n}


def test_processing_many_takes_all_locks_or_none(manifest):
    manifest.lock(DAYS[3], "a", "run-1")
    before = _version(manifest.path)
    with pytest.raises(ItemLockedError, match=r"daily_aggregates/2024-03-04.*run-1|run-1.*03-04"):
        with manifest.processing_many(DAYS, "daily_aggregates", "run-2"):
            pytest.fail("must not run without every lock")
    assert _version(manifest.path) == before  # nothing written for the free items
    states = item_states(manifest.path, prefix="daily_aggregates/")
    assert set(states) == {DAYS[3]} and states[DAYS[3]].holder_run_id == "run-1"


def test_processing_many_fails_every_item_with_the_error(manifest):
    with pytest.raises(RuntimeError, match="disk full"):
        with manifest.processing_many(DAYS[:2], "daily_aggregates", "run-1") as payloads:
            payloads[0]["rows"] = 7
            raise RuntimeError("disk full")
    first, second = (item_state(manifest.path, d) for d in DAYS[:2])
    assert first.status is ItemStatus.FAIL_LOCKED and second.status is ItemStatus.FAIL_LOCKED
    assert first.reason == second.reason == "RuntimeError: disk full"
    assert first.failure.payload["rows"] == 7


def test_concurrent_batches_one_run_holds_every_item(manifest, spark, clock):
    manifest.ensure_table()
    items = [f"batch/{i}" for i in range(6)]
    outcomes: dict[str, str] = {}
    # A timeout: one crashed contender breaks the barrier instead of hanging CI.
    barrier = threading.Barrier(2, timeout=120)

    def contender(run_id: str) -> None:
        writer = ProcessingManifest(spark, manifest.path, clock=clock)
        barrier.wait()
        try:
            writer.lock_many(items, "a", run_id)
            outcomes[run_id] = "won"
        except ItemLockedError:
            outcomes[run_id] = "lost"

    threads = [threading.Thread(target=contender, args=(f"run-{n}",), daemon=True) for n in (1, 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert not any(thread.is_alive() for thread in threads), "a contender hung"
    winners = [run for run, outcome in outcomes.items() if outcome == "won"]
    assert len(winners) == 1 and len(outcomes) == 2, outcomes
    states = item_states(manifest.path, prefix="batch/")
    assert {states[i].holder_run_id for i in items} == set(winners)
    assert all(states[i].status is ItemStatus.LOCKED for i in items)


def test_resolve_run_releases_every_item_of_one_run_only(manifest, clock):
    a1, a2, a3, b1 = (f"daily_aggregates/2024-03-0{i}" for i in (1, 2, 3, 4))
    manifest.lock_many([a1, a2], "daily_aggregates", "run-a")
    failed = manifest.lock(a3, "daily_aggregates", "run-a")
    manifest.fail(failed, "boom")
    manifest.lock(b1, "daily_aggregates", "run-b")
    clock.tick(seconds=5)
    done = manifest.resolve_run("run-a", "the run was killed")
    assert done == {
        a1: "lock abandoned and resolved",
        a2: "lock abandoned and resolved",
        a3: "failure resolved",
    }
    for item in (a1, a2, a3):
        assert manifest.state(item).status is ItemStatus.FREE
    assert manifest.state(b1).status is ItemStatus.LOCKED
    assert manifest.resolve_run("run-a", "again") == {}


def test_a_refused_lock_says_how_to_recover(manifest):
    manifest.lock(ITEM, "a", "run-1")
    with pytest.raises(ItemLockedError, match=r"manifest resolve --run run-1"):
        manifest.lock(ITEM, "a", "run-2")


def test_a_table_another_process_is_still_creating_is_waited_for(spark, home, clock):
    """Found by the two-process race under load: while another process creates the manifest, its
    `_delta_log` folder exists before its first commit, and Spark's CREATE TABLE IF NOT EXISTS
    then returns without creating anything. The lock waits for a visible version instead of
    writing to a table that is not there (AttributeError on a None table before)."""
    from deltalake import write_deltalake

    from sessionize_assets.resources.processing_manifest import _arrow_records

    path = home / "warehouse" / "processing_manifest"
    (path / "_delta_log").mkdir(parents=True)  # the other creator has begun

    def other_creator_commits() -> None:
        time.sleep(4.0)
        write_deltalake(str(path), _arrow_records([]), partition_by=["item_bucket"])

    other = threading.Thread(target=other_creator_commits, daemon=True)
    other.start()
    record = ProcessingManifest(spark, str(path), clock=clock).lock(ITEM, "app", "run-1")
    other.join(timeout=60)
    assert record.run_id == "run-1"
    assert [r.run_id for r in read_records(str(path), item=ITEM)] == ["run-1"]
