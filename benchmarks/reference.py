"""The single-node reference: the same tables computed by DuckDB straight from the landing files.

DuckDB reads the CSV / NDJSON landing files itself (no Delta extension: it downloads itself at run
time), applies the loader's row validation, the `filtered_events` deduplication, and computes
`daily_aggregates`, gap-mode `sessions` and `users` with the project's rules. `compare_tables`
then checks them against the Delta tables Spark wrote (read with delta-rs, no Spark).

Rules, as the project applies them (SPEC sections 4-6), and where this reference differs:

- valid rows: a CSV row with the header's number of fields / a line that is valid JSON, a
  non-empty `event_id`, every timestamp column parseable (`YYYY-MM-DD HH:MM:SS[.fff]`, also with
  `T`), `derived_tstamp` (else `collector_tstamp`) not more than `max_clock_skew_minutes` after
  `load_tstamp`; `load_date = date(load_tstamp)` (UTC).
- filtered_events: a row is dropped when its `event_id` was loaded in one of the
  `dedupe_lookback_days` load days before its own, or an earlier copy is in its own load day
  (first `load_tstamp`, then `collector_tstamp`, then `dvce_created_tstamp`); `event_date =
  date(derived_tstamp)`; rows before `start_date` dropped. Difference: the last tie-break is the
  row's text here and Spark's `_row_hash` there; both only ever separate identical copies, so the
  kept content is the same. `global_dedupe_difference` counts the rows that a "first copy ever
  loaded wins" rule (no lookback limit) would drop on top: the spec's lookback rule is what Spark
  applies.
- daily_aggregates: per (user = `domain_userid`, event day) over all filtered rows (the benchmark
  sets `min_rows_to_process: 1` and `reprocess_days` beyond the largest lateness, so the spec says
  the table equals this full recompute).
- sessions (gap mode): per user, rows with session timestamp (`collector_tstamp`, else
  `load_tstamp`) at or after `start_date`, not sent more than `days_late_allowed` days after
  created, deduplicated on (user, event_id, derived_tstamp); ordered by `derived_tstamp`, ties by
  `event_id`; a gap strictly longer than `session_gap_minutes` starts a session; a chain longer
  than `max_session_days` is cut every `max_session_days` days from 1970-01-01 (quarantined);
  `session_identifier = sha256(user | first event_id)`; `session_number` by (start,
  session_identifier).
"""

from __future__ import annotations

import csv
import datetime as dt
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import duckdb

TIMESTAMP_COLUMNS: tuple[str, ...] = (
    "etl_tstamp",
    "collector_tstamp",
    "dvce_created_tstamp",
    "dvce_sent_tstamp",
    "derived_tstamp",
    "load_tstamp",
    "true_tstamp",
    "refr_dvce_tstamp",
)
TIMESTAMP_FORMATS: tuple[str, ...] = (
    "%Y-%m-%d %H:%M:%S.%f",
    "%Y-%m-%d %H:%M:%S.%g",
    "%Y-%m-%d %H:%M:%S",
    "%Y-%m-%dT%H:%M:%S.%f",
    "%Y-%m-%dT%H:%M:%S.%g",
    "%Y-%m-%dT%H:%M:%S",
)
NEEDED_COLUMNS: tuple[str, ...] = (
    "event_id",
    "event_name",
    "domain_userid",
    "page_url",
    "collector_tstamp",
    "dvce_created_tstamp",
    "dvce_sent_tstamp",
    "derived_tstamp",
    "load_tstamp",
)


@dataclass(frozen=True)
class ReferenceRules:
    """The settings the reference needs (same names as the project's settings)."""

    start_date: dt.date
    max_clock_skew_minutes: int = 10
    dedupe_lookback_days: int = 3
    session_gap_minutes: int = 30
    max_session_days: int = 3
    days_late_allowed: int = 3

    @classmethod
    def from_settings(cls, settings: Any) -> ReferenceRules:
        """From a `sessionize_assets.settings.Settings` (or anything with those attributes)."""
        return cls(**{k: getattr(settings, k) for k in asdict(cls(dt.date(2020, 1, 1)))})


