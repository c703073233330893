"""The time-based branch's Spark steps, callable without Dagster (the assets, the commands and the
tests call them): each reads Delta, calls the pure core (`core.filtering`, `core.late_days`,
`core.aggregates`, `core.attributes`), writes Delta and returns a `StepResult`.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from sessionize_assets import faults
from sessionize_assets.core import aggregates as agg
from sessionize_assets.core import attributes as attrs
from sessionize_assets.core import filtering
from sessionize_assets.core import sessionize as core_sessions
from sessionize_assets.core.clock import as_date, as_utc_or_none
from sessionize_assets.core.late_days import (
    aggregation_horizons,
    decide_load_days,
    decided_horizons,
    event_days_to_request,
    latest_process_decisions,
    rows_up_to_horizon,
)
from sessionize_assets.core.lateness import lateness_markdown, load_day_metadata
from sessionize_assets.core.schema import (
    EVENT_DATE,
    LOAD_DATE,
    STATISTICS_PROPERTY,
    statistics_columns,
)
from sessionize_assets.core.sessionize import user_key
from sessionize_assets.ingest.load_days import EMPTY_FINGERPRINT
from sessionize_assets.resources import delta, shared_reads
from sessionize_assets.resources.delta import (
    APPEND_FEATURES,
    DRIVER_WRITE_ROWS,
    add_actions,
    data_skipping_when_it_pays,
    delta_table,
    delta_version,
    distinct_values,
    driver_writable,
    exists,
    live_rows,
    local_arrow,
    local_frame,
    overwrite_from_driver,
    plain_protocol,
    read_pinned,
    read_version,
    replace_partitions,
    replace_partitions_from_driver,
    replace_small,
    rows_by_key,
    same_types,
    upsert_small,
)
from sessionize_assets.resources.spark import (
    arrow_frame,
    fetch_arrow,
    persist_compact,
    small_query_conf,
)
from sessionize_assets.sessions.frames import computed_once_rows
from sessionize_assets.settings import Settings
from sessionize_assets.time_based.state import (
    TimeBasedState,
    files_in,
    partition_counts,
    read_state,
    recorded_source,
    rows_in,
)
from sessionize_assets.time_based.tables import (
    ACCOUNTING_SCHEMA,
    DECISIONS_SCHEMA,
    DROP_COLUMNS,
    HORIZONS_SCHEMA,
    MANIFEST_SCHEMA,
    TimeBasedTables,
)

# At most this many load day rows (the Delta log's count), their ids needing a decision are
# found with the ids broadcast (`filtering.ids_needing_a_decision(few_load_day_rows=True)`) and
# fetched to the driver or kept in one partition per core. (Named CACHED_LOAD_DAY_ROWS until
# session 56, when it also decided that the load days' rows were cached at full width.)
FEW_LOAD_DAY_ROWS = 300_000
# At most this many ids needing a decision are broadcast from the driver (three narrow columns).
LOCAL_CARE_ROWS = 20_000

# `daily_aggregates` from up to this many rows (counted in the Delta log) is aggregated by Spark
# and fetched, at most DRIVER_WRITE_ROWS rows of it, for the driver's write: a (user, day) row
# stands for many events (the 30 x 200,000 benchmark's day: about 394,000 rows aggregated into
# tens of thousands), and a Spark write of them plans and commits through Delta's transaction.
# More aggregated rows than that: Spark writes them (the aggregation runs again, on rows kept).
DRIVER_AGGREGATE_ROWS = 2_000_000


@dataclass
class StepResult:
    """What a step did: metadata for Dagster and facts for the commands' reports."""

    metadata: dict[str, Any] = field(default_factory=dict)
    used_spark: bool = False
    facts: dict[str, Any] = field(default_factory=dict)
    # Each partition's own numbers (partition key -> label -> number), labelled as a run of that
    # partition alone labels them, so the UI plots one curve whatever the run's size.
    per_partition: dict[str, dict[str, float]] = field(default_factory=dict)


def _limits_metadata(state: TimeBasedState, settings: Settings, now: dt.datetime) -> dict[str, Any]:
    """Where the run limits stand: the state and load window of the next scheduled run (`sessionize
    run` or the sensors at `now`), named so, since a backfill or a partition launched by hand
    processes other days (this run's own days are under `load days`)."""
    limits = state.load_window(settings, now)
    return {
        "next scheduled run: state": limits.state.value,
        "next scheduled run: load window": f"[{limits.start.isoformat()}, {limits.end.isoformat()})",
    }


def filtered_events_step(
    spark: SparkSession,
    tables: TimeBasedTables,
    settings: Settings,
    load_days: Sequence[dt.date],
    now: dt.datetime,
) -> StepResult:
    """Filter and deduplicate load days; replace exactly their rows; record the accounting
    (`_filtered_events`), with Delta's data skipping only where it pays."""
    with data_skipping_when_it_pays(spark, [tables.events, tables.filtered_events], settings.spark):
        return _filtered_events(spark, tables, settings, load_days, now)


