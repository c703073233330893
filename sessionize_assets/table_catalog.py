"""Every table the project writes: columns, types, keys, partitioning and writer, from the code.

Each entry is built from the schema objects the writers use (Spark StructTypes, DDL strings,
pyarrow schemas, the loader's column lists), so `docs/tables.md` cannot drift from them; no Spark
session is started. Types are Spark SQL names, as `DESCRIBE` shows them. `daily_aggregates` and
`attributes` depend on settings: they are listed for the defaults of `settings.Settings`.

    python -m sessionize_assets.table_catalog --write   # regenerate docs/tables.md
    python -m sessionize_assets.table_catalog           # print it
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from sessionize_assets.core import aggregates, attributes, forget, schema
from sessionize_assets.core.validate import INVALID_EVENTS_SCHEMA
from sessionize_assets.ingest.loader import LOAD_LOG_SCHEMA, ordered_columns
from sessionize_assets.resources import tables as names
from sessionize_assets.resources.cursor_store import cursor_schema
from sessionize_assets.resources.delta import schema_pairs
from sessionize_assets.resources.processing_manifest import spark_schema as manifest_spark_schema
from sessionize_assets.sessions import tables as session_tables
from sessionize_assets.settings import Settings
from sessionize_assets.time_based import definitions as time_definitions
from sessionize_assets.time_based import tables as time_tables

DOC_PATH = Path(__file__).resolve().parents[1] / "docs" / "tables.md"
REGENERATE = "python -m sessionize_assets.table_catalog --write"


@dataclass(frozen=True)
class Column:
    """One column as the Delta table stores it."""

    name: str
    type: str  # Spark SQL type name (`bigint`, `array<date>`, ...)
    nullable: bool = True


@dataclass(frozen=True)
class Table:
    """One table's entry in the catalog (and section of docs/tables.md)."""

    name: str
    purpose: str
    columns: tuple[Column, ...]
    key: tuple[str, ...]  # columns unique together (empty: no key)
    key_note: str  # how the code keeps the key (or why there is none)
    partition_by: tuple[str, ...]
    written_by: str
    varies: str = ""  # what changes the columns (settings, the input)


# ------------------------------------------------------------------ schema objects -> columns

_DDL_NAMES = {"long": "bigint", "integer": "int", "short": "smallint", "byte": "tinyint"}


def _from_ddl(ddl: str) -> tuple[Column, ...]:
    """Columns of a Spark DDL string (`"a string, b long"`); every column nullable."""
    return tuple(Column(n, _DDL_NAMES.get(k.lower(), k.lower())) for n, k in schema_pairs(ddl))


def _from_struct(struct: Any) -> tuple[Column, ...]:
    """Columns of a pyspark StructType (no JVM needed)."""
    return tuple(Column(f.name, f.dataType.simpleString(), f.nullable) for f in struct.fields)


def _arrow_type(kind: pa.DataType) -> str:
    """A pyarrow type as the Spark SQL type Delta stores it as."""
    simple = {
        pa.string(): "string",
        pa.int64(): "bigint",
        pa.int32(): "int",
        pa.float64(): "double",
        pa.bool_(): "boolean",
        pa.date32(): "date",
    }
    if kind in simple:
        return simple[kind]
    if pa.types.is_timestamp(kind):
        return "timestamp" if kind.tz else "timestamp_ntz"
    if pa.types.is_list(kind):
        return f"array<{_arrow_type(kind.value_type)}>"
    if pa.types.is_map(kind):
        return f"map<{_arrow_type(kind.key_type)},{_arrow_type(kind.item_type)}>"
    raise ValueError(f"no Spark name for pyarrow type {kind}")


def _from_arrow(arrow: pa.Schema) -> tuple[Column, ...]:
    return tuple(Column(f.name, _arrow_type(f.type), f.nullable) for f in arrow)


