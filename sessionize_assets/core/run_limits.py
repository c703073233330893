"""Snowplow's run limits (seed 000): the package state and the window one incremental run takes on.

Plain Python, no Spark. With B = `backfill_limit_days` and L = `lookback_window_hours`, bounds
inclusive (SPEC section 6):

| state | when | lower limit | upper limit |
|---|---|---|---|
| 1 first run | no enabled model in the manifest | start_date | least(start_date + B, now) |
| 2 new model | some enabled model missing | start_date | least(max_last_success, start_date + B) |
| 3 out of sync | min_last_success < max_last_success | min_last_success - L | least(max_last_success, min_last_success + B) |
| 4 standard | otherwise | max_last_success - L | least(max_last_success + B, now) |

A model whose `last_success` is at or past the upper limit skips the window; `last_success`
only moves forward, and only for a model that succeeded. `caught_up` decides, before a run from
the lake's state and after a run from its outcome, whether the models are caught up to now.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import IntEnum, StrEnum
from typing import Any

from sessionize_assets.core.clock import as_utc, midnight


class PackageState(IntEnum):
    """The four states of Snowplow's incremental logic."""

    FIRST_RUN = 1
    NEW_MODEL = 2
    OUT_OF_SYNC = 3
    STANDARD = 4


# Snowplow's own log lines (dbt's `snowplow_<package>_base_new_event_limits`).
STATE_MESSAGES: dict[PackageState, str] = {
    PackageState.FIRST_RUN: "Snowplow: No data in manifest. Processing data from start_date",
    PackageState.NEW_MODEL: "Snowplow: New Snowplow incremental model. Backfilling",
    PackageState.OUT_OF_SYNC: "Snowplow: Snowplow incremental models out of sync. Syncing",
    PackageState.STANDARD: "Snowplow: Standard incremental run",
}
NO_DATA_WARNING = (
    "Snowplow Warning: No data in {table} for date range from variables, please modify your run "
    "variables to include data if this is not expected."
)


def format_tstamp(value: dt.datetime) -> str:
    """`YYYY-MM-DD HH:MM:SS[.ffffff]` in UTC, as Snowplow prints its limits."""
    value = as_utc(value)
    text = value.strftime("%Y-%m-%d %H:%M:%S")
    return f"{text}.{value.microsecond:06d}" if value.microsecond else text


@dataclass(frozen=True)
class RunLimits:
    """The state and the inclusive window [lower_limit, upper_limit] of one run."""

    state: PackageState
    lower_limit: dt.datetime
    upper_limit: dt.datetime
    enabled_models: tuple[str, ...]
    models_in_manifest: int
    min_last_success: dt.datetime | None
    max_last_success: dt.datetime | None

    @property
    def state_message(self) -> str:
        return STATE_MESSAGES[self.state]

    @property
    def window_message(self) -> str:
        return (
            f"Snowplow: Processing data between {format_tstamp(self.lower_limit)} "
            f"and {format_tstamp(self.upper_limit)}"
        )

    def log_lines(self) -> list[str]:
        """The two lines Snowplow logs at the start of every run."""
        return [self.state_message, self.window_message]

    def reaches(self, now: dt.datetime) -> bool:
        """True when the window's upper limit is now: nothing newer is waiting for a later run."""
        return self.upper_limit >= as_utc(now)

    def as_metadata(self) -> dict[str, Any]:
        """Plain values for materialization metadata."""
        return {
            "state": int(self.state),
            "state_name": self.state.name.lower(),
            "state_message": self.state_message,
            "lower_limit": self.lower_limit.isoformat(),
            "upper_limit": self.upper_limit.isoformat(),
            "window": self.window_message,
            "models_in_manifest": self.models_in_manifest,
            "enabled_models": ", ".join(self.enabled_models),
        }


