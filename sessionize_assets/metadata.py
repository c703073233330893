"""Plain Python values -> Dagster metadata: the one converter every asset and check uses."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dagster import MetadataValue


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
