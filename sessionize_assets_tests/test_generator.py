"""The landing-data generator: reproducible, realistic, and every injected oddity findable in the files."""

from __future__ import annotations

import csv
import datetime as dt
import hashlib
import json
import re
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest

from sessionize_assets.errors import UserError
from sessionize_assets.generator import (
    COLUMNS,
    DAY,
    DUPLICATE_KINDS,
    HOUR,
    MALFORMED_KINDS_CSV,
    MALFORMED_KINDS_JSON,
    MANIFEST_NAME,
    MINUTE,
    PROFILES,
    SECOND,
    GenerationSummary,
    format_tstamp,
    generate,
    parse_tstamp,
)

COL = {name: i for i, name in enumerate(COLUMNS)}
TSTAMPS = (
    "etl_tstamp",
    "collector_tstamp",
    "dvce_created_tstamp",
    "dvce_sent_tstamp",
    "derived_tstamp",
    "load_tstamp",
)
UUID4 = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")
MAX_CLOCK_SKEW = 10 * MINUTE
MAX_LATE_DAYS = 5
START = dt.date(2024, 3, 1)


@dataclass
class Row:
    """One landed line: its load day (folder), its fields as read (None = empty/null) and kind."""

    load_day: str
    fields: list[str | None]
    malformed: str | None
    ms: dict[str, int]

    def get(self, name: str) -> str | None:
        return self.fields[COL[name]]


def classify(fields: list[str | None]) -> tuple[str | None, dict[str, int]]:
    """Find a malformed row from its content alone, as a loader would; parsed timestamps."""
    if len(fields) != len(COLUMNS):
        return "wrong_field_count", {}
    if not fields[COL["event_id"]]:
        return "missing_event_id", {}
    parsed: dict[str, int] = {}
    for name in TSTAMPS:
        try:
            parsed[name] = parse_tstamp(fields[COL[name]] or "")
        except ValueError:
            return "unparseable_timestamp", {}
    if parsed["derived_tstamp"] > parsed["load_tstamp"] + MAX_CLOCK_SKEW:
        return "clock_skew", parsed
    return None, parsed


def read_landing(out: Path, summary: GenerationSummary) -> list[Row]:
    """Every row of every file the summary lists, parsed with the stdlib readers."""
    rows: list[Row] = []
    for rel in summary.files:
        path = out / rel
        load_day = path.parent.name.removeprefix("load_date=")
        with path.open(encoding="utf-8", newline="") as handle:
            if path.suffix == ".csv":
                reader = csv.reader(handle)
                assert next(reader) == list(COLUMNS)
                for record in reader:
                    fields = [value or None for value in record]
                    kind, ms = classify(fields)
                    rows.append(Row(load_day, fields, kind, ms))
            else:
                for line in handle:
                    try:
                        record = json.loads(line)
                    except json.JSONDecodeError:
                        rows.append(Row(load_day, [line], "invalid_json", {}))
                        continue
                    assert set(record) <= set(COLUMNS)
                    assert all(v is None or isinstance(v, str) for v in record.values())
                    fields = [record.get(name) for name in COLUMNS]
                    kind, ms = classify(fields)
                    rows.append(Row(load_day, fields, kind, ms))
    return rows


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, GenerationSummary, list[Row]]:
    out = tmp_path_factory.mktemp("landing") / "csv"
    summary = generate(
        out, START, days=8, events_per_day=4500, seed=11, max_late_days=MAX_LATE_DAYS
    )
    return out, summary, read_landing(out, summary)


@pytest.fixture(scope="module")
def json_dataset(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Path, GenerationSummary, list[Row]]:
    out = tmp_path_factory.mktemp("landing") / "mixed"
    summary = generate(
        out, START, days=4, events_per_day=2000, seed=5, file_format="mixed", malformed_share=0.02
    )
    return out, summary, read_landing(out, summary)


def valid(rows: list[Row]) -> list[Row]:
    return [r for r in rows if r.malformed is None]


def tree_bytes(out: Path) -> dict[str, bytes]:
    return {
        p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()
    }


# --- reproducibility and layout -----------------------------------------------------------------