def _filtered_events(
    spark: SparkSession,
    tables: TimeBasedTables,
    settings: Settings,
    load_days: Sequence[dt.date],
    now: dt.datetime,
) -> StepResult:
    """Filter and deduplicate load days; replace exactly their rows; record the accounting.

    Later load days (already materialized) that a change reaches through duplicates get their
    consumed fingerprint invalidated, so they show up as pending and are redone.
    """
    started = time.monotonic()
    days = sorted(set(load_days))
    state = read_state(tables)
    fingerprints = dict(state.events_fingerprints)  # read before the data: a newer load re-runs
    previous = state.accounting
    has_events = [d for d in days if d in fingerprints]
    had_rows = [d for d in days if d in previous]
    result = StepResult(metadata=_limits_metadata(state, settings, now))
    result.metadata["load days"] = ", ".join(d.isoformat() for d in days)
    if not has_events and not had_rows:
        result.metadata.update(
            {
                "rows read": 0,
                "rows written": 0,
                "note": "no data in these load days: done without a Spark job",
            }
        )
        result.metadata["time taken (s)"] = round(time.monotonic() - started, 3)
        result.facts = {"accounting": {}, "reached": []}
        return result

    n = settings.dedupe_lookback_days
    events_version = delta_version(tables.events)
    if events_version is None:
        raise RuntimeError(f"the events table at {tables.events} does not exist")
    # One version of `events` for every read below (the counts, the reach check and the write
    # must see the same rows), at or after the fingerprints read above.
    events_at = delta_table(tables.events, events_version)
    on_driver = _decisions_on_driver(spark, events_at, days, n)
    # The driver's few rows: the step's queries run with the small-query configuration (the
    # reach check's Spark read of `events` too, which it does not bound: plans only).
    with small_query_conf(spark, on_driver is not None):
        return _mark_and_write(
            spark,
            tables,
            settings,
            days,
            events_version,
            on_driver,
            state,
            fingerprints,
            result,
            started,
        )


def _mark_and_write(
    spark: SparkSession,
    tables: TimeBasedTables,
    settings: Settings,
    days: list[dt.date],
    events_version: int,
    on_driver: tuple[DataFrame, DataFrame, list[dt.date]] | None,
    state: TimeBasedState,
    fingerprints: dict[dt.date, str],
    result: StepResult,
    started: float,
) -> StepResult:
    """`_filtered_events` once it knows who decides: mark the load days' rows (with the
    driver's decisions when given, else reading `events` with Spark) and `_filter_and_write`
    them, every read of `events` at `events_version`."""
    n = settings.dedupe_lookback_days
    first, last = days[0] - dt.timedelta(days=n), days[-1] + dt.timedelta(days=n)
    level = StorageLevel.MEMORY_AND_DISK_DESER
    persisted: list[DataFrame] = []  # unpersisted when the step ends
    earlier: DataFrame | None = None
    to_mark = rows_in(tables.events, LOAD_DATE, days, events_version)  # from the Delta log
    if on_driver is not None:
        # Few load day rows: they and the look-back keys of their ids are read by the driver,
        # which decides which ids need a decision (`filtering.decisions_needed`); Spark reads
        # `events` only if a later load day's reach must be checked.
        rows, care, read_days = on_driver
        result.metadata["events read by"] = "the driver (delta-rs)"

        def events_of() -> DataFrame:
            return read_version(spark, tables.events, events_version)

    else:
        # Spark reads the window (a driver read of it would hold more rows than the load days').
        result.metadata["events read by"] = "Spark"
        events = read_version(spark, tables.events, events_version)
        read_days = [first + dt.timedelta(days=i) for i in range((last - first).days + 1)]
        # Marking reads the keys of the load days and their look-back days once (two columns,
        # one shuffle); the ids that need a decision are kept (a few percent of the keys). The
        # load days' rows are then read by the counts and the write, not cached (see below).
        window = events.filter(
            (F.col(LOAD_DATE) >= F.lit(first)) & (F.col(LOAD_DATE) <= F.lit(last))
        )
        rows = window.filter(F.col(LOAD_DATE).isin(days))
        earlier = window.filter(F.col(LOAD_DATE) < F.lit(days[-1]))
        few = to_mark is not None and to_mark <= FEW_LOAD_DAY_ROWS
        care = filtering.ids_needing_a_decision(
            rows, earlier, n, keys=filtering.window_keys(window, days), few_load_day_rows=few
        )
        # Few load day rows: the ids are fetched once and broadcast from the driver by the counts
        # and the write (no Spark job per broadcast), or, when there are many, kept in one
        # partition per core (a read of a cached result is one task per partition it was
        # computed in).
        if few:
            care, local = computed_once_rows(spark, care, LOCAL_CARE_ROWS, fetch_first=True)
        else:
            care, local = care.persist(level), None
        if local is None:
            persisted.append(care)
        result.metadata["ids needing a decision"] = (
            "cached by Spark" if local is None else "broadcast from the driver"
        )

        def events_of() -> DataFrame:
            return events

    marked = filtering.mark_rows(
        rows,
        earlier,
        n,
        app_ids=settings.app_ids,
        event_names=settings.event_names,
        start_date=settings.start_date,
        care=care,
    )
    if on_driver is not None:
        # Driver-local rows: kept in one partition per core while they are counted and written.
        marked = persist_compact(spark, marked, level)
        persisted.append(marked)
    # Read by Spark, the marked rows are not cached at full width: the counts read only the
    # columns the marking uses (the keys, the dedupe order, the filters' columns), and gather
    # the layout's sample too (`_filter_and_write`); the write reads them at full width.
    # Encoding ~200,000 rows of 46 columns into the cache cost more than those reads
    # (docs/benchmarks.md, "Session 56").
    try:
        return _filter_and_write(
            spark,
            tables,
            settings,
            days,
            marked,
            events_of,
            read_days,
            state,
            fingerprints,
            result,
            started,
            to_mark,
        )
    finally:
        for frame in persisted:
            frame.unpersist()


