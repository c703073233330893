"""One validated Settings object (SPEC section 3), resolved in one order everywhere.

Order: `--config FILE`, else `$SESSIONIZE_CONFIG`, else `sessionize.yaml` in the home folder,
else the defaults. The CLI exports the resolved file and home through `SESSIONIZE_CONFIG` and
`SESSIONIZE_HOME`, so the Dagster code server and run processes see the same settings.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from sessionize_assets.errors import SettingsError

AGGREGATIONS = ("count", "sum", "min", "max", "first", "last", "distinct_list")
_PERIOD = re.compile(r"^(lifetime|last_(\d+)_days)$")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class AttributeDefinition:
    """An attribute added by configuration (SPEC section 5)."""

    @property
    def period_days(self) -> int | None:
        """N for `last_<N>_days`, None for `lifetime`."""
        match = _PERIOD.match(self.period)
        assert match is not None
        return int(match.group(2)) if match.group(2) else None

    # Defined after the method above: the field name `property` shadows the builtin in this body.
    name: str
    aggregation: str
    property: str | None = None
    event_names: tuple[str, ...] = ()
    period: str = "lifetime"


@dataclass(frozen=True)
class Settings:
    start_date: dt.date = dt.date(2020, 1, 1)
    backfill_limit_days: int = 30
    lookback_window_hours: int = 6
    max_session_days: int = 3
    days_late_allowed: int = 3
    session_lookback_days: int = 730
    session_mode: str = "id"
    session_identifier: tuple[str, ...] = ("domain_sessionid",)
    user_identifier: tuple[str, ...] = ("domain_userid",)
    session_timestamp: str = "collector_tstamp"
    session_gap_minutes: int = 30
    reprocess_days: int = 5
    min_rows_to_process: int = 1000
    dedupe_lookback_days: int = 3
    max_clock_skew_minutes: int = 10
    # A load time more than this after "now" is implausible: the row is rejected, not landed.
    max_load_ahead_minutes: int = 60
    # An event time more than this many days before its own load time is implausible (a device
    # clock at 1970, say): the row is rejected, not landed. 0: no such bound.
    max_event_age_days: int = 365
    # The text encoding of CSV and JSON input files (a BOM, when present, wins).
    input_encoding: str = "utf-8"
    # filtered_events' files: about this many rows each, clustered by user within each (load day,
    # event day) partition, so session reads of a few users' events skip the other files.
    filtered_events_rows_per_file: int = 25_000
    app_ids: tuple[str, ...] = ()
    event_names: tuple[str, ...] = ()
    attribute_windows_days: tuple[int, ...] = (7, 30)
    attributes: tuple[AttributeDefinition, ...] = ()
    column_mapping: Mapping[str, str] = field(default_factory=dict)
    spark: Mapping[str, str] = field(default_factory=dict)
    # `sessionize refresh` (and a refresh from the UI) may rebuild the session models without
    # `--yes` (Snowplow's `snowplow__allow_refresh`).
    allow_refresh: bool = False
    # Session-based models that are enabled (SPEC section 6: adding one triggers state 2).
    session_models: tuple[str, ...] = ("sessions", "users")

    def key_columns(self) -> tuple[str, ...]:
        """The columns the session models read events by: the user and session identifiers and
        the session timestamp (`events` and `filtered_events` keep file statistics on them)."""
        return (*self.user_identifier, *self.session_identifier, self.session_timestamp)

    def replace(self, **changes: Any) -> Settings:
        """A copy with some settings changed, validated again."""
        return from_mapping({**to_mapping(self), **changes})


SETTING_NAMES = tuple(f.name for f in dataclasses.fields(Settings))
KNOWN_SESSION_MODELS = ("sessions", "users", "user_session_stats")


def _fail(key: str, message: str) -> SettingsError:
    return SettingsError(f"Setting `{key}` {message}.")


def _int(key: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(key, f"must be an integer, got {value!r}")
    if value < minimum:
        raise _fail(key, f"must be at least {minimum}, got {value}")
    return value


def _str_list(key: str, value: Any, allow_empty: bool = True) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) and v for v in value):
        raise _fail(key, f"must be a string or a list of strings, got {value!r}")
    if not allow_empty and not value:
        raise _fail(key, "must name at least one column")
    return tuple(value)


def _date(key: str, value: Any) -> dt.date:
    if isinstance(value, dt.datetime):
        return value.date()
    if isinstance(value, dt.date):
        return value
    if isinstance(value, str):
        try:
            return dt.date.fromisoformat(value)
        except ValueError:
            pass
    raise _fail(key, f"must be a date like 2020-01-01, got {value!r}")


def _encoding(key: str, value: Any) -> str:
    import codecs

    if not isinstance(value, str) or not value.strip():
        raise _fail(key, f"must name a text encoding such as utf-8 or latin-1, got {value!r}")
    try:
        return codecs.lookup(value.strip()).name
    except LookupError:
        raise _fail(key, f"names an unknown text encoding {value!r}") from None


_SIZE = re.compile(r"^\d+[kmgtp]?b?$", re.IGNORECASE)
_SIZE_KEYS = re.compile(r"(memory|memoryOverhead|maxResultSize|\.buffer(\.max)?)$")
_INT_KEYS = re.compile(r"(\.cores|\.instances|\.partitions|\.parallelism|\.maxFailures)$")
_BOOL_KEYS = re.compile(r"\.enabled$")


def _spark_options(key: str, options: dict[str, str]) -> dict[str, str]:
    """Spark options a JVM would refuse at start (`JAVA_GATEWAY_EXITED`, no key named) are
    refused here instead, naming the option: sizes, counts and switches of the common keys."""
    for name, value in options.items():
        text = str(value).strip()
        if not name.startswith("spark."):
            raise _fail(f"{key}.{name}", "is not a Spark option (they start with `spark.`)")
        if _SIZE_KEYS.search(name) and not _SIZE.match(text):
            raise _fail(f"{key}.{name}", f"must be a size such as 2g or 512m, got {value!r}")
        if _INT_KEYS.search(name) and not text.isdigit():
            raise _fail(f"{key}.{name}", f"must be a whole number, got {value!r}")
        if _BOOL_KEYS.search(name) and text.lower() not in ("true", "false"):
            raise _fail(f"{key}.{name}", f"must be true or false, got {value!r}")
    return options


def _str_map(key: str, value: Any) -> dict[str, str]:
    if not isinstance(value, Mapping):
        raise _fail(key, f"must be a mapping, got {value!r}")
    out = {}
    for k, v in value.items():
        if not isinstance(k, str) or isinstance(v, list | dict) or v is None:
            raise _fail(key, f"must map names to single values, got {k!r}: {v!r}")
        out[k] = str(v).lower() if isinstance(v, bool) else str(v)
    return out


def _attribute(index: int, value: Any) -> AttributeDefinition:
    key = f"attributes[{index}]"
    if not isinstance(value, Mapping):
        raise _fail(key, f"must be a mapping, got {value!r}")
    unknown = set(value) - {"name", "aggregation", "property", "event_names", "period"}
    if unknown:
        raise _fail(f"{key}.{sorted(unknown)[0]}", "is not a known attribute field")
    name = value.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise _fail(f"{key}.name", f"must be a column name, got {name!r}")
    aggregation = value.get("aggregation")
    if aggregation not in AGGREGATIONS:
        raise _fail(
            f"{key}.aggregation", f"must be one of {', '.join(AGGREGATIONS)}, got {aggregation!r}"
        )
    prop = value.get("property")
    if prop is not None and (not isinstance(prop, str) or not _NAME.match(prop)):
        raise _fail(f"{key}.property", f"must be a column name, got {prop!r}")
    if aggregation != "count" and prop is None:
        raise _fail(f"{key}.property", f"is required for aggregation {aggregation}")
    period = value.get("period", "lifetime")
    match = _PERIOD.match(period) if isinstance(period, str) else None
    if match is None or (match.group(2) is not None and int(match.group(2)) < 1):
        raise _fail(
            f"{key}.period", f"must be `lifetime` or `last_<N>_days` with N ≥ 1, got {period!r}"
        )
    return AttributeDefinition(
        name=name,
        aggregation=aggregation,
        property=prop,
        event_names=_str_list(f"{key}.event_names", value.get("event_names", [])),
        period=period,
    )


def from_mapping(raw: Mapping[str, Any], today: dt.date | None = None) -> Settings:
    """Validate a mapping of settings (YAML top-level keys) into Settings."""
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise SettingsError("The settings file must be a mapping of setting names to values.")
    unknown = [k for k in raw if k not in SETTING_NAMES]
    if unknown:
        raise _fail(str(unknown[0]), f"is not a known setting (known: {', '.join(SETTING_NAMES)})")
    values: dict[str, Any] = {}
    for key, value in raw.items():
        if key == "start_date":
            values[key] = _date(key, value)
        elif key == "backfill_limit_days":
            values[key] = _int(key, value, 1)
        elif key in (
            "lookback_window_hours",
            "days_late_allowed",
            "reprocess_days",
            "dedupe_lookback_days",
            "max_clock_skew_minutes",
            "max_load_ahead_minutes",
            "max_event_age_days",
        ):
            values[key] = _int(key, value, 0)
        elif key == "input_encoding":
            values[key] = _encoding(key, value)
        elif key in (
            "max_session_days",
            "session_lookback_days",
            "session_gap_minutes",
            "filtered_events_rows_per_file",
        ):
            values[key] = _int(key, value, 1)
        elif key == "min_rows_to_process":
            values[key] = _int(key, value, 0)
        elif key == "session_mode":
            if value not in ("id", "gap"):
                raise _fail(key, f"must be `id` or `gap`, got {value!r}")
            values[key] = value
        elif key in ("session_identifier", "user_identifier"):
            values[key] = _str_list(key, value, allow_empty=False)
        elif key == "session_timestamp":
            if not isinstance(value, str) or not _NAME.match(value):
                raise _fail(key, f"must be a column name, got {value!r}")
            values[key] = value
        elif key in ("app_ids", "event_names"):
            values[key] = _str_list(key, value)
        elif key == "attribute_windows_days":
            if not isinstance(value, list | tuple):
                raise _fail(key, f"must be a list of day counts, got {value!r}")
            values[key] = tuple(sorted({_int(key, v, 1) for v in value}))
        elif key == "attributes":
            if isinstance(value, tuple) and all(isinstance(a, AttributeDefinition) for a in value):
                values[key] = value
                continue
            if not isinstance(value, list | tuple):
                raise _fail(key, f"must be a list of attribute definitions, got {value!r}")
            values[key] = tuple(_attribute(i, a) for i, a in enumerate(value))
            names = [a.name for a in values[key]]
            if len(set(names)) != len(names):
                raise _fail(key, "has two definitions with the same name")
        elif key == "column_mapping":
            values[key] = _str_map(key, value)
        elif key == "spark":
            values[key] = _spark_options(key, _str_map(key, value))
        elif key == "allow_refresh":
            if not isinstance(value, bool):
                raise _fail(key, f"must be true or false, got {value!r}")
            values[key] = value
        elif key == "session_models":
            models = _str_list(key, value, allow_empty=False)
            bad = [m for m in models if m not in KNOWN_SESSION_MODELS]
            if bad:
                raise _fail(
                    key,
                    f"names unknown model {bad[0]!r} (known: {', '.join(KNOWN_SESSION_MODELS)})",
                )
            values[key] = models
    settings = Settings(**values)
    today = today or dt.datetime.now(dt.UTC).date()
    if settings.start_date > today:
        raise _fail("start_date", f"is in the future ({settings.start_date} > {today})")
    return settings


def to_mapping(settings: Settings) -> dict[str, Any]:
    """Settings as plain values (the inverse of from_mapping)."""
    out = {}
    for f in dataclasses.fields(Settings):
        value = getattr(settings, f.name)
        if f.name == "attributes":
            value = [
                {
                    k: (list(v) if isinstance(v, tuple) else v)
                    for k, v in dataclasses.asdict(a).items()
                }
                for a in value
            ]
        elif isinstance(value, tuple):
            value = list(value)
        elif isinstance(value, Mapping):
            value = dict(value)
        out[f.name] = value
    return out


def default_home() -> Path:
    """`$SESSIONIZE_HOME`, else `./.sessionize`."""
    return Path(os.environ.get("SESSIONIZE_HOME") or ".sessionize").resolve()


def settings_file(home: Path, config: str | os.PathLike | None = None) -> Path | None:
    """The file the settings come from, in the spec's order (None: defaults)."""
    if config:
        path = Path(config)
        if not path.is_file():
            raise SettingsError(f"The settings file {path} given with --config does not exist.")
        return path.resolve()
    env = os.environ.get("SESSIONIZE_CONFIG")
    if env:
        path = Path(env)
        if not path.is_file():
            raise SettingsError(
                f"The settings file {path} named by $SESSIONIZE_CONFIG does not exist."
            )
        return path.resolve()
    path = home / "sessionize.yaml"
    return path.resolve() if path.is_file() else None