def test_same_seed_gives_the_same_bytes_and_another_seed_does_not(tmp_path: Path) -> None:
    args = dict(start_date="2024-03-01", days=3, events_per_day=800, file_format="mixed")
    generate(tmp_path / "a", seed=3, **args)
    generate(tmp_path / "b", seed=3, **args)
    generate(tmp_path / "c", seed=4, **args)
    first, again, other = (
        tree_bytes(tmp_path / "a"),
        tree_bytes(tmp_path / "b"),
        tree_bytes(tmp_path / "c"),
    )
    assert len(first) == 4  # three load days and the manifest
    assert first == again
    assert set(other) == set(first)
    assert all(other[name] != first[name] for name in first if name != MANIFEST_NAME)


def test_files_per_load_day_and_the_manifest_match_the_data(dataset) -> None:
    out, summary, rows = dataset
    expected_days = [(START + dt.timedelta(days=d)).isoformat() for d in range(8)]
    assert summary.files == [f"load_date={day}/events.csv" for day in expected_days]
    assert Counter(r.load_day for r in rows) == Counter(summary.rows_per_load_day)
    assert summary.total_rows == len(rows)
    assert json.loads((out / MANIFEST_NAME).read_text()) == json.loads(summary.to_json())
    # Each row's own load_tstamp falls on its file's load day (so --load-tstamp-from load_tstamp works).
    for r in valid(rows):
        assert format_tstamp(r.ms["load_tstamp"])[:10] == r.load_day
    # Rows per load day stay near the requested volume (the first day lacks earlier days' late rows).
    assert all(3400 <= n <= 5500 for n in summary.rows_per_load_day.values())


def test_rows_are_snowplow_shaped(dataset) -> None:
    _, _, rows = dataset
    good = valid(rows)
    assert all(UUID4.fullmatch(r.get("event_id") or "") for r in good)
    names = Counter(r.get("event_name") for r in good)
    assert {"page_view", "page_ping", "link_click", "event"} <= set(names)
    assert names["page_ping"] > names["page_view"] > names["link_click"] > names["event"] > 0
    for r in good:
        ms = r.ms
        # Snowplow's derived_tstamp, and nothing happens after it is loaded.
        assert ms["derived_tstamp"] == ms["collector_tstamp"] - (
            ms["dvce_sent_tstamp"] - ms["dvce_created_tstamp"]
        )
        assert ms["derived_tstamp"] <= ms["collector_tstamp"] <= ms["load_tstamp"]
        json.loads(r.get("contexts_com_snowplowanalytics_snowplow_web_page_1_0_0") or "")
    values = [
        float(r.get("se_value") or "")
        for r in good
        if r.get("se_action") in ("add_to_cart", "purchase")
    ]
    assert values and all(v > 0 for v in values)
    with_user_id = sum(1 for r in good if r.get("user_id"))
    assert 0 < with_user_id < len(good)


# --- timing: late rows, device-late rows ------------------------------------------------------


def test_most_rows_load_within_a_minute_and_late_ones_up_to_the_maximum(dataset) -> None:
    _, summary, rows = dataset
    good = valid(rows)
    copies = Counter(r.get("event_id") for r in good)
    singles = [r for r in good if copies[r.get("event_id")] == 1]
    lateness = [r.ms["load_tstamp"] - r.ms["collector_tstamp"] for r in singles]
    late = [x for x in lateness if x > 60 * SECOND]
    # late_share 5% (a little less: rows near the end of the range cannot be days late).
    assert 0.035 <= len(late) / len(singles) <= 0.06
    assert all(x >= 6 * 3600 * SECOND for x in late)  # late means hours to days, not seconds
    assert max(late) <= MAX_LATE_DAYS * DAY
    assert max(late) >= 0.8 * MAX_LATE_DAYS * DAY
    assert sum(1 for x in late if x >= DAY) > 0.3 * len(late)
    assert summary.late_rows >= len(late) >= summary.late_rows * 0.95
    assert summary.max_lateness_days == pytest.approx(max(late) / DAY, abs=0.01)


