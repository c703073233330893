"""The time-based branch driven from code (the CLI's run / backfill / verify / status): the
imperative shell around the assets, through `dagster.materialize` on the instance passed in, so the
runs are recorded where the UI shows them."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from sessionize_assets.core import aggregates as agg
from sessionize_assets.core import attributes as attrs
from sessionize_assets.core import filtering
from sessionize_assets.core.cursor import advance
from sessionize_assets.core.load_windows import (
    RunPlan,
    backfill_cursor,
    backfill_windows,
    contiguous_ranges,
)
from sessionize_assets.core.planning import (
    days_between,
    finish_due,
    last_started_day,
    load_day_runs,
    next_load_days,
    ready_event_days,
    redo_cascade,
)
from sessionize_assets.core.schema import EVENT_DATE, LOAD_DATE
from sessionize_assets.resources.dead_runs import run_tags
from sessionize_assets.resources.delta import read_table
from sessionize_assets.resources.tables import ATTRIBUTES, DAILY_AGGREGATES, FILTERED_EVENTS
from sessionize_assets.settings import Settings
from sessionize_assets.time_based import definitions
from sessionize_assets.time_based.state import TimeBasedState, read_state
from sessionize_assets.time_based.tables import TimeBasedTables

if TYPE_CHECKING:  # Dagster is imported only when a run is launched (a no-op launches none)
    from dagster import DagsterInstance

    from sessionize_assets.lake import LakeAccess


def _fmt(days: Sequence[dt.date]) -> str:
    ranges = contiguous_ranges(days, 10**6)
    return ", ".join(a.isoformat() if a == b else f"{a}..{b}" for a, b in ranges) or "none"


def _downstream_lines(report: Any, always_event_days: bool) -> list[str]:
    """What a report's load days led to: later load days redone, event days aggregated (the line
    even when none, with `always_event_days`), event days waiting, attributes."""
    out = []
    if report.reached:
        out.append(
            f"  Later load days redone (their duplicates were reached): {_fmt(report.reached)}"
        )
    if report.event_days or always_event_days:
        out.append(f"  daily_aggregates (re)computed for event days: {_fmt(report.event_days)}")
    if report.waiting:
        out.append(
            f"  Event days decided but not yet partitions (clock skew): {_fmt(report.waiting)}"
        )
    if report.attributes:
        out.append("  attributes and daily_aggregation_manifest recomputed.")
    return out


# What a time-based run recomputes once its load days and event days are done.
FINISHED = ("attributes", "daily_aggregation_manifest")


class _Runner:
    """Materializes the planner's runs (`core.planning`) on one instance, as the sensors' run
    requests would: the same assets, partitions and lane tag."""

    def __init__(
        self,
        lake: LakeAccess,
        instance: DagsterInstance | Callable[[], DagsterInstance],
        tags: Mapping[str, str] | None = None,
        whole: bool = False,
        start_spark: Callable[[], object] | None = None,
    ) -> None:
        self.lake = lake
        self.settings = lake.settings
        # The instance, or a function opening it: opened on the first run, so a command with
        # nothing to do neither opens the home's run storage nor builds the assets.
        self._instance = instance
        self._definitions: tuple[list, dict] | None = None
        self.run_ids: list[str] = []
        self._state: tuple[int, TimeBasedState] | None = None
        self.tags = dict(tags or {})
        # A refresh: each step's days in one run (not backfill_limit_days per run), so each table
        # changes in one commit and readers see the old table until then.
        self.whole = whole
        # Called before each run (the command's session starts once, on the first): a command
        # with nothing to do starts no Spark.
        self.start_spark = start_spark

    @property
    def instance(self) -> DagsterInstance:
        if callable(self._instance):
            self._instance = self._instance()
        return self._instance

    def definitions(self) -> tuple[list, dict]:
        """The assets and checks the runs select from, and their resources (built once)."""
        if self._definitions is None:
            from sessionize_assets.checks import build_checks
            from sessionize_assets.definitions import build_assets
            from sessionize_assets.resources.spark_resource import SparkDeltaResource

            # The checks run in the runs that materialize their assets, as in the UI and the
            # sensors' jobs: no_duplicate_event_ids with each load-day run (on those load days),
            # accounting_invariant (blocking) with each daily_aggregates run.
            assets = [*build_assets(self.settings), *build_checks(self.settings)]
            resources = {
                "lake": self.lake.resource(),
                "spark": SparkDeltaResource(spark_config=dict(self.settings.spark)),
            }
            self._definitions = (assets, resources)
        return self._definitions

    def run(
        self,
        selection: Sequence[str],
        first: dt.date | None = None,
        last: dt.date | None = None,
        run_config: dict | None = None,
    ) -> str:
        from dagster import materialize

        from sessionize_assets.checks import (
            ASSET_PARTITION_RANGE_END_TAG,
            ASSET_PARTITION_RANGE_START_TAG,
        )
        from sessionize_assets.jobs import TIME_BASED_LANE

        tags = {**TIME_BASED_LANE, **run_tags(), **self.tags}
        partition_key = None
        if first is not None and last is not None and first != last:
            tags |= {
                ASSET_PARTITION_RANGE_START_TAG: first.isoformat(),
                ASSET_PARTITION_RANGE_END_TAG: last.isoformat(),
            }
        elif first is not None:
            partition_key = first.isoformat()
        if self.start_spark is not None:
            self.start_spark()
        assets, resources = self.definitions()
        result = materialize(
            assets,
            selection=list(selection),
            partition_key=partition_key,
            instance=self.instance,
            resources=resources,
            tags=tags,
            run_config=run_config,
        )
        self.run_ids.append(result.run_id)
        return result.run_id

    def state(self) -> TimeBasedState:
        """The branch's state (`read_state`), read again only after a run of this runner: a
        `run` with nothing to do reads it once, not once per planning step (the no-op run's
        three reads of its tables were about a second)."""
        if self._state is None or self._state[0] != len(self.run_ids):
            self._state = (len(self.run_ids), read_state(_tables(self.lake)))
        return self._state[1]

    def load_days(self, days: Sequence[dt.date], refilter: set[dt.date]) -> None:
        """The load days' runs (`planning.load_day_runs`), ascending."""
        for run in load_day_runs(days, refilter, self._run_days(days)):
            self.run(run.assets, run.first, run.last)

    def event_days(
        self, days: Sequence[dt.date], all_loaded_rows: bool = False, finish: bool = False
    ) -> bool:
        """daily_aggregates of `days`. A whole run also recomputes the event days between them,
        which are not outstanding: from the same rows and horizons, to the same rows.
        `finish`: the last of these runs also materializes what `finish` does (one Dagster run
        fewer; its assets run after daily_aggregates and its blocking check, as in a run of
        their own after it). True when it did (there was a run to add them to)."""
        config = {"ops": {"daily_aggregates": {"config": {"all_loaded_rows": all_loaded_rows}}}}
        ranges = (
            [(min(days), max(days))]
            if self.whole and days
            else contiguous_ranges(days, self.settings.backfill_limit_days)
        )
        for i, (first, last) in enumerate(ranges):
            last_run = finish and i == len(ranges) - 1
            selection = ("daily_aggregates", *(FINISHED if last_run else ()))
            self.run(selection, first, last, run_config=config)
        return finish and bool(ranges)

    def _run_days(self, days: Sequence[dt.date]) -> int:
        """At most this many partitions per run."""
        if self.whole and days:
            return (max(days) - min(days)).days + 1
        return self.settings.backfill_limit_days

    def finish(self) -> None:
        self.run(FINISHED)


