"""Snowplow's four package states and run limits (seed 000), as a table of cases."""

from __future__ import annotations

import datetime as dt

import pytest

from sessionize_assets.core.run_limits import (
    ConsumedState,
    LakeState,
    LastRun,
    PackageState,
    Verdict,
    caught_up,
    format_tstamp,
    next_last_success,
    nothing_new,
    restated,
    run_limits,
    skips_window,
)

START = dt.date(2021, 1, 1)
NOW = dt.datetime(2022, 1, 1, tzinfo=dt.UTC)
MODELS = ("sessions", "users")


def t(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text).replace(tzinfo=dt.UTC)


# (case, manifest, enabled models, now, expected state, lower, upper); B = 30 days, L = 6 hours.
CASES = [
    ("first run", {}, MODELS, NOW, PackageState.FIRST_RUN, "2021-01-01", "2021-01-31"),
    (
        "first run capped by now",
        {},
        MODELS,
        t("2021-01-10 12:00"),
        PackageState.FIRST_RUN,
        "2021-01-01",
        "2021-01-10 12:00",
    ),
    (
        "new model",
        {"sessions": t("2021-03-01"), "users": t("2021-03-01")},
        ("sessions", "users", "user_session_stats"),
        NOW,
        PackageState.NEW_MODEL,
        "2021-01-01",
        "2021-01-31",
    ),
    (
        "new model behind the backfill limit",
        {"sessions": t("2021-01-10"), "users": t("2021-01-10")},
        ("sessions", "users", "user_session_stats"),
        NOW,
        PackageState.NEW_MODEL,
        "2021-01-01",
        "2021-01-10",
    ),
    (
        "out of sync, close",
        {"sessions": t("2021-03-05"), "users": t("2021-03-01")},
        MODELS,
        NOW,
        PackageState.OUT_OF_SYNC,
        "2021-02-28 18:00",
        "2021-03-05",
    ),
    (
        "out of sync, far",
        {"sessions": t("2021-05-01"), "users": t("2021-03-01")},
        MODELS,
        NOW,
        PackageState.OUT_OF_SYNC,
        "2021-02-28 18:00",
        "2021-03-31",
    ),
    (
        "standard",
        {"sessions": t("2021-03-01"), "users": t("2021-03-01")},
        MODELS,
        NOW,
        PackageState.STANDARD,
        "2021-02-28 18:00",
        "2021-03-31",
    ),
    (
        "standard capped by now",
        {"sessions": t("2021-03-01"), "users": t("2021-03-01")},
        MODELS,
        t("2021-03-02 09:30"),
        PackageState.STANDARD,
        "2021-02-28 18:00",
        "2021-03-02 09:30",
    ),
    (
        "disabled model rows are ignored",
        {
            "sessions": t("2021-03-01"),
            "users": t("2021-03-01"),
            "user_session_stats": t("2021-01-05"),
        },
        MODELS,
        NOW,
        PackageState.STANDARD,
        "2021-02-28 18:00",
        "2021-03-31",
    ),
]


