"""A seeded, realistic Snowplow-style event generator that writes landing files per load day.

Used by `sessionize generate`, `sessionize demo` and the benchmarks. Pure Python (stdlib only),
streaming: rows go straight to their load day's file, so memory stays flat however many days and
events are asked for. The same arguments and seed give byte-identical files.

Layout written into `out_dir`::

    load_date=2024-03-01/events.csv      (or events.ndjson; `file_format="mixed"` alternates)
    load_date=2024-03-02/events.csv
    ...
    _manifest.json                       (the GenerationSummary, sorted keys)

Every row carries its own `load_tstamp`; a file's rows all have that file's load day. What the data
holds (the model behind it):

- human users (who visits depends on the profile, below), each with a tracker-assigned
  `domain_sessionid` per visit; events within a visit are seconds to minutes apart (page view,
  page pings every ~10 s while engaged, link clicks, structured e-commerce/docs events with
  `se_value`), idle stretches under 25 minutes; a user's visits are more than 30 minutes apart, so
  id-mode and gap-mode sessions agree for humans; a share of visits start just before midnight
  and cross it;
- bots: one cookie and one session id each, a page view every 1-25 minutes for 3.25-6 days (longer
  than `max_session_days` = 3 in both session modes, to exercise quarantine);
- timing as Snowplow's: `derived_tstamp = collector - (dvce_sent - dvce_created)`; some device
  clocks are off by minutes to hours (derived corrects them); most rows load within a minute of
  `collector_tstamp`, a `late_share` loads later (how much later: the profile); a
  `device_late_share` was created offline and sent 10 minutes to 10 days later (so
  `dvce_sent - dvce_created` can exceed `days_late_allowed`; the profile shapes the delay);
- duplicated `event_id`s (`DUPLICATE_KINDS`): the same row loaded twice on the same load day, on a
  later load day (1 to `max_duplicate_delay_days` later), or re-sent by the tracker (later
  `dvce_sent_tstamp` and `collector_tstamp`, same `derived_tstamp`);
- malformed rows (`MALFORMED_KINDS_CSV` / `MALFORMED_KINDS_JSON`), each a corrupted copy of a real
  event with a fresh event id (so if a loader wrongly kept one it would show): wrong number of CSV
  fields (1-3 trailing fields missing, or 1-2 extra; `load_tstamp` stays readable), invalid JSON
  line (truncated), an unparseable timestamp (in collector, device-created or derived), a missing
  `event_id`, every event time hours to days after the row's own load time (clock skew). Normal rows
  never have `derived_tstamp` after `load_tstamp`.

Rows past the end of the generated range (load time at or after `start_date + days`) are not
written; the manifest counts what was written. Near the end a late row's delay is drawn from what
still fits before it (a row with no room for any delay loads on time).

Profiles (`profile=`, frozen `Profile` dataclasses in `PROFILES`; bots, duplicates and malformed
rows are the same in both, and so are `late_share` and `device_late_share`):

- `harsh` (the default of `generate`, the generator's original output byte for byte): late rows
  load 6 hours to `max_late_days` after collection, log-uniform (with 60 days, three in four are
  more than a day late), so every load day holds rows of almost every earlier event day;
  device-late rows are sent 10 minutes to 10 days late, log-uniform (17% of them after more than
  3 days); users come from a fixed pool (`SkewedPool`: about 3 visits each, few one-visit users,
  no heavy tail). A stress case for the reprocessing of late event days.
- `realistic` (the benchmark's default): late rows: 90% load 5 minutes to 6 hours after
  collection, 9.5% 6 hours to 3 days, 0.5% 3 days to `max_late_days` (each band log-uniform);
  device-late rows: 90% sent 10 minutes to 6 hours after creation, 9% 6 hours to 3 days, 1% 3 to
  10 days; users: half of the visits are by first-time users, the others by returning users
  drawn in proportion to a Pareto engagement weight (`EngagedUsers`: Zipf-like, most users visit
  once in a few weeks, a few daily).

  Basis (reasoning, not a fitted data set). Snowplow's documentation on late-arriving data names
  two kinds: late *sent* events (the device was offline: mobile trackers store events and send
  them when the connection and the app are back) and late *loaded* events (collector to load:
  batch loading, pipeline problems); it handles the first with `days_late_allowed` and the second
  with a lookback of hours (`lookback_window_hours`; the project's defaults are 3 days and 6
  hours). Delivery retries, loader micro-batches and short offline stretches (a tunnel, a flight)
  are minutes to hours; an app not reopened for days or a pipeline incident gives days; failed
  events recovered and replayed later give the rare weeks. Who visits: web analytics tools commonly
  show most visitors of a site in a month coming once and a small core of returning users making
  a disproportionate share of the visits; a heavy-tailed (Pareto) engagement per user reproduces
  both, and its rank-frequency curve is Zipf's (weight of rank r ~ r^(-1/1.1)).
"""

from __future__ import annotations

import csv
import datetime as dt
import json
import math
import random
import re
import shutil
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any, NamedTuple

from sessionize_assets.errors import UserError

FILE_FORMATS: tuple[str, ...] = ("csv", "json", "mixed")
DUPLICATE_KINDS: tuple[str, ...] = ("same_load_day", "later_load_day", "different_collector_tstamp")
MALFORMED_KINDS_CSV: tuple[str, ...] = (
    "wrong_field_count",
    "unparseable_timestamp",
    "missing_event_id",
    "clock_skew",
)
MALFORMED_KINDS_JSON: tuple[str, ...] = (
    "invalid_json",
    "unparseable_timestamp",
    "missing_event_id",
    "clock_skew",
)
MANIFEST_NAME = "_manifest.json"  # leading underscore: loaders skip it (Hadoop convention)
FILE_NAMES: dict[str, str] = {"csv": "events.csv", "json": "events.ndjson"}
ON_TIME_MAX_SECONDS = 60  # on-time rows load within this many seconds of collector_tstamp
LATE_MIN_HOURS = 6  # `harsh`: a late row loads at least this long after collector_tstamp