def _typed(names_and_types: Iterable[tuple[str, str]]) -> tuple[Column, ...]:
    return tuple(Column(n, t) for n, t in names_and_types)


# ------------------------------------------------------------------ columns built in Spark code

_LINEAGE_TYPES = {
    schema.LOAD_DATE: "date",
    schema.LOAD_ID: "string",
    schema.SOURCE_FILE: "string",
    schema.ROW_HASH: "string",
}


def _events_columns() -> tuple[Column, ...]:
    """The loader's layout (`ingest.loader.ordered_columns`) of the canonical and lineage
    columns: timestamps typed, every other canonical column a string."""
    canonical = (*schema.REQUIRED_COLUMNS, *schema.TIMESTAMP_COLUMNS, *_LINEAGE_TYPES)
    ordered = ordered_columns(dict.fromkeys(canonical))
    return _typed(
        (
            c,
            _LINEAGE_TYPES.get(c, "timestamp" if c in schema.TIMESTAMP_COLUMNS else "string"),
        )
        for c in ordered
    )


def _daily_aggregates_columns(settings: Settings) -> tuple[Column, ...]:
    """`core.aggregates.daily_aggregates` plus the step's horizon columns (settings without
    configured attributes: their `attr_<name>` columns' types depend on the aggregation)."""
    if settings.attributes:
        raise ValueError("the catalog lists daily_aggregates without configured attributes")
    types = {
        aggregates.USER_IDENTIFIER: "string",
        schema.EVENT_DATE: "date",
        "total_events": "bigint",
        "page_views": "bigint",
        "first_event_tstamp": "timestamp",
        "last_event_tstamp": "timestamp",
        aggregates.EVENT_COUNTS: "map<string,bigint>",
    }
    base = _typed((c, types[c]) for c in aggregates.BASE_COLUMNS)
    return (*base, Column("_horizon_load_date", "date"), Column("_aggregated_at", "timestamp"))


def _attributes_columns(settings: Settings) -> tuple[Column, ...]:
    """`core.attributes.attribute_columns` for the settings' windows (no configured attributes)."""
    if settings.attributes:
        raise ValueError("the catalog lists attributes without configured attributes")
    types = {
        aggregates.USER_IDENTIFIER: "string",
        "first_event_tstamp": "timestamp",
        "last_event_tstamp": "timestamp",
        aggregates.EVENT_COUNTS: "map<string,bigint>",
        "as_of": "date",
    }  # every other column (totals, active days, per-window counts) is a bigint
    cols = attributes.attribute_columns(settings.attribute_windows_days, ())
    return _typed((c, types.get(c, "bigint")) for c in cols)


# ------------------------------------------------------------------ the catalog

_REBUILT = "; a full rebuild (`rebuild_*` in `sessions/steps.py`) overwrites the table"
_SESSION_BRANCH = "asset `{name}` of the `session_models` multi-asset (`sessions/run.py`)"


