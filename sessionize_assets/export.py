"""`sessionize export TABLE --out FILE [--force]`: a table of the home as CSV (header row, ISO 8601
UTC, nested values as JSON) or Parquet, written atomically; an existing file is kept unless
`--force`."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

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
                [None if v is None else _json(v) for v in column.to_pylist()], pa.string()
            )
        columns.append(column)
    return pa.table(columns, names=table.column_names)


def _json(value: Any) -> str:
    """A nested value as JSON: a map (pyarrow's list of key/value pairs) as an object."""

    def plain(v: Any) -> Any:
        if isinstance(v, list) and v and all(isinstance(x, tuple) and len(x) == 2 for x in v):
            return {str(k): plain(x) for k, x in v}
        if isinstance(v, list):
            return [plain(x) for x in v]
        if isinstance(v, dict):
            return {str(k): plain(x) for k, x in v.items()}
        return v

    return json.dumps(plain(value), default=str, sort_keys=True)


def export_table(spark: Any, home: Home, table: str, out: Path, force: bool = False) -> str:
    """Write `table` to `out` (.csv or .parquet); returns a one-line summary. `spark` is unused
    (the table is read with delta-rs)."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    del spark
    if table not in KNOWN_TABLES:
        raise UserError(f"`{table}` is not a table name (known tables: {', '.join(KNOWN_TABLES)}).")
    suffix = out.suffix.lower()
    if out.is_dir():
        raise UserError(f"--out {out} is a folder; give a file name ending in .csv or .parquet.")
    if suffix not in (".csv", ".parquet"):
        raise UserError(f"--out must end in .csv or .parquet, got {out.name}.")
    if out.exists() and not force:
        raise UserError(f"{out} exists; pass --force to overwrite it.")
    try:
        data = DeltaTable(home.table(table)).to_pyarrow_table()
    except TableNotFoundError:
        raise UserError(
            f"There is no table `{table}` in {home.warehouse} yet (nothing has written it)."
        ) from None
    out.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f".{out.name}.", dir=out.parent)
    os.close(handle)
    try:
        if suffix == ".parquet":
            import pyarrow.parquet as pq

            pq.write_table(data, temporary)
        else:
            import pyarrow.csv as pcsv

            pcsv.write_csv(_iso_timestamps(data), temporary)
        os.replace(temporary, out)  # readers see the old file or the new one, never a part
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)
    return f"wrote {data.num_rows} rows of {table} to {out}"