def _tables(lake: LakeAccess) -> TimeBasedTables:
    return TimeBasedTables.at(lake.table)


def _aggregate_outstanding(
    runner: _Runner, today: dt.date, finish: bool = False
) -> tuple[list[dt.date], list[dt.date], bool]:
    """Materialize every outstanding event day that is a partition; (done, waiting, finished).
    `finish`: attributes and daily_aggregation_manifest with the last of them, when
    daily_aggregates exists already (then `finish_due` holds after any event day's run);
    `finished` says whether they ran."""
    state = runner.state()
    ready, waiting = ready_event_days(state.outstanding(), today)
    finished = runner.event_days(
        ready, finish=finish and state.daily_aggregates_version is not None
    )
    return ready, waiting, finished


def _redo_reached(
    runner: _Runner,
    processed: Sequence[dt.date],
    left_for_later: set[dt.date],
    latest: dt.date,
) -> list[dt.date]:
    """Redo the later, processed load days that a change to `processed` reached through
    duplicates, and what those redos reach in turn (`planning.redo_cascade`)."""
    settings = runner.settings
    read: list[TimeBasedState] = []  # the state each round read, which its redo uses too

    def pending_now() -> list[dt.date]:
        read[:] = [runner.state()]
        return read[0].pending_load_days(settings.start_date)

    def redo(days: list[dt.date]) -> None:
        runner.load_days(days, set(read[0].pending_filtered()))

    return redo_cascade(
        pending_now, redo, processed, left_for_later, settings.dedupe_lookback_days, latest
    )