def _decisions_on_driver(
    spark: SparkSession,
    events: Any,
    days: Sequence[dt.date],
    dedupe_lookback_days: int,
) -> tuple[DataFrame, DataFrame, list[dt.date]] | None:
    """The load days' rows of the delta-rs `events` table (driver-local, full width), the
    ids among them that need a decision (`filtering.ids_needing_a_decision`'s rows, driver-local)
    and the load days read,
    decided by the driver from the load days' keys and the look-back keys that hold their ids:
    the `dedupe_lookback_days` load days before each processed day that are not processed
    here, read by delta-rs (`rows_by_key`), so Spark neither reads `events` nor shuffles a key.

    None when the load days hold more than LOCAL_READ_ROWS rows, delta-rs does not read them or
    the look-back keys (`local_arrow`, `rows_by_key`), or Spark refuses their Arrow columns:
    Spark marks the rows then."""
    if events is None:
        return None
    rows = local_arrow(events, partitions=(LOAD_DATE, days))
    if rows is None or "event_id" not in rows.column_names:
        return None
    last = max(days)
    # Each processed day's own look-back days (Spark's keys span first..last - 1: a held day
    # outside every look-back cannot make a copy seen, so the decisions are the same).
    look_back_days = sorted(
        {
            day - dt.timedelta(days=i)
            for day in days
            for i in range(1, dedupe_lookback_days + 1)
            if day - dt.timedelta(days=i) not in days
        }
    )
    held: pa.Table | None = pa.table({LOAD_DATE: pa.array([], pa.date32()), "event_id": []})
    read_days = sorted(days)
    if dedupe_lookback_days > 0 and look_back_days and rows.num_rows:
        read_days = sorted({*days, *look_back_days})
        held = rows_by_key(
            events,
            {"event_id": distinct_values(rows.column("event_id"))},
            columns=[LOAD_DATE, "event_id"],
            partitions=(LOAD_DATE, look_back_days),
        )
    if held is None:
        return None
    mine = zip(rows.column(LOAD_DATE).to_pylist(), rows.column("event_id").to_pylist(), strict=True)
    theirs = zip(
        held.column(LOAD_DATE).to_pylist(), held.column("event_id").to_pylist(), strict=True
    )
    decided = filtering.decisions_needed(
        [
            *((day, event_id, 1, int(day < last)) for day, event_id in mine),
            *((day, event_id, 0, 1) for day, event_id in theirs),
        ],
        dedupe_lookback_days,
    )
    care = pa.table(
        {
            LOAD_DATE: pa.array([d for d, _, _ in decided], pa.date32()),
            "event_id": pa.array([i for _, i, _ in decided], pa.string()),
            filtering.SEEN_BEFORE: pa.array([s for _, _, s in decided], pa.bool_()),
        }
    )
    try:
        return arrow_frame(spark, rows), arrow_frame(spark, care), read_days
    except Exception:  # noqa: BLE001 - Spark refuses an Arrow column: Spark reads `events` then
        return None


def _replaced_by_driver(
    path: str, kept: DataFrame, kept_n: int, days: list[dt.date], rows_per_file: int
) -> bool:
    """Few kept rows into an existing filtered_events: fetched in their clustered order (one
    Spark job) and written by delta-rs (`replace_partitions_from_driver`), in pages of the
    layout's rows. A Spark write of 5,000 rows took 2.2 s of a warmed run (docs/benchmarks.md,
    "Session 39"). Only rows Spark would write in one task (at most `rows_per_file`): then
    both write one file per (load day, event day), sorted by user and time. False, writing
    nothing, when there are more (or more than `delta.DRIVER_FETCH_ROWS`), or the table is
    absent or refuses the driver."""
    if kept_n > min(delta.DRIVER_FETCH_ROWS, rows_per_file):
        return False
    table = driver_writable(path)
    if table is None:
        return False
    page_rows = int(filtering.PARQUET_LAYOUT["parquet.page.row.count.limit"])
    data = fetch_arrow(kept)[0]
    return replace_partitions_from_driver(
        path, data, LOAD_DATE, days, APPEND_FEATURES, page_rows=page_rows, table=table
    )


