"""`sessionize maintain`: compact every table (OPTIMIZE) and delete the files no version within the
retention needs (VACUUM), never those a reader still needs (`core/maintenance.py`)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from pathlib import Path

from pyspark.sql import SparkSession

from sessionize_assets.commands.context import CommandContext
from sessionize_assets.core.maintenance import (
    DELTA_MINIMUM_HOURS,
    OldVersionReader,
    compaction_finds_work,
    first_data_change,
    vacuum_finds_work,
    vacuum_refusal,
)
from sessionize_assets.core.schema import STATISTICS_PROPERTY, statistics_columns
from sessionize_assets.errors import UserError
from sessionize_assets.home import Home
from sessionize_assets.ingest.load_days import carry_consumed_fingerprints
from sessionize_assets.resources.delta import add_actions, delta_table, optimize, table_ref
from sessionize_assets.resources.tables import (
    EVENTS,
    FILTERED_EVENTS,
    FILTERED_EVENTS_ACCOUNTING,
)


def delta_tables(warehouse: Path) -> list[Path]:
    """The Delta tables in a warehouse folder, by name."""
    if not warehouse.is_dir():
        return []
    return sorted(p for p in warehouse.iterdir() if (p / "_delta_log").is_dir())


def files_on_disk(table: Path) -> int:
    """Data and change-data files under a table folder (the log excluded)."""
    return len(_data_files(table))


def _data_files(table: Path) -> list[Path]:
    return [p for p in table.rglob("*.parquet") if "_delta_log" not in p.relative_to(table).parts]


def unreferenced_ages_hours(table: Path, actions: list[dict], now: dt.datetime) -> list[float]:
    """The age in hours of each data or change-data file on disk that the current version does
    not reference (`actions`: its add actions; part-file names are unique within a table)."""
    referenced = {str(a["path"]).rsplit("/", 1)[-1] for a in actions}
    return [
        (now.timestamp() - p.stat().st_mtime) / 3600.0
        for p in _data_files(table)
        if p.name not in referenced
    ]


def old_version_readers(table_path: Callable[[str], str]) -> list[OldVersionReader]:
    """The session models that will read filtered_events' change feed from an old version."""
    from sessionize_assets.sessions.state import read_manifest

    path = table_path(FILTERED_EVENTS)
    table = delta_table(path)
    if table is None:
        return []
    history = table.history()
    commits = {int(c["version"]): c.get("timestamp") for c in history}
    operations = {int(c["version"]): str(c.get("operation")) for c in history}
    readers = []
    for model, state in sorted(read_manifest(table_path).items()):
        if state.consumed_version is None:
            continue
        # Commits that change no data (an earlier maintain's VACUUM) need no file kept.
        first = first_data_change(operations, state.consumed_version)
        stamp = commits.get(first) if first is not None else None
        if stamp is None:  # caught up: nothing newer to read yet
            continue
        readers.append(
            OldVersionReader(
                table=FILTERED_EVENTS,
                reader=f"session model `{model}` (its change data feed from version {first})",
                since=dt.datetime.fromtimestamp(int(stamp) / 1000.0, dt.UTC),
            )
        )
    return readers


def maintain(ctx: CommandContext, vacuum_hours: float | None) -> list[str]:
    """`sessionize maintain`: `maintain_home` on the command's home and engine."""
    return maintain_home(ctx.home, lambda: ctx.spark, vacuum_hours, ctx.settings.key_columns())


def maintain_home(
    home: Home,
    spark_session: Callable[[], SparkSession],
    vacuum_hours: float | None,
    key_columns: Sequence[str] = (),
) -> list[str]:
    """OPTIMIZE every table, then VACUUM it with `vacuum_hours` (None: no VACUUM). Refused before
    any change (and before Spark starts) when the retention would delete files a reader still
    needs. One line per table. `events` and `filtered_events` made before their file statistics
    were limited (STATISTICS_PROPERTY) get the property first, as they are created with it
    (`filtered_events` also naming `key_columns`, the settings' `Settings.key_columns`), so that
    their next writes, the compaction of `events` among them, compute only those."""
    tables = delta_tables(Path(home.warehouse))
    if not tables:
        raise UserError(f"{home.warehouse} holds no tables yet: nothing to maintain.")
    now = dt.datetime.now(dt.UTC)  # file ages are real ages, whatever --now says
    if vacuum_hours is not None:
        refusal = vacuum_refusal(vacuum_hours, old_version_readers(home.table), now)
        if refusal is not None:
            raise UserError(refusal)
    from sessionize_assets.resources.spark import default_parallelism, temporary_conf

    spark = spark_session()
    confs = {
        # VACUUM lists a table's folders in one Spark job of up to this many tasks (10,000 by
        # default: minutes of task overhead per table on a small machine); the cores suffice.
        "spark.sql.sources.parallelPartitionDiscovery.parallelism": str(
            max(2, 2 * default_parallelism(spark))
        ),
    }
    if vacuum_hours is not None and vacuum_hours < DELTA_MINIMUM_HOURS:
        # Delta refuses retentions under 7 days unless told; the command lock keeps other
        # commands out and the readers were checked above.
        confs["spark.databricks.delta.retentionDurationCheck.enabled"] = "false"
    with temporary_conf(spark, confs):
        return _maintain_tables(spark, tables, vacuum_hours, now, key_columns)


