"""`sessionize export TABLE --out FILE`: any table as CSV (header row, ISO 8601 UTC) or Parquet."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from sessionize_assets.errors import UserError
from sessionize_assets.home import Home
from sessionize_assets.resources import tables as T

KNOWN_TABLES = sorted(v for k, v in vars(T).items() if k.isupper() and isinstance(v, str))


def _iso_timestamps(table: pa.Table) -> pa.Table:
    """Timestamp columns as ISO 8601 UTC strings (`2024-03-01T10:00:00.123000Z`)."""
    columns = []
    for field, column in zip(table.schema, table.columns, strict=True):
        if pa.types.is_timestamp(field.type):
            column = pc.strftime(
                column.cast(pa.timestamp("us", tz="UTC")), format="%Y-%m-%dT%H:%M:%SZ"
            )
        elif pa.types.is_date(field.type):
            column = pc.strftime(column, format="%Y-%m-%d")
        elif pa.types.is_nested(field.type) or pa.types.is_map(field.type):
            column = pa.array(
                [None if v is None else str(v) for v in column.to_pylist()], pa.string()
            )
        columns.append(column)
    return pa.table(columns, names=table.column_names)


def export_table(spark, home: Home, table: str, out: Path) -> str:  # noqa: ANN001 - spark unused (delta-rs)
    """Write `table` to `out` (.csv or .parquet); returns a one-line summary."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    suffix = out.suffix.lower()
    if suffix not in (".csv", ".parquet"):
        raise UserError(f"--out must end in .csv or .parquet, got {out.name}.")
    try:
        data = DeltaTable(home.table(table)).to_pyarrow_table()
    except TableNotFoundError:
        raise UserError(
            f"There is no table `{table}` in {home.warehouse} (known tables: {', '.join(KNOWN_TABLES)})."
        ) from None
    out.parent.mkdir(parents=True, exist_ok=True)
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        pq.write_table(data, out)
    else:
        import pyarrow.csv as pcsv

        pcsv.write_csv(_iso_timestamps(data), out)
    return f"wrote {data.num_rows} rows of {table} to {out}"