def _filter_and_write(
    spark: SparkSession,
    tables: TimeBasedTables,
    settings: Settings,
    days: list[dt.date],
    marked: DataFrame,
    events_of: Callable[[], DataFrame],
    read_days: list[dt.date],
    state: TimeBasedState,
    fingerprints: dict[dt.date, str],
    result: StepResult,
    started: float,
    to_mark: int | None = None,
) -> StepResult:
    """`filtered_events_step` once its rows are marked: count, find the later load days reached
    (in `events_of()`: the raw rows, read only then), write, record the accounting (in
    `result`). `read_days`: the load days of `events` the marking read (for the metadata);
    `to_mark`: how many rows are marked, when the Delta log says (at least as many as are
    kept)."""
    n = settings.dedupe_lookback_days
    previous = state.accounting
    has_events = [d for d in days if d in fingerprints]
    had_rows = [d for d in days if d in previous]
    # The counts' query also gathers the kept rows' sample for the write's layout, when the
    # layout searches a sample: the rows marked are at most that many (else
    # `clustered_by_user` reads its own sample if the rows kept turn out few enough).
    rows_per_file = settings.filtered_events_rows_per_file
    layout = None
    if to_mark is not None and filtering.searched_layout(to_mark, rows_per_file):
        layout = (user_key(settings), filtering.picked_for_layout(rows_per_file))
    outcome_rows = filtering.outcome_counts(marked, layout=layout).collect()
    # Load days whose input changed reach later, already materialized load days.
    changed = [
        d
        for d in days
        if previous.get(d) is None
        or previous[d].events_fingerprint != fingerprints.get(d, EMPTY_FINGERPRINT)
    ]
    reached: list[dt.date] = []
    later_materialized = [
        d
        for d in previous
        if d not in days and any(c < d <= c + dt.timedelta(days=n) for c in changed)
    ]
    if changed and later_materialized and n > 0:
        ids = marked.filter(F.col(LOAD_DATE).isin(changed)).select(LOAD_DATE, "event_id")
        if exists(tables.filtered_events):
            old = spark.read.format("delta").load(tables.filtered_events)
            ids = ids.unionByName(
                old.filter(F.col(LOAD_DATE).isin(changed)).select(LOAD_DATE, "event_id")
            )
        later = events_of().filter(F.col(LOAD_DATE).isin(later_materialized))
        result.metadata["later load days' reach read by"] = "Spark"
        read_days = sorted({*read_days, *later_materialized})
        reached = sorted(r[LOAD_DATE] for r in filtering.load_days_reached(ids, later, n).collect())
    # Files clustered by user within each (load day, event day): the session branch's reads
    # of a few users' late events open few files (`core.filtering.clustered_by_user`).
    kept_n = sum(int(r["rows"]) for r in outcome_rows if r["outcome"] == "kept")
    kept = filtering.clustered_by_user(
        filtering.kept_rows(marked),
        user_key(settings),
        kept_n,
        rows_per_file,
        sample=filtering.layout_sample(outcome_rows) if layout is not None else None,
    )
    result.metadata["filtered_events layout"] = filtering.layout_of(
        kept_n, rows_per_file, sample_given=layout is not None
    )
    # --- the processing-manifest lock wraps from here (see `guarded`)
    if _replaced_by_driver(tables.filtered_events, kept, kept_n, days, rows_per_file):
        result.metadata["filtered_events written by"] = "the driver (delta-rs)"
    else:
        result.metadata["filtered_events written by"] = "Spark"
        replace_partitions(
            spark,
            kept,
            tables.filtered_events,
            LOAD_DATE,
            days,
            [LOAD_DATE, EVENT_DATE],
            properties={
                "delta.enableChangeDataFeed": "true",
                STATISTICS_PROPERTY: statistics_columns(kept.columns, settings.key_columns()),
            },
            parquet=filtering.PARQUET_LAYOUT,
        )

    per_day: dict[dt.date, dict[str, int]] = defaultdict(dict)
    max_loaded: dict[dt.date, dt.datetime] = {}
    for r in outcome_rows:  # a (load day, outcome) may have several rows (the layout's keys)
        outcomes = per_day[r[LOAD_DATE]]
        outcomes[r["outcome"]] = outcomes.get(r["outcome"], 0) + r["rows"]
        if r["max_load_tstamp"] is not None:
            stamp = as_utc_or_none(r["max_load_tstamp"])
            max_loaded[r[LOAD_DATE]] = max(stamp, max_loaded.get(r[LOAD_DATE], stamp))
    materialization = uuid.uuid4().hex
    materialized_at = dt.datetime.now(dt.UTC)
    accounting_rows = []
    accounts: dict[str, dict[str, int]] = {}
    for day in days:
        acc = filtering.accounting(per_day.get(day, {}))
        accounts[day.isoformat()] = acc
        if day not in has_events and day not in had_rows:
            continue  # a load day without data is done without a record
        accounting_rows.append(
            {
                LOAD_DATE: day,
                "events_fingerprint": fingerprints.get(day, EMPTY_FINGERPRINT),
                **acc,
                "max_load_tstamp": max_loaded.get(day),
                "materialization_id": materialization,
                "materialized_at": materialized_at,
            }
        )
    for day in reached:
        old_row = previous[day]
        accounting_rows.append(
            {
                LOAD_DATE: day,
                "events_fingerprint": "redo: reached by duplicates of "
                + ", ".join(c.isoformat() for c in changed),
                "rows_read": old_row.rows_read,
                "rows_kept": old_row.rows_kept,
                **{c: old_row.dropped.get(c[len("dropped_") :], 0) for c in DROP_COLUMNS},
                "max_load_tstamp": old_row.max_load_tstamp,
                "materialization_id": old_row.materialization_id,
                "materialized_at": old_row.materialized_at,
            }
        )
    upsert_small(tables.accounting, accounting_rows, ACCOUNTING_SCHEMA, LOAD_DATE, compact=True)

    files_read, files_total = files_in(tables.events, LOAD_DATE, read_days)
    total = {k: sum(a[k] for a in accounts.values()) for k in next(iter(accounts.values()))}
    result.used_spark = True
    result.metadata.update(
        {
            "rows read": total["rows_read"],
            "rows written": total["rows_kept"],
            **{k.replace("_", " "): v for k, v in total.items() if k.startswith("dropped_")},
            "accounting per load day": accounts,
            "events files read": files_read,
            "events files in table": files_total,
            "later load days reached by duplicates (marked pending)": [
                d.isoformat() for d in reached
            ],
            "time taken (s)": round(time.monotonic() - started, 3),
        }
    )
    result.facts = {"accounting": accounts, "reached": reached}
    result.per_partition = {
        day: {
            "rows read": acc["rows_read"],
            "rows written": acc["rows_kept"],
            **{k.replace("_", " "): v for k, v in acc.items() if k.startswith("dropped_")},
        }
        for day, acc in accounts.items()
    }
    return result