# ------------------------------------------------------------------------------------- run


@dataclass
class TimeBasedRunReport:
    """What `run` did for the time-based branch."""

    plan: RunPlan
    load_days: list[dt.date] = field(default_factory=list)
    reached: list[dt.date] = field(default_factory=list)
    event_days: list[dt.date] = field(default_factory=list)
    waiting: list[dt.date] = field(default_factory=list)
    attributes: bool = False
    run_ids: list[str] = field(default_factory=list)

    @property
    def state(self) -> str:
        return self.plan.window.state.value

    @property
    def window(self) -> tuple[dt.datetime, dt.datetime]:
        return self.plan.window.start, self.plan.window.end

    @property
    def nothing_to_do(self) -> bool:
        return not (self.load_days or self.event_days or self.attributes)

    def lines(self) -> list[str]:
        out = ["Time-based branch:", *("  " + line for line in self.plan.lines())]
        out += _downstream_lines(self, always_event_days=False)
        out.append(f"  Dagster runs: {len(self.run_ids)}")
        return out


def run_time_based(
    lake: LakeAccess,
    spark: SparkSession | None,
    instance: DagsterInstance | Callable[[], DagsterInstance],
    start_spark: Callable[[], object] | None = None,
) -> TimeBasedRunReport:
    """Process what is pending, as the sensors would, within the run limits: the pending load days
    in order (at most backfill_limit_days + 1), then the event days they decided, then attributes.

    `spark` is the session the runs share (the assets get it through the `spark` resource);
    `start_spark`, when given instead, starts it before the first run (a run with nothing to do
    starts none). `instance` may be a function opening the instance, called before the first
    run only.
    """
    del spark  # the SparkDeltaResource reuses the process's active session
    settings, now = lake.settings, lake.current_time()
    definitions.refuse_changed(_tables(lake).definitions, settings)
    runner = _Runner(lake, instance, start_spark=start_spark)
    state = runner.state()
    pending = state.pending_load_days(settings.start_date)
    plan, _ = next_load_days(
        state.load_window(settings, now), pending, settings.backfill_limit_days, now
    )
    report = TimeBasedRunReport(plan=plan)
    # Pending days this run does not take (run limits) stay for the next run, even if reached.
    left_for_later = set(pending) - set(plan.load_days)
    runner.load_days(plan.load_days, set(state.pending_filtered()))
    report.load_days = list(plan.load_days)
    report.reached = _redo_reached(runner, plan.load_days, left_for_later, last_started_day(now))
    report.event_days, report.waiting, finished = _aggregate_outstanding(
        runner, now.date(), finish=True
    )
    state = runner.state()
    changed = bool(report.load_days or report.event_days)
    if not finished and finish_due(
        state.daily_aggregates_version is not None, changed, state.attributes_stale(now.date())
    ):
        runner.finish()
        finished = True
    report.attributes = finished
    report.run_ids = runner.run_ids
    return report


# -------------------------------------------------------------------------------- backfill


