"""The session runs a home recorded, and whether id mode's lifecycle can be replayed from them.

In id mode the lifecycle manifest is memory: a session's user is the one first seen, and a
quarantined session's start stays frozen. Which run saw a session first decides both, so a
recompute from today's `filtered_events` alone cannot know them. Every session run records, in
the Processed (or Failed) record of its processing-manifest lock (item `session_models`), what
it read: the `filtered_events` version, the window's upper limit, whether it started from an
empty memory (a refresh), and how far its sessions step got. `sessionize verify` replays those
runs from an empty memory, oldest first, and compares the lifecycle it ends with.

This module decides, from the records alone (plain Python), which runs a replay takes and when
a replay is not possible. When it is not possible, the reason is one sentence, and verify falls
back to taking the stored lifecycle as given.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sessionize_assets.core.clock import as_utc
from sessionize_assets.core.manifest_state import Record, RecordState, record_order

RUN_ITEM = "session_models"  # the processing-manifest item of the session models' runs

# The keys a run writes into its record (`record_keys`); `sessions` is one of the three below.
VERSION_KEY = "filtered_events_version"
UPPER_KEY = "upper_limit"
MEMORY_KEY = "lifecycle_memory"  # "kept", or "forgotten" for a refresh
SESSIONS_KEY = "sessions"
NOT_RUN = "not run"  # the sessions step did not run: nothing of the lifecycle changed
STARTED = "started"  # it began writing and did not finish (a failure: maybe half written)
RAN = "ran"  # it finished: every session up to the upper limit was decided


def record_keys(
    version: int | None, upper_limit: dt.datetime, forgets_memory: bool
) -> dict[str, Any]:
    """What a run records before it writes anything (its sessions step not run yet)."""
    return {
        VERSION_KEY: version,
        UPPER_KEY: as_utc(upper_limit).isoformat(),
        MEMORY_KEY: "forgotten" if forgets_memory else "kept",
        SESSIONS_KEY: NOT_RUN,
    }


@dataclass(frozen=True)
class RecordedRun:
    """One run a replay repeats: the version it read, its upper limit, its memory."""

    run_id: str
    filtered_events_version: int
    upper_limit: dt.datetime
    forgets_memory: bool


@dataclass(frozen=True)
class Replay:
    """The runs to replay, oldest first; or why none can be (`refusal`)."""

    runs: tuple[RecordedRun, ...] = ()
    refusal: str | None = None

    @property
    def possible(self) -> bool:
        return self.refusal is None


def _when(record: Record) -> str:
    return as_utc(record.time).strftime("%Y-%m-%d %H:%M:%S UTC")


def _recorded(payload: Mapping[str, Any] | None) -> bool:
    return bool(payload) and SESSIONS_KEY in payload and VERSION_KEY in payload


def replay_of(records: Sequence[Record]) -> Replay:
    """The runs a replay takes from the records of item `session_models`, or the refusal.

    A closed run is taken when its sessions step ran; skipped when it did not run (or the run
    failed before recording anything). A replay is refused when a run's record cannot say what
    the run wrote: a run that failed while writing, a lock abandoned by an operator (the run was
    killed), a lock still open (a run in progress or killed), or a Processed record without a
    window (written by a version before runs recorded them). A refresh forgets the memory, so
    the replay starts at the last one: what came before it no longer matters.
    """
    ordered = sorted((r for r in records if r.item_id == RUN_ITEM), key=record_order)
    closed = {r.previous_record_id for r in ordered if r.previous_record_id}
    runs: list[RecordedRun] = []
    refusal: str | None = None
    for record in ordered:
        payload = record.payload or {}
        if record.state == RecordState.PROCESSING:
            if record.record_id not in closed:
                refusal = (
                    f"the session run {record.run_id} (locked {_when(record)}) has not "
                    "finished: it is running or was stopped"
                )
            continue
        if record.state not in (RecordState.PROCESSED, RecordState.FAILED):
            continue  # Resolved, Skipped, New: no run of their own
        if not _recorded(payload):
            if record.state == RecordState.PROCESSED:
                refusal = (
                    f"the session run {record.run_id} ({_when(record)}) recorded no window "
                    "(runs before this version did not)"
                )
            elif "abandoned_run_id" in payload:
                refusal = (
                    f"the session run {payload['abandoned_run_id']} was stopped from outside "
                    f"and its lock abandoned ({_when(record)}): what it wrote is not known"
                )
            continue  # else it failed before it read anything
        state = payload[SESSIONS_KEY]
        if state == STARTED:
            refusal = (
                f"the session run {record.run_id} failed while writing sessions "
                f"({_when(record)}): what it wrote is not known"
            )
            continue
        if state != RAN or payload[VERSION_KEY] is None:
            continue
        run = RecordedRun(
            run_id=record.run_id,
            filtered_events_version=int(payload[VERSION_KEY]),
            upper_limit=as_utc(str(payload[UPPER_KEY])),
            forgets_memory=payload.get(MEMORY_KEY) == "forgotten",
        )
        if run.forgets_memory:  # a refresh: nothing before it is remembered
            runs, refusal = [], None
        runs.append(run)
    if refusal is not None:
        return Replay(refusal=refusal)
    return Replay(runs=tuple(_without_repeats(runs)))


def _without_repeats(runs: list[RecordedRun]) -> list[RecordedRun]:
    """Consecutive runs over the same version and upper limit, keeping their memory, decide the
    same sessions from the same rows: the second changes nothing, so it is replayed once."""
    out: list[RecordedRun] = []
    for run in runs:
        last = out[-1] if out else None
        if (
            last is not None
            and not run.forgets_memory
            and (last.filtered_events_version, last.upper_limit)
            == (run.filtered_events_version, run.upper_limit)
        ):
            continue
        out.append(run)
    return out