def days_to_process_step(
    tables: TimeBasedTables,
    settings: Settings,
    load_days: Sequence[dt.date],
    now: dt.datetime,
) -> StepResult:
    """Decide the event days of load days, in ascending order; replace exactly their rows.

    Reads no event data and starts no Spark job: rows per (load day, event day) come from
    filtered_events' Delta log, and the decisions are written with delta-rs.
    """
    started = time.monotonic()
    days = sorted(set(load_days))
    state = read_state(tables)
    result = StepResult(metadata=_limits_metadata(state, settings, now))
    result.metadata["load days"] = ", ".join(d.isoformat() for d in days)
    horizons = decided_horizons(
        ((r.load_date, r.event_date, r.decision) for r in state.decisions),
        {d: a.horizon for d, a in state.aggregated.items()},
    )
    previous: dict[dt.date, list[dt.date]] = defaultdict(list)
    for r in state.decisions:
        previous[r.load_date].append(r.event_date)
    decisions = decide_load_days(
        days,
        state.counts,
        horizons,
        settings.reprocess_days,
        settings.min_rows_to_process,
        previous_event_days=previous,
    )
    decided_at = dt.datetime.now(dt.UTC)
    had_rows = any(d in previous for d in days)
    if decisions or had_rows:
        rows = [
            {
                LOAD_DATE: x.load_date,
                EVENT_DATE: x.event_date,
                "rows": x.rows,
                "is_late": x.is_late,
                "horizon_before": x.horizon_before,
                "pending": x.pending,
                "decision": x.decision.value,
                "reason": x.reason,
                "decided_at": decided_at,
                "filtered_materialization_id": (
                    state.accounting[x.load_date].materialization_id
                    if x.load_date in state.accounting
                    else ""
                ),
                "max_load_tstamp": (
                    state.accounting[x.load_date].max_load_tstamp
                    if x.load_date in state.accounting
                    else None
                ),
            }
            for x in decisions
        ]
        # --- the processing-manifest lock wraps from here (see `guarded`)
        replace_small(tables.days_to_process, rows, DECISIONS_SCHEMA, LOAD_DATE, days, [LOAD_DATE])
        result.metadata["written with"] = "delta-rs (no Spark job)"

    processed = [x for x in decisions if x.decision == "process"]
    skipped = [x for x in decisions if x.decision == "skip"]
    requested = event_days_to_request(decisions)
    result.metadata.update(
        {
            "rows read": sum(x.rows for x in decisions),
            "rows written": len(decisions),
            "event days processed": len({x.event_date for x in processed}),
            "event days skipped": len({x.event_date for x in skipped}),
            "decisions": [
                {
                    "load day": x.load_date.isoformat(),
                    "event day": x.event_date.isoformat(),
                    "rows": x.rows,
                    "pending": x.pending,
                    "decision": x.decision.value,
                    "reason": x.reason,
                }
                for x in decisions
            ],
            "skipped event days (pending rows)": {
                x.event_date.isoformat(): x.pending for x in skipped
            },
            "daily_aggregates partitions requested": [d.isoformat() for d in requested],
            "time taken (s)": round(time.monotonic() - started, 3),
        }
    )
    # How late the load days' rows are (core.lateness): numbers the UI plots per partition when
    # the run decided one load day, one entry per load day otherwise.
    lateness = load_day_metadata(state.counts, days)
    if len(days) == 1 and lateness:
        result.metadata.update(next(iter(lateness.values())))
    elif lateness:
        result.metadata["lateness per load day"] = lateness
    if not decisions and not had_rows:
        result.metadata["note"] = "no rows in these load days: nothing to decide"
    result.facts = {"decisions": decisions, "requested": requested}
    result.per_partition = {day: dict(figures) for day, figures in lateness.items()}
    return result


def daily_aggregates_step(
    spark: SparkSession,
    tables: TimeBasedTables,
    settings: Settings,
    event_days: Sequence[dt.date],
    all_loaded_rows: bool = False,
) -> StepResult:
    """Recompute event days in full from their rows with load day <= horizon; replace exactly
    their rows (`_daily_aggregates`), with Delta's data skipping only where it pays.
    `all_loaded_rows`: a keyhole repair that counts every row loaded so far."""
    with data_skipping_when_it_pays(spark, [tables.filtered_events], settings.spark):
        return _daily_aggregates(spark, tables, settings, event_days, all_loaded_rows)