@dataclass
class TimeBasedBackfillReport:
    """What `backfill --start --end` did for the time-based branch."""

    start: dt.date
    end: dt.date
    load_day_runs: list[tuple[dt.date, dt.date]] = field(default_factory=list)
    resumed_at: dt.datetime | None = None
    reached: list[dt.date] = field(default_factory=list)
    event_days: list[dt.date] = field(default_factory=list)
    waiting: list[dt.date] = field(default_factory=list)
    attributes: bool = False
    run_ids: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        out = [f"Time-based backfill of load days {self.start} .. {self.end} (inclusive):"]
        if self.resumed_at is not None:
            out.append(
                f"  Resuming an interrupted backfill: load days before {self.resumed_at.date()} "
                "were completed and checkpointed by an earlier run (`--restart` redoes them)."
            )
        for first, last in self.load_day_runs:
            out.append(
                f"  filtered_events + days_to_process re-materialized for {_fmt(days_between(first, last))}"
            )
        out += _downstream_lines(self, always_event_days=True)
        out.append(
            f"  Dagster runs: {len(self.run_ids)} (at most backfill_limit_days partitions each)"
        )
        return out


def backfill_time_based(
    start: dt.date,
    end: dt.date,
    lake: LakeAccess,
    spark: SparkSession | None,
    instance: DagsterInstance,
    cursor: dt.datetime | None = None,
    checkpoint: Callable[[dt.datetime, str | None], Any] | None = None,
    refresh: bool = False,
    whole: bool = False,
) -> TimeBasedBackfillReport:
    """Re-materialize load days start .. end (inclusive) and everything they affect downstream:
    later load days their duplicates reach, the event days they decide, attributes.

    The load days are cursor windows (`core.load_windows.backfill_cursor`: one Dagster run of at
    most backfill_limit_days days each); after each window `checkpoint(cursor, run_id)` is called,
    and a backfill given the `cursor` of an interrupted one resumes at its first unfinished window.
    `refresh`: the runs rebuild under settings that changed since the models were built
    (`sessionize refresh`); otherwise such a change refuses the backfill. `whole`: one run per
    step for the whole range, whatever backfill_limit_days says (a refresh: each table changes in
    one commit).
    """
    del spark
    settings, now = lake.settings, lake.current_time()
    if end < start:
        raise ValueError(f"end {end} is before start {start}")
    if not refresh:
        definitions.refuse_changed(_tables(lake).definitions, settings)
    first = max(start, settings.start_date)
    report = TimeBasedBackfillReport(start=start, end=end)
    runner = _Runner(
        lake, instance, {definitions.REFRESH_TAG: "true"} if refresh else None, whole=whole
    )
    if first > end:
        config, windows = None, []
    else:
        per_run = (end - first).days + 1 if whole else settings.backfill_limit_days
        config = backfill_cursor(first, end, per_run)
        windows = backfill_windows(config, cursor, now)
    if cursor is not None and config is not None and cursor > config.start:
        report.resumed_at = cursor
    for window, days in windows:
        runner.load_days(days, set(days))
        report.load_day_runs.append((days[0], days[-1]))
        cursor = advance(cursor, window)
        if checkpoint is not None:
            checkpoint(cursor, runner.run_ids[-1] if runner.run_ids else None)
    last = min(end, now.date())
    if config is not None and first <= last:
        # The cascade leaves the range's own days alone (a resumed backfill's finished windows
        # stay finished); the windows redid them in order, so none is reached again.
        report.reached = _redo_reached(
            runner, [first, last], set(days_between(first, last)), now.date()
        )
    report.event_days, report.waiting, _ = _aggregate_outstanding(runner, now.date())
    # A backfill always recomputes attributes and the manifest once daily_aggregates exists.
    if finish_due(read_state(_tables(lake)).daily_aggregates_version is not None, True, False):
        runner.finish()
        report.attributes = True
    report.run_ids = runner.run_ids
    return report


