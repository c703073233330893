"""The project's table names and where they are (the generic Delta helpers are in `resources.delta`)."""

from __future__ import annotations

from pathlib import Path

from dagster import ConfigurableResource

from sessionize_assets.home import Home

# Table names (the spec's, plus the project's own bookkeeping tables).
EVENTS = "events"
INVALID_EVENTS = "invalid_events"
LOAD_LOG = "load_log"
FILTERED_EVENTS = "filtered_events"
FILTERED_EVENTS_ACCOUNTING = "filtered_events_accounting"
DAYS_TO_PROCESS = "days_to_process"
DAILY_AGGREGATE_HORIZONS = "daily_aggregate_horizons"
DAILY_AGGREGATION_MANIFEST = "daily_aggregation_manifest"
DAILY_AGGREGATES = "daily_aggregates"
ATTRIBUTES = "attributes"
SESSIONS = "sessions"
USERS = "users"
SESSIONS_LIFECYCLE_MANIFEST = "sessions_lifecycle_manifest"
QUARANTINED_SESSIONS = "quarantined_sessions"
SUPERSEDED_SESSIONS = "superseded_sessions"
INCREMENTAL_MANIFEST = "incremental_manifest"
PROCESSING_MANIFEST = "processing_manifest"
CURSOR_STATE = "cursor_state"
FORGET_LOG = "forget_log"
TIME_BASED_DEFINITIONS = "time_based_definitions"


class WarehouseResource(ConfigurableResource):
    """Where the tables are: the warehouse folder under the home (or an object-store URI)."""

    home: str

    def location(self, table: str) -> str:
        return Home(Path(self.home)).table(table)
