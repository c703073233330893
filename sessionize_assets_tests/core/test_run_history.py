"""Which recorded session runs a replay of id mode's memory takes, from the records alone."""

from __future__ import annotations

import datetime as dt
import itertools

from sessionize_assets.core.manifest_state import Record, RecordState
from sessionize_assets.core.run_history import (
    RAN,
    RUN_ITEM,
    SESSIONS_KEY,
    STARTED,
    record_keys,
    replay_of,
)

T0 = dt.datetime(2024, 3, 1, tzinfo=dt.UTC)
_n = itertools.count()


def _run(
    state: RecordState,
    payload: dict | None,
    run_id: str | None = None,
    closed: bool = True,
    item: str = RUN_ITEM,
) -> list[Record]:
    """A lock record and (unless not `closed`) its close of `state` with `payload`."""
    n = next(_n)
    run_id = run_id or f"run-{n}"
    lock = Record(
        f"lock-{n}", item, "dagster:x", RecordState.PROCESSING, run_id, None, None,
        T0 + dt.timedelta(minutes=2 * n),
    )  # fmt: skip
    if not closed:
        return [lock]
    close = Record(
        f"close-{n}", item, "dagster:x", state, run_id, lock.record_id, payload,
        T0 + dt.timedelta(minutes=2 * n + 1),
    )  # fmt: skip
    return [lock, close]


def _ran(version: int, upper_hours: int, forgets: bool = False, state: str = RAN) -> dict:
    payload = record_keys(version, T0 + dt.timedelta(hours=upper_hours), forgets_memory=forgets)
    payload[SESSIONS_KEY] = state
    return payload


def test_runs_whose_sessions_step_ran_are_replayed_oldest_first_repeats_once() -> None:
    records = (
        _run(RecordState.PROCESSED, _ran(3, 24))
        + _run(RecordState.PROCESSED, record_keys(3, T0, False))  # sessions skipped the window
        + _run(RecordState.PROCESSED, _ran(3, 24))  # same version and limit: decides nothing new
        + _run(RecordState.FAILED, {"reason": "SettingsError: changed"})  # failed before reading
        + _run(RecordState.FAILED, {**_ran(5, 48), "reason": "users failed"})  # sessions done
        + _run(RecordState.PROCESSED, {"anything": 1}, item="filtered_events/2024-03-01")
    )
    replay = replay_of(list(reversed(records)))  # the order is the records' time, not the input's
    assert replay.possible
    assert [(r.filtered_events_version, r.upper_limit, r.forgets_memory) for r in replay.runs] == [
        (3, T0 + dt.timedelta(hours=24), False),
        (5, T0 + dt.timedelta(hours=48), False),
    ]
    # A refresh forgets the memory: the replay starts there, and a run before it whose writes
    # are unknown no longer matters.
    unknown = _run(RecordState.FAILED, {**_ran(6, 60, state=STARTED), "reason": "boom"})
    assert not replay_of(records + unknown).possible
    refreshed = replay_of(
        records
        + unknown
        + _run(RecordState.PROCESSED, _ran(7, 72, forgets=True))
        + _run(RecordState.PROCESSED, _ran(7, 72))  # a repeat of the refresh's window
    )
    assert [(r.filtered_events_version, r.forgets_memory) for r in refreshed.runs] == [(7, True)]


def test_a_run_whose_writes_are_unknown_refuses_the_replay_and_says_which() -> None:
    done = _run(RecordState.PROCESSED, _ran(1, 24))
    cases = {
        "failed while writing sessions": _run(
            RecordState.FAILED, {**_ran(2, 24, state=STARTED), "reason": "boom"}, "r-half"
        ),
        "was stopped from outside": _run(
            RecordState.FAILED, {"reason": "abandoned", "abandoned_run_id": "r-killed"}
        ),
        "has not finished": _run(RecordState.PROCESSED, None, "r-open", closed=False),
        "recorded no window": _run(RecordState.PROCESSED, None, "r-old"),
    }
    for words, records in cases.items():
        replay = replay_of(done + records)
        assert not replay.possible and words in replay.refusal, (words, replay)
        run_id = records[0].run_id if words != "was stopped from outside" else "r-killed"
        assert run_id in replay.refusal
    assert replay_of(done).possible and replay_of([]).runs == ()