def _daily_aggregates(
    spark: SparkSession,
    tables: TimeBasedTables,
    settings: Settings,
    event_days: Sequence[dt.date],
    all_loaded_rows: bool,
) -> StepResult:
    started = time.monotonic()
    days = sorted(set(event_days))
    state = read_state(tables)
    version, counts = partition_counts(tables.filtered_events)
    horizons = aggregation_horizons(
        state.decisions, state.aggregated, counts, days, all_loaded_rows
    )
    latest = latest_process_decisions(state.decisions)
    result = StepResult()
    result.metadata["event days"] = ", ".join(d.isoformat() for d in days)
    result.metadata["mode"] = (
        "keyhole repair: every row loaded so far"
        if all_loaded_rows
        else "up to the decided horizon"
    )
    existing = state.daily_aggregates_version is not None
    with_rows = [d for d in days if horizons[d] is not None]
    aggregated_at = dt.datetime.now(dt.UTC)
    rows_counted = {d: rows_up_to_horizon(counts, d, horizons[d]) for d in days}
    files_read = 0
    # Event days read by the driver (few rows): the step's queries run with the small-query
    # configuration.
    with ExitStack() as small:
        if with_rows or existing:
            # What this step and the session branch read: a third of the table's width.
            columns = [
                *agg.source_columns(settings.user_identifier, settings.attributes),
                *core_sessions.shared_columns(settings),
            ]
            # The event days' rows: read by the driver when the Delta log counts few of them.
            local_rows = (
                local_arrow(
                    delta_table(tables.filtered_events, version),
                    columns=columns,
                    partitions=(EVENT_DATE, with_rows or days),
                )
                if version is not None
                else None
            )
            source = None if local_rows is None else local_frame(spark, local_rows)
            if source is None:
                local_rows = None  # Spark reads the event days
            else:
                small.enter_context(small_query_conf(spark, True))
            result.metadata["event days read by"] = (
                "the driver (delta-rs)" if source is not None else "Spark"
            )
            if source is None:
                source = (
                    read_version(spark, tables.filtered_events, version)
                    if version is not None
                    else _empty_filtered(spark)
                )
            horizon_df = spark.createDataFrame(
                [(d, horizons[d]) for d in with_rows],
                T.StructType(
                    [
                        T.StructField(EVENT_DATE, T.DateType()),
                        T.StructField("_horizon_load_date", T.DateType()),
                    ]
                ),
            )
            # Inside `sessionize run` the event days read here are kept for the session branch
            # (resources/shared_reads.py); they are then persisted already and released by the run.
            rows, shared = (
                shared_reads.event_days(
                    source,
                    tables.filtered_events,
                    version,
                    with_rows,
                    columns,
                )
                if with_rows
                else (source.limit(0), False)
            )
            rows = rows.join(F.broadcast(horizon_df), on=EVENT_DATE).filter(
                F.col(LOAD_DATE) <= F.col("_horizon_load_date")
            )
            if not shared:
                # Kept while the aggregate runs: it reads the rows twice (the counts per event name,
                # the rest), and Spark would otherwise scan filtered_events twice.
                rows = rows.persist(StorageLevel.MEMORY_AND_DISK_DESER)
            if with_rows and version is not None:
                files_read, _ = files_in(tables.filtered_events, EVENT_DATE, with_rows, version)
            daily = (
                agg.daily_aggregates(rows, settings.user_identifier, settings.attributes)
                .join(F.broadcast(horizon_df), on=EVENT_DATE, how="left")
                .withColumn("_aggregated_at", F.lit(aggregated_at).cast("timestamp"))
                .select(
                    *agg.BASE_COLUMNS,
                    *[agg.attribute_column(d) for d in settings.attributes],
                    "_horizon_load_date",
                    "_aggregated_at",
                )
            )
            # --- the processing-manifest lock wraps from here (see `guarded`)
            try:
                # Few rows aggregated (counted in the Delta log), or few aggregated rows out of
                # up to DRIVER_AGGREGATE_ROWS: collected and committed by the driver.
                on_driver = existing and sum(rows_counted.values()) <= DRIVER_AGGREGATE_ROWS
                aggregated_by = "Spark"
                if on_driver:
                    computed = None
                    if local_rows is not None and not settings.attributes:
                        computed = _daily_on_driver(
                            local_rows, settings, horizons, with_rows, aggregated_at
                        )
                    if computed is None:
                        computed = fetch_arrow(daily.limit(DRIVER_WRITE_ROWS + 1))[0]
                        if computed.num_rows > DRIVER_WRITE_ROWS:
                            computed = None  # more (user, day) rows: Spark writes them
                    else:
                        aggregated_by = "the driver (plain Python)"
                    on_driver = computed is not None and replace_partitions_from_driver(
                        tables.daily_aggregates, computed, EVENT_DATE, days
                    )
                if not on_driver:
                    replace_partitions(
                        spark,
                        daily.repartition(EVENT_DATE),
                        tables.daily_aggregates,
                        EVENT_DATE,
                        days,
                        [EVENT_DATE],
                    )
                result.metadata["written by"] = "the driver (delta-rs)" if on_driver else "Spark"
                result.metadata["aggregated by"] = aggregated_by if on_driver else "Spark"
            finally:
                if not shared:
                    rows.unpersist()
            records = [
                {
                    EVENT_DATE: d,
                    "horizon_load_date": horizons[d],
                    "rows_aggregated": rows_counted[d],
                    "decided_through": latest.get(d),
                    "aggregated_at": aggregated_at,
                    "all_loaded_rows": all_loaded_rows,
                }
                for d in days
            ]
            upsert_small(tables.horizons, records, HORIZONS_SCHEMA, EVENT_DATE, compact=True)
            result.used_spark = True
    _, written_actions = add_actions(
        tables.daily_aggregates, columns=["num_records", f"partition.{EVENT_DATE}"]
    )
    written = sum(
        a["num_records"] or 0
        for a in written_actions
        if as_date(a[f"partition.{EVENT_DATE}"]) in set(days)
    )
    pending_after = {
        d.isoformat(): sum(
            r
            for (ld, dd), r in counts.items()
            if dd == d and (horizons[d] is None or ld > horizons[d])
        )
        for d in days
    }
    result.metadata.update(
        {
            "rows read": sum(rows_counted.values()),
            "rows written": written,
            "horizons": {
                d.isoformat(): (h.isoformat() if h else None) for d, h in horizons.items()
            },
            "rows counted per event day": {d.isoformat(): r for d, r in rows_counted.items()},
            "pending rows after (not counted yet)": pending_after,
            "filtered_events files read": files_read,
            "filtered_events version read": version if version is not None else -1,
            "time taken (s)": round(time.monotonic() - started, 3),
        }
    )
    if not result.used_spark:
        result.metadata["note"] = "nothing decided for these event days: done without a Spark job"
    result.facts = {"horizons": horizons, "rows": rows_counted}
    result.per_partition = {
        d.isoformat(): {
            "rows read": rows_counted.get(d, 0),
            "pending rows (not counted yet)": pending_after[d.isoformat()],
        }
        for d in days
    }
    return result


def _daily_on_driver(
    rows: pa.Table,
    settings: Settings,
    horizons: dict[dt.date, dt.date | None],
    days: Sequence[dt.date],
    aggregated_at: dt.datetime,
) -> pa.Table | None:
    """The event `days`' daily_aggregates rows computed in plain Python from the driver's
    filtered_events `rows` (`agg.daily_aggregates_from_rows`, in Spark's types: the driver's
    write refuses a stored table of other types, `replace_partitions_from_driver`, and Spark
    computes and writes then); None (Spark aggregates) when a user identifier column is not a
    string."""
    try:
        return agg.daily_aggregates_from_rows(
            rows,
            settings.user_identifier,
            {d: horizons[d] for d in days if horizons[d] is not None},
            aggregated_at,
        )
    except (pa.ArrowException, TypeError, ValueError, KeyError) as error:
        logging.getLogger(__name__).warning("daily_aggregates aggregated by Spark: %s", error)
        return None


def _empty_filtered(spark: SparkSession) -> DataFrame:
    from sessionize_assets.core.schema import REQUIRED_COLUMNS, TIMESTAMP_COLUMNS

    fields = [
        T.StructField(c, T.TimestampType() if c in TIMESTAMP_COLUMNS else T.StringType())
        for c in REQUIRED_COLUMNS
    ]
    fields += [T.StructField(LOAD_DATE, T.DateType()), T.StructField(EVENT_DATE, T.DateType())]
    return spark.createDataFrame([], T.StructType(fields))


LATENESS_TABLE = "lateness of the last 14 load days"