def test_device_late_rows_were_sent_long_after_they_were_created(dataset) -> None:
    _, summary, rows = dataset
    delays = [r.ms["dvce_sent_tstamp"] - r.ms["dvce_created_tstamp"] for r in valid(rows)]
    offline = [d for d in delays if d >= 10 * MINUTE]
    assert summary.device_late_rows > 0
    assert len(offline) >= summary.device_late_rows  # duplicates of them count too
    assert any(d > 3 * DAY for d in offline)  # beyond days_late_allowed


# --- sessions ------------------------------------------------------------------------------------


def human_rows(rows: list[Row]) -> list[Row]:
    return [
        r
        for r in valid(rows)
        if '"spiderOrRobot":false'
        in (r.get("contexts_com_iab_snowplow_spiders_and_robots_1_0_0") or "")
    ]


def bot_rows(rows: list[Row]) -> list[Row]:
    return [
        r
        for r in valid(rows)
        if '"spiderOrRobot":true'
        in (r.get("contexts_com_iab_snowplow_spiders_and_robots_1_0_0") or "")
    ]


def test_human_sessions_agree_in_id_and_gap_mode(dataset) -> None:
    """Within a visit events are < 30 min apart, between a user's visits > 30 min (by derived time)."""
    _, summary, rows = dataset
    by_user: dict[str, list[Row]] = defaultdict(list)
    for r in human_rows(rows):
        by_user[r.get("domain_userid") or ""].append(r)
    gaps_within: list[int] = []
    gaps_between: list[int] = []
    for events in by_user.values():
        events.sort(key=lambda r: (r.ms["derived_tstamp"], r.get("event_id")))
        for before, after in zip(events, events[1:], strict=False):
            gap = after.ms["derived_tstamp"] - before.ms["derived_tstamp"]
            if before.get("domain_sessionid") == after.get("domain_sessionid"):
                gaps_within.append(gap)
            else:
                gaps_between.append(gap)
                assert int(after.get("domain_sessionidx") or 0) > int(
                    before.get("domain_sessionidx") or 0
                )
    assert max(gaps_within) <= 30 * MINUTE
    assert min(gaps_between) > 30 * MINUTE
    assert sorted(gaps_within)[len(gaps_within) // 2] < MINUTE  # mostly seconds apart
    assert max(gaps_within) > 2 * MINUTE  # some idle stretches of minutes
    sessions_per_user = Counter(
        len({r.get("domain_sessionid") for r in events}) for events in by_user.values()
    )
    assert sum(n for k, n in sessions_per_user.items() if k >= 3) > 10  # returning users
    assert summary.human_sessions >= sum(k * n for k, n in sessions_per_user.items())


def test_sessions_cross_midnight(dataset) -> None:
    _, summary, rows = dataset
    days: dict[str, set[int]] = defaultdict(set)
    for r in human_rows(rows):
        days[r.get("domain_sessionid") or ""].add(r.ms["derived_tstamp"] // DAY)
    crossing = [sid for sid, d in days.items() if len(d) > 1]
    assert len(crossing) >= 5
    assert summary.sessions_crossing_midnight >= len(crossing) * 0.9


def test_bots_keep_one_session_for_more_than_three_days(dataset) -> None:
    _, summary, rows = dataset
    sessions: dict[str, list[int]] = defaultdict(list)
    for r in bot_rows(rows):
        sessions[r.get("domain_sessionid") or ""].append(r.ms["derived_tstamp"])
    assert summary.bot_sessions >= len(sessions) >= 1
    spans = {sid: max(t) - min(t) for sid, t in sessions.items()}
    long_ones = [sid for sid, span in spans.items() if span > 3 * DAY]
    assert long_ones
    for sid in long_ones:  # one chain in gap mode too: never 30 minutes without an event
        times = sorted(sessions[sid])
        assert max(b - a for a, b in zip(times, times[1:], strict=False)) < 30 * MINUTE
    share = len(bot_rows(rows)) / len(rows)
    assert 0.01 <= share <= 0.04


# --- duplicates and malformed rows ---------------------------------------------------------------


def test_duplicates_of_each_kind_are_in_the_files(dataset) -> None:
    _, summary, rows = dataset
    copies: dict[str, list[Row]] = defaultdict(list)
    for r in valid(rows):
        copies[r.get("event_id") or ""].append(r)
    repeated = {eid: rs for eid, rs in copies.items() if len(rs) > 1}
    assert all(len(rs) == 2 for rs in repeated.values())
    assert len(repeated) == sum(summary.duplicate_rows.values())
    assert 0.006 <= len(repeated) / summary.events <= 0.014
    assert all(summary.duplicate_rows[kind] > 0 for kind in DUPLICATE_KINDS)
    pairs = list(repeated.values())
    other_day = [
        p
        for p in pairs
        if p[0].load_day != p[1].load_day
        and p[0].get("collector_tstamp") == p[1].get("collector_tstamp")
    ]
    resent = [p for p in pairs if p[0].get("collector_tstamp") != p[1].get("collector_tstamp")]
    assert other_day and resent
    for a, b in resent:  # a tracker retry: same event time, later send and collection
        assert a.get("derived_tstamp") == b.get("derived_tstamp")
        assert a.get("dvce_created_tstamp") == b.get("dvce_created_tstamp")


def test_malformed_csv_rows_of_each_kind_are_identifiable(dataset) -> None:
    _, summary, rows = dataset
    found = Counter(r.malformed for r in rows if r.malformed)
    assert set(found) == set(MALFORMED_KINDS_CSV)
    assert found == Counter({k: n for k, n in summary.malformed_rows.items() if n})
    assert 0.003 <= sum(found.values()) / summary.events <= 0.008
    # A wrong field count still leaves a readable load_tstamp when fields are missing at the end.
    short = [r for r in rows if r.malformed == "wrong_field_count" and len(r.fields) < len(COLUMNS)]
    assert short and all(parse_tstamp(r.fields[COL["load_tstamp"]] or "") for r in short)


def test_malformed_json_lines_of_each_kind_are_identifiable(json_dataset) -> None:
    _, summary, rows = json_dataset
    assert [Path(f).name for f in summary.files] == ["events.csv", "events.ndjson"] * 2
    found = Counter(r.malformed for r in rows if r.malformed)
    assert set(found) == set(MALFORMED_KINDS_CSV) | set(MALFORMED_KINDS_JSON)
    assert found == Counter({k: n for k, n in summary.malformed_rows.items() if n})
    json_days = {
        Path(f).parent.name.removeprefix("load_date=")
        for f in summary.files
        if f.endswith(".ndjson")
    }
    assert all(r.load_day in json_days for r in rows if r.malformed == "invalid_json")
    assert not any(r.load_day in json_days for r in rows if r.malformed == "wrong_field_count")


# --- parameters ------------------------------------------------------------------------------------


def test_shares_follow_the_parameters(tmp_path: Path) -> None:
    summary = generate(
        tmp_path / "x",
        START,
        days=4,
        events_per_day=2000,
        seed=2,
        late_share=0.2,
        duplicate_share=0.0,
        malformed_share=0.0,
        bot_share=0.0,
    )
    rows = read_landing(tmp_path / "x", summary)
    assert not any(r.malformed for r in rows)
    assert len({r.get("event_id") for r in rows}) == len(rows)
    assert summary.bot_sessions == 0 and not bot_rows(rows)
    late = sum(1 for r in rows if r.ms["load_tstamp"] - r.ms["collector_tstamp"] > 60 * SECOND)
    assert 0.15 <= late / len(rows) <= 0.22


def test_bad_parameters_and_a_used_folder_are_user_errors(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="late_share"):
        generate(tmp_path / "a", late_share=1.5)
    with pytest.raises(UserError, match="file_format"):
        generate(tmp_path / "a", file_format="xml")
    with pytest.raises(UserError, match="days"):
        generate(tmp_path / "a", days=0)
    with pytest.raises(UserError, match="start_date"):
        generate(tmp_path / "a", start_date="March 1st")
    with pytest.raises(UserError, match="profile"):
        generate(tmp_path / "a", profile="gentle")
    generate(tmp_path / "b", START, days=2, events_per_day=200, seed=1)
    with pytest.raises(UserError, match="already holds"):
        generate(tmp_path / "b", START, days=1, events_per_day=200, seed=1)
    summary = generate(tmp_path / "b", START, days=1, events_per_day=200, seed=1, overwrite=True)
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == sorted(
        ["load_date=2024-03-01", MANIFEST_NAME]
    )
    assert summary.files == ["load_date=2024-03-01/events.csv"]


# --- profiles: harsh (the original output) and realistic -----------------------------------------

# Computed with the generator as it was before profiles existed (commit 4f8888e): sha256 over the
# landing files (sorted by path: path, NUL, bytes) and sha256 of the manifest text. `harsh`, the
# default, must write exactly these bytes (the manifest only gains `profile` and
# `profile_parameters`).
HARSH_BEFORE_PROFILES = {
    "dataset": (
        "c5a4c53f302bf5b9c8edd80ff7d73c1da77747c6ca78009273b2da0818d88d5c",
        "7f43eaf63d8f164438ec7b74b76ab83095a0d28fd6a568b8b45da9f694459bd6",
    ),
    "json_dataset": (
        "ef3bb37f5ab38814196bc3b22d5e53882882719fe74a8a5183fd2de40e874e87",
        "ab5f85da364c58ba75073dc73f3bbb1d5e0abbf30fa141f8622ea0db7f8698ba",
    ),
}
PROFILE_ARGS = dict(start_date=START, days=10, events_per_day=4000, seed=11)


def landing_digest(out: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(out.rglob("*")):
        if path.is_file() and path.name != MANIFEST_NAME:
            digest.update(path.relative_to(out).as_posix().encode())
            digest.update(b"\0")
            digest.update(path.read_bytes())
    return digest.hexdigest()


@pytest.mark.parametrize("fixture", sorted(HARSH_BEFORE_PROFILES))
def test_harsh_is_the_original_output_byte_for_byte(request, fixture: str) -> None:
    out, summary, _ = request.getfixturevalue(fixture)
    files_sha, manifest_sha = HARSH_BEFORE_PROFILES[fixture]
    assert summary.profile == "harsh"
    assert landing_digest(out) == files_sha
    manifest = json.loads((out / MANIFEST_NAME).read_text())
    assert manifest["profile"] == "harsh"
    assert manifest["profile_parameters"] == PROFILES["harsh"].to_json()
    del manifest["profile"], manifest["profile_parameters"]
    text = json.dumps(manifest, indent=2, sort_keys=True) + "\n"
    assert hashlib.sha256(text.encode()).hexdigest() == manifest_sha


def test_realistic_is_reproducible_and_differs_from_harsh(tmp_path: Path) -> None:
    args = dict(start_date="2024-03-01", days=3, events_per_day=800, seed=3)
    generate(tmp_path / "a", profile="realistic", **args)
    generate(tmp_path / "b", profile=PROFILES["realistic"], **args)
    generate(tmp_path / "c", profile="harsh", **args)
    realistic, again, harsh = (tree_bytes(tmp_path / name) for name in ("a", "b", "c"))
    assert realistic == again
    assert all(harsh[name] != realistic[name] for name in realistic)


@pytest.fixture(scope="module")
def profiles(
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, tuple[GenerationSummary, list[Row]]]:
    """The same arguments and seed under each profile: 10 load days of 4,000 rows."""
    out = {}
    for name in ("harsh", "realistic"):
        folder = tmp_path_factory.mktemp("profiles") / name
        summary = generate(folder, profile=name, **PROFILE_ARGS)
        out[name] = (summary, read_landing(folder, summary))
    return out


def load_lateness(rows: list[Row]) -> list[int]:
    """load - collector (ms) of the late rows: single copies loaded more than a minute late."""
    good = valid(rows)
    copies = Counter(r.get("event_id") for r in good)
    lateness = [
        r.ms["load_tstamp"] - r.ms["collector_tstamp"]
        for r in good
        if copies[r.get("event_id")] == 1
    ]
    return [x for x in lateness if x > 60 * SECOND]


def share(values: list[int], at_most: int) -> float:
    return sum(1 for v in values if v <= at_most) / len(values)


def test_realistic_late_rows_load_within_hours_with_a_thin_tail_of_days(profiles) -> None:
    summary, rows = profiles["realistic"]
    late = load_lateness(rows)
    assert 0.035 <= len(late) / summary.events <= 0.06  # late_share 5%, as in harsh
    # 90% in the 5 min-6 h band, 9.5% 6 h-3 d (56% of which within the first day), 0.5% beyond.
    assert 0.87 <= share(late, 6 * HOUR) <= 0.94
    assert 0.935 <= share(late, DAY) <= 0.985
    assert share(late, 3 * DAY) >= 0.985
    assert min(late) >= 5 * MINUTE
    assert 3 * DAY < max(late) <= PROFILE_ARGS["days"] * DAY  # the tail exists, within the span
    assert summary.max_lateness_days == pytest.approx(max(late) / DAY, abs=0.01)
    # The harsh twin (same seed and shares): nothing within 6 hours, most late rows days late.
    harsh_late = load_lateness(profiles["harsh"][1])
    assert share(harsh_late, 6 * HOUR) == 0.0
    assert share(harsh_late, DAY) < 0.6


def event_days_by_load_day(rows: list[Row]) -> dict[int, Counter[int]]:
    """Per load day (days since START), the valid rows per event day (date of derived_tstamp)."""
    start = (START - dt.date(1970, 1, 1)).days
    out: dict[int, Counter[int]] = defaultdict(Counter)
    for r in valid(rows):
        out[r.ms["load_tstamp"] // DAY - start][r.ms["derived_tstamp"] // DAY - start] += 1
    return out


def test_a_realistic_load_day_touches_few_event_days(profiles) -> None:
    realistic = event_days_by_load_day(profiles["realistic"][1])
    harsh = event_days_by_load_day(profiles["harsh"][1])
    for load_day in range(5, PROFILE_ARGS["days"]):
        # harsh: rows of every event day so far, 2-4% of them older than the day before
        assert set(harsh[load_day]) == set(range(load_day + 1))
        # realistic: the day itself, the day before, and a few stragglers
        days = realistic[load_day]
        assert {load_day, load_day - 1} <= set(days)
        assert len(days) <= 7
        older = sum(n for day, n in days.items() if day < load_day - 1)
        assert older / sum(days.values()) < 0.01


def user_activity(rows: list[Row]) -> tuple[list[int], list[int]]:
    """Human users' (events, visits), each list sorted from the most active user down."""
    events: Counter[str] = Counter()
    visits: dict[str, set[str]] = defaultdict(set)
    for r in human_rows(rows):
        user = r.get("domain_userid") or ""
        events[user] += 1
        visits[user].add(r.get("domain_sessionid") or "")
    return sorted(events.values(), reverse=True), sorted(map(len, visits.values()), reverse=True)


def test_realistic_users_are_mostly_one_visit_with_a_heavy_tail(profiles) -> None:
    stats = {}
    for name, (_, rows) in profiles.items():
        events, visits = user_activity(rows)
        top = max(1, len(events) // 100)
        stats[name] = {
            "top_1pct_share": sum(events[:top]) / sum(events),
            "one_visit_share": sum(1 for v in visits if v == 1) / len(visits),
            "max_over_mean_visits": visits[0] / (sum(visits) / len(visits)),
        }
    realistic, harsh = stats["realistic"], stats["harsh"]
    assert realistic["one_visit_share"] > 0.65
    assert realistic["top_1pct_share"] > 0.06
    assert realistic["max_over_mean_visits"] > 10
    # The fixed pool of harsh: few one-visit users, no heavy tail.
    assert harsh["one_visit_share"] < 0.2
    assert harsh["top_1pct_share"] < 0.05
    assert harsh["max_over_mean_visits"] < 8


def test_realistic_keeps_bots_duplicates_malformed_and_device_late_rows(profiles) -> None:
    summary, rows = profiles["realistic"]
    assert summary.profile == "realistic"
    assert summary.profile_parameters == PROFILES["realistic"].to_json()
    assert summary.bot_sessions > 0 and bot_rows(rows)
    assert all(summary.duplicate_rows[kind] > 0 for kind in DUPLICATE_KINDS)
    found = Counter(r.malformed for r in rows if r.malformed)
    assert set(found) == set(MALFORMED_KINDS_CSV)
    assert summary.device_late_rows > 0
    offline = [r.ms["dvce_sent_tstamp"] - r.ms["dvce_created_tstamp"] for r in valid(rows)]
    assert sum(1 for d in offline if d >= 10 * MINUTE) >= summary.device_late_rows