def landing_files(data_dir: Path) -> list[Path]:
    """The landing files of a generated data set (CSV and NDJSON, metadata files skipped)."""
    files = [
        p
        for p in sorted(Path(data_dir).rglob("*"))
        if p.is_file()
        and p.suffix.lower() in (".csv", ".json", ".jsonl", ".ndjson")
        and not any(part.startswith(("_", ".")) for part in p.relative_to(data_dir).parts)
    ]
    return files


def landing_files_of(data_dir: Path, folders: Sequence[Path]) -> list[Path]:
    """The landing files of some load-day folders of a data set."""
    return [f for folder in folders for f in landing_files(Path(folder))] if folders else []


def _run(con: duckdb.DuckDBPyConnection, sql: str) -> list[tuple[Any, ...]]:
    """Run a statement to completion (DuckDB keeps unfinished results otherwise)."""
    return con.execute(sql).fetchall()


def _sql_list(paths: Sequence[Path]) -> str:
    return "[" + ", ".join("'" + str(p).replace("'", "''") + "'" for p in paths) + "]"


def _parse_ts(column: str) -> str:
    text = f"nullif(trim({column}), '')"
    formats = "[" + ", ".join(f"'{f}'" for f in TIMESTAMP_FORMATS) + "]"
    return f"try_strptime({text}, {formats})"


def csv_header(path: Path) -> tuple[str, ...]:
    """A CSV file's column names (its first line)."""
    with Path(path).open(newline="", encoding="utf-8") as handle:
        return tuple(h.strip() for h in next(csv.reader([handle.readline()]), []))


def _raw_union(con: duckdb.DuckDBPyConnection, files: Sequence[Path]) -> str:
    """A query over every readable row of the landing files (all values text). CSV files are read
    with their own header's columns (no dialect sniffing: a bad row must not change the dialect)."""
    by_header: dict[tuple[str, ...], list[Path]] = {}
    json_files = []
    for path in files:
        if path.suffix.lower() == ".csv":
            by_header.setdefault(csv_header(path), []).append(path)
        else:
            json_files.append(path)
    views = []
    for i, (header, paths) in enumerate(sorted(by_header.items())):
        columns = ", ".join(f"'{c}': 'VARCHAR'" for c in header)
        _run(
            con,
            f"""CREATE OR REPLACE TEMP VIEW raw_csv_{i} AS SELECT * FROM read_csv(
            {_sql_list(paths)}, header = true, auto_detect = false, columns = {{{columns}}},
            delim = ',', quote = '"', escape = '"', ignore_errors = true, strict_mode = true,
            null_padding = false, filename = true)""",
        )
        views.append(f"raw_csv_{i}")
    if json_files:
        columns = ", ".join(
            f"{c}: 'VARCHAR'" for c in dict.fromkeys(NEEDED_COLUMNS + TIMESTAMP_COLUMNS)
        )
        _run(
            con,
            f"""CREATE OR REPLACE TEMP VIEW raw_json AS SELECT * FROM read_json(
            {_sql_list(json_files)}, format = 'newline_delimited', columns = {{{columns}}},
            ignore_errors = true, filename = true)""",
        )
        views.append("raw_json")
    select = []
    for view in views:
        names = {r[0] for r in con.execute(f"DESCRIBE {view}").fetchall()}
        cols = [
            (f"{c}" if c in names else f"NULL::VARCHAR AS {c}")
            for c in dict.fromkeys(NEEDED_COLUMNS + TIMESTAMP_COLUMNS)
        ]
        select.append(f"SELECT {', '.join(cols)}, filename FROM {view}")
    return " UNION ALL BY NAME ".join(select)