def limit_statistics(spark: SparkSession, path: str, key_columns: Sequence[str]) -> str | None:
    """Set STATISTICS_PROPERTY on a table that lacks it (one metadata commit, `SET
    TBLPROPERTIES`, which changes no data); the columns set, or None when it had the property."""
    table = delta_table(path)
    if table is None or STATISTICS_PROPERTY in table.metadata().configuration:
        return None
    columns = statistics_columns(table.schema().to_arrow().names, key_columns)
    spark.sql(
        f"ALTER TABLE {table_ref(path)} SET TBLPROPERTIES ('{STATISTICS_PROPERTY}' = '{columns}')"
    ).collect()
    return columns


def _maintain_tables(
    spark: SparkSession,
    tables: list[Path],
    vacuum_hours: float | None,
    now: dt.datetime,
    key_columns: Sequence[str],
) -> list[str]:
    """OPTIMIZE and VACUUM each table where they find work (`core.maintenance`: a table whose
    partitions are one file each is compact; VACUUM deletes only unreferenced files older than the
    retention), deciding from the Delta log and the file ages without a Spark job."""
    lines = []
    for table in tables:
        limited = None
        if table.name in (EVENTS, FILTERED_EVENTS):
            # as the loader and the filtering step create them: the settings' columns are
            # filtered_events' (the session models read it by them), not the loader's
            configured = key_columns if table.name == FILTERED_EVENTS else ()
            limited = limit_statistics(spark, str(table), configured)
        actions = add_actions(str(table))[1]  # the current version's files, until an OPTIMIZE
        current_before = len(actions)
        disk_before = files_on_disk(table)
        partitions = [
            tuple(v for k, v in sorted(a.items()) if k.startswith("partition.")) for a in actions
        ]
        if table.name != FILTERED_EVENTS and not compaction_finds_work(partitions):
            line = f"{table.name}: {current_before} files, already compact (one per partition)"
        elif table.name == FILTERED_EVENTS:
            # Not compacted: its files are user ranges within each (load day, event day), which
            # is what lets the session branch skip files (docs/sessions.md); OPTIMIZE would merge
            # them. Each load-day run rewrites its partitions whole, so no small files pile up.
            line = f"{table.name}: {current_before} files kept as written (clustered by user)"
        elif table.name == EVENTS:
            # A load day's files are its fingerprint (ingest/load_days.py): the compaction's new
            # files would read as changed data and redo every load day, unless the fingerprints
            # filtered_events consumed are carried across it.
            version = delta_table(str(table)).version()
            optimize(spark, str(table))
            actions = add_actions(str(table))[1]
            current_after = len(actions)
            carried = carry_consumed_fingerprints(
                str(table), str(table.parent / FILTERED_EVENTS_ACCOUNTING), version
            )
            line = (
                f"{table.name}: {current_before} -> {current_after} files in the current version "
                f"({carried} consumed load-day fingerprint(s) carried across the compaction)"
            )
        else:
            optimize(spark, str(table))
            actions = add_actions(str(table))[1]
            current_after = len(actions)
            line = f"{table.name}: {current_before} -> {current_after} files in the current version"
        if vacuum_hours is not None:
            if vacuum_finds_work(unreferenced_ages_hours(table, actions, now), vacuum_hours):
                spark.sql(f"VACUUM {table_ref(str(table))} RETAIN {vacuum_hours:g} HOURS").collect()
            deleted = disk_before - files_on_disk(table)
            line += f"; {deleted} unreferenced file(s) older than {vacuum_hours:g} h deleted"
        if limited is not None:
            line += f"; file statistics limited to {limited} (new files)"
        lines.append(line)
    return lines