def manifest_step(tables: TimeBasedTables) -> StepResult:
    """Rewrite daily_aggregation_manifest from the state (no event data read, no Spark job)."""
    started = time.monotonic()
    state = read_state(tables)
    rows = state.manifest()
    replace_small(tables.manifest, [dataclasses.asdict(r) for r in rows], MANIFEST_SCHEMA)
    pending = {r.event_date.isoformat(): r.pending for r in rows if r.pending}
    return StepResult(
        metadata={
            "rows read": sum(r.rows_loaded for r in rows),
            "rows written": len(rows),
            "event days": len(rows),
            "event days with pending rows": len(pending),
            "pending rows": sum(pending.values()),
            "pending rows per event day": pending,
            "event days awaiting aggregation": [
                r.event_date.isoformat() for r in rows if r.awaiting_aggregation
            ],
            "event days not accounted": [r.event_date.isoformat() for r in rows if not r.accounted],
            # The lateness matrix of `sessionize status --lateness`, Markdown for the UI.
            LATENESS_TABLE: lateness_markdown(state.counts),
            "time taken (s)": round(time.monotonic() - started, 3),
        },
        facts={"rows": rows},
    )


def attributes_step(
    spark: SparkSession, tables: TimeBasedTables, settings: Settings, as_of: dt.date
) -> StepResult:
    """Drop and recompute attributes from daily_aggregates, as of a day."""
    started = time.monotonic()
    source = delta_table(tables.daily_aggregates)
    version = source.version() if source is not None else None
    if version is None:
        return StepResult(
            metadata={"rows read": 0, "rows written": 0, "note": "no daily_aggregates yet"}
        )
    daily = read_pinned(spark, tables.daily_aggregates, version)
    windows, definitions = settings.attribute_windows_days, settings.attributes
    fingerprint = attrs.definition_fingerprint(windows, definitions)
    touched = users_to_recompute(tables, version, as_of, fingerprint, windows, definitions)
    out = attrs.attributes(daily, as_of, windows, definitions)
    source = json.dumps(
        {
            "daily_aggregates_version": version,
            "as_of": as_of.isoformat(),
            "definition": fingerprint,
        }
    )
    refreshed_rows = None
    computed_by = "Spark"
    if touched is not None:
        attributes_version, users = touched
        refreshed = refreshed_on_driver(
            spark, tables, version, attributes_version, users, as_of, windows, definitions
        )
        if refreshed is not None:
            refreshed_rows, computed_by = refreshed
        else:
            previous = read_version(spark, tables.attributes, attributes_version)
            # The stored columns of the types computed now (nullability aside), else in full.
            if attrs.same_types(previous.select(*out.columns).schema, out.schema):
                chosen = spark.createDataFrame(
                    pa.table({agg.USER_IDENTIFIER: pa.array(users, pa.string())})
                )
                out = attrs.refreshed(previous, daily, chosen, as_of, windows, definitions)
            else:
                touched = None
    _, read_actions = add_actions(tables.daily_aggregates, version, columns=["num_records"])
    counts = [a["num_records"] for a in read_actions]
    rows_read = sum(n or 0 for n in counts)
    if refreshed_rows is not None:
        # Refreshed on the driver: its rows are in memory whatever their number.
        on_driver = overwrite_from_driver(tables.attributes, refreshed_rows, user_metadata=source)
        if not on_driver:
            out = arrow_frame(spark, refreshed_rows)
    else:
        # At most one row per user of daily_aggregates: few rows are committed by the driver (a
        # file without a row count, statistics being off, leaves the size unknown: Spark writes).
        on_driver = (
            None not in counts
            and rows_read <= DRIVER_WRITE_ROWS
            and overwrite_from_driver(tables.attributes, fetch_arrow(out)[0], user_metadata=source)
        )
    if not on_driver:
        with faults.commit_of(tables.attributes):
            (
                # One file, but computed in parallel: coalesce(1) would run the aggregation's
                # last stage in a single task (docs/benchmarks.md, "Session 25").
                out.repartition(1)
                .write.format("delta")
                .mode("overwrite")
                .option("overwriteSchema", "true")
                .option("userMetadata", source)
                .save(tables.attributes)
            )
    _, written_actions = add_actions(tables.attributes, columns=["num_records"])
    return StepResult(
        used_spark=True,
        metadata={
            "rows read": rows_read,
            "rows written": sum(a["num_records"] or 0 for a in written_actions),
            "written by": "the driver (delta-rs)" if on_driver else "Spark",
            "recomputed": "in full" if touched is None else f"{len(touched[1])} users",
            "refreshed by": (
                "-"
                if touched is None
                else "Spark"
                if refreshed_rows is None
                else "the driver (delta-rs)"
            ),
            "users' rows computed by": computed_by,
            "as_of": as_of.isoformat(),
            "windows (days)": list(settings.attribute_windows_days),
            "configured attributes": [d.name for d in settings.attributes],
            "daily_aggregates version read": version,
            "time taken (s)": round(time.monotonic() - started, 3),
        },
    )


# The most rows the driver's attributes refresh holds (the stored rows kept, and the chosen users'
# daily rows): about 200 MB of Arrow for the benchmark's columns. Above, Spark refreshes.
DRIVER_REFRESH_ROWS = 1_000_000