def _kept(rules: ReferenceRules) -> str:
    """filtered_events' rule on a ranked row `r` (its `_copy` within its load day), with `seen`
    the (load day, id) pairs of every row: the first copy, on or after start_date, its id not
    loaded in the dedupe_lookback_days load days before its own."""
    return f"""r._copy = 1
          AND CAST(r.derived_tstamp AS DATE) >= DATE '{rules.start_date.isoformat()}'
          AND NOT EXISTS (
            SELECT 1 FROM seen s
            WHERE s.event_id = r.event_id
              AND s.seen_day < r.load_date
              AND s.seen_day >= r.load_date - {int(rules.dedupe_lookback_days)})"""


def daily_aggregates_query(source: str) -> str:
    """daily_aggregates per (user = `domain_userid`, event day) of the filtered rows `source`."""
    return f"""SELECT domain_userid AS user_identifier, event_date,
               count(*) AS total_events,
               count(*) FILTER (WHERE event_name = 'page_view') AS page_views,
               min(derived_tstamp) AS first_event_tstamp,
               max(derived_tstamp) AS last_event_tstamp
        FROM {source} GROUP BY ALL"""


def session_events_query(source: str, rules: ReferenceRules) -> str:
    """Each usable filtered row of `source` with its gap-mode session (event -> session)."""
    gap_us = int(rules.session_gap_minutes) * 60_000_000
    max_us = int(rules.max_session_days) * 86_400_000_000
    late_us = int(rules.days_late_allowed) * 86_400_000_000
    return f"""WITH usable AS (
          SELECT nullif(domain_userid, '') AS user_key, event_id, event_name, page_url,
                 derived_tstamp, load_date, dvce_created_tstamp,
                 coalesce(collector_tstamp, load_tstamp) AS session_ts
          FROM {source}
          WHERE nullif(domain_userid, '') IS NOT NULL
            AND coalesce(collector_tstamp, load_tstamp) >= TIMESTAMP '{rules.start_date.isoformat()}'
            AND NOT coalesce(epoch_us(dvce_sent_tstamp) - epoch_us(dvce_created_tstamp) > {late_us}, false)),
        deduped AS (
          SELECT * FROM (
            SELECT *, row_number() OVER (
                     PARTITION BY user_key, event_id, derived_tstamp
                     ORDER BY session_ts, dvce_created_tstamp, event_name, page_url) AS _copy
            FROM usable) WHERE _copy = 1),
        gaps AS (
          SELECT *, epoch_us(derived_tstamp) AS us,
                 epoch_us(derived_tstamp) - lag(epoch_us(derived_tstamp)) OVER (
                   PARTITION BY user_key ORDER BY derived_tstamp, event_id) AS gap
          FROM deduped),
        chains AS (
          SELECT *, sum(CASE WHEN gap IS NULL OR gap > {gap_us} THEN 1 ELSE 0 END) OVER (
                   PARTITION BY user_key ORDER BY derived_tstamp, event_id
                   ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS chain
          FROM gaps),
        spans AS (
          SELECT *, (max(us) OVER (PARTITION BY user_key, chain)
                     - min(us) OVER (PARTITION BY user_key, chain)) > {max_us} AS is_long
          FROM chains),
        pieces AS (
          SELECT *, CASE WHEN is_long THEN (us - (us % {max_us})) // {max_us} END AS piece
          FROM spans)
        SELECT user_key, chain, piece, is_long, event_id, event_name, page_url,
               derived_tstamp, load_date,
               sha256(user_key || '|' || first(event_id ORDER BY derived_tstamp, event_id)
                      OVER (PARTITION BY user_key, chain, piece)) AS session_identifier
        FROM pieces"""


