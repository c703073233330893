"""Plain Python values -> Dagster metadata: the one converter every asset and check uses."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dagster import AssetMaterialization, MetadataValue


def as_metadata_value(value: Any) -> Any:
    """A value as Dagster metadata: numbers stay numbers (so the UI can plot them per partition),
    mappings and lists become JSON, None a null, anything else text."""
    if isinstance(value, MetadataValue):
        return value
    if value is None:
        return MetadataValue.null()
    if isinstance(value, bool):
        return MetadataValue.bool(value)
    if isinstance(value, int):
        return MetadataValue.int(value)
    if isinstance(value, float):
        return MetadataValue.float(value)
    if isinstance(value, str):
        return MetadataValue.text(value)
    if isinstance(value, Mapping | list | tuple):
        return MetadataValue.json(value if not isinstance(value, tuple) else list(value))
    return MetadataValue.text(str(value))


def dagster_metadata(values: Mapping[str, Any]) -> dict[str, Any]:
    """Every value of a metadata dict through `as_metadata_value`."""
    return {str(key): as_metadata_value(value) for key, value in values.items()}


RUN_TOTALS = "run totals (all partitions of the run, not this one's)"
# The tag of the per-partition materialization events of a run of several partitions.
FIGURES_TAG = "sessionize/partition_figures"


def partition_metadata(
    values: Mapping[str, Any],
    partition_keys: Sequence[str],
    per_partition: Mapping[str, Mapping[str, float]] | None = None,
) -> dict[str, Any]:
    """Metadata of a partitioned materialization. Dagster copies one run's metadata onto every
    partition the run wrote (it has no per-partition metadata for a multi-partition run, dagster
    issue #18123), so a run of several partitions keeps its numbers in one JSON entry instead of
    as plottable numbers that would count each total once per partition (each partition's own
    numbers follow in `partition_figures`). A run of one partition reports its numbers as they
    are, with that partition's figures from `per_partition`, and `dagster/row_count` (its rows
    written) too."""
    keys = list(partition_keys)
    if len(keys) <= 1:
        out = dict(values)
        if keys and per_partition and keys[0] in per_partition:
            out.update(per_partition[keys[0]])
        return dagster_metadata(_with_row_count(out))
    numbers = {
        k: v for k, v in values.items() if isinstance(v, int | float) and not isinstance(v, bool)
    }
    rest = {k: v for k, v in values.items() if k not in numbers}
    return dagster_metadata(
        {
            **rest,
            "partitions in this run": f"{len(keys)}: {keys[0]} .. {keys[-1]}",
            RUN_TOTALS: numbers,
        }
    )


def _with_row_count(values: Mapping[str, Any]) -> dict[str, Any]:
    """`values` and Dagster's `dagster/row_count`: the rows written, when there is such a number."""
    out = dict(values)
    written = out.get("rows written")
    if isinstance(written, int) and not isinstance(written, bool):
        out["dagster/row_count"] = written
    return out


def partition_figures(
    asset: str,
    per_partition: Mapping[str, Mapping[str, float]],
    partition_keys: Sequence[str],
) -> list[AssetMaterialization]:
    """For a run of several partitions: one materialization event per partition with that
    partition's own numbers (and `dagster/row_count` from its rows written), logged after the
    run's own, so each partition's latest materialization carries its figures and the UI's
    partition plots (Overview -> Metadata -> Plots) show every partition, whatever the size of
    the run that wrote it. None for a run of one partition (its metadata has them already)."""
    keys = list(partition_keys)
    if len(keys) <= 1:
        return []
    events = []
    for key in keys:
        figures = per_partition.get(key)
        if not figures:
            continue
        events.append(
            AssetMaterialization(
                asset_key=asset,
                partition=key,
                description=(
                    f"Partition {key}'s own figures, from a run of {len(keys)} partitions "
                    f"({keys[0]} .. {keys[-1]}) whose materialization just before holds the totals."
                ),
                metadata=dagster_metadata(_with_row_count(figures)),
                tags={FIGURES_TAG: "true"},
            )
        )
    return events


def schema_metadata(table: str, settings: Any = None) -> dict[str, Any]:
    """Definition metadata of a table asset: its `dagster/column_schema` from the table catalog
    (the columns docs/tables.md lists); none for a table whose columns the catalog cannot know
    from the settings (configured attributes)."""
    from sessionize_assets import table_catalog

    try:
        return {"dagster/column_schema": table_catalog.column_schema(table, settings)}
    except ValueError:
        return {}