@pytest.mark.parametrize(
    ("manifest", "models", "now", "state", "lower", "upper"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_states_and_limits(manifest, models, now, state, lower, upper):
    limits = run_limits(
        manifest, models, START, backfill_limit_days=30, lookback_window_hours=6, now=now
    )
    assert limits.state == state
    assert limits.lower_limit == t(lower)
    assert limits.upper_limit == t(upper)
    assert limits.models_in_manifest == len([m for m in models if m in manifest])


def test_log_lines_use_snowplows_words():
    first = run_limits({}, MODELS, START, 30, 6, NOW)
    assert first.log_lines() == [
        "Snowplow: No data in manifest. Processing data from start_date",
        "Snowplow: Processing data between 2021-01-01 00:00:00 and 2021-01-31 00:00:00",
    ]
    new = run_limits({"sessions": t("2021-03-01")}, MODELS, START, 30, 6, NOW)
    assert new.state_message == "Snowplow: New Snowplow incremental model. Backfilling"
    sync = run_limits(
        {"sessions": t("2021-03-02"), "users": t("2021-03-01")}, MODELS, START, 30, 6, NOW
    )
    assert sync.state_message == "Snowplow: Snowplow incremental models out of sync. Syncing"
    standard = run_limits(
        {"sessions": t("2021-01-07 05:59:32"), "users": t("2021-01-07 05:59:32")},
        MODELS,
        START,
        2,
        12,
        NOW,
    )
    assert standard.log_lines() == [
        "Snowplow: Standard incremental run",
        "Snowplow: Processing data between 2021-01-06 17:59:32 and 2021-01-09 05:59:32",
    ]
    assert format_tstamp(t("2021-01-05 17:59:32.5")) == "2021-01-05 17:59:32.500000"


def test_a_model_already_past_the_window_skips_it():
    limits = run_limits(
        {"sessions": t("2021-03-01"), "users": t("2021-03-01")},
        ("sessions", "users", "user_session_stats"),
        START,
        30,
        6,
        NOW,
    )
    assert (limits.lower_limit, limits.upper_limit) == (t("2021-01-01"), t("2021-01-31"))
    assert skips_window(t("2021-03-01"), limits)
    assert skips_window(t("2021-01-31"), limits)  # at the upper limit: nothing left in the window
    assert not skips_window(t("2021-01-30 23:59"), limits)
    assert not skips_window(None, limits)


def test_a_restatement_starts_the_window_at_midnight_of_its_day_or_earlier():
    limits = run_limits(
        {"sessions": t("2021-01-08 12:00")}, ("sessions",), START, 30, 6, t("2021-01-09")
    )
    assert limits.lower_limit == t("2021-01-08 06:00")
    again = restated(limits, dt.date(2021, 1, 3))
    assert (again.lower_limit, again.upper_limit) == (t("2021-01-03"), limits.upper_limit)
    assert again.state == limits.state
    # A day after the window's start leaves the window as it is.
    assert restated(limits, dt.date(2021, 1, 8)).lower_limit == t("2021-01-08")
    assert restated(limits, dt.date(2021, 1, 9)) == limits


def test_last_success_moves_forward_only_and_only_on_success():
    before = t("2021-03-01")
    assert next_last_success(before, t("2021-03-04"), succeeded=True) == t("2021-03-04")
    assert next_last_success(before, t("2021-02-01"), succeeded=True) == before  # late data only
    assert next_last_success(before, t("2021-03-04"), succeeded=False) == before
    assert next_last_success(before, None, succeeded=True) == before  # no data found
    assert next_last_success(None, t("2021-01-02"), succeeded=True) == t("2021-01-02")
    assert next_last_success(None, t("2021-01-02"), succeeded=False) is None


def test_catching_up_reaches_now_window_by_window():
    """Replaying the limits run after run: each run starts where the last stopped, minus L."""
    manifest: dict[str, dt.datetime] = {}
    now = t("2021-03-15 10:00")
    windows = []
    for _ in range(10):
        limits = run_limits(manifest, MODELS, START, 30, 6, now)
        windows.append(limits)
        processed = limits.upper_limit  # data everywhere: the greatest timestamp is the upper limit
        manifest = {m: next_last_success(manifest.get(m), processed, True) for m in MODELS}
        if limits.reaches(now):
            break
    assert [w.state for w in windows] == [PackageState.FIRST_RUN] + [PackageState.STANDARD] * 2
    assert windows[1].lower_limit == t("2021-01-30 18:00")
    assert windows[-1].upper_limit == now


def test_needs_an_enabled_model():
    with pytest.raises(ValueError):
        run_limits({}, (), START, 30, 6, NOW)


# --- nothing new for the session models ---------------------------------------------------------


def _consumed(last: str, version: int | None, through: str | None) -> ConsumedState:
    return ConsumedState(
        dt.datetime.fromisoformat(last).replace(tzinfo=dt.UTC),
        version,
        dt.datetime.fromisoformat(through).replace(tzinfo=dt.UTC) if through else None,
    )


NEWEST = dt.datetime(2021, 3, 1, 9, tzinfo=dt.UTC)


@pytest.mark.parametrize(
    ("states", "version", "newest", "skip"),
    [
        # in sync, consumed v7, processed past the newest row: nothing to do
        ({"sessions": ("2021-03-01T09:00", 7, "2021-03-02"), "users": ("2021-03-01T09:00", 7, "2021-03-02")}, 7, NEWEST, True),
        # a commit not consumed yet (new rows, a deletion, a backfill)
        ({"sessions": ("2021-03-01T09:00", 6, "2021-03-02"), "users": ("2021-03-01T09:00", 7, "2021-03-02")}, 7, NEWEST, False),
        # a newly enabled model (state 2)
        ({"sessions": ("2021-03-01T09:00", 7, "2021-03-02")}, 7, NEWEST, False),
        # out of sync
        ({"sessions": ("2021-03-01T09:00", 7, "2021-03-02"), "users": ("2021-02-28T09:00", 7, "2021-03-02")}, 7, NEWEST, False),
        # rows beyond the last window (future-dated then, due now)
        ({"sessions": ("2021-03-01T09:00", 7, "2021-03-01T08:00"), "users": ("2021-03-01T09:00", 7, "2021-03-01T08:00")}, 7, NEWEST, False),
        # statistics unknown, or no table
        ({"sessions": ("2021-03-01T09:00", 7, "2021-03-02"), "users": ("2021-03-01T09:00", 7, "2021-03-02")}, 7, None, False),
        ({"sessions": ("2021-03-01T09:00", 7, "2021-03-02"), "users": ("2021-03-01T09:00", 7, "2021-03-02")}, None, NEWEST, False),
    ],
)  # fmt: skip
def test_nothing_new_only_when_every_model_consumed_everything(states, version, newest, skip):
    manifest = {m: _consumed(*values) for m, values in states.items()}
    reason = nothing_new(["sessions", "users"], manifest, version, newest)
    assert (reason is not None) == skip, reason
    if skip:
        assert "filtered_events v7" in reason and "no run" in reason


IN_SYNC_AT_7 = {
    "sessions": ("2021-03-01T09:00", 7, "2021-03-02"),
    "users": ("2021-03-01T09:00", 7, "2021-03-02"),
}


@pytest.mark.parametrize(
    ("version", "data_version", "skip"),
    [
        (9, 7, True),  # v8, v9: maintain's VACUUM START/END (no data): still nothing new
        (9, 8, False),  # v8 changed data, not consumed
        (9, 9, False),
        (6, 6, False),  # consumed a version the table no longer has (replaced): run
    ],
)
def test_commits_that_change_no_data_are_nothing_new(version, data_version, skip):
    manifest = {m: _consumed(*values) for m, values in IN_SYNC_AT_7.items()}
    reason = nothing_new(["sessions", "users"], manifest, version, NEWEST, data_version)
    assert (reason is not None) == skip, reason
    if skip:
        assert "consumed filtered_events v7 (v8..v9 changed no data)" in reason


# --- caught up? ---------------------------------------------------------------------------------

IN_SYNC = {
    "sessions": _consumed("2021-03-01T09:00", 7, "2021-03-02"),
    "users": _consumed("2021-03-01T09:00", 7, "2021-03-02"),
}
CATCH_UP_NOW = t("2021-03-15 10:00")
REACHING = run_limits(  # standard run, window up to now
    {m: t("2021-03-14") for m in MODELS}, MODELS, START, 30, 6, CATCH_UP_NOW
)
SHORT = run_limits({}, MODELS, START, 30, 6, CATCH_UP_NOW)  # first run: 2021-01-01 .. 01-31
NEVER = object()  # resumes_at must not be looked up
NEXT_WINDOW = run_limits(  # after SHORT moved last_success: a standard run's window
    {m: t("2021-01-20") for m in MODELS}, MODELS, START, 30, 6, CATCH_UP_NOW
)


@pytest.mark.parametrize(
    ("seen", "resumes", "verdict"),
    [
        # before a run: the lake says every model consumed everything
        (LakeState(MODELS, IN_SYNC, 7, NEWEST), NEVER, Verdict.NOTHING_NEW),
        # before a run: a commit not consumed yet
        (LakeState(MODELS, IN_SYNC, 8, NEWEST), NEVER, Verdict.BEHIND),
        # a run whose window reached now with every model in it
        (LastRun(REACHING, True, True), NEVER, Verdict.REACHED_NOW),
        (LastRun(REACHING, True, False), NEVER, Verdict.REACHED_NOW),
        # reached now but a model skipped the window (it is catching up): run again
        (LastRun(REACHING, False, True), NEVER, Verdict.BEHIND),
        # a window short of now that moved the manifest: run again
        (LastRun(SHORT, True, True), NEVER, Verdict.BEHIND),
        (LastRun(SHORT, True, True, NEXT_WINDOW), NEVER, Verdict.BEHIND),
        # ... unless the next run would take the same window again (no last_success moved):
        # that repeat is not run, and the run counts as having moved nothing
        (LastRun(SHORT, True, True, SHORT), None, Verdict.NO_DATA_AHEAD),
        (LastRun(SHORT, True, True, SHORT), t("2021-02-10 09:00"), Verdict.GAP),
        # a run that moved nothing: nothing after its window, or only future-dated rows
        (LastRun(SHORT, True, False), None, Verdict.NO_DATA_AHEAD),
        (LastRun(SHORT, True, False), t("2021-03-16"), Verdict.NO_DATA_AHEAD),
        (LastRun(REACHING, False, False), None, Verdict.NO_DATA_AHEAD),
        # ... but data resumes before now: a gap longer than backfill_limit_days
        (LastRun(SHORT, True, False), t("2021-02-10 09:00"), Verdict.GAP),
    ],
)  # fmt: skip
def test_caught_up(seen, resumes, verdict):
    def resumes_at():
        assert resumes is not NEVER, "resumes_at looked up when the verdict does not need it"
        return resumes

    got = caught_up(CATCH_UP_NOW, seen, resumes_at)
    assert got.verdict == verdict
    assert got.caught_up == (
        verdict in (Verdict.NOTHING_NEW, Verdict.REACHED_NOW, Verdict.NO_DATA_AHEAD)
    )
    assert got.stopped == (verdict == Verdict.GAP)
    if verdict == Verdict.NOTHING_NEW:
        assert "consumed filtered_events v7" in got.message
    if verdict == Verdict.GAP:
        assert got.message == (
            "no data between 2021-01-01 00:00:00 and 2021-01-31 00:00:00 but data resumes at "
            "2021-02-10 09:00:00: the gap is longer than backfill_limit_days (Snowplow waits here "
            "too); raise backfill_limit_days to bridge it"
        )


def test_caught_up_needs_resumes_at_when_nothing_moved():
    with pytest.raises(ValueError):
        caught_up(CATCH_UP_NOW, LastRun(SHORT, True, False))
    assert caught_up(CATCH_UP_NOW, LastRun(REACHING, True, True)).caught_up  # not needed here
