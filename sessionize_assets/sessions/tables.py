"""The session branch's tables: model names and order, and the schemas of every table it writes.

All are unpartitioned Delta tables under the warehouse (names in `resources.tables`):
`sessions`, `users`, `user_session_stats` (the models); `sessions_lifecycle_manifest`,
`quarantined_sessions`, `superseded_sessions` (the bookkeeping tables the models keep) and
`incremental_manifest` (per model: last_success, consumed filtered_events version,
processed-through limit). docs/sessions.md has their keys and columns.
"""

from __future__ import annotations

from collections.abc import Callable

from sessionize_assets.resources.tables import SESSIONS, USERS

USER_SESSION_STATS = "user_session_stats"
MODEL_ORDER: tuple[str, ...] = (SESSIONS, USERS, USER_SESSION_STATS)

# Where a table is: `LakeResource.table` / `Home.table`.
TablePath = Callable[[str], str]

SESSIONS_SCHEMA = (
    "session_identifier string, user_identifier string, start_tstamp timestamp, end_tstamp timestamp, "
    "total_events long, page_views long, duration_s double, first_page_url string, "
    "last_page_url string, session_number long, is_quarantined boolean"
)
LIFECYCLE_SCHEMA = (
    "session_identifier string, user_identifier string, start_tstamp timestamp, "
    "end_tstamp timestamp, is_quarantined boolean"
)
QUARANTINED_SCHEMA = (
    "session_identifier string, user_identifier string, start_tstamp timestamp, "
    "capped_at timestamp, quarantined_at timestamp"
)
SUPERSEDED_SCHEMA = (
    "superseded_session_identifier string, session_identifier string, user_identifier string, "
    "reason string, superseded_at timestamp"
)
USERS_SCHEMA = (
    "user_identifier string, first_session_start_tstamp timestamp, last_session_end_tstamp timestamp, "
    "sessions long, total_events long, page_views long"
)
USER_SESSION_STATS_SCHEMA = (
    "user_identifier string, sessions long, total_duration_s double, mean_duration_s double, "
    "median_duration_s double, min_duration_s double, max_duration_s double"
)
MANIFEST_SCHEMA = (
    "model string, last_success timestamp, consumed_version long, processed_through timestamp, "
    "updated_at timestamp, definition string"
)
USER_MODEL_SCHEMAS = {USERS: USERS_SCHEMA, USER_SESSION_STATS: USER_SESSION_STATS_SCHEMA}
