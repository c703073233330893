"""The lake resource: the home folder, the validated settings and "now", shared by every asset
(`sessionize_assets.lake` holds the same without Dagster, for planning)."""

from __future__ import annotations

from dagster import ConfigurableResource

from sessionize_assets.lake import LakeAccess


class LakeResource(LakeAccess, ConfigurableResource):
    """Where the tables are, which settings apply, and what time it is (`LakeAccess`), as a
    Dagster resource."""

    home: str
    config_file: str | None = None
    now: str | None = None