def sessions_query(source: str) -> str:
    """One row per session of the session events `source` (gap mode)."""
    return f"""WITH s AS (
          SELECT session_identifier, any_value(user_key) AS user_identifier,
                 min(derived_tstamp) AS start_tstamp, max(derived_tstamp) AS end_tstamp,
                 count(*) AS total_events,
                 count(*) FILTER (WHERE event_name = 'page_view') AS page_views,
                 first(page_url ORDER BY derived_tstamp, event_id)
                   FILTER (WHERE page_url IS NOT NULL) AS first_page_url,
                 first(page_url ORDER BY derived_tstamp DESC, event_id DESC)
                   FILTER (WHERE page_url IS NOT NULL) AS last_page_url,
                 bool_or(is_long) AS is_quarantined
          FROM {source} GROUP BY session_identifier)
        SELECT session_identifier, user_identifier, start_tstamp, end_tstamp, total_events,
               page_views,
               (epoch_us(end_tstamp) - epoch_us(start_tstamp)) / 1e6 AS duration_s,
               first_page_url, last_page_url,
               row_number() OVER (PARTITION BY user_identifier
                                  ORDER BY start_tstamp, session_identifier) AS session_number,
               is_quarantined
        FROM s"""


def users_query(source: str) -> str:
    """One row per user of the sessions `source`."""
    return f"""SELECT user_identifier, min(start_tstamp) AS first_session_start_tstamp,
               max(end_tstamp) AS last_session_end_tstamp, count(*) AS sessions,
               sum(total_events) AS total_events, sum(page_views) AS page_views
        FROM {source} GROUP BY user_identifier"""


# The order that decides which copy of an id within a load day is kept: Spark's
# (`core.filtering.DEDUPE_ORDER`, nulls last), so that both keep the same rows.
REBUILD_DEDUPE_ORDER = ("load_tstamp", "collector_tstamp", "dvce_created_tstamp", "_row_hash")