@dataclass
class TimeBasedRedoReport:
    """What re-materializing chosen load days did for the time-based branch (`forget`)."""

    load_days: list[dt.date] = field(default_factory=list)
    reached: list[dt.date] = field(default_factory=list)
    event_days: list[dt.date] = field(default_factory=list)
    waiting: list[dt.date] = field(default_factory=list)
    attributes: bool = False
    run_ids: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        out = [
            "Time-based branch:",
            f"  filtered_events + days_to_process re-materialized for {_fmt(self.load_days)}",
        ]
        out += _downstream_lines(self, always_event_days=True)
        out.append(f"  Dagster runs: {len(self.run_ids)}")
        return out


def redo_load_days_time_based(
    days: Sequence[dt.date], lake: LakeAccess, instance: DagsterInstance
) -> TimeBasedRedoReport:
    """Re-materialize exactly `days` (not the days between them) and what they affect: later load
    days their duplicates reach, the event days they decide, attributes. `forget` uses it after
    deleting rows from those load days of `events`."""
    now = lake.current_time()
    runner = _Runner(lake, instance)
    report = TimeBasedRedoReport(load_days=sorted(days))
    if report.load_days:
        runner.load_days(report.load_days, set(report.load_days))
        # A day of `days` reached again by a redo between them is redone again (`redo_cascade`).
        report.reached = _redo_reached(runner, report.load_days, set(), now.date())
    report.event_days, report.waiting, _ = _aggregate_outstanding(runner, now.date())
    state = read_state(_tables(lake))
    if finish_due(state.daily_aggregates_version is not None, bool(report.load_days), False):
        runner.finish()
        report.attributes = True
    report.run_ids = runner.run_ids
    return report


# ---------------------------------------------------------------------------------- verify


@dataclass(frozen=True)
class VerifyCheck:
    """One check of a table and the differences it found (each in words)."""

    table: str
    name: str  # "accounting", "duplicates", "recompute"
    differences: tuple[str, ...] = ()


@dataclass
class TimeBasedVerifyReport:
    """Differences between the stored tables and a recompute, and what is pending (not a difference)."""

    checks: list[VerifyCheck] = field(default_factory=list)
    pending_rows: dict[str, int] = field(default_factory=dict)
    pending_load_days: list[dt.date] = field(default_factory=list)
    event_days_checked: int = 0

    @property
    def differences(self) -> list[str]:
        return [d for check in self.checks for d in check.differences]

    @property
    def ok(self) -> bool:
        return not self.differences

    def lines(self) -> list[str]:
        out = [
            f"Time-based branch: {self.event_days_checked} event days checked, "
            f"{len(self.differences)} difference(s)."
        ]
        out += [f"  DIFFERENCE {d}" for d in self.differences]
        if self.pending_rows:
            out.append(
                f"  Pending (not a difference): {sum(self.pending_rows.values())} rows in "
                f"{len(self.pending_rows)} event days: "
                + ", ".join(f"{d}: {n}" for d, n in sorted(self.pending_rows.items()))
            )
        if self.pending_load_days:
            out.append(
                f"  Load days not processed yet (not a difference): {_fmt(self.pending_load_days)}"
            )
        return out


def _compare(stored: DataFrame, recomputed: DataFrame, key: str) -> dict:
    """{key value: (rows only in stored, rows only in the recompute)} where they differ."""
    a, b = agg.comparable(stored), agg.comparable(recomputed.select(*stored.columns))
    return {
        r[key]: (int(r["only_stored"]), int(r["only_recomputed"]))
        for r in agg.multiset_differences(a, b, key).collect()
    }