# Snowplow atomic column names, in Snowplow's order; JSON columns (context/unstruct) last so a CSV
# row missing trailing fields still has a readable load_tstamp.
COLUMNS: tuple[str, ...] = (
    "app_id",
    "platform",
    "etl_tstamp",
    "collector_tstamp",
    "dvce_created_tstamp",
    "event",
    "event_id",
    "name_tracker",
    "v_tracker",
    "user_id",
    "domain_userid",
    "domain_sessionidx",
    "network_userid",
    "geo_country",
    "page_url",
    "page_title",
    "page_referrer",
    "page_urlhost",
    "page_urlpath",
    "refr_medium",
    "refr_source",
    "se_category",
    "se_action",
    "se_label",
    "se_property",
    "se_value",
    "useragent",
    "br_lang",
    "dvce_sent_tstamp",
    "domain_sessionid",
    "derived_tstamp",
    "event_vendor",
    "event_name",
    "event_format",
    "event_version",
    "load_tstamp",
    "contexts_com_snowplowanalytics_snowplow_web_page_1_0_0",
    "contexts_com_iab_snowplow_spiders_and_robots_1_0_0",
    "unstruct_event_com_snowplowanalytics_snowplow_link_click_1",
)
_I = {name: i for i, name in enumerate(COLUMNS)}
I_APP, I_ETL, I_COLLECTOR, I_CREATED = (
    _I["app_id"],
    _I["etl_tstamp"],
    _I["collector_tstamp"],
    _I["dvce_created_tstamp"],
)
I_EVENT, I_EVENT_ID, I_USER_ID, I_DUID = (
    _I["event"],
    _I["event_id"],
    _I["user_id"],
    _I["domain_userid"],
)
I_SIDX, I_NUID, I_COUNTRY = _I["domain_sessionidx"], _I["network_userid"], _I["geo_country"]
I_URL, I_TITLE, I_REFERRER = _I["page_url"], _I["page_title"], _I["page_referrer"]
I_HOST, I_PATH, I_MEDIUM, I_SOURCE = (
    _I["page_urlhost"],
    _I["page_urlpath"],
    _I["refr_medium"],
    _I["refr_source"],
)
I_SE_CAT, I_SE_ACT, I_SE_LAB, I_SE_PROP, I_SE_VAL = (
    _I["se_category"],
    _I["se_action"],
    _I["se_label"],
    _I["se_property"],
    _I["se_value"],
)
I_UA, I_LANG, I_SENT, I_SID, I_DERIVED = (
    _I["useragent"],
    _I["br_lang"],
    _I["dvce_sent_tstamp"],
    _I["domain_sessionid"],
    _I["derived_tstamp"],
)
I_VENDOR, I_NAME, I_FORMAT, I_VERSION = (
    _I["event_vendor"],
    _I["event_name"],
    _I["event_format"],
    _I["event_version"],
)
I_LOAD = _I["load_tstamp"]
I_WEB_PAGE = _I["contexts_com_snowplowanalytics_snowplow_web_page_1_0_0"]
I_SPIDER = _I["contexts_com_iab_snowplow_spiders_and_robots_1_0_0"]
I_LINK = _I["unstruct_event_com_snowplowanalytics_snowplow_link_click_1"]
_EVENT_TIMESTAMPS = (I_ETL, I_COLLECTOR, I_CREATED, I_SENT, I_DERIVED)

SECOND = 1_000
MINUTE = 60 * SECOND
HOUR = 60 * MINUTE
DAY = 24 * HOUR
_EPOCH = dt.date(1970, 1, 1)
_EPOCH_ORDINAL = _EPOCH.toordinal()

# event_name -> (event, event_vendor, event_name, event_format, event_version)
_EVENT_TYPES: dict[str, tuple[str, str, str, str, str]] = {
    "page_view": (
        "page_view",
        "com.snowplowanalytics.snowplow",
        "page_view",
        "jsonschema",
        "1-0-0",
    ),
    "page_ping": (
        "page_ping",
        "com.snowplowanalytics.snowplow",
        "page_ping",
        "jsonschema",
        "1-0-0",
    ),
    "link_click": (
        "unstruct",
        "com.snowplowanalytics.snowplow",
        "link_click",
        "jsonschema",
        "1-0-1",
    ),
    "event": ("struct", "com.google.analytics", "event", "jsonschema", "1-0-0"),
}

_HUMAN_AGENTS: tuple[str, ...] = (
    "Mozilla/5.0 (Macintosh; Intel Mac OS X 10_15_7) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.3 Safari/605.1.15",
    "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/122.0.0.0 Safari/537.36",
    "Mozilla/5.0 (Windows NT 10.0; Win64; x64; rv:123.0) Gecko/20100101 Firefox/123.0",
    "Mozilla/5.0 (iPhone; CPU iPhone OS 17_3 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.3 Mobile/15E148 Safari/604.1",
    "Mozilla/5.0 (Linux; Android 14; Pixel 8) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/122.0.0.0 Mobile Safari/537.36",
    "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/121.0.0.0 Safari/537.36",
)
_BOT_AGENTS: tuple[str, ...] = (
    "Mozilla/5.0 (compatible; ExampleCrawler/2.1; +https://crawler.example.org/bot.html)",
    "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) HeadlessChrome/122.0.0.0 Safari/537.36",
    "python-requests/2.31.0",
)
_COUNTRIES: tuple[str, ...] = (
    "US",
    "US",
    "US",
    "DE",
    "GB",
    "GB",
    "FR",
    "NL",
    "AU",
    "CA",
    "BR",
    "IN",
    "JP",
)
_LANGS: dict[str, str] = {
    "US": "en-US",
    "DE": "de-DE",
    "GB": "en-GB",
    "FR": "fr-FR",
    "NL": "nl-NL",
    "AU": "en-AU",
    "CA": "en-CA",
    "BR": "pt-BR",
    "IN": "en-IN",
    "JP": "ja-JP",
}
_HUMAN_SPIDER = (
    '[{"category":"BROWSER","primaryImpact":"NONE","reason":"PASSED_ALL","spiderOrRobot":false}]'
)
_BOT_SPIDER = '[{"category":"SPIDER_OR_ROBOT","primaryImpact":"UNKNOWN","reason":"FAILED_UA_INCLUDE","spiderOrRobot":true}]'

# (referrer url, refr_medium, refr_source, weight) for a visit's first page.
_EXTERNAL_REFERRERS: tuple[tuple[str | None, str | None, str | None, float], ...] = (
    (None, None, None, 0.35),
    ("https://www.google.com/", "search", "Google", 0.38),
    ("https://www.bing.com/", "search", "Bing", 0.05),
    ("https://t.co/", "social", "Twitter", 0.07),
    ("https://www.reddit.com/r/CampingGear/", "social", "Reddit", 0.05),
    ("https://news.ycombinator.com/", "unknown", None, 0.03),
    ("https://newsletter.example.net/issue/42", "email", None, 0.07),
)
_REFERRER_WEIGHTS = [r[3] for r in _EXTERNAL_REFERRERS]