class _SettingsLoader(yaml.SafeLoader):
    """YAML's safe loader, except that dates stay text: `_date` parses them and names the key,
    so `start_date: 2024-02-30` is a sentence about `start_date`, not a traceback."""


_SettingsLoader.add_constructor(
    "tag:yaml.org,2002:timestamp", lambda loader, node: loader.construct_scalar(node)
)


def load_settings(
    home: Path | None = None, config: str | os.PathLike | None = None, today: dt.date | None = None
) -> Settings:
    """Resolve and validate the settings (raises SettingsError naming the bad key)."""
    home = home or default_home()
    path = settings_file(home, config)
    if path is None:
        return from_mapping({}, today=today)
    try:
        raw = yaml.load(path.read_text(encoding="utf-8"), Loader=_SettingsLoader) or {}
    except UnicodeDecodeError:
        raise SettingsError(f"The settings file {path} is not UTF-8 text.") from None
    except yaml.YAMLError as exc:
        raise SettingsError(f"The settings file {path} is not valid YAML: {exc}") from None
    try:
        return from_mapping(raw, today=today)
    except SettingsError as exc:
        raise SettingsError(f"{exc} (in {path})") from None


def parse_now(value: str | None) -> dt.datetime:
    """An ISO 8601 instant (UTC when no zone is given), or the current time."""
    if not value:
        return dt.datetime.now(dt.UTC)
    try:
        parsed = dt.datetime.fromisoformat(value)
    except ValueError:
        raise SettingsError(
            f"--now must be an ISO 8601 time like 2024-03-01T12:00:00, got {value!r}."
        ) from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=dt.UTC)
    return parsed.astimezone(dt.UTC)


def parse_day(value: str | None, what: str) -> dt.date | None:
    """An ISO day from a run config (`what` names the field), or None when empty; one sentence
    (SettingsError) when it is not a day."""
    if not value:
        return None
    try:
        return dt.date.fromisoformat(value.strip())
    except ValueError:
        raise SettingsError(f"{what} must be a day such as 2024-03-02, not {value!r}.") from None