def verify_time_based(lake: LakeAccess, spark: SparkSession) -> TimeBasedVerifyReport:
    """Recompute filtered_events, each event day of daily_aggregates up to its horizon and
    attributes from scratch (in memory: nothing in the lake is written), compare row by row, and
    check the accounting invariant. Pending rows are reported, not treated as differences."""
    from sessionize_assets.checks import accounting_invariant, duplicates_in_filtered_events

    settings, tables = lake.settings, _tables(lake)
    state = read_state(tables)
    report = TimeBasedVerifyReport(pending_load_days=state.pending_load_days(settings.start_date))
    accounting = [f"accounting: {d}" for d in accounting_invariant(tables)]
    duplicates = [
        f"filtered_events: {d}"
        for d in duplicates_in_filtered_events(
            spark, tables, settings.dedupe_lookback_days, configured=settings.spark
        )
    ]
    aggregates, attributes = _verify_aggregates_and_attributes(
        spark, tables, settings, state, lake.current_time().date()
    )
    report.checks = [
        VerifyCheck(DAILY_AGGREGATES, "accounting", tuple(accounting)),
        VerifyCheck(FILTERED_EVENTS, "duplicates", tuple(duplicates)),
        VerifyCheck(
            FILTERED_EVENTS,
            "recompute",
            tuple(_verify_filtered_events(spark, tables, settings, state)),
        ),
        VerifyCheck(DAILY_AGGREGATES, "recompute", tuple(aggregates)),
        VerifyCheck(ATTRIBUTES, "recompute", tuple(attributes)),
    ]
    for row in state.manifest():
        if row.pending:
            report.pending_rows[row.event_date.isoformat()] = row.pending
    report.event_days_checked = len(state.manifest())
    return report


def _verify_filtered_events(
    spark: SparkSession, tables: TimeBasedTables, settings: Settings, state: TimeBasedState
) -> list[str]:
    """filtered_events of every processed, up-to-date load day equals a recompute from events."""
    current = sorted(set(state.accounting) - set(state.pending_filtered()))
    events, stored = read_table(spark, tables.events), read_table(spark, tables.filtered_events)
    if not current or events is None or stored is None:
        return []
    rows = events.filter(F.col(LOAD_DATE).isin(current))
    marked = filtering.mark_rows(
        rows,
        events,
        settings.dedupe_lookback_days,
        settings.app_ids,
        settings.event_names,
        settings.start_date,
    )
    key_cols = [LOAD_DATE, EVENT_DATE, "event_id", "_row_hash"]
    recomputed = filtering.kept_rows(marked).select(*key_cols)
    mine = stored.filter(F.col(LOAD_DATE).isin(current)).select(*key_cols)
    return [
        f"filtered_events load day {day}: {a} stored rows not in a recompute, {b} recomputed rows not stored"
        for day, (a, b) in sorted(_compare(mine, recomputed, LOAD_DATE).items())
    ]


def _verify_aggregates_and_attributes(
    spark: SparkSession,
    tables: TimeBasedTables,
    settings: Settings,
    state: TimeBasedState,
    today: dt.date,
) -> tuple[list[str], list[str]]:
    """(daily_aggregates' differences, attributes' differences) from a recompute."""
    out: list[str] = []
    stored = read_table(spark, tables.daily_aggregates)
    filtered = read_table(spark, tables.filtered_events)
    if stored is None or filtered is None:
        return out, []
    horizons = {d: a.horizon for d, a in state.aggregated.items() if a.horizon is not None}
    recorded = {
        r[EVENT_DATE]: r["h"]
        for r in stored.groupBy(EVENT_DATE).agg(F.max("_horizon_load_date").alias("h")).collect()
    }
    for day, horizon in sorted(recorded.items()):
        if horizons.get(day) != horizon:
            out.append(
                f"daily_aggregates {day}: rows say horizon {horizon}, daily_aggregate_horizons says {horizons.get(day)}"
            )
    horizon_df = spark.createDataFrame(
        sorted(horizons.items()), f"{EVENT_DATE} date, _horizon_load_date date"
    )
    rows = filtered.join(F.broadcast(horizon_df), on=EVENT_DATE).filter(
        F.col(LOAD_DATE) <= F.col("_horizon_load_date")
    )
    # Kept: compared here, then the input of the attributes' recompute (one aggregation of
    # filtered_events instead of two; the aggregates are a small fraction of its rows).
    recomputed = agg.daily_aggregates(rows, settings.user_identifier, settings.attributes).persist()
    try:
        for day, (a, b) in sorted(
            _compare(stored.select(*recomputed.columns), recomputed, EVENT_DATE).items()
        ):
            out.append(
                f"daily_aggregates {day}: {a} stored rows differ from a recompute up to horizon "
                f"{horizons.get(day)} ({b} recomputed rows not stored)"
            )
        return out, _attribute_differences(spark, tables, settings, state, today, recomputed)
    finally:
        recomputed.unpersist()