_PRODUCTS: tuple[tuple[str, str, float], ...] = (
    ("trail-tent-2p", "Trail Tent, 2 Person", 249.0),
    ("summit-tent-3p", "Summit Tent, 3 Person", 389.0),
    ("down-sleeping-bag", "Down Sleeping Bag -5°C", 219.5),
    ("camp-stove", "Compact Camp Stove", 59.9),
    ("headlamp-400", "Headlamp 400 lm", 34.95),
    ("hiking-boots-w", "Women's Hiking Boots", 149.0),
    ("hiking-boots-m", "Men's Hiking Boots", 149.0),
    ("rain-jacket", 'Rain Jacket "Storm"', 179.0),
    ("water-filter", "Water Filter", 44.5),
    ("trekking-poles", "Trekking Poles (pair)", 79.0),
    ("backpack-45l", "Backpack 45 L", 169.0),
    ("camp-chair", "Folding Camp Chair", 39.0),
)
_SHOP_PAGES: tuple[tuple[str, str, float], ...] = (
    ("/", "Example Outdoor | Tents, boots & more", 3.0),
    ("/category/tents", "Tents | Example Outdoor", 1.5),
    ("/category/footwear", "Footwear | Example Outdoor", 1.2),
    ("/category/clothing", "Clothing | Example Outdoor", 1.0),
    ("/search", "Search results | Example Outdoor", 1.0),
    ("/about", "About us | Example Outdoor", 0.3),
    ("/help/shipping", "Shipping & returns | Example Outdoor", 0.4),
) + tuple((f"/product/{slug}", f"{name} | Example Outdoor", 0.6) for slug, name, _ in _PRODUCTS)
_DOCS_PAGES: tuple[tuple[str, str, float], ...] = (
    ("/", "Example Docs", 2.0),
    ("/getting-started", "Getting started | Example Docs", 2.0),
    ("/guides/late-data", "Late-arriving data | Example Docs", 1.0),
    ("/guides/sessions", "Sessions, explained | Example Docs", 1.0),
    ("/api/events", "Events API | Example Docs", 0.8),
    ("/api/sessions", "Sessions API | Example Docs", 0.6),
    ("/faq", "FAQ | Example Docs", 0.5),
)
_SITES: dict[str, tuple[str, tuple[tuple[str, str, float], ...]]] = {
    "shop": ("shop.example.com", _SHOP_PAGES),
    "docs": ("docs.example.com", _DOCS_PAGES),
}
_PRICES = {f"/product/{slug}": (slug, price) for slug, _, price in _PRODUCTS}
_SEARCH_TERMS = ("tent", "boots", "stove", "sleeping bag", "rain jacket", "headlamp", "backpack")


class LandingRow(NamedTuple):
    """One row for a load day's file: values in `COLUMNS` order (None = empty/null).

    `malformed` names the kind when the row was made unusable on purpose; `variant` picks how a
    structural corruption (wrong field count, invalid JSON) is applied when serialized.
    """

    day_index: int
    values: list[str | None]
    malformed: str | None = None
    variant: int = 0


@dataclass(frozen=True)
class GenerationSummary:
    """What `generate` wrote (also written as `manifest.json`): all counts are rows written."""

    start_date: str
    days: int
    events_per_day: int
    seed: int
    file_format: str
    profile: str
    profile_parameters: dict[str, Any]
    parameters: dict[str, float | int]
    files: list[str]
    rows_per_load_day: dict[str, int]
    total_rows: int
    events: int
    bot_events: int
    users: int
    human_sessions: int
    bot_sessions: int
    sessions_crossing_midnight: int
    late_rows: int
    late_rows_by_days_late: dict[str, int]
    max_lateness_days: float
    device_late_rows: int
    device_late_rows_by_days_late: dict[str, int]
    duplicate_rows: dict[str, int]
    malformed_rows: dict[str, int]

    def to_json(self) -> str:
        """Stable JSON text (sorted keys): same generation, same bytes."""
        return json.dumps(asdict(self), indent=2, sort_keys=True) + "\n"


# --- small pure helpers -------------------------------------------------------------------------

_MINUTE_PREFIXES: dict[int, str] = {}
_SECOND_SUFFIXES: tuple[str, ...] = tuple(
    f":{s:02d}.{m:03d}" for s in range(60) for m in range(1000)
)


def format_tstamp(ms: int) -> str:
    """Epoch milliseconds -> `YYYY-MM-DD HH:MM:SS.mmm` (UTC, no zone)."""
    minute, rest = divmod(ms, MINUTE)
    prefix = _MINUTE_PREFIXES.get(minute)
    if prefix is None:
        if len(_MINUTE_PREFIXES) > 500_000:
            _MINUTE_PREFIXES.clear()
        moment = dt.datetime(1970, 1, 1) + dt.timedelta(minutes=minute)
        prefix = _MINUTE_PREFIXES[minute] = moment.strftime("%Y-%m-%d %H:%M")
    return prefix + _SECOND_SUFFIXES[rest]


_TSTAMP = re.compile(r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}\.\d{3}")


def parse_tstamp(text: str) -> int:
    """`YYYY-MM-DD HH:MM:SS.mmm` (UTC) -> epoch milliseconds; ValueError for anything else."""
    if not _TSTAMP.fullmatch(text):
        raise ValueError(f"not a YYYY-MM-DD HH:MM:SS.mmm timestamp: {text!r}")
    moment = dt.datetime.fromisoformat(text)
    return (moment.toordinal() - _EPOCH_ORDINAL) * DAY + (
        moment.hour * HOUR
        + moment.minute * MINUTE
        + moment.second * SECOND
        + moment.microsecond // 1000
    )


def day_start_ms(day: dt.date) -> int:
    """Epoch milliseconds of a UTC day's midnight."""
    return (day - _EPOCH).days * DAY


def seeded_uuid4(rng: random.Random) -> str:
    """A version-4 UUID string drawn from `rng` (reproducible, unlike uuid.uuid4)."""
    n = rng.getrandbits(128)
    n = (n & ~(0xF000 << 64)) | (0x4000 << 64)
    n = (n & ~(0xC000 << 48)) | (0x8000 << 48)
    h = f"{n:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def log_uniform(rng: random.Random, low: float, high: float) -> float:
    """A value between low and high, uniform on a log scale (many small, some very large)."""
    if high <= low:
        return low
    return math.exp(rng.uniform(math.log(low), math.log(high)))


def day_format(file_format: str, day_index: int) -> str:
    """The serialization of a load day's file: `mixed` alternates csv (even days) and json."""
    if file_format == "mixed":
        return "csv" if day_index % 2 == 0 else "json"
    return file_format


def diurnal_weight(ms_of_day: int) -> float:
    """Relative traffic at a time of day: quietest around 04:00 UTC, busiest around 16:00."""
    phase = 2 * math.pi * (ms_of_day - 4 * HOUR) / DAY
    return 0.3 + 0.7 * (0.5 - 0.5 * math.cos(phase))