def refreshed_on_driver(
    spark: SparkSession,
    tables: TimeBasedTables,
    version: int,
    attributes_version: int,
    users: Sequence[str],
    as_of: dt.date,
    windows: Sequence[int],
    definitions: Sequence[Any],
) -> tuple[pa.Table, str] | None:
    """`core.attributes.refreshed` with its reads and its union on the driver: the `users`' rows
    of daily_aggregates at `version` and every other row of attributes at `attributes_version`
    read by delta-rs (`rows_by_key`), only the users' rows aggregated by Spark (a driver-local
    DataFrame; without configured attributes, by plain Python: `attrs.attributes_from_rows`),
    the kept rows given the new `as_of`, with who computed the users' rows. Spark's refresh
    scanned every daily row and every stored row, and wrote the union (docs/benchmarks.md,
    "Session 33").

    None when delta-rs does not read both tables (`rows_by_key`), either read holds more than
    DRIVER_REFRESH_ROWS rows (they are in the driver's memory at once), or the stored columns'
    types differ from the computed ones (nullability aside): the caller refreshes with Spark,
    or recomputes in full."""
    chosen = pa.array(users, pa.string())
    daily = rows_by_key(
        delta_table(tables.daily_aggregates, version),
        {agg.USER_IDENTIFIER: chosen},
        limit=DRIVER_REFRESH_ROWS,
    )
    if daily is None:
        return None
    kept = rows_by_key(
        delta_table(tables.attributes, attributes_version),
        {agg.USER_IDENTIFIER: chosen},
        keep=False,
        limit=DRIVER_REFRESH_ROWS,
    )
    if kept is None:
        return None
    columns = attrs.attribute_columns(windows, definitions)
    if kept.column_names != columns:
        return None
    kept = kept.set_column(
        columns.index("as_of"), "as_of", pa.array([as_of] * kept.num_rows, pa.date32())
    )
    if not definitions:
        # The built-in columns only: plain Python, in Spark's types (stored ones that differ
        # are Spark's to handle below).
        try:
            recomputed = attrs.attributes_from_rows(daily, as_of, windows)
        except (pa.ArrowException, TypeError, ValueError) as error:
            logging.getLogger(__name__).warning("attributes refreshed by Spark: %s", error)
        else:
            if same_types(recomputed.schema, kept.schema):
                combined = pa.concat_tables([recomputed, kept.cast(recomputed.schema)])
                return combined, "the driver (plain Python)"
    # Computed even for no user: its schema is what the stored types are compared with. The
    # rows are driver-local and few: the small-query configuration.
    with small_query_conf(spark, True):
        recomputed, _ = fetch_arrow(
            attrs.attributes(arrow_frame(spark, daily), as_of, windows, definitions)
        )
    recomputed = recomputed.select(columns)
    if not same_types(recomputed.schema, kept.schema):
        return None
    return pa.concat_tables([recomputed, kept.cast(recomputed.schema)]), "Spark"


# The largest share of the stored users an attributes refresh recomputes; more, and it recomputes
# every user (the refresh's delta-rs reads and its union would cost more than they save).
REFRESH_MAX_SHARE = 0.5


def users_to_recompute(
    tables: TimeBasedTables,
    version: int,
    as_of: dt.date,
    fingerprint: str,
    windows: Sequence[int],
    definitions: Sequence[Any],
) -> tuple[int, list[str]] | None:
    """(the stored attributes' version, the users whose rows can differ from it) when the stored
    table can be refreshed (`core.attributes.refreshed`), else None: recompute in full.

    The stored table must be the last commit's (its recorded daily_aggregates version and as_of,
    the same definitions, the same columns), and both versions of daily_aggregates readable by
    delta-rs. The users: those with rows in the event days whose files changed between the two
    versions (in the rows before and after) or in the days `as_of`'s move brings into or out of a
    period (`core.attributes.edge_days`), read from the Delta tables with delta-rs (one column of
    those days' files). Any failure to read them means a full recompute, never a guess."""
    attributes_table = delta_table(tables.attributes)
    if attributes_table is None or not plain_protocol(attributes_table):
        return None
    # What the loaded version's own commit recorded (not a later one's).
    recorded = recorded_source(attributes_table)
    if recorded is None or recorded.get("definition") != fingerprint:
        return None
    stored_columns = pa.schema(attributes_table.schema().to_arrow()).names
    if stored_columns != attrs.attribute_columns(windows, definitions):
        return None
    try:
        before_version = int(recorded["daily_aggregates_version"])
        before_as_of = dt.date.fromisoformat(recorded["as_of"])
        before = delta_table(tables.daily_aggregates, before_version)
        after = delta_table(tables.daily_aggregates, version)
        if before is None or after is None or before_version > version:
            return None
        if not (plain_protocol(before) and plain_protocol(after)):
            return None
        days = attrs.changed_days(_files_by_day(before), _files_by_day(after))
        if None in days:
            return None
        edges = attrs.edge_days(before_as_of, as_of, attrs.periods(windows, definitions))
        users = _users_on(after, days | edges) | _users_on(before, days)
    except Exception as error:  # noqa: BLE001 - a version gone from the log, a vacuumed file
        logging.getLogger(__name__).warning("attributes recomputed in full: %s", error)
        return None
    # Most users (a `refresh` rewrote every day): the full recompute is cheaper than the refresh.
    stored_rows = live_rows(attributes_table)
    if stored_rows is None or len(users) > stored_rows * REFRESH_MAX_SHARE:
        return None
    return attributes_table.version(), sorted(users)


def _files_by_day(table: Any) -> list[tuple[str, dt.date | None]]:
    """The live files of a delta-rs table of daily_aggregates as (path, event day)."""
    actions = pa.table(table.get_add_actions(flatten=True))
    paths = actions.column("path").to_pylist()
    days = actions.column(f"partition.{EVENT_DATE}").to_pylist()
    return [(p, as_date(d) if d is not None else None) for p, d in zip(paths, days, strict=True)]


def _users_on(table: Any, days: set[dt.date]) -> set[str]:
    """The non-null users with rows in `days` of a delta-rs table of daily_aggregates."""
    if not days:
        return set()
    data = table.to_pyarrow_table(
        columns=[agg.USER_IDENTIFIER],
        partitions=[(EVENT_DATE, "in", sorted(d.isoformat() for d in days))],
    )
    column = data.column(agg.USER_IDENTIFIER)
    return {u for u in pc.unique(column).to_pylist() if u is not None}