def catalog(settings: Settings | None = None) -> tuple[Table, ...]:
    """Every table, in pipeline order, for `settings` (default: the defaults)."""
    settings = settings or Settings()
    events = _events_columns()
    load, event = schema.LOAD_DATE, schema.EVENT_DATE
    return (
        Table(
            names.EVENTS,
            "Raw events as landed: one row per usable input row, canonical columns typed.",
            events,
            (),
            "append-only; copies of an `event_id` are kept (filtered_events drops them)",
            (load,),
            "`sessionize load` (`ingest/loader.py`), or any Delta writer; asset `events`",
            "the input files: every other input column is kept too, with its input type, "
            "before the lineage columns (setting `column_mapping` renames input columns to "
            "canonical ones)",
        ),
        Table(
            names.INVALID_EVENTS,
            "Input rows that could not be used: load day, reason and raw text.",
            _from_struct(INVALID_EVENTS_SCHEMA),
            (),
            "append-only",
            (load,),
            "`sessionize load` (`ingest/loader.py`); asset `invalid_events`",
        ),
        Table(
            names.LOAD_LOG,
            "One row per landed file: its content hash, format, row counts and load days.",
            _from_struct(LOAD_LOG_SCHEMA),
            ("sha256",),
            "a file whose content is in the log is skipped (`loaded_hashes`); "
            "`load_id` is the hash's first 32 hex digits",
            (),
            "`sessionize load` (`ingest/loader.py`); no asset",
        ),
        Table(
            names.FILTERED_EVENTS,
            "`events` of a load day, filtered and deduplicated, with their event day.",
            (*events, Column(event, "date")),
            (load, "event_id"),
            "no `event_id` twice within `dedupe_lookback_days` load days (`core/filtering.py`, "
            "check `no_duplicate_event_ids`); a load day's rows are replaced (replaceWhere)",
            (load, event),
            "asset `filtered_events` (`time_based/steps.py`)",
            "the input files, as `events` (its extra columns flow through)",
        ),
        Table(
            names.FILTERED_EVENTS_ACCOUNTING,
            "Per load day: events fingerprint consumed, rows read, kept and dropped per rule.",
            _from_arrow(time_tables.ACCOUNTING_SCHEMA),
            (load,),
            "delta-rs MERGE on the key (`upsert_small`)",
            (),
            "asset `filtered_events` (`time_based/steps.py`)",
        ),
        Table(
            names.DAYS_TO_PROCESS,
            "Per (load day, event day) it touches: rows, lateness, pending rows, the decision.",
            _from_arrow(time_tables.DECISIONS_SCHEMA),
            (load, event),
            "one decision per pair (`core/late_days.py`); a load day's rows are replaced",
            (load,),
            "asset `days_to_process` (`time_based/steps.py`)",
        ),
        Table(
            names.DAILY_AGGREGATES,
            "Per (user, event day): counts, first and last event, events per name.",
            _daily_aggregates_columns(settings),
            (aggregates.USER_IDENTIFIER, event),
            "the group-by of `core/aggregates.py` (a null user is one row per day); an event "
            "day's rows are replaced (replaceWhere; few rows: a delta-rs overwrite with that "
            "predicate)",
            (event,),
            "asset `daily_aggregates` (`time_based/steps.py`)",
            "setting `attributes` adds one `attr_<name>` column per entry, before "
            "`_horizon_load_date` "
            "(type by aggregation, `core/aggregates.py`); `user_identifier` picks the source "
            "column, not the schema",
        ),
        Table(
            names.DAILY_AGGREGATE_HORIZONS,
            "Per event day: the load day horizon its aggregate counts, and when it was made.",
            _from_arrow(time_tables.HORIZONS_SCHEMA),
            (event,),
            "delta-rs MERGE on the key (`upsert_small`)",
            (),
            "asset `daily_aggregates` (`time_based/steps.py`)",
        ),
        Table(
            names.DAILY_AGGREGATION_MANIFEST,
            "Per event day: rows loaded, aggregated, pending and skipped so far, horizons.",
            _from_arrow(time_tables.MANIFEST_SCHEMA),
            (event,),
            "one row per event day (`core.late_days.manifest_rows`); the table is rewritten",
            (),
            "asset `daily_aggregation_manifest` (`time_based/steps.py`)",
        ),
        Table(
            names.ATTRIBUTES,
            "Per user: lifetime and last-N-days metrics and configured attributes, as of a day.",
            _attributes_columns(settings),
            (aggregates.USER_IDENTIFIER,),
            "the group-by of `core/attributes.py` (null users left out); the table is rewritten",
            (),
            "asset `attributes` (`time_based/steps.py`)",
            "setting `attribute_windows_days` gives three `*_last_<N>_days` columns per N "
            f"(here {', '.join(map(str, settings.attribute_windows_days))}); setting "
            "`attributes` adds one column per entry, before `as_of`",
        ),
        Table(
            names.SESSIONS,
            "One row per session, kept current incrementally.",
            _from_ddl(session_tables.SESSIONS_SCHEMA),
            ("session_identifier",),
            "MERGE key (`replace_sessions`)" + _REBUILT,
            (),
            _SESSION_BRANCH.format(name=names.SESSIONS),
        ),
        Table(
            names.USERS,
            "One row per non-null user, from their sessions.",
            _from_ddl(session_tables.USERS_SCHEMA),
            ("user_identifier",),
            "MERGE key (`process_user_model`)" + _REBUILT,
            (),
            _SESSION_BRANCH.format(name=names.USERS),
        ),
        Table(
            session_tables.USER_SESSION_STATS,
            "Per user: session-duration statistics (when listed in `session_models`).",
            _from_ddl(session_tables.USER_SESSION_STATS_SCHEMA),
            ("user_identifier",),
            "MERGE key (`process_user_model`)" + _REBUILT,
            (),
            _SESSION_BRANCH.format(name=session_tables.USER_SESSION_STATS),
        ),
        Table(
            names.SESSIONS_LIFECYCLE_MANIFEST,
            "Per session: user, start, end, quarantined; finds the sessions new events touch.",
            _from_ddl(session_tables.LIFECYCLE_SCHEMA),
            ("session_identifier",),
            "MERGE key (`process_sessions`)" + _REBUILT,
            (),
            _SESSION_BRANCH.format(name=names.SESSIONS_LIFECYCLE_MANIFEST),
        ),
        Table(
            names.QUARANTINED_SESSIONS,
            "Sessions capped at `max_session_days`.",
            _from_ddl(session_tables.QUARANTINED_SCHEMA),
            ("session_identifier",),
            "gap mode: MERGE key; id mode: only sessions not quarantined before are appended "
            "(`write_side_tables`)" + _REBUILT,
            (),
            _SESSION_BRANCH.format(name=names.QUARANTINED_SESSIONS),
        ),
        Table(
            names.SUPERSEDED_SESSIONS,
            "gap mode: session ids that stopped existing, each with a successor and why.",
            _from_ddl(session_tables.SUPERSEDED_SCHEMA),
            (),
            "append-only; an id split in several has one row per successor, "
            "`session_identifier` is null when it was removed",
            (),
            _SESSION_BRANCH.format(name=names.SUPERSEDED_SESSIONS),
        ),
        Table(
            names.INCREMENTAL_MANIFEST,
            "Per session model: last success, consumed filtered_events version, limit reached.",
            _from_ddl(session_tables.MANIFEST_SCHEMA),
            ("model",),
            "one row per model; the table is rewritten with delta-rs (`sessions/state.py`)",
            (),
            _SESSION_BRANCH.format(name=names.INCREMENTAL_MANIFEST),
        ),
        Table(
            names.PROCESSING_MANIFEST,
            "Append-only lock and state records of every processed item (asset partition, file).",
            _from_struct(manifest_spark_schema()),
            ("record_id",),
            "a fresh uuid per record; appended as exactly the next version (compare-and-swap)",
            ("item_bucket",),
            "the assets' locks (`resources/manifest_lock.py`), `sessionize load`, "
            "`sessionize manifest` (`resources/processing_manifest.py`); no asset",
        ),
        Table(
            names.CURSOR_STATE,
            "Checkpoints of named cursors: resumable backfills and `load --by-load-date`.",
            _from_struct(cursor_schema()),
            ("cursor_name", "sequence"),
            "insert-only MERGE refusing a sequence at or below the cursor's latest",
            (),
            "`sessionize backfill`, `sessionize load --by-load-date` "
            "(`resources/cursor_store.py`); no asset",
        ),
        Table(
            names.TIME_BASED_DEFINITIONS,
            "The settings each time-based model was built with; a run whose settings differ "
            "stops with one sentence (`sessionize refresh MODEL --yes` rebuilds it).",
            _from_arrow(time_definitions.DEFINITIONS_SCHEMA),
            ("model",),
            "delta-rs MERGE on the key (`upsert_small`); written at a first build and by refresh",
            (),
            "assets `filtered_events`, `daily_aggregates` (`time_based/assets.py`), "
            "`sessionize refresh` (`time_based/definitions.py`)",
        ),
        Table(
            names.FORGET_LOG,
            "One row per finished `sessionize forget` request: when, by whom, why, how many ids "
            "and rows per table, the load days redone; never the ids.",
            _from_arrow(forget.FORGET_LOG_SCHEMA),
            ("request_id",),
            "a fresh uuid per request (delta-rs MERGE on it, `upsert_small`)",
            (),
            "`sessionize forget` (`commands/forget.py`); no asset",
        ),
    )


