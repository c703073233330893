"""Canonical column names (Snowplow atomic events) and the project's own lineage columns."""

from __future__ import annotations

# Timestamps parsed to UTC TimestampType on load; every other canonical column is a string.
TIMESTAMP_COLUMNS: tuple[str, ...] = (
    "collector_tstamp",
    "dvce_created_tstamp",
    "dvce_sent_tstamp",
    "derived_tstamp",
    "load_tstamp",
    "etl_tstamp",
    "true_tstamp",
    "refr_dvce_tstamp",
)

# The columns every `events` row has (created as null strings when an input lacks them).
REQUIRED_COLUMNS: tuple[str, ...] = (
    "event_id",
    "app_id",
    "platform",
    "event_name",
    "domain_userid",
    "user_id",
    "network_userid",
    "domain_sessionid",
    "page_url",
    "page_referrer",
    "collector_tstamp",
    "dvce_created_tstamp",
    "dvce_sent_tstamp",
    "derived_tstamp",
    "load_tstamp",
)

# Lineage columns the loader adds.
LOAD_DATE = "load_date"  # date(load_tstamp), the partition column of events and filtered_events
LOAD_ID = "_load_id"  # one id per landed file
SOURCE_FILE = "_source_file"
ROW_HASH = "_row_hash"  # sha2 of the row's raw text: the stable last tie-break of deduplication

EVENT_DATE = "event_date"  # date(derived_tstamp), added by filtered_events

# Segment-style sources: a column mapping users can start from (SPEC section 4).
SEGMENT_COLUMN_MAPPING: dict[str, str] = {
    "messageId": "event_id",
    "anonymousId": "domain_userid",
    "userId": "user_id",
    "timestamp": "derived_tstamp",
    "receivedAt": "load_tstamp",
    "sentAt": "dvce_sent_tstamp",
    "originalTimestamp": "dvce_created_tstamp",
    "event": "event_name",
}