def run_limits(
    last_successes: Mapping[str, dt.datetime | None],
    enabled_models: Sequence[str],
    start_date: dt.date,
    backfill_limit_days: int,
    lookback_window_hours: int,
    now: dt.datetime,
) -> RunLimits:
    """Snowplow's `get_run_limits`: the state and window from the manifest's enabled models.

    `last_successes` maps a model to its `last_success` (models absent from the manifest are
    absent from the mapping; rows of disabled models are ignored, as Snowplow's query does).
    """
    if not enabled_models:
        raise ValueError("run_limits needs at least one enabled model")
    now = as_utc(now)
    start = midnight(start_date)
    backfill = dt.timedelta(days=backfill_limit_days)
    lookback = dt.timedelta(hours=lookback_window_hours)
    known = [
        as_utc(last_successes[m])
        for m in enabled_models
        if m in last_successes and last_successes[m] is not None
    ]
    min_ls = min(known) if known else None
    max_ls = max(known) if known else None
    if not known:
        state, lower, upper = PackageState.FIRST_RUN, start, min(start + backfill, now)
    elif len(known) < len(set(enabled_models)):
        state, lower, upper = PackageState.NEW_MODEL, start, min(max_ls, start + backfill)
    elif min_ls < max_ls:
        state = PackageState.OUT_OF_SYNC
        lower, upper = min_ls - lookback, min(max_ls, min_ls + backfill)
    else:
        state, lower, upper = PackageState.STANDARD, max_ls - lookback, min(max_ls + backfill, now)
    return RunLimits(
        state=state,
        lower_limit=lower,
        upper_limit=upper,
        enabled_models=tuple(enabled_models),
        models_in_manifest=len(known),
        min_last_success=min_ls,
        max_last_success=max_ls,
    )


def restated(limits: RunLimits, day: dt.date) -> RunLimits:
    """The window of a restatement from `day` (`sessionize refresh sessions --from DAY`): it starts
    at midnight of that day, or earlier when the run's own window already does; the upper limit is
    the run's. A window that starts earlier takes more rows again, which is what every run's
    lookback does: the sessions of those rows are recomputed from filtered_events."""
    return replace(limits, lower_limit=min(limits.lower_limit, midnight(day)))


def skips_window(last_success: dt.datetime | None, limits: RunLimits) -> bool:
    """A model already past the window skips it (its last_success is at or after the upper limit)."""
    return last_success is not None and as_utc(last_success) >= limits.upper_limit


def next_last_success(
    previous: dt.datetime | None, processed_max: dt.datetime | None, succeeded: bool
) -> dt.datetime | None:
    """`last_success` after a run: moves forward only, and only when the model succeeded."""
    if not succeeded or processed_max is None:
        return previous
    processed_max = as_utc(processed_max)
    if previous is None:
        return processed_max
    return max(as_utc(previous), processed_max)


@dataclass(frozen=True)
class ConsumedState:
    """What an incremental_manifest row says a model has seen."""

    last_success: dt.datetime | None
    consumed_version: int | None
    processed_through: dt.datetime | None


def nothing_new(
    models: Sequence[str],
    states: Mapping[str, ConsumedState],
    version: int | None,
    newest_session_tstamp: dt.datetime | None,
    data_version: int | None = None,
) -> str | None:
    """Why a run of the session models would change nothing (None: it might, so run).

    True only when every enabled model is in sync (same last_success), has consumed the current
    `filtered_events` version or one after its last data change (`data_version`: commits since
    then, such as `maintain`'s OPTIMIZE and VACUUM, changed no row; default `version`), and its
    last run's window reached past the newest session timestamp in the table
    (`newest_session_tstamp`, from the Delta log's file statistics; None when unknown or the
    table is empty). Then every row was processed by a window and every later commit was
    consumed: a run would re-read its look-back window and write the same rows.
    """
    if version is None or newest_session_tstamp is None or not models:
        return None
    changed = version if data_version is None else data_version
    seen = [states.get(m) for m in models]
    if any(
        s is None
        or s.consumed_version is None
        or not changed <= s.consumed_version <= version
        or s.processed_through is None
        for s in seen
    ):
        return None
    if len({s.last_success for s in seen}) != 1:
        return None
    through = min(s.processed_through for s in seen)
    if as_utc(newest_session_tstamp) > as_utc(through):
        return None
    consumed = min(s.consumed_version for s in seen)
    later = f" (v{consumed + 1}..v{version} changed no data)" if consumed < version else ""
    return (
        f"Nothing new for the session models: each consumed filtered_events v{consumed}{later} "
        f"and processed through {format_tstamp(through)}, past the newest session timestamp "
        f"({format_tstamp(newest_session_tstamp)}); no run."
    )


# --- caught up? ---------------------------------------------------------------------------------