def rebuild_from_events(
    con: duckdb.DuckDBPyConnection,
    event_files: Sequence[str],
    rules: ReferenceRules,
    out_dir: Path,
) -> dict[str, int]:
    """DuckDB's trash and rebuild, the same work as `benchmarks.rebuild`'s: from the Parquet
    files of `events` (the table's active files, `load_date` from their folders), the kept rows
    at full width (every column, with `event_date`) written as Parquet partitioned by event day;
    then the daily aggregates, the sessions (from the written rows) and the users (from the
    written sessions), each written as Parquet into `out_dir`. The copies of an id are decided
    on its keys (each copy's file index and row number, DuckDB's virtual columns), as Spark's
    marking does, and the rows kept are read again for the write. Left out, where Spark does
    more: `attributes` (the reference has no rules for it) and `daily_aggregates`'
    `event_counts`. Returns the row counts under the reference's table names (`ref_filtered`,
    ...)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    _run(con, "SET TimeZone = 'UTC'")
    # Not a view: DuckDB's virtual columns (file_index, file_row_number) do not pass through one.
    events = f"read_parquet({_sql_list([Path(f) for f in event_files])}, hive_partitioning = true)"
    order = ", ".join(f"{c} NULLS LAST" for c in REBUILD_DEDUPE_ORDER)
    _run(
        con,
        f"""CREATE OR REPLACE TEMP TABLE rb_kept AS
        WITH keys AS (
          SELECT file_index, file_row_number, load_date, event_id, derived_tstamp,
                 {", ".join(REBUILD_DEDUPE_ORDER)}
          FROM {events}),
        ranked AS (
          SELECT *, row_number() OVER (PARTITION BY load_date, event_id ORDER BY {order}) AS _copy
          FROM keys),
        seen AS (SELECT DISTINCT load_date AS seen_day, event_id FROM keys)
        SELECT file_index, file_row_number FROM ranked r
        WHERE {_kept(rules)}""",
    )
    filtered = out_dir / "filtered_events"
    _run(
        con,
        f"""COPY (
          SELECT e.*, CAST(e.derived_tstamp AS DATE) AS event_date
          FROM {events} e SEMI JOIN rb_kept k
            ON e.file_index = k.file_index AND e.file_row_number = k.file_row_number)
        TO '{filtered}' (FORMAT parquet, PARTITION_BY (event_date), OVERWRITE_OR_IGNORE)""",
    )
    _run(
        con,
        f"""CREATE OR REPLACE TEMP VIEW rb_filtered AS SELECT * FROM read_parquet(
        '{filtered}/**/*.parquet', hive_partitioning = true)""",
    )
    outputs = {
        "ref_filtered": filtered,
        "ref_daily_aggregates": out_dir / "daily_aggregates",
        "ref_sessions": out_dir / "sessions.parquet",
        "ref_users": out_dir / "users.parquet",
    }
    _run(
        con,
        f"""COPY ({daily_aggregates_query("rb_filtered")}) TO '{outputs["ref_daily_aggregates"]}'
        (FORMAT parquet, PARTITION_BY (event_date), OVERWRITE_OR_IGNORE)""",
    )
    _run(
        con,
        "CREATE OR REPLACE TEMP TABLE rb_session_events AS "
        + session_events_query("rb_filtered", rules),
    )
    _run(
        con,
        f"COPY ({sessions_query('rb_session_events')}) TO '{outputs['ref_sessions']}' "
        "(FORMAT parquet)",
    )
    sessions = f"read_parquet('{outputs['ref_sessions']}')"
    _run(con, f"COPY ({users_query(sessions)}) TO '{outputs['ref_users']}' (FORMAT parquet)")
    counts = {}
    for name, path in outputs.items():
        pattern = f"{path}/**/*.parquet" if path.is_dir() else str(path)
        counts[name] = _run(con, f"SELECT count(*) FROM read_parquet('{pattern}')")[0][0]
    return counts


def build_reference(
    con: duckdb.DuckDBPyConnection, files: Sequence[Path], rules: ReferenceRules
) -> dict[str, int]:
    """Create tables `ref_events`, `ref_filtered`, `ref_daily_aggregates`, `ref_sessions`,
    `ref_session_events` (event -> session) and `ref_users` in `con`; return their row counts."""
    _run(con, "SET TimeZone = 'UTC'")
    raw = _raw_union(con, files)
    parsed = ",\n".join(f"{_parse_ts(c)} AS {c}" for c in TIMESTAMP_COLUMNS)
    unparseable = " OR ".join(
        f"(nullif(trim({c}), '') IS NOT NULL AND {_parse_ts(c)} IS NULL)" for c in TIMESTAMP_COLUMNS
    )
    _run(
        con,
        f"""CREATE OR REPLACE TABLE ref_raw AS
        SELECT event_id, event_name, domain_userid, page_url, filename,
               ({unparseable}) AS _unparseable,
               {parsed}
        FROM ({raw})""",
    )
    skew = int(rules.max_clock_skew_minutes)
    _run(
        con,
        f"""CREATE OR REPLACE TABLE ref_events AS
        WITH filled AS (
          SELECT * REPLACE (
                   coalesce(derived_tstamp, collector_tstamp) AS derived_tstamp,
                   coalesce(dvce_created_tstamp, collector_tstamp) AS dvce_created_tstamp,
                   coalesce(dvce_sent_tstamp, collector_tstamp) AS dvce_sent_tstamp)
          FROM ref_raw)
        SELECT event_id, event_name, domain_userid, page_url, collector_tstamp,
               dvce_created_tstamp, dvce_sent_tstamp, derived_tstamp, load_tstamp,
               CAST(load_tstamp AS DATE) AS load_date, filename
        FROM filled
        WHERE nullif(trim(event_id), '') IS NOT NULL
          AND NOT _unparseable
          AND derived_tstamp IS NOT NULL
          AND load_tstamp IS NOT NULL
          AND derived_tstamp <= load_tstamp + INTERVAL {skew} MINUTE""",
    )
    _run(
        con,
        f"""CREATE OR REPLACE TABLE ref_filtered AS
        WITH ranked AS (
          SELECT *, row_number() OVER (
                   PARTITION BY load_date, event_id
                   ORDER BY load_tstamp, collector_tstamp, dvce_created_tstamp,
                            derived_tstamp, dvce_sent_tstamp, event_name, domain_userid,
                            page_url) AS _copy
          FROM ref_events),
        seen AS (SELECT DISTINCT load_date AS seen_day, event_id FROM ref_events)
        SELECT r.* EXCLUDE (_copy), CAST(r.derived_tstamp AS DATE) AS event_date
        FROM ranked r
        WHERE {_kept(rules)}""",
    )
    _run(
        con,
        f"CREATE OR REPLACE TABLE ref_daily_aggregates AS {daily_aggregates_query('ref_filtered')}",
    )
    _run(
        con,
        "CREATE OR REPLACE TABLE ref_session_events AS "
        + session_events_query("ref_filtered", rules),
    )
    _run(con, f"CREATE OR REPLACE TABLE ref_sessions AS {sessions_query('ref_session_events')}")
    _run(con, f"CREATE OR REPLACE TABLE ref_users AS {users_query('ref_sessions')}")
    return {
        name: con.execute(f"SELECT count(*) FROM {name}").fetchall()[0][0]
        for name in (
            "ref_raw",
            "ref_events",
            "ref_filtered",
            "ref_daily_aggregates",
            "ref_sessions",
            "ref_users",
        )
    }


def restrict_to_horizons(
    con: duckdb.DuckDBPyConnection, horizons: Sequence[tuple[dt.date, dt.date]]
) -> int:
    """Recompute `ref_daily_aggregates` over the rows of each event day with load day <= its
    horizon (event days without one are left out); return the rows left out (pending)."""
    _run(con, "CREATE OR REPLACE TEMP TABLE ref_horizons (event_date DATE, horizon DATE)")
    if horizons:
        con.executemany("INSERT INTO ref_horizons VALUES (?, ?)", [list(h) for h in horizons])
    _run(
        con,
        """CREATE OR REPLACE TABLE ref_daily_aggregates AS
        SELECT domain_userid AS user_identifier, f.event_date,
               count(*) AS total_events,
               count(*) FILTER (WHERE event_name = 'page_view') AS page_views,
               min(derived_tstamp) AS first_event_tstamp,
               max(derived_tstamp) AS last_event_tstamp
        FROM ref_filtered f JOIN ref_horizons h
          ON f.event_date = h.event_date AND f.load_date <= h.horizon
        GROUP BY ALL""",
    )
    return con.execute(
        """SELECT count(*) FROM ref_filtered f LEFT JOIN ref_horizons h
           ON f.event_date = h.event_date
           WHERE h.horizon IS NULL OR f.load_date > h.horizon"""
    ).fetchall()[0][0]


def global_dedupe_difference(con: duckdb.DuckDBPyConnection) -> int:
    """Rows `ref_filtered` keeps that a "first copy ever loaded wins" rule would drop (copies
    loaded more than `dedupe_lookback_days` after the first): the spec's rule keeps them."""
    return con.execute(
        """SELECT count(*) FROM ref_filtered f
        WHERE EXISTS (SELECT 1 FROM ref_events e
                      WHERE e.event_id = f.event_id AND e.load_date < f.load_date)"""
    ).fetchall()[0][0]