def table(name: str, settings: Settings | None = None) -> Table:
    """One table's entry (configured attributes change only `daily_aggregates` and
    `attributes`: the others are listed whatever they are)."""
    if (
        settings is not None
        and settings.attributes
        and name
        not in (
            names.DAILY_AGGREGATES,
            names.ATTRIBUTES,
        )
    ):
        settings = dataclasses.replace(settings, attributes=())
    found = {t.name: t for t in catalog(settings)}
    if name not in found:
        raise KeyError(f"no table {name!r} in the catalog")
    return found[name]


def column_schema(name: str, settings: Settings | None = None) -> Any:
    """The table's `dagster/column_schema` (a dagster TableSchema), for asset metadata."""
    from dagster import TableColumn, TableColumnConstraints, TableSchema

    return TableSchema(
        columns=[
            TableColumn(c.name, c.type, constraints=TableColumnConstraints(nullable=c.nullable))
            for c in table(name, settings).columns
        ]
    )


# ------------------------------------------------------------------ Markdown


def _names(columns: Sequence[str]) -> str:
    return ", ".join(f"`{c}`" for c in columns) if columns else "–"


def render_markdown(settings: Settings | None = None) -> str:
    """docs/tables.md."""
    tables = catalog(settings)
    out = [
        "<!-- Generated from sessionize_assets/table_catalog.py: do not edit by hand. -->",
        "# Tables",
        "",
        f"Generated from the code by `{REGENERATE}`",
        "(`sessionize_assets_tests/test_table_catalog.py` fails when this file is out of date).",
        "Every table is a Delta table under the warehouse, `<home>/warehouse/<name>`. Types are",
        "Spark SQL types. `daily_aggregates` and `attributes` depend on settings: they are listed",
        "for the default settings, and each table names what changes its columns.",
        "",
        "| table | key | partitioned by | columns |",
        "|---|---|---|---|",
    ]
    out += [
        f"| [`{t.name}`](#{t.name}) | {_names(t.key)} | {_names(t.partition_by)} | {len(t.columns)} |"
        for t in tables
    ]
    for t in tables:
        out += [
            "",
            f"## {t.name}",
            "",
            t.purpose,
            "",
            f"- key: {_names(t.key) if t.key else 'none'} — {t.key_note}",
            f"- partitioned by: {_names(t.partition_by) if t.partition_by else 'not partitioned'}",
            f"- written by: {t.written_by}",
        ]
        if t.varies:
            out.append(f"- columns vary with: {t.varies}")
        out += ["", "| column | type | nullable |", "|---|---|---|"]
        out += [f"| `{c.name}` | `{c.type}` | {'yes' if c.nullable else 'no'} |" for c in t.columns]
    return "\n".join(out) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Print docs/tables.md, or write it with `--write`."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args not in ([], ["--write"]):
        print(f"usage: {REGENERATE} (or without --write to print)", file=sys.stderr)
        return 2
    text = render_markdown()
    if args:
        DOC_PATH.write_text(text, encoding="utf-8")
        print(f"wrote {DOC_PATH}")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
