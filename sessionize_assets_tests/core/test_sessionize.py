"""Sessionization rules (core.sessionize): id mode (Snowplow) and gap mode (the blog), and the
read ranges the incremental path relies on.

Spark work is batched: each test puts all its cases in one DataFrame (one session or user per
case) and checks them from one collect. The read-range claim for gap mode is checked against a
plain-Python model of the same rules with hypothesis (fast), and the Spark implementation is
checked against that model on random data.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql import Window
from pyspark.sql import functions as F

from sessionize_assets.core import sessionize as core
from sessionize_assets_tests.sessions.support import (
    PREPARED_WITH_PART,
    events_frame,
    make_settings,
    rows_of,
    utc,
)
from sessionize_assets_tests.sessions.support import event as make_event

MIN = 60_000_000
DAY = 86_400_000_000


def _sessions(spark, rows, settings, lifecycle=None):
    result = core.compute_sessions(events_frame(spark, rows), settings, lifecycle)
    return result


# --- id mode ------------------------------------------------------------------------------------


def test_id_mode_rules(spark):
    """One session per rule; all checked from one Spark pass."""
    s = make_settings(start_date="2021-01-01", max_session_days=3, days_late_allowed=3)
    rows = [
        # plain: two events, user is the largest non-null user id
        make_event("2021-03-01T10:00", "b", "plain"),
        make_event("2021-03-01T10:05", "a", "plain"),
        make_event("2021-03-01T10:06", None, "plain", event_name="page_ping"),
        # capped: an event exactly at start + 3 days is kept and quarantines the session,
        # one after it is left out
        make_event("2021-03-01T00:00", "u", "capped"),
        make_event("2021-03-04T00:00", "u", "capped"),
        make_event("2021-03-04T00:00:01", "u", "capped"),
        # just under the cap: not quarantined
        make_event("2021-03-01T00:00", "u", "under"),
        make_event("2021-03-03T23:59:59", "u", "under"),
        # sent late: left out (more than 3 days after created)
        make_event("2021-03-02T00:00", "v", "late"),
        make_event("2021-03-02T00:01", "v", "late", sent_late_days=3.5),
        # duplicate event_id in a session: the first copy (by session timestamp) stays
        make_event(
            "2021-03-02T08:00", "w", "dupe", event_id="same", collector="2021-03-02T08:00:05"
        ),
        make_event(
            "2021-03-02T08:00",
            "w",
            "dupe",
            event_id="same",
            collector="2021-03-02T08:00:01",
            page_url="https://example.com/first-copy",
        ),
        # no session identifier: left out
        make_event("2021-03-02T09:00", "x", None),
        # before start_date on the session timestamp: left out
        make_event("2020-12-31T23:59", "y", "early"),
    ]
    result = _sessions(spark, rows, s)
    got = {
        r[0]: r[1:]
        for r in rows_of(
            result.sessions,
            "session_identifier",
            "user_identifier",
            "total_events",
            "page_views",
            "is_quarantined",
            "first_page_url",
            "session_number",
        )
    }
    assert got["plain"][:4] == ("b", 3, 2, False)
    assert got["capped"][:4] == ("u", 2, 2, True)
    assert got["under"][:4] == ("u", 2, 2, False)
    assert got["late"][:4] == ("v", 1, 1, False)
    assert got["dupe"][:4] == ("w", 1, 1, False)
    assert got["dupe"][4] == "https://example.com/first-copy"
    assert "early" not in got and None not in got
    # numbering per user by start: "capped" and "under" start together, ties by id
    assert (got["capped"][5], got["under"][5]) == (1, 2)
    reasons = defaultdict(int)
    for (reason,) in rows_of(result.excluded, core.REASON):
        reasons[reason] += 1
    assert dict(reasons) == {
        core.AFTER_MAX_SESSION_DAYS: 1,
        core.SENT_LATE_RULE: 1,
        core.DUPLICATE_EVENT: 1,
        core.NO_SESSION_IDENTIFIER: 1,
        core.BEFORE_START_DATE: 1,
    }


def test_id_mode_takes_quarantine_and_first_seen_user_from_the_lifecycle(spark):
    s = make_settings(start_date="2021-01-01", max_session_days=3)
    rows = [
        # quarantined at 03-01 10:00: an earlier and a later event are ignored, one inside counts
        make_event("2021-02-28T10:00", "u", "frozen"),
        make_event("2021-03-02T10:00", "u", "frozen"),
        make_event("2021-03-04T10:00", "u", "frozen"),
        make_event("2021-03-04T10:00:01", "u", "frozen"),
        # first seen with user "a": keeps it although "z" is larger
        make_event("2021-03-01T10:00", "z", "seen"),
        # not in the lifecycle: starts at its own first event
        make_event("2021-02-27T10:00", "n", "new"),
    ]
    lifecycle = spark.createDataFrame(
        [
            ("frozen", "u", utc("2021-03-01T10:00"), utc("2021-03-04T10:00"), True),
            ("seen", "a", utc("2021-03-01T10:00"), utc("2021-03-01T10:00"), False),
        ],
        "session_identifier string, user_identifier string, start_tstamp timestamp, end_tstamp timestamp, is_quarantined boolean",
    )
    result = _sessions(spark, rows, s, lifecycle)
    got = {
        r[0]: r[1:]
        for r in rows_of(
            result.sessions,
            "session_identifier",
            "user_identifier",
            "total_events",
            "is_quarantined",
            core.LC_START,
        )
    }
    assert got["frozen"] == ("u", 2, True, utc("2021-03-01T10:00"))
    assert got["seen"][0] == "a"
    assert got["new"] == ("n", 1, False, utc("2021-02-27T10:00"))
    reasons = sorted(r[0] for r in rows_of(result.excluded, core.REASON))
    assert reasons == [core.QUARANTINED_SESSION, core.QUARANTINED_SESSION]


def test_id_read_ranges_cover_every_current_event(spark):
    s = make_settings(start_date="2021-01-01", max_session_days=3)
    changes = core.prepare_events(
        events_frame(
            spark,
            [
                make_event("2021-03-05T00:00", "u", "known"),
                make_event("2021-02-28T00:00", "u", "known"),
                make_event("2021-03-09T00:00", "u", "frozen"),
                make_event("2021-03-02T00:00", "u", "new"),
                make_event("2021-03-03T00:00", "u", "new"),
            ],
        ),
        s,
    )
    lifecycle = spark.createDataFrame(
        [
            ("known", "u", utc("2021-03-01T00:00"), utc("2021-03-02T00:00"), False),
            ("frozen", "u", utc("2021-03-01T00:00"), utc("2021-03-04T00:00"), True),
        ],
        "session_identifier string, user_identifier string, start_tstamp timestamp, end_tstamp timestamp, is_quarantined boolean",
    )
    got = {
        r[0]: r[1:]
        for r in rows_of(
            core.id_read_ranges(changes, lifecycle, s),
            core.SESSION_KEY,
            "_read_lo",
            "_read_hi",
            "_is_known",
        )
    }
    assert got == {
        "known": (utc("2021-02-28T00:00"), utc("2021-03-05T00:00"), True),
        "frozen": (utc("2021-03-01T00:00"), utc("2021-03-04T00:00"), True),
        "new": (utc("2021-03-02T00:00"), utc("2021-03-03T00:00"), False),
    }


# --- gap mode: a plain-Python model of the rules ------------------------------------------------


def model_gap_sessions(events, gap_minutes, max_days):
    """Sessions of (user, t_micros, event_id) events: {(user, start, end, count, quarantined, first_id)}."""
    gap, cap = gap_minutes * MIN, max_days * DAY
    by_user = defaultdict(list)
    for user, t, eid in set(events):
        by_user[user].append((t, eid))
    out = set()
    for user, evs in by_user.items():
        evs.sort()
        chains, current = [], [evs[0]]
        for prev, cur in zip(evs, evs[1:], strict=False):
            if cur[0] - prev[0] > gap:
                chains.append(current)
                current = []
            current.append(cur)
        chains.append(current)
        for chain in chains:
            if chain[-1][0] - chain[0][0] > cap:
                pieces = defaultdict(list)
                for t, eid in chain:
                    pieces[t // cap].append((t, eid))
                groups, quarantined = list(pieces.values()), True
            else:
                groups, quarantined = [chain], False
            for g in groups:
                out.add((user, g[0][0], g[-1][0], len(g), quarantined, g[0][1]))
    return out


def _overlaps(session, lo, hi):
    return session[1] <= hi and session[2] >= lo


times = st.integers(min_value=0, max_value=8 * DAY // MIN).map(lambda m: 10_000 * DAY + m * MIN)


@settings(max_examples=1000, deadline=None)
@given(
    base=st.lists(times, min_size=1, max_size=40),
    inserted=st.lists(times, min_size=0, max_size=3),
    deleted_picks=st.lists(st.integers(min_value=0, max_value=1000), max_size=3),
    gap_minutes=st.sampled_from([30, 240, 1440]),
    max_days=st.sampled_from([1, 2]),
)
def test_gap_read_ranges_are_exact(base, inserted, deleted_picks, gap_minutes, max_days):
    """Sessions wholly outside the changed range are the same before and after the change; those
    overlapping it are computed exactly from the events in the read range (SPEC section 6)."""
    s = make_settings(
        start_date="2000-01-01",
        session_mode="gap",
        session_gap_minutes=gap_minutes,
        max_session_days=max_days,
    )
    reach, margin = core.gap_reach_micros(s), core.gap_margin_micros(s)
    old = [("u", t, f"b{i}") for i, t in enumerate(base)]
    deleted = {old[p % len(old)] for p in deleted_picks}
    added = [("u", t, f"n{i}") for i, t in enumerate(inserted)]
    new = [e for e in old if e not in deleted] + added
    changed = [e[1] for e in deleted] + [e[1] for e in added]
    if not changed or not new:
        return
    lo, hi = min(changed) - reach, max(changed) + reach
    before, after = (
        model_gap_sessions(old, gap_minutes, max_days),
        model_gap_sessions(new, gap_minutes, max_days),
    )
    assert {x for x in before if not _overlaps(x, lo, hi)} == {
        x for x in after if not _overlaps(x, lo, hi)
    }
    read = [e for e in new if lo - margin <= e[1] <= hi + margin]
    from_read = model_gap_sessions(read, gap_minutes, max_days) if read else set()
    assert {x for x in from_read if _overlaps(x, lo, hi)} == {
        x for x in after if _overlaps(x, lo, hi)
    }
    # The same two claims for the ranges narrowed by the old sessions' chains, per changed time
    # and merged where their read ranges overlap (`gap_change_ranges` with `gap_chains`),
    # modelled here from the old sessions alone.
    narrowed = model_narrowed_ranges(before, changed, gap_minutes * MIN, reach, margin)
    assert all(lo <= c_lo <= c_hi <= hi for c_lo, c_hi, _, _ in narrowed)
    assert all(lo - margin <= r_lo <= r_hi <= hi + margin for _, _, r_lo, r_hi in narrowed)

    def touched(x):
        return any(_overlaps(x, c_lo, c_hi) for c_lo, c_hi, _, _ in narrowed)

    assert {x for x in before if not touched(x)} == {x for x in after if not touched(x)}
    for c_lo, c_hi, r_lo, r_hi in narrowed:
        narrow = [e for e in new if r_lo <= e[1] <= r_hi]
        from_narrow = model_gap_sessions(narrow, gap_minutes, max_days) if narrow else set()
        assert {x for x in from_narrow if _overlaps(x, c_lo, c_hi)} == {
            x for x in after if _overlaps(x, c_lo, c_hi)
        }


def model_narrowed_ranges(old_sessions, changed, gap, reach, margin):
    """[changed_lo, changed_hi, read_lo, read_hi] per group of changed times: the changed times
    clustered (a gap or less apart), each cluster's ranges narrowed to the chains of the old
    sessions within a gap of it, then merged where the read ranges overlap or touch (the rule
    `gap_change_ranges` applies with `gap_chains`)."""
    chains: list[list[int]] = []
    for _, start, end, *_ in sorted(old_sessions, key=lambda x: (x[1], x[2])):
        if chains and start - chains[-1][1] <= gap:
            chains[-1][1] = max(chains[-1][1], end)
        else:
            chains.append([start, end])
    clusters: list[list[int]] = []
    for t in sorted(set(changed)):
        if clusters and t - clusters[-1][1] <= gap:
            clusters[-1][1] = t
        else:
            clusters.append([t, t])
    each = []
    for lo, hi in clusters:
        near = [c for c in chains if c[1] >= lo - gap and c[0] <= hi + gap]
        first, last = min([lo] + [c[0] for c in near]), max([hi] + [c[1] for c in near])
        each.append(
            [
                max(lo - reach, first),
                min(hi + reach, last),
                max(lo - reach - margin, first),
                min(hi + reach + margin, last),
            ]
        )
    merged: list[list[int]] = []
    for c_lo, c_hi, r_lo, r_hi in sorted(each, key=lambda r: (r[2], r[3])):
        if merged and r_lo <= merged[-1][3]:
            m = merged[-1]
            m[:] = [min(m[0], c_lo), max(m[1], c_hi), m[2], max(m[3], r_hi)]
        else:
            merged.append([c_lo, c_hi, r_lo, r_hi])
    return merged


def test_gap_mode_in_spark_matches_the_model(spark):
    """Random users (one per example) sessionized in one Spark pass equal the Python model."""
    import random

    rng = random.Random(7)
    s = make_settings(
        start_date="2000-01-01", session_mode="gap", session_gap_minutes=30, max_session_days=1
    )
    rows, model_events = [], []
    for n in range(30):
        user = f"user{n}"
        bot = n >= 25  # dense activity for more than a day: the cut rule
        clock = 18_700 * DAY + rng.randrange(DAY)
        for i in range(rng.randrange(60, 90) if bot else rng.randrange(1, 40)):
            steps = (
                [10 * MIN, 29 * MIN, 30 * MIN]
                if bot
                else [MIN, 10 * MIN, 29 * MIN, 30 * MIN, 31 * MIN, 180 * MIN, 0]
            )
            clock += rng.choice(steps)
            when = dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(microseconds=clock)
            eid = f"{user}-{i:03d}"
            rows.append(make_event(when, user, None, event_id=eid))
            model_events.append((user, clock, eid))
    result = core.compute_sessions(events_frame(spark, rows), s)
    got = set()
    for r in result.sessions.select(
        "user_identifier",
        core._micros("start_tstamp").alias("s"),
        core._micros("end_tstamp").alias("e"),
        "total_events",
        "is_quarantined",
        "session_identifier",
    ).collect():
        got.add((r[0], r[1], r[2], r[3], r[4], r[5]))
    expected = {
        (u, a, b, n, q, _sha(u, first))
        for (u, a, b, n, q, first) in model_gap_sessions(model_events, 30, 1)
    }
    assert got == expected
    assert any(q for *_, q, _ in got)  # the random data reached the cut rule


def _rows_with_copies(seed: int) -> list[tuple]:
    """Prepared rows (PREPARED_WITH_PART) with null times and ids, exact copies, copies that
    differ in the columns that choose the copy kept (all of them, or one), copies in another
    session, the same id a microsecond apart, and each user's events in two parts
    separate in time."""
    import random

    rng = random.Random(seed)
    base = dt.datetime(2024, 3, 1)
    rows = []
    for _ in range(400):
        when = None if rng.random() < 0.05 else base + dt.timedelta(minutes=rng.randrange(2880))
        rows.append(
            (
                None if rng.random() < 0.05 else f"e{rng.randrange(300)}",
                rng.choice(["page_view", "page_ping", None]),
                rng.choice(["/a", "/b", None]),
                when,
                rng.choice([when, None]),
                f"s{rng.randrange(40)}",
                f"u{rng.randrange(4)}",
                rng.choice([when, base]),
                False,
                0 if when is None or when < base + dt.timedelta(hours=20) else 1,
            )
        )
    for _ in range(200):
        row = list(rng.choice(rows))
        kind = rng.randrange(5)
        if kind == 3:  # a copy in another session: in gap mode it differs only outside
            row[5] = f"s{rng.randrange(40)}"  # COPY_ORDER: kept or not, the same sessions
        # kind 1: a copy that differs in the columns that choose the copy kept; kind 4: in one
        varied = {1, 2, 4, 6, 7} if kind == 1 else {rng.choice([1, 2, 4, 6, 7])}
        if kind in (1, 4):
            draws = {
                1: ["page_view", "page_ping", None],
                2: ["/a", "/b", "/c", None],
                4: [row[3], None, base],
                6: [row[6], "u9"],  # id mode: a copy of another user
                7: [row[3], base, base + dt.timedelta(days=1)],
            }
            for column in varied:
                row[column] = rng.choice(draws[column])
        elif kind == 2 and row[3] is not None:  # the same id a microsecond later: no copy
            row[3] += dt.timedelta(microseconds=1)
        rows.append(tuple(row))  # kind 0: an exact copy
    return rows


@pytest.mark.parametrize("mode", ["gap", "id"])
def test_copies_are_dropped_as_deduplicating_first_would(spark, mode):
    """Each mode finds the copies of its key ((user, event id, time) in gap mode, (session,
    event id) in id mode) in the sort its own windows need: the sessions and the copies left
    out equal those of deduplicating first (ranking each key's copies in a window of their own,
    as before session 48, then sessionizing rows without copies)."""
    s = make_settings(
        start_date="2000-01-01", session_mode=mode, session_gap_minutes=30, max_session_days=1
    )
    frame = spark.createDataFrame(_rows_with_copies(11), PREPARED_WITH_PART)
    key = (
        [core.USER_KEY, "event_id", "derived_tstamp"]
        if mode == "gap"
        else [core.SESSION_KEY, "event_id"]
    )
    if mode == "id":
        frame = frame.drop(core.PART)
    result = core.sessionize(frame, s)
    copy = F.row_number().over(Window.partitionBy(*key).orderBy(*core._copy_order()))
    ranked = frame.withColumn("_n", copy)
    kept = ranked.filter(F.col("_n") == 1).drop("_n")
    copies = ranked.filter(F.col("_n") > 1).withColumn(core.REASON, F.lit(core.DUPLICATE_EVENT))
    first = core.sessionize(kept, s)

    def bag(df):
        return sorted(tuple(str(v) for v in r) for r in df.collect())

    # Copies that tie on the key and COPY_ORDER may differ in the session key (gap mode): which
    # of them is dropped is not fixed, and no session can tell.
    copy_columns = list(dict.fromkeys([*key, *core.COPY_ORDER, core.REASON]))
    dropped = result.excluded.filter(F.col(core.REASON) == core.DUPLICATE_EVENT)
    assert first.excluded.filter(F.col(core.REASON) == core.DUPLICATE_EVENT).count() == 0
    assert bag(dropped.select(*copy_columns)) == bag(copies.select(*copy_columns))
    assert bag(result.excluded.filter(F.col(core.REASON) != core.DUPLICATE_EVENT)) == bag(
        first.excluded
    )
    assert bag(result.sessions) == bag(first.sessions.select(*result.sessions.columns))
    # Ties on COPY_ORDER broken by the order the rows were drawn in, first and last drawn kept:
    # the same sessions. Fails when COPY_ORDER leaves out a column a session takes from its
    # events (then two copies that tie may give different sessions).
    drawn = frame.withColumn("_drawn", F.monotonically_increasing_id())
    for tie in (F.col("_drawn").asc(), F.col("_drawn").desc()):
        n = F.row_number().over(Window.partitionBy(*key).orderBy(*core._copy_order(), tie))
        kept_tie = drawn.withColumn("_n", n).filter(F.col("_n") == 1).drop("_n", "_drawn")
        assert bag(core.sessionize(kept_tie, s).sessions) == bag(result.sessions)
    # the draws hold copies with and without a time, and sessions without a time (gap mode)
    assert dropped.filter(F.col("derived_tstamp").isNull()).count() > 0
    assert dropped.filter(F.col("derived_tstamp").isNotNull()).count() > 0
    if mode == "gap":
        assert result.sessions.filter(F.col("start_tstamp").isNull()).count() > 0


def _sha(user, event_id):
    import hashlib

    return hashlib.sha256(f"{user}|{event_id}".encode()).hexdigest()


def test_gap_mode_boundaries(spark):
    """A gap of exactly the limit continues a session, one microsecond more starts a new one;
    sessions are not split at midnight; a chain longer than max_session_days is cut at UTC
    boundaries counted from 1970-01-01 and every piece is quarantined."""
    s = make_settings(
        start_date="2020-01-01", session_mode="gap", session_gap_minutes=30, max_session_days=1
    )
    rows = [
        make_event("2021-03-01T10:00:00", "exact"),
        make_event("2021-03-01T10:30:00", "exact"),
        make_event("2021-03-01T10:00:00", "over"),
        make_event("2021-03-01T10:30:00.000001", "over"),
        make_event("2021-03-01T23:50:00", "midnight", page_url="/before"),
        make_event("2021-03-02T00:05:00", "midnight", event_name="page_ping", page_url="/ping"),
        make_event("2021-03-02T00:10:00", "midnight", page_url="/after"),
    ]
    clock = utc("2021-03-01T20:00")
    while clock <= utc("2021-03-03T04:00"):  # 32 h of activity every 20 minutes
        rows.append(make_event(clock, "bot"))
        clock += dt.timedelta(minutes=20)
    result = core.compute_sessions(events_frame(spark, rows), s)
    got = defaultdict(list)
    for user, start, end, n, q, number in rows_of(
        result.sessions,
        "user_identifier",
        "start_tstamp",
        "end_tstamp",
        "total_events",
        "is_quarantined",
        "session_number",
    ):
        got[user].append((start, end, n, q, number))
    assert [x[2] for x in got["exact"]] == [2]
    assert sorted(x[2] for x in got["over"]) == [1, 1]
    assert got["midnight"] == [(utc("2021-03-01T23:50"), utc("2021-03-02T00:10"), 3, False, 1)]
    # A session across a max_session_days boundary that is not cut keeps its page views and
    # its first and last page from both sides of the boundary.
    assert rows_of(
        result.sessions.filter(F.col("user_identifier") == "midnight"),
        "page_views",
        "first_page_url",
        "last_page_url",
    ) == [(2, "/before", "/after")]
    bot = sorted(got["bot"])
    assert [(b[0], b[1]) for b in bot] == [
        (utc("2021-03-01T20:00"), utc("2021-03-01T23:40")),
        (utc("2021-03-02T00:00"), utc("2021-03-02T23:40")),
        (utc("2021-03-03T00:00"), utc("2021-03-03T04:00")),
    ]
    assert all(b[3] for b in bot) and [b[4] for b in bot] == [1, 2, 3]


def test_gap_change_ranges_merge_nearby_changes(spark):
    s = make_settings(
        start_date="2020-01-01", session_mode="gap", session_gap_minutes=30, max_session_days=1
    )
    changes = core.prepare_events(
        events_frame(
            spark,
            [
                make_event("2021-03-01T10:00", "u"),
                make_event("2021-03-02T10:00", "u"),  # within reach of the first: same range
                make_event("2021-03-20T10:00", "u"),  # far: its own range
                make_event("2021-03-01T10:00", "v"),
            ],
        ),
        s,
    )
    ranges = rows_of(
        core.gap_change_ranges(changes, s),
        core.USER_KEY,
        "_changed_lo",
        "_changed_hi",
        "_read_lo",
        "_read_hi",
    )
    reach = dt.timedelta(days=1, minutes=30)
    margin = dt.timedelta(days=1, minutes=60)
    assert ranges == sorted(
        [
            (
                "u",
                utc("2021-03-01T10:00") - reach,
                utc("2021-03-02T10:00") + reach,
                utc("2021-03-01T10:00") - reach - margin,
                utc("2021-03-02T10:00") + reach + margin,
            ),
            (
                "u",
                utc("2021-03-20T10:00") - reach,
                utc("2021-03-20T10:00") + reach,
                utc("2021-03-20T10:00") - reach - margin,
                utc("2021-03-20T10:00") + reach + margin,
            ),
            (
                "v",
                utc("2021-03-01T10:00") - reach,
                utc("2021-03-01T10:00") + reach,
                utc("2021-03-01T10:00") - reach - margin,
                utc("2021-03-01T10:00") + reach + margin,
            ),
        ],
        key=lambda t: tuple(str(x) for x in t),
    )


def test_gap_change_ranges_narrow_to_the_chains_of_old_sessions_they_touch(spark):
    """With the changed users' lifecycle chains: a change within a gap of an old chain reads
    that whole chain (two sessions a cut apart are one chain) and nothing else; a change near
    no old session reads only itself; a chain longer than the margins is cut at them."""
    s = make_settings(
        start_date="2020-01-01", session_mode="gap", session_gap_minutes=30, max_session_days=1
    )
    lifecycle = spark.createDataFrame(
        [
            ("u", utc("2021-03-01T10:00"), utc("2021-03-01T10:20")),
            ("u", utc("2021-03-01T10:40"), utc("2021-03-01T11:00")),  # 20 min on: same chain
            ("u", utc("2021-03-01T15:00"), utc("2021-03-01T15:10")),  # hours away: untouched
            ("v", utc("2021-03-01T09:00"), utc("2021-03-01T09:10")),  # 50 min before: untouched
            ("bot", utc("2021-02-20T00:00"), utc("2021-03-10T00:00")),  # one long chain
        ],
        "user_identifier string, start_tstamp timestamp, end_tstamp timestamp",
    )
    changes = core.prepare_events(
        events_frame(
            spark,
            [
                make_event("2021-03-01T11:25", "u"),
                make_event("2021-03-01T10:00", "v"),
                make_event("2021-03-01T12:00", "bot"),
            ],
        ),
        s,
    )
    chains = core.gap_chains(lifecycle, s)
    assert rows_of(chains, core.USER_KEY, "_chain_lo", "_chain_hi") == sorted(
        [
            ("bot", *(core_micros(utc(t)) for t in ("2021-02-20T00:00", "2021-03-10T00:00"))),
            ("u", *(core_micros(utc(t)) for t in ("2021-03-01T10:00", "2021-03-01T11:00"))),
            ("u", *(core_micros(utc(t)) for t in ("2021-03-01T15:00", "2021-03-01T15:10"))),
            ("v", *(core_micros(utc(t)) for t in ("2021-03-01T09:00", "2021-03-01T09:10"))),
        ]
    )
    ranges = rows_of(
        core.gap_change_ranges(changes, s, chains),
        core.USER_KEY,
        "_changed_lo",
        "_changed_hi",
        "_read_lo",
        "_read_hi",
    )
    reach = dt.timedelta(days=1, minutes=30)
    margin = dt.timedelta(days=1, minutes=60)
    noon = utc("2021-03-01T12:00")
    assert ranges == [
        (
            "bot",
            noon - reach,
            noon + reach,
            noon - reach - margin,
            noon + reach + margin,
        ),
        (
            "u",
            utc("2021-03-01T10:00"),
            utc("2021-03-01T11:25"),
            utc("2021-03-01T10:00"),
            utc("2021-03-01T11:25"),
        ),
        ("v", *[utc("2021-03-01T10:00")] * 4),
    ]


def core_micros(when: dt.datetime) -> int:
    return (when - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)) // dt.timedelta(microseconds=1)


def test_users_and_stats_from_sessions(spark):
    s = make_settings(start_date="2020-01-01", session_mode="gap", session_gap_minutes=30)
    rows = [
        make_event("2021-03-01T10:00", "u"),
        make_event("2021-03-01T10:10", "u", event_name="page_ping"),
        make_event("2021-03-01T12:00", "u"),
        make_event("2021-03-01T14:00", "u"),
        make_event("2021-03-01T14:20", "u"),
        make_event("2021-03-01T10:00", "v"),
    ]
    sessions = core.compute_sessions(events_frame(spark, rows), s).sessions.persist()
    users = {r[0]: r[1:] for r in rows_of(core.users_from_sessions(sessions), *core.USER_COLUMNS)}
    assert users["u"] == (utc("2021-03-01T10:00"), utc("2021-03-01T14:20"), 3, 5, 4)
    assert users["v"] == (utc("2021-03-01T10:00"), utc("2021-03-01T10:00"), 1, 1, 1)
    stats = {
        r[0]: r[1:]
        for r in rows_of(
            core.user_session_stats_from_sessions(sessions), *core.USER_SESSION_STATS_COLUMNS
        )
    }
    assert stats["u"] == (3, 1800.0, 600.0, 600.0, 0.0, 1200.0)
    assert stats["v"] == (1, 0.0, 0.0, 0.0, 0.0, 0.0)
    sessions.unpersist()


def test_superseded_names_merges_and_splits(spark):
    schema = "session_identifier string, user_identifier string, start_tstamp timestamp, end_tstamp timestamp"
    old = spark.createDataFrame(
        [
            ("a", "u", utc("2021-03-01T09:00"), utc("2021-03-01T09:30")),
            ("b", "u", utc("2021-03-01T10:00"), utc("2021-03-01T10:30")),
            ("c", "u", utc("2021-03-01T12:00"), utc("2021-03-01T12:30")),
            ("d", "u", utc("2021-03-01T15:00"), utc("2021-03-01T15:30")),
        ],
        schema,
    )
    new = spark.createDataFrame(
        [
            ("a", "u", utc("2021-03-01T09:00"), utc("2021-03-01T10:30"), False),  # a absorbed b
            (
                "c1",
                "u",
                utc("2021-03-01T11:50"),
                utc("2021-03-01T12:30"),
                False,
            ),  # c starts earlier
        ],
        schema + ", is_quarantined boolean",
    )
    got = rows_of(
        core.superseded(old, new), "superseded_session_identifier", "session_identifier", "reason"
    )
    assert got == [("b", "a", "merged"), ("c", "c1", "first event changed"), ("d", None, "removed")]