# --- comparison with the Spark-written Delta tables ------------------------------------------

# (reference table, Delta table, comparable columns as SQL over either side)
COMPARISONS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "events": (
        "ref_events",
        "events",
        ("load_date", "event_id", "epoch_us(derived_tstamp)", "epoch_us(load_tstamp)"),
    ),
    "filtered_events": (
        "ref_filtered",
        "filtered_events",
        ("load_date", "event_id", "event_date", "epoch_us(collector_tstamp)"),
    ),
    "daily_aggregates": (
        "ref_daily_aggregates",
        "daily_aggregates",
        (
            "user_identifier",
            "event_date",
            "total_events::BIGINT",
            "page_views::BIGINT",
            "epoch_us(first_event_tstamp)",
            "epoch_us(last_event_tstamp)",
        ),
    ),
    "sessions": (
        "ref_sessions",
        "sessions",
        (
            "session_identifier",
            "user_identifier",
            "epoch_us(start_tstamp)",
            "epoch_us(end_tstamp)",
            "total_events::BIGINT",
            "page_views::BIGINT",
            "round(duration_s, 6)",
            "first_page_url",
            "last_page_url",
            "session_number::BIGINT",
            "is_quarantined",
        ),
    ),
    "users": (
        "ref_users",
        "users",
        (
            "user_identifier",
            "epoch_us(first_session_start_tstamp)",
            "epoch_us(last_session_end_tstamp)",
            "sessions::BIGINT",
            "total_events::BIGINT",
            "page_views::BIGINT",
        ),
    ),
}
SOURCE_COLUMNS: dict[str, tuple[str, ...]] = {
    "events": ("load_date", "event_id", "derived_tstamp", "load_tstamp"),
    "filtered_events": ("load_date", "event_id", "event_date", "collector_tstamp"),
}


