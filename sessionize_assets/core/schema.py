"""Canonical column names (Snowplow atomic events) and the project's own lineage columns."""

from __future__ import annotations

from collections.abc import Iterable

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

# The columns whose Delta file statistics (per-file min, max and null count) `events` and
# `filtered_events` keep: the identifiers and timestamps that reads skip files by (the session
# branch's reads of a few users or a time span, delta-rs's pruned scans), i.e. the required
# columns but the long text no read filters on and `event_id` (random ids never skip a file).
# Delta's default, the first 32 columns, also described page URLs, referrers and user agents:
# computing those took 10-25 % of a 6 M-row partitioned write (docs/benchmarks.md, "Session 42").
STATISTICS_COLUMNS: tuple[str, ...] = tuple(
    c for c in REQUIRED_COLUMNS if c not in ("event_id", "page_url", "page_referrer")
)
# The Delta table property naming them (Delta Lake 3.0+ and delta-rs honour it when writing).
STATISTICS_PROPERTY = "delta.dataSkippingStatsColumns"


def statistics_columns(available: Iterable[str], configured: Iterable[str] = ()) -> str:
    """The value of STATISTICS_PROPERTY for a table of the `available` columns: the
    STATISTICS_COLUMNS, then the `configured` ones (the settings' user and session identifiers
    and session timestamp, which may name other columns), each only if the table has it."""
    have = set(available)
    wanted = dict.fromkeys([*STATISTICS_COLUMNS, *configured])
    return ",".join(c for c in wanted if c in have and c not in (LOAD_DATE, EVENT_DATE))