def _attribute_differences(
    spark: SparkSession,
    tables: TimeBasedTables,
    settings: Settings,
    state: TimeBasedState,
    today: dt.date,
    daily: DataFrame,
) -> list[str]:
    """attributes' differences from a recompute over `daily` (the recomputed daily_aggregates)."""
    stored_attributes = read_table(spark, tables.attributes)
    if stored_attributes is None:
        return ["attributes: the table does not exist although daily_aggregates does"]
    as_of_text = state.attributes_source.get("as_of")
    as_of = dt.date.fromisoformat(as_of_text) if as_of_text else today
    expected = attrs.attributes(daily, as_of, settings.attribute_windows_days, settings.attributes)
    if sorted(expected.columns) != sorted(stored_attributes.columns):
        return [
            "attributes: columns differ from a recompute (settings changed since it was computed?)"
        ]
    diff = _compare(
        stored_attributes.withColumn("_all", F.lit(1)),
        expected.withColumn("_all", F.lit(1)),
        "_all",
    )
    return [
        f"attributes (as of {as_of}): {a} stored rows differ from a recompute ({b} recomputed rows not stored)"
        for _, (a, b) in diff.items()
    ]


# ---------------------------------------------------------------------------------- status


@dataclass
class TimeBasedStatusReport:
    """Run-limit state and window, pending and skipped days, event days awaiting aggregation."""

    plan: RunPlan
    pending_filtered: list[dt.date]
    pending_decisions: list[dt.date]
    outstanding: list[dt.date]
    manifest: list
    attributes_stale: bool

    def lines(self) -> list[str]:
        limits = self.plan.window
        out = [
            "Time-based branch:",
            f"  State: {limits.state.value}; next window [{limits.start.isoformat()}, {limits.end.isoformat()})",
            f"  Load days with new data for filtered_events: {_fmt(self.pending_filtered)}",
            f"  Load days whose days_to_process is behind: {_fmt(self.pending_decisions)}",
            f"  Next run takes load days: {_fmt(self.plan.load_days)}"
            + (f" (then {len(self.plan.deferred)} more wait)" if self.plan.deferred else ""),
            f"  Event days awaiting daily_aggregates: {_fmt(self.outstanding)}",
        ]
        pending = [r for r in self.manifest if r.pending]
        skipped = [r for r in self.manifest if r.rows_skipped_so_far]
        out.append(
            f"  Event days with pending rows: {len(pending)} ({sum(r.pending for r in pending)} rows)"
        )
        for r in pending:
            out.append(
                f"    {r.event_date}: {r.pending} pending, {r.rows_aggregated} aggregated, horizon "
                f"{r.horizon}, skipped so far {r.rows_skipped_so_far}"
            )
        out.append(
            f"  Event days with skipped rows so far: {len(skipped)} "
            f"({sum(r.rows_skipped_so_far for r in skipped)} rows)"
        )
        unaccounted = [r.event_date.isoformat() for r in self.manifest if not r.accounted]
        if unaccounted:
            out.append(
                f"  Event days whose aggregate is behind filtered_events: {', '.join(unaccounted)}"
            )
        if self.attributes_stale:
            out.append(
                "  attributes is older than daily_aggregates or today: the next run recomputes it."
            )
        return out


def status_time_based(lake: LakeAccess) -> TimeBasedStatusReport:
    """The branch's state from the lake (no Spark)."""
    settings, now = lake.settings, lake.current_time()
    state = read_state(_tables(lake))
    plan, _ = next_load_days(
        state.load_window(settings, now),
        state.pending_load_days(settings.start_date),
        settings.backfill_limit_days,
        now,
    )
    return TimeBasedStatusReport(
        plan=plan,
        pending_filtered=state.pending_filtered(),
        pending_decisions=state.pending_decisions(),
        outstanding=sorted(state.outstanding()),
        manifest=state.manifest(),
        attributes_stale=state.attributes_stale(now.date()),
    )