@dataclass(frozen=True)
class TableComparison:
    """One table: Spark's rows vs the reference's, as counts, content hashes and a row diff."""

    table: str
    spark_rows: int | None
    reference_rows: int
    spark_hash: str | None
    reference_hash: str
    only_in_spark: int
    only_in_reference: int
    samples_only_in_spark: list[list[Any]]
    samples_only_in_reference: list[list[Any]]
    error: str | None = None

    @property
    def equal(self) -> bool:
        return (
            self.error is None
            and self.spark_rows == self.reference_rows
            and self.spark_hash == self.reference_hash
            and self.only_in_spark == 0
            and self.only_in_reference == 0
        )

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["equal"] = self.equal
        return out


def _content_hash(con: duckdb.DuckDBPyConnection, relation: str, columns: Sequence[str]) -> str:
    """An order-independent content hash: the sum of the rows' hashes (multiset-sensitive)."""
    row = con.execute(
        f"SELECT count(*), coalesce(sum(hash({', '.join(columns)})::HUGEINT), 0) FROM {relation}"
    ).fetchall()[0]
    return f"{row[0]}:{row[1]:x}"


def _jsonable(value: Any) -> Any:
    if isinstance(value, dt.date | dt.datetime):
        return value.isoformat()
    return value


def compare_table(
    con: duckdb.DuckDBPyConnection, warehouse: str, name: str, samples: int = 5
) -> TableComparison:
    """Compare one Delta table (read with delta-rs) with its reference table."""
    from deltalake import DeltaTable

    ref_table, delta_name, columns = COMPARISONS[name]
    select = ", ".join(f"{c} AS c{i}" for i, c in enumerate(columns))
    _run(con, f"CREATE OR REPLACE TEMP VIEW ref_side AS SELECT {select} FROM {ref_table}")
    ref_rows = con.execute("SELECT count(*) FROM ref_side").fetchall()[0][0]
    ref_hash = _content_hash(con, "ref_side", [f"c{i}" for i in range(len(columns))])
    try:
        table = DeltaTable(f"{warehouse.rstrip('/')}/{delta_name}")
        wanted = SOURCE_COLUMNS.get(name)
        arrow = table.to_pyarrow_table(columns=list(wanted) if wanted else None)
    except Exception as exc:  # noqa: BLE001 - a missing table is a reported difference
        return TableComparison(name, None, ref_rows, None, ref_hash, 0, ref_rows, [], [], str(exc))
    con.register("spark_arrow", arrow)
    _run(con, f"CREATE OR REPLACE TEMP TABLE spark_side AS SELECT {select} FROM spark_arrow")
    con.unregister("spark_arrow")
    spark_rows = con.execute("SELECT count(*) FROM spark_side").fetchall()[0][0]
    spark_hash = _content_hash(con, "spark_side", [f"c{i}" for i in range(len(columns))])
    diffs = []
    for left, right in (("spark_side", "ref_side"), ("ref_side", "spark_side")):
        n = con.execute(
            f"SELECT count(*) FROM (SELECT * FROM {left} EXCEPT ALL SELECT * FROM {right})"
        ).fetchall()[0][0]
        rows = con.execute(
            f"SELECT * FROM (SELECT * FROM {left} EXCEPT ALL SELECT * FROM {right}) "
            f"ORDER BY ALL LIMIT {int(samples)}"
        ).fetchall()
        diffs.append((n, [[_jsonable(v) for v in r] for r in rows]))
    _run(con, "DROP TABLE spark_side")
    return TableComparison(
        table=name,
        spark_rows=spark_rows,
        reference_rows=ref_rows,
        spark_hash=spark_hash,
        reference_hash=ref_hash,
        only_in_spark=diffs[0][0],
        only_in_reference=diffs[1][0],
        samples_only_in_spark=diffs[0][1],
        samples_only_in_reference=diffs[1][1],
    )