class Verdict(StrEnum):
    """Whether the session models are caught up, and why."""

    NOTHING_NEW = "nothing new"  # before a run: every model consumed everything (no run needed)
    REACHED_NOW = "reached now"  # the run's window reached now with every model in it
    NO_DATA_AHEAD = "no data ahead"  # the run moved nothing and no usable row waits before now
    GAP = "gap"  # the run moved nothing but data resumes later: a gap longer than B (stop)
    BEHIND = "behind"  # run again


@dataclass(frozen=True)
class LakeState:
    """Before a run: what the Delta log and the manifest say (no data read)."""

    models: tuple[str, ...]
    states: Mapping[str, ConsumedState]
    version: int | None  # filtered_events' current version
    newest_session_tstamp: dt.datetime | None  # from the Delta log's file statistics
    # the latest version that changed data (None: `version`); later ones are OPTIMIZE, VACUUM...
    data_version: int | None = None


@dataclass(frozen=True)
class LastRun:
    """After a run: what its outcome says."""

    limits: RunLimits
    every_model_in_window: bool  # no model skipped the window (each ran or found no data)
    manifest_changed: bool  # some model's manifest row moved
    # the window the manifest after this run gives the next run (None: not known)
    next_limits: RunLimits | None = None

    @property
    def next_run_repeats(self) -> bool:
        """The next run would take this run's window again: the manifest moved only in what
        does not decide the window (consumed version, processed_through), so a repeat would
        re-read the same rows and write the same ones."""
        return self.next_limits is not None and self.next_limits == self.limits


@dataclass(frozen=True)
class CatchUp:
    """A verdict and the sentence that explains it (for `nothing new` and `gap`)."""

    verdict: Verdict
    message: str | None = None

    @property
    def caught_up(self) -> bool:
        return self.verdict in (Verdict.NOTHING_NEW, Verdict.REACHED_NOW, Verdict.NO_DATA_AHEAD)

    @property
    def stopped(self) -> bool:
        """Not caught up, and another run would not move either (the gap)."""
        return self.verdict == Verdict.GAP


def caught_up(
    now: dt.datetime,
    seen: LakeState | LastRun,
    resumes_at: Callable[[], dt.datetime | None] | None = None,
) -> CatchUp:
    """Are the session models caught up to `now`? The one rule the CLI, the sensor and the asset use.

    | seen | when | verdict |
    |---|---|---|
    | the lake, before a run | `nothing_new` gives a reason | nothing new |
    | the lake, before a run | otherwise | behind |
    | a run | its window reached now and no model skipped it | reached now |
    | a run | it moved nothing, and no usable row lies after its window up to now | no data ahead |
    | a run | it moved nothing, but data resumes after its window before now | gap |
    | a run | otherwise | behind |

    A run "moved nothing" when it changed no manifest row, or changed them only so that the next
    run would take the same window again (`LastRun.next_run_repeats`): no `last_success` moved.
    Such a repeat would read the same rows and write what this run wrote, so it is not run (a
    run whose new rows were all late, inside a window short of now, used to be followed by one).
    `resumes_at()` (the earliest usable session timestamp after the window, None: none; it reads
    data) is called only for a run that moved nothing and did not reach now.
    """
    now = as_utc(now)
    if isinstance(seen, LakeState):
        reason = nothing_new(
            seen.models, seen.states, seen.version, seen.newest_session_tstamp, seen.data_version
        )
        return CatchUp(Verdict.NOTHING_NEW, reason) if reason else CatchUp(Verdict.BEHIND)
    limits = seen.limits
    if limits.reaches(now) and seen.every_model_in_window:
        return CatchUp(Verdict.REACHED_NOW)
    if seen.manifest_changed and not seen.next_run_repeats:
        return CatchUp(Verdict.BEHIND)
    if resumes_at is None:
        raise ValueError("caught_up needs resumes_at for a run that moved nothing")
    resumes = resumes_at()
    if resumes is None or as_utc(resumes) > now:
        return CatchUp(
            Verdict.NO_DATA_AHEAD
        )  # nothing newer is waiting (or only future-dated rows)
    return CatchUp(
        Verdict.GAP,
        f"no data between {format_tstamp(limits.lower_limit)} and "
        f"{format_tstamp(limits.upper_limit)} but data resumes at {format_tstamp(resumes)}: the "
        "gap is longer than backfill_limit_days (Snowplow waits here too); raise "
        "backfill_limit_days to bridge it",
    )