def csv_fields(row: LandingRow) -> list[str | None]:
    """A row's CSV fields; a `wrong_field_count` row loses 1-3 trailing fields or gains 1-2."""
    if row.malformed != "wrong_field_count":
        return row.values
    if row.variant % 2 == 0:
        return row.values[: -(1 + row.variant // 2 % 3)]
    return row.values + ["extra"] * (1 + row.variant // 2 % 2)


def json_line(row: LandingRow) -> str:
    """A row as one NDJSON line (all values strings or null; a missing event_id is left out).

    An `invalid_json` row is cut off part-way (never valid JSON: the closing brace is gone).
    """
    record = dict(zip(COLUMNS, row.values, strict=True))
    if row.malformed == "missing_event_id":
        del record["event_id"]
    text = json.dumps(record, separators=(",", ":"))
    if row.malformed == "invalid_json":
        cut = int(len(text) * (0.2 + 0.6 * (row.variant % 1000) / 1000))
        text = text[: max(cut, 2)]
    return text


# --- profiles: how late rows arrive and how often users come back --------------------------------


@dataclass(frozen=True)
class Band:
    """One band of a delay mixture: `weight` of the draws, log-uniform from `low_ms` to `high_ms`
    (None: up to the ceiling of the draw, e.g. `max_late_days`)."""

    weight: float
    low_ms: int
    high_ms: int | None = None


@dataclass(frozen=True)
class Delay:
    """A delay distribution: a mixture of log-uniform bands.

    `draw` picks a band among those that fit under the ceiling (the room left before the end of
    the generated range, or `max_late_days`), weights renormalized, then a log-uniform value in
    it. With a single band no band is drawn (so the random stream is the one of a plain
    log-uniform draw).
    """

    bands: tuple[Band, ...]

    @property
    def min_ms(self) -> int:
        """The shortest possible delay: a delay needs at least this much room."""
        return min(b.low_ms for b in self.bands)

    def draw(self, rng: random.Random, ceiling_ms: int) -> int:
        """A delay in [min_ms, ceiling_ms]; the caller checks `ceiling_ms >= min_ms`."""
        if len(self.bands) == 1:
            band = self.bands[0]
        else:
            fitting = [b for b in self.bands if b.low_ms <= ceiling_ms]
            band = rng.choices(fitting, [b.weight for b in fitting])[0]
        high = ceiling_ms if band.high_ms is None else min(band.high_ms, ceiling_ms)
        return int(log_uniform(rng, band.low_ms, high))


class _UserChooser:
    """Proposes the user of the next visit (`candidate`) and learns the visits (`visited`)."""

    def candidate(self, rng: random.Random) -> int:
        raise NotImplementedError

    def visited(self, index: int) -> None:
        """A visit by user `index` happened."""


class _PoolChooser(_UserChooser):
    def __init__(self, pool: int, skew: float) -> None:
        self.pool, self.skew = pool, skew

    def candidate(self, rng: random.Random) -> int:
        return int(self.pool * rng.random() ** self.skew)


class _EngagedChooser(_UserChooser):
    """New users with a Pareto engagement weight; returning visits drawn in proportion to it
    (a Fenwick tree over the users' weights: O(log users) per draw and per new user)."""

    def __init__(self, new_user_share: float, shape: float, max_weight: float) -> None:
        self.new_user_share, self.shape, self.max_weight = new_user_share, shape, max_weight
        self.tree: list[float] = [0.0]  # 1-based Fenwick tree; user i is position i + 1
        self.total = 0.0

    def _prefix(self, k: int) -> float:
        out = 0.0
        while k > 0:
            out += self.tree[k]
            k -= k & -k
        return out

    def _add_user(self, weight: float) -> int:
        i = len(self.tree)
        self.tree.append(weight + self._prefix(i - 1) - self._prefix(i - (i & -i)))
        self.total += weight
        return i - 1

    def _find(self, x: float) -> int:
        """The user whose weight interval holds x (0 <= x < total)."""
        n = len(self.tree) - 1
        pos, step = 0, 1 << (n.bit_length() - 1)
        while step:
            if pos + step <= n and self.tree[pos + step] <= x:
                x -= self.tree[pos + step]
                pos += step
            step >>= 1
        return min(pos, n - 1)

    def candidate(self, rng: random.Random) -> int:
        if self.total == 0.0 or rng.random() < self.new_user_share:
            return self._add_user(min(rng.paretovariate(self.shape), self.max_weight))
        return self._find(rng.random() * self.total)


@dataclass(frozen=True)
class SkewedPool:
    """A fixed pool of users, `visits_per_user` visits each on average over the first
    `max_pool_days` days, user index = pool × U^`skew` (U uniform): every user keeps coming back,
    low indexes more often. Few one-visit users, no heavy tail."""

    skew: float = 1.5
    visits_per_user: float = 3.0
    max_pool_days: int = 30

    def chooser(self, sessions_per_day: float, days: int) -> _UserChooser:
        pool = max(5, int(sessions_per_day * min(days, self.max_pool_days) / self.visits_per_user))
        return _PoolChooser(pool, self.skew)


@dataclass(frozen=True)
class EngagedUsers:
    """Users differ in how engaged they are: a visit is by a first-time user with probability
    `new_user_share`; each new user draws an engagement weight from a Pareto law (shape
    `engagement_shape`, minimum 1, capped at `max_engagement`), and a returning visit goes to a
    past user in proportion to that weight. Ranked by weight, users follow Zipf's law (weight of
    rank r ~ r^(-1/shape)); most users have a weight near 1 and do not come back within a few
    weeks, a few come back daily. Users keep arriving every day."""

    new_user_share: float = 0.5
    engagement_shape: float = 1.1
    max_engagement: float = 2000.0

    def chooser(self, sessions_per_day: float, days: int) -> _UserChooser:
        return _EngagedChooser(self.new_user_share, self.engagement_shape, self.max_engagement)


@dataclass(frozen=True)
class Profile:
    """How a data set's rows arrive late and how its users come back (see the module docstring).

    `load_delay`: how long after `collector_tstamp` a late row (`late_share`) loads;
    `device_delay`: how long after `dvce_created_tstamp` a device-late row (`device_late_share`,
    created offline) is sent; `users`: who makes each human visit.
    """

    name: str
    load_delay: Delay
    device_delay: Delay
    users: SkewedPool | EngagedUsers

    def to_json(self) -> dict[str, Any]:
        """The parameters as JSON values, for the manifest (delays in milliseconds)."""
        out = asdict(self)
        out["users"] = {"kind": type(self.users).__name__, **out["users"]}
        return json.loads(json.dumps(out))


HARSH = Profile(
    name="harsh",
    # 6 hours to max_late_days, log-uniform (with 60 days, 3 late rows in 4 are over a day late),
    # so a load day holds rows of almost every earlier event day (the original behaviour).
    load_delay=Delay((Band(1.0, LATE_MIN_HOURS * HOUR),)),
    device_delay=Delay((Band(1.0, 10 * MINUTE, 10 * DAY),)),
    users=SkewedPool(),
)
REALISTIC = Profile(
    name="realistic",
    # Most late rows within hours (collector and loader retries, loader batches, short offline
    # stretches), a thin tail of days (pipeline incidents), a tiny tail up to max_late_days
    # (failed events recovered and replayed).
    load_delay=Delay(
        (
            Band(0.90, 5 * MINUTE, 6 * HOUR),
            Band(0.095, 6 * HOUR, 3 * DAY),
            Band(0.005, 3 * DAY),
        )
    ),
    # Mobile trackers buffer events offline and send them when the app is back online: mostly
    # minutes to hours, a few after days (the app not reopened).
    device_delay=Delay(
        (
            Band(0.90, 10 * MINUTE, 6 * HOUR),
            Band(0.09, 6 * HOUR, 3 * DAY),
            Band(0.01, 3 * DAY, 10 * DAY),
        )
    ),
    users=EngagedUsers(),
)
PROFILES: dict[str, Profile] = {p.name: p for p in (HARSH, REALISTIC)}


# --- the event model (functional core: emits LandingRows to a sink) -----------------------------


class _User:
    __slots__ = ("duid", "nuid", "user_id", "country", "agent", "offset_ms", "free_at", "sessions")

    def __init__(self, rng: random.Random, index: int) -> None:
        self.duid = seeded_uuid4(rng)
        self.nuid = seeded_uuid4(rng)
        self.user_id = f"user_{index:06d}@example.com" if rng.random() < 0.3 else None
        self.country = rng.choice(_COUNTRIES)
        self.agent = rng.choice(_HUMAN_AGENTS)
        r = rng.random()
        if r < 0.05:  # a device clock that is off (derived_tstamp corrects it)
            self.offset_ms = rng.randint(-3 * HOUR, 8 * MINUTE)
        elif r < 0.95:
            self.offset_ms = rng.randint(-800, 800)
        else:
            self.offset_ms = 0
        self.free_at = -1  # earliest start of this user's next visit (epoch ms)
        self.sessions = 0


@dataclass
class _Stats:
    events: int = 0
    bot_events: int = 0
    human_sessions: int = 0
    bot_sessions: int = 0
    crossing_midnight: int = 0
    late_rows: int = 0
    late_by_days: dict[str, int] = field(default_factory=dict)
    max_lateness_ms: int = 0
    device_late_rows: int = 0
    device_late_by_days: dict[str, int] = field(default_factory=dict)
    duplicates: dict[str, int] = field(default_factory=lambda: dict.fromkeys(DUPLICATE_KINDS, 0))
    malformed: dict[str, int] = field(default_factory=dict)


class EventModel:
    """The simulated site: users, visits, bots and the loader's timing, driven by one seeded RNG.

    `run(sink)` calls `sink(LandingRow)` for every row, in a deterministic order; rows of one load
    day are not necessarily adjacent or in time order (late rows reach later days' files early).
    """

    def __init__(
        self,
        start_date: dt.date,
        days: int,
        events_per_day: int,
        seed: int,
        *,
        file_format: str = "csv",
        late_share: float = 0.05,
        max_late_days: float = 60.0,
        device_late_share: float = 0.005,
        bot_share: float = 0.02,
        duplicate_share: float = 0.01,
        max_duplicate_delay_days: int = 3,
        malformed_share: float = 0.005,
        midnight_share: float = 0.03,
        profile: Profile = HARSH,
    ) -> None:
        self.rng = random.Random(seed)
        self.profile = profile
        self.start_ms = day_start_ms(start_date)
        self.days = days
        self.end_ms = self.start_ms + days * DAY
        self.file_format = file_format
        self.late_share = late_share
        self.max_late_ms = int(max_late_days * DAY)
        self.device_late_share = device_late_share
        self.duplicate_share = duplicate_share
        self.max_duplicate_delay_days = max_duplicate_delay_days
        self.malformed_share = malformed_share
        self.midnight_share = midnight_share
        # Originals per day such that originals + duplicates + malformed copies ~ events_per_day.
        originals = events_per_day / (1.0 + duplicate_share + malformed_share)
        self.bot_events_per_day = originals * bot_share
        self.human_events_per_day = originals - self.bot_events_per_day
        mean_bot_events_per_day = DAY / (13 * MINUTE)
        self.bot_slots = (
            0
            if bot_share <= 0
            else max(1, round(self.bot_events_per_day / mean_bot_events_per_day))
        )
        sessions_per_day = max(1.0, self.human_events_per_day / 18.0)
        self.chooser = profile.users.chooser(sessions_per_day, days)
        self.users: dict[int, _User] = {}
        self.stats = _Stats()
        self._sink: Callable[[LandingRow], None] = lambda row: None
        self._human_generated = 0

    # -- driving ---------------------------------------------------------------------------------

    def run(self, sink: Callable[[LandingRow], None]) -> _Stats:
        """Generate every row, day by day (bots first, then human visits), into `sink`."""
        self._sink = sink
        rng = self.rng
        bot_next = [self.start_ms + rng.randrange(DAY) for _ in range(self.bot_slots)]
        for d in range(self.days):
            day_start = self.start_ms + d * DAY
            for slot, when in enumerate(bot_next):
                while when < day_start + DAY and when < self.end_ms:
                    when = self._bot_session(when) + rng.randrange(12 * HOUR)
                bot_next[slot] = when
            target = self.human_events_per_day * (d + 1)
            while self._human_generated < target:
                self._human_generated += self._human_session(day_start)
        return self.stats

    # -- visits ----------------------------------------------------------------------------------

    def _visit_start(self, day_start: int) -> int:
        rng = self.rng
        if rng.random() < self.midnight_share:
            return day_start + DAY - rng.randint(30 * SECOND, 15 * MINUTE)
        while True:
            ms_of_day = rng.randrange(DAY)
            if rng.random() < diurnal_weight(ms_of_day):
                return day_start + ms_of_day

    def _pick_user(self, start: int) -> tuple[_User, int]:
        """The visit's user (the profile proposes, up to 4 times, one free at `start`) and its
        start (after the last proposed user's current visit when none was free)."""
        rng = self.rng
        user = None
        index = -1
        for _ in range(4):
            index = self.chooser.candidate(rng)
            user = self.users.get(index)
            if user is None:
                user = self.users[index] = _User(rng, index)
            if user.free_at <= start:
                self.chooser.visited(index)
                return user, start
        assert user is not None
        self.chooser.visited(index)
        return user, user.free_at + rng.randrange(3 * HOUR)

    def _template(
        self, user_fields: tuple[Any, ...], sid: str, sidx: int, app: str | None
    ) -> list[str | None]:
        duid, nuid, user_id, country, agent, spider = user_fields
        row: list[str | None] = [None] * len(COLUMNS)
        row[I_APP] = app
        row[_I["platform"]] = "web"
        row[_I["name_tracker"]] = "sp"
        row[_I["v_tracker"]] = "js-3.23.0"
        row[I_USER_ID] = user_id
        row[I_DUID] = duid
        row[I_SIDX] = str(sidx)
        row[I_NUID] = nuid
        row[I_COUNTRY] = country
        row[I_UA] = agent
        row[I_LANG] = _LANGS.get(country or "", "en-US")
        row[I_SID] = sid
        row[I_SPIDER] = spider
        return row

    def _set_page(
        self,
        row: list[str | None],
        app: str,
        path: str,
        title: str,
        referrer: tuple[str | None, str | None, str | None],
    ) -> str:
        host = _SITES[app][0]
        url = f"https://{host}{path}"
        row[I_URL], row[I_TITLE], row[I_HOST], row[I_PATH] = url, title, host, path
        row[I_REFERRER], row[I_MEDIUM], row[I_SOURCE] = referrer
        page_view_id = seeded_uuid4(self.rng)
        row[I_WEB_PAGE] = f'[{{"id":"{page_view_id}"}}]'
        return url

    def _human_session(self, day_start: int) -> int:
        """One visit; returns the number of events generated (written or not)."""
        rng = self.rng
        user, start = self._pick_user(self._visit_start(day_start))
        user.sessions += 1
        self.stats.human_sessions += 1
        app = "shop" if rng.random() < 0.8 else "docs"
        logged_in = user.user_id if user.user_id is not None and rng.random() < 0.7 else None
        spider = _HUMAN_SPIDER
        row = self._template(
            (user.duid, user.nuid, logged_in, user.country, user.agent, spider),
            seeded_uuid4(rng),
            user.sessions,
            app,
        )
        pages = _SITES[app][1]
        page_weights = [p[2] for p in pages]
        n_pages = 1
        while n_pages < 25 and rng.random() < 0.65:
            n_pages += 1
        referrer = rng.choices(_EXTERNAL_REFERRERS, _REFERRER_WEIGHTS)[0][:3]
        cart: list[float] = []
        forced: list[tuple[str, str]] = []
        t = start
        generated = 0
        for _ in range(n_pages):
            if forced:
                path, title = forced.pop(0)
            elif cart and app == "shop" and rng.random() < 0.5:
                path, title = "/cart", "Your cart | Example Outdoor"
                forced = [
                    ("/checkout", "Checkout | Example Outdoor"),
                    ("/checkout/complete", "Thank you for your order | Example Outdoor"),
                ]
            else:
                path, title, _ = rng.choices(pages, page_weights)[0]
            url = self._set_page(row, app, path, title, referrer)
            self._emit(row, t, "page_view", user.offset_ms, human=True)
            generated += 1
            last = t
            engaged = min(rng.expovariate(1 / 40_000), 20 * MINUTE)
            if path in _PRICES and rng.random() < 0.15:
                slug, price = _PRICES[path]
                cart.append(price)
                last = t + rng.randint(2 * SECOND, 9 * SECOND)
                self._emit(
                    row,
                    last,
                    "event",
                    user.offset_ms,
                    human=True,
                    se=("ecommerce", "add_to_cart", slug, "product", f"{price:.2f}"),
                )
                generated += 1
            elif path == "/checkout/complete" and cart:
                last = t + rng.randint(SECOND, 4 * SECOND)
                self._emit(
                    row,
                    last,
                    "event",
                    user.offset_ms,
                    human=True,
                    se=(
                        "ecommerce",
                        "purchase",
                        f"order-{rng.randrange(10**8):08d}",
                        "order",
                        f"{sum(cart):.2f}",
                    ),
                )
                generated += 1
                cart = []
            elif path == "/search" or (app == "docs" and rng.random() < 0.1):
                last = t + rng.randint(SECOND, 6 * SECOND)
                action = "search" if path == "/search" else "copy_code"
                label = rng.choice(_SEARCH_TERMS) if action == "search" else path
                self._emit(
                    row,
                    last,
                    "event",
                    user.offset_ms,
                    human=True,
                    se=(app, action, label, None, None),
                )
                generated += 1
            ping = t + 10 * SECOND + rng.randint(-300, 300)
            while ping - t <= engaged:
                self._emit(row, ping, "page_ping", user.offset_ms, human=True)
                generated += 1
                last = ping
                ping += 10 * SECOND + rng.randint(-300, 300)
            if rng.random() < 0.5:
                last += rng.randint(500, 4 * SECOND)
                target = rng.choices(pages, page_weights)[0][0]
                self._emit(
                    row,
                    last,
                    "link_click",
                    user.offset_ms,
                    human=True,
                    link=f"https://{_SITES[app][0]}{target}",
                )
                generated += 1
            referrer = (url, "internal", None)
            if rng.random() < 0.12:  # the tab sat idle: no pings, but under the 30-minute timeout
                t = last + rng.randint(2 * MINUTE, 25 * MINUTE)
            else:
                t = last + rng.randint(SECOND, 8 * SECOND)
        user.free_at = last + 31 * MINUTE + rng.randrange(2 * HOUR)
        if start // DAY != last // DAY and last < self.end_ms:
            self.stats.crossing_midnight += 1
        return generated

    def _bot_session(self, start: int) -> int:
        """One bot: one cookie and session for 3.25-6 days, a page view every 1-25 minutes.

        Returns the end of its activity (epoch ms).
        """
        rng = self.rng
        self.stats.bot_sessions += 1
        agent = rng.choice(_BOT_AGENTS)
        row = self._template(
            (
                seeded_uuid4(rng),
                seeded_uuid4(rng),
                None,
                rng.choice(_COUNTRIES),
                agent,
                _BOT_SPIDER,
            ),
            seeded_uuid4(rng),
            1,
            "shop",
        )
        end = start + rng.randint(int(3.25 * DAY), 6 * DAY)
        t = start
        referrer: tuple[str | None, str | None, str | None] = (None, None, None)
        while t < end and t < self.end_ms:
            path, title, _ = rng.choice(_SHOP_PAGES)
            url = self._set_page(row, "shop", path, title, referrer)
            self._emit(row, t, "page_view", 0, human=False)
            referrer = (url, "internal", None)
            t += rng.randint(MINUTE, 25 * MINUTE)
        return min(t, end)

    # -- one event: timestamps, lateness, duplicates, malformed copies ----------------------------

    def _emit(
        self,
        template: list[str | None],
        t: int,
        kind: str,
        offset_ms: int,
        *,
        human: bool,
        se: tuple[str | None, ...] | None = None,
        link: str | None = None,
    ) -> None:
        """Write one event (true time `t`) and any duplicate or malformed copy of it."""
        rng = self.rng
        if t >= self.end_ms:
            return
        send_delay = 5 + min(int(rng.expovariate(1 / 80)), 5000)
        net = 15 + min(int(rng.expovariate(1 / 60)), 3000)
        r = rng.random()
        late = r < self.late_share
        device_late = human and not late and r < self.late_share + self.device_late_share
        if device_late:  # created offline, sent when the device came back
            room = self.end_ms - t - 10 * SECOND
            if room < self.profile.device_delay.min_ms:
                device_late = False
            else:
                send_delay = self.profile.device_delay.draw(rng, room)
        created = t + offset_ms
        sent = created + send_delay
        collector = t + send_delay + net
        derived = collector - (sent - created)
        if late:
            room = self.end_ms - 1 - collector
            late = room >= self.profile.load_delay.min_ms
        if late:
            etl = collector + rng.randint(400, 3 * SECOND)
            load = collector + self.profile.load_delay.draw(rng, min(self.max_late_ms, room))
        else:
            timing = self._on_time_load(collector)
            if timing is None:
                return
            etl, load = timing
        row = template.copy()
        et = _EVENT_TYPES[kind]
        row[I_EVENT], row[I_VENDOR], row[I_NAME], row[I_FORMAT], row[I_VERSION] = et
        row[I_EVENT_ID] = seeded_uuid4(rng)
        row[I_ETL] = format_tstamp(etl)
        row[I_COLLECTOR] = format_tstamp(collector)
        row[I_CREATED] = format_tstamp(created)
        row[I_SENT] = format_tstamp(sent)
        row[I_DERIVED] = format_tstamp(derived)
        row[I_LOAD] = format_tstamp(load)
        if se is not None:
            row[I_SE_CAT], row[I_SE_ACT], row[I_SE_LAB], row[I_SE_PROP], row[I_SE_VAL] = se
        if link is not None:
            row[I_LINK] = json.dumps(
                {
                    "schema": "iglu:com.snowplowanalytics.snowplow/link_click/jsonschema/1-0-1",
                    "data": {"targetUrl": link},
                },
                separators=(",", ":"),
            )
        stats = self.stats
        stats.events += 1
        if not human:
            stats.bot_events += 1
        if late:
            lateness = load - collector
            stats.late_rows += 1
            key = str(lateness // DAY)
            stats.late_by_days[key] = stats.late_by_days.get(key, 0) + 1
            stats.max_lateness_ms = max(stats.max_lateness_ms, lateness)
        if device_late:
            stats.device_late_rows += 1
            key = str((sent - created) // DAY)
            stats.device_late_by_days[key] = stats.device_late_by_days.get(key, 0) + 1
        day = (load - self.start_ms) // DAY
        self._sink(LandingRow(day, row))
        if self.duplicate_share and rng.random() < self.duplicate_share:
            self._duplicate(row, load, collector, sent)
        if self.malformed_share and rng.random() < self.malformed_share:
            self._malformed(row, load, day)

    def _on_time_load(self, collector: int) -> tuple[int, int] | None:
        """(etl, load) for a row collected at `collector` that loads on time; None past the end."""
        rng = self.rng
        etl = collector + rng.randint(400, 3 * SECOND)
        load = etl + rng.randint(200, 55 * SECOND)
        if load >= self.end_ms:
            load = self.end_ms - 1
            if load < collector:
                return None
            etl = min(etl, load)
        return etl, load

    def _duplicate(self, row: list[str | None], load: int, collector: int, sent: int) -> None:
        rng = self.rng
        kind = rng.choice(DUPLICATE_KINDS)
        copy = row.copy()
        day_end = (load // DAY + 1) * DAY
        if kind == "same_load_day":
            ceiling = (
                collector + ON_TIME_MAX_SECONDS * SECOND
                if load - collector <= ON_TIME_MAX_SECONDS * SECOND
                else load + HOUR
            )
            ceiling = min(ceiling, day_end - 1, self.end_ms - 1)
            new_load = load + rng.randint(0, max(ceiling - load, 0))
        elif kind == "later_load_day":
            new_load = (
                load // DAY + rng.randint(1, self.max_duplicate_delay_days)
            ) * DAY + rng.randrange(DAY)
            if new_load >= self.end_ms:
                return
        else:  # the tracker re-sent it: later sent and collector times, same derived time
            shift = rng.randint(2 * SECOND, 10 * MINUTE)
            timing = self._on_time_load(collector + shift)
            if timing is None:
                return
            etl, new_load = timing
            copy[I_SENT] = format_tstamp(sent + shift)
            copy[I_COLLECTOR] = format_tstamp(collector + shift)
            copy[I_ETL] = format_tstamp(etl)
        copy[I_LOAD] = format_tstamp(new_load)
        self.stats.duplicates[kind] += 1
        self._sink(LandingRow((new_load - self.start_ms) // DAY, copy))

    def _malformed(self, row: list[str | None], load: int, day: int) -> None:
        rng = self.rng
        kinds = (
            MALFORMED_KINDS_CSV
            if day_format(self.file_format, day) == "csv"
            else MALFORMED_KINDS_JSON
        )
        kind = rng.choice(kinds)
        copy = row.copy()
        copy[I_EVENT_ID] = seeded_uuid4(rng)
        variant = rng.randrange(1000)
        if kind == "missing_event_id":
            copy[I_EVENT_ID] = None
        elif kind == "unparseable_timestamp":
            column = rng.choice((I_COLLECTOR, I_COLLECTOR, I_CREATED, I_DERIVED))
            text = copy[column] or format_tstamp(load)
            date_part, time_part = text.split(" ")
            copy[column] = rng.choice(
                (
                    f"{date_part[:5]}13-{date_part[8:]} {time_part}",  # month 13
                    f"{date_part} 25:{time_part[3:]}",  # hour 25
                    f"{date_part[8:]}/{date_part[5:7]}/{date_part[:4]} {time_part[:5]}",  # DD/MM/YYYY
                    "not a timestamp",
                    f"{date_part}X{time_part}",
                )
            )
        elif kind == "clock_skew":  # every event time well after the row's own load time
            skew = rng.randint(HOUR, 30 * DAY)
            for i, column in enumerate(_EVENT_TIMESTAMPS):
                copy[column] = format_tstamp(load + skew + i * 37)
        self.stats.malformed[kind] = self.stats.malformed.get(kind, 0) + 1
        self._sink(LandingRow(day, copy, kind, variant))


# --- imperative shell: files ------------------------------------------------------------------


class _LandingFiles:
    """Appends rows to the load days' files, keeping at most `max_open` handles open."""

    def __init__(
        self, out_dir: Path, start_date: dt.date, days: int, file_format: str, max_open: int = 64
    ) -> None:
        self.paths: list[Path] = []
        self.formats: list[str] = []
        self.rows = [0] * days
        self.max_open = max_open
        self.handles: OrderedDict[int, tuple[IO[str], Any]] = OrderedDict()
        for d in range(days):
            fmt = day_format(file_format, d)
            folder = out_dir / f"load_date={(start_date + dt.timedelta(days=d)).isoformat()}"
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / FILE_NAMES[fmt]
            with path.open("w", encoding="utf-8", newline="") as handle:
                if fmt == "csv":
                    csv.writer(handle, lineterminator="\n").writerow(COLUMNS)
            self.paths.append(path)
            self.formats.append(fmt)

    def _handle(self, day: int) -> tuple[IO[str], Any]:
        entry = self.handles.get(day)
        if entry is not None:
            self.handles.move_to_end(day)
            return entry
        if len(self.handles) >= self.max_open:
            _, (old, _) = self.handles.popitem(last=False)
            old.close()
        handle = self.paths[day].open("a", encoding="utf-8", newline="", buffering=1 << 16)
        writer = csv.writer(handle, lineterminator="\n") if self.formats[day] == "csv" else None
        self.handles[day] = (handle, writer)
        return handle, writer

    def write(self, row: LandingRow) -> None:
        """Append one row to its load day's file."""
        handle, writer = self._handle(row.day_index)
        if writer is not None:
            writer.writerow(csv_fields(row))
        else:
            handle.write(json_line(row))
            handle.write("\n")
        self.rows[row.day_index] += 1

    def close(self) -> None:
        for handle, _ in self.handles.values():
            handle.close()
        self.handles.clear()


def _clear_previous(out_dir: Path, overwrite: bool) -> None:
    """Refuse to mix with an earlier generation unless `overwrite`; then remove only its files."""
    previous = sorted(out_dir.glob("load_date=*")) if out_dir.exists() else []
    manifest = out_dir / MANIFEST_NAME
    if not previous and not manifest.exists():
        return
    if not overwrite:
        raise UserError(
            f"{out_dir} already holds generated landing files; choose an empty folder or overwrite it."
        )
    for folder in previous:
        for name in FILE_NAMES.values():
            (folder / name).unlink(missing_ok=True)
        if folder.is_dir() and not any(folder.iterdir()):
            shutil.rmtree(folder)
    manifest.unlink(missing_ok=True)


def _check(name: str, ok: bool, rule: str) -> None:
    if not ok:
        raise UserError(f"Generator parameter `{name}` {rule}.")


def generate(
    out_dir: str | Path,
    start_date: dt.date | str = dt.date(2024, 3, 1),
    days: int = 7,
    events_per_day: int = 10_000,
    seed: int = 0,
    *,
    file_format: str = "csv",
    late_share: float = 0.05,
    max_late_days: float = 60.0,
    device_late_share: float = 0.005,
    bot_share: float = 0.02,
    duplicate_share: float = 0.01,
    max_duplicate_delay_days: int = 3,
    malformed_share: float = 0.005,
    midnight_share: float = 0.03,
    overwrite: bool = False,
    profile: str | Profile = "harsh",
) -> GenerationSummary:
    """Write a seeded, realistic landing data set: one file per load day plus `manifest.json`.

    Load days are `start_date` .. `start_date + days - 1`; about `events_per_day` rows per load day
    (original events plus duplicate and malformed copies). Shares are of original events:
    `late_share` load late (`harsh`: 6 hours to `max_late_days` after collection; `realistic`:
    mostly within hours, see `PROFILES`), `device_late_share` were sent 10 minutes to 10 days after
    creation, `bot_share` come from bots, `duplicate_share` are loaded a second time,
    `malformed_share` get a corrupted copy. `profile` (a name in `PROFILES` or a `Profile`) shapes
    the delays and who visits; `harsh`, the default, is the generator's original output. Same
    arguments, same bytes.
    Raises UserError for an invalid parameter, or when `out_dir` already holds generated files and
    `overwrite` is false.
    """
    if isinstance(start_date, str):
        try:
            start_date = dt.date.fromisoformat(start_date)
        except ValueError:
            raise UserError(
                f"Generator parameter `start_date` is not an ISO date: {start_date!r}."
            ) from None
    _check("days", days >= 1, "must be at least 1")
    _check("events_per_day", events_per_day >= 1, "must be at least 1")
    _check("file_format", file_format in FILE_FORMATS, f"must be one of {', '.join(FILE_FORMATS)}")
    if isinstance(profile, str):
        _check("profile", profile in PROFILES, f"must be one of {', '.join(PROFILES)}")
        profile = PROFILES[profile]
    for name, value in (
        ("late_share", late_share),
        ("device_late_share", device_late_share),
        ("bot_share", bot_share),
        ("duplicate_share", duplicate_share),
        ("malformed_share", malformed_share),
        ("midnight_share", midnight_share),
    ):
        _check(name, 0.0 <= value < 1.0, "must be in [0, 1)")
    _check(
        "late_share", late_share + device_late_share < 1.0, "plus device_late_share must be below 1"
    )
    shortest_late_hours = profile.load_delay.min_ms / HOUR
    _check(
        "max_late_days",
        max_late_days * DAY > profile.load_delay.min_ms,
        f"must exceed {shortest_late_hours:g} hours",
    )
    _check("max_duplicate_delay_days", max_duplicate_delay_days >= 1, "must be at least 1")

    out = Path(out_dir)
    _clear_previous(out, overwrite)
    out.mkdir(parents=True, exist_ok=True)
    model = EventModel(
        start_date,
        days,
        events_per_day,
        seed,
        file_format=file_format,
        late_share=late_share,
        max_late_days=max_late_days,
        device_late_share=device_late_share,
        bot_share=bot_share,
        duplicate_share=duplicate_share,
        max_duplicate_delay_days=max_duplicate_delay_days,
        malformed_share=malformed_share,
        midnight_share=midnight_share,
        profile=profile,
    )
    files = _LandingFiles(out, start_date, days, file_format)
    try:
        stats = model.run(files.write)
    finally:
        files.close()

    malformed_kinds = dict.fromkeys(
        sorted(
            {
                k
                for d in range(days)
                for k in (
                    MALFORMED_KINDS_CSV
                    if day_format(file_format, d) == "csv"
                    else MALFORMED_KINDS_JSON
                )
            }
        ),
        0,
    )
    malformed_kinds.update(stats.malformed)
    summary = GenerationSummary(
        start_date=start_date.isoformat(),
        days=days,
        events_per_day=events_per_day,
        seed=seed,
        file_format=file_format,
        profile=profile.name,
        profile_parameters=profile.to_json(),
        parameters={
            "late_share": late_share,
            "max_late_days": max_late_days,
            "device_late_share": device_late_share,
            "bot_share": bot_share,
            "duplicate_share": duplicate_share,
            "max_duplicate_delay_days": max_duplicate_delay_days,
            "malformed_share": malformed_share,
            "midnight_share": midnight_share,
        },
        files=[p.relative_to(out).as_posix() for p in files.paths],
        rows_per_load_day={
            (start_date + dt.timedelta(days=d)).isoformat(): n for d, n in enumerate(files.rows)
        },
        total_rows=sum(files.rows),
        events=stats.events,
        bot_events=stats.bot_events,
        users=len(model.users),
        human_sessions=stats.human_sessions,
        bot_sessions=stats.bot_sessions,
        sessions_crossing_midnight=stats.crossing_midnight,
        late_rows=stats.late_rows,
        late_rows_by_days_late=dict(sorted(stats.late_by_days.items(), key=lambda kv: int(kv[0]))),
        max_lateness_days=round(stats.max_lateness_ms / DAY, 3),
        device_late_rows=stats.device_late_rows,
        device_late_rows_by_days_late=dict(
            sorted(stats.device_late_by_days.items(), key=lambda kv: int(kv[0]))
        ),
        duplicate_rows=dict(stats.duplicates),
        malformed_rows=malformed_kinds,
    )
    (out / MANIFEST_NAME).write_text(summary.to_json(), encoding="utf-8")
    return summary