def compare_tables(
    con: duckdb.DuckDBPyConnection,
    warehouse: str,
    tables: Sequence[str] = ("events", "filtered_events", "daily_aggregates", "sessions", "users"),
) -> dict[str, TableComparison]:
    """Every compared table by name."""
    return {name: compare_table(con, warehouse, name) for name in tables}


# --- the minimal work of an incremental run --------------------------------------------------


def minimal_rows(
    con: duckdb.DuckDBPyConnection, new_load_day: dt.date, dedupe_lookback_days: int
) -> dict[str, int]:
    """What an incremental run that adds load day `new_load_day` needs to read, from the data:

    - `new_rows`: the load day's valid rows;
    - `touched_event_day_rows`: the filtered rows of every event day the new rows touch (those
      days' aggregates are recomputed in full);
    - `touched_session_rows`: the events of every session (after the load) holding a new row
      (merged sessions included);
    - `minimal_rows` = the sum of those three; `dedupe_lookback_rows` (the earlier load days a
      new row's duplicate is looked for in: their event ids must be read too) is given apart.
    """
    day = f"DATE '{new_load_day.isoformat()}'"

    def one(sql: str) -> tuple[Any, ...]:
        return con.execute(sql).fetchall()[0]

    new_rows = one(f"SELECT count(*) FROM ref_events WHERE load_date = {day}")[0]
    new_filtered = one(f"SELECT count(*) FROM ref_filtered WHERE load_date = {day}")[0]
    touched_days, day_rows = one(
        f"""SELECT count(DISTINCT event_date), count(*) FROM ref_filtered WHERE event_date IN
        (SELECT DISTINCT event_date FROM ref_filtered WHERE load_date = {day})"""
    )
    sessions, session_rows = one(
        f"""SELECT count(*), coalesce(sum(total_events), 0) FROM ref_sessions WHERE
        session_identifier IN (SELECT session_identifier FROM ref_session_events
                               WHERE load_date = {day})"""
    )
    lookback = one(
        f"""SELECT count(*) FROM ref_events
        WHERE load_date < {day} AND load_date >= {day} - {int(dedupe_lookback_days)}"""
    )[0]
    history = one(f"SELECT count(*) FROM ref_filtered WHERE load_date < {day}")[0]
    return {
        "new_rows": int(new_rows),
        "new_filtered_rows": int(new_filtered),
        "touched_event_days": int(touched_days),
        "touched_event_day_rows": int(day_rows),
        "touched_sessions": int(sessions),
        "touched_session_rows": int(session_rows),
        "dedupe_lookback_rows": int(lookback),
        "minimal_rows": int(new_rows + day_rows + session_rows),
        "history_filtered_rows": int(history),
    }
