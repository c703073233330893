"""The spans a session run reads: every range covered, few spans, nothing merged needlessly."""

from __future__ import annotations

import random

import pytest

from sessionize_assets.core.read_spans import covering_spans, read_terms, span_members


def covered(spans: list[tuple[int, int]], lo: int, hi: int) -> bool:
    return any(a <= lo and hi <= b for a, b in spans)


def test_overlapping_and_touching_ranges_merge_and_distant_ones_stay_apart():
    assert covering_spans([(10, 20), (15, 30), (30, 40), (100, 110)]) == [(10, 40), (100, 110)]
    assert covering_spans([(100, 110), (10, 20)]) == [(10, 20), (100, 110)]
    assert covering_spans([]) == []


def test_over_the_limit_the_smallest_gaps_close_first():
    ranges = [(0, 1), (3, 4), (100, 101), (104, 105), (1000, 1001)]
    assert covering_spans(ranges, max_spans=3) == [(0, 4), (100, 105), (1000, 1001)]
    assert covering_spans(ranges, max_spans=1) == [(0, 1001)]
    with pytest.raises(ValueError, match="at least 1"):
        covering_spans(ranges, max_spans=0)


@pytest.mark.parametrize("seed", range(20))
def test_random_ranges_are_all_covered_by_disjoint_sorted_spans(seed):
    rng = random.Random(seed)
    ranges = []
    for _ in range(rng.randint(1, 300)):
        lo = rng.randint(0, 10_000)
        ranges.append((lo, lo + rng.randint(0, 50)))
    limit = rng.randint(1, 40)
    spans = covering_spans(ranges, max_spans=limit)
    assert 1 <= len(spans) <= limit
    assert all(covered(spans, lo, hi) for lo, hi in ranges)
    assert all(a <= b for a, b in spans)
    assert all(spans[i][1] < spans[i + 1][0] for i in range(len(spans) - 1))
    # every span starts and ends at a range's bound: nothing is read that no range asked for
    # beyond the gaps the limit closed
    los, his = {lo for lo, _ in ranges}, {hi for _, hi in ranges}
    assert all(a in los and b in his for a, b in spans)
    # with no limit pressure, no gap is closed: the spans cover exactly the union of the ranges
    if len(covering_spans(ranges, max_spans=10_000)) <= limit:
        points = {p for lo, hi in ranges for p in range(lo, hi + 1)}
        assert sum(b - a + 1 for a, b in spans) == len(points)


def test_each_span_names_the_users_of_its_ranges_within_the_limits():
    ranges = [(0, 10, ["a"]), (5, 20, ["b", "a"]), (100, 110, ["c"]), (200, 210, ["d", "e", "f"])]
    spans = covering_spans([(lo, hi) for lo, hi, _ in ranges])
    assert spans == [(0, 20), (100, 110), (200, 210)]
    assert span_members(ranges, spans) == [
        frozenset({"a", "b"}),
        frozenset({"c"}),
        frozenset({"d", "e", "f"}),
    ]
    # a span with too many users, or a range without its users, reads everyone in that span
    assert span_members(ranges, spans, per_span=2) == [frozenset({"a", "b"}), {"c"}, None]
    unknown = [*ranges, (105, 106, None)]
    assert span_members(unknown, spans)[1] is None
    # over the total budget, the largest lists go first
    assert span_members(ranges, spans, in_all=3) == [frozenset({"a", "b"}), {"c"}, None]
    assert span_members(ranges, spans, in_all=0) == [None, None, None]
    with pytest.raises(ValueError, match="inside no span"):
        span_members([(300, 400, ["x"])], spans)


@pytest.mark.parametrize("seed", range(10))
def test_a_users_range_is_always_read_by_its_span(seed):
    """Whatever the limits: every (user, range) is inside a span whose list is None (all users)
    or names the user -- the filter never loses a row the exact join keeps."""
    rng = random.Random(seed)
    ranges = []
    for _ in range(rng.randint(1, 200)):
        lo = rng.randint(0, 5_000)
        users = [f"u{rng.randint(0, 60)}" for _ in range(rng.randint(1, 3))]
        ranges.append((lo, lo + rng.randint(0, 40), users))
    spans = covering_spans([(lo, hi) for lo, hi, _ in ranges], max_spans=rng.randint(1, 20))
    members = span_members(ranges, spans, per_span=rng.randint(0, 30), in_all=rng.randint(0, 90))
    for lo, hi, users in ranges:
        (i,) = [i for i, (a, b) in enumerate(spans) if a <= lo and hi <= b]
        assert members[i] is None or set(users) <= members[i]


def test_few_users_late_hours_stay_apart_from_a_day_of_many_users():
    """A day of many users (time only) and a few users' late hours on older days: over the
    limit, the few-user spans merge with each other (lists united), never into the time-only
    span, so an old day is read for its named users only."""
    crowd = [(1000, 1100, [f"c{i}", f"c{i + 1}"]) for i in range(0, 6, 2)]  # 6 users > 2
    late = [(10, 20, ["a"]), (200, 210, ["b"]), (300, 310, ["c"])]
    terms = read_terms(crowd + late, max_spans=2, per_span=2)
    assert (1000, 1100, None) in terms
    assert sorted(t for t in terms if t[2] is not None) == [
        (10, 20, frozenset({"a"})),
        (200, 310, frozenset({"b", "c"})),  # the two closest merged
    ]
    # the time-only read of covering_spans would have taken everything from 10 to 1100
    assert covering_spans([(lo, hi) for lo, hi, _ in crowd + late], max_spans=1) == [(10, 1100)]
    # past the budget of named users, a span reads everyone in its hours
    assert read_terms(late, in_all=2) == [(300, 310, None), (10, 20, {"a"}), (200, 210, {"b"})]
    assert read_terms([]) == []


def test_one_users_long_range_stays_apart_from_a_crowded_day():
    """A long chain's read (days, one user) overlapping today's crowded hours: a term of its own
    naming its user, so today's time-only span stays today."""
    crowd = [(1000, 1100, [f"c{i}", f"c{i + 1}"]) for i in range(0, 6, 2)]
    bot = (0, 5000, ["bot"])
    assert read_terms([*crowd, bot], per_span=2, long_range=1000) == [
        (1000, 1100, None),
        (0, 5000, {"bot"}),
    ]
    # not long: it merges with the crowd into one time-only span
    assert read_terms([*crowd, bot], per_span=2, long_range=10_000) == [(0, 5000, None)]


@pytest.mark.parametrize("seed", range(20))
def test_every_range_is_read_by_a_term_that_reads_its_users(seed):
    """Whatever the limits: each (users, range) lies inside a term of every user or one naming
    all its users; at most max_spans terms of each kind; a range of unknown users is read whole."""
    rng = random.Random(seed)
    ranges = []
    for _ in range(rng.randint(1, 300)):
        lo = rng.randint(0, 20_000)
        users = None if rng.random() < 0.05 else [f"u{rng.randint(0, 500)}" for _ in range(3)]
        ranges.append((lo, lo + rng.randint(0, 60 if rng.random() < 0.9 else 3_000), users))
    limit = rng.randint(1, 20)
    terms = read_terms(
        ranges,
        max_spans=limit,
        per_span=rng.randint(0, 30),
        in_all=rng.randint(0, 200),
        long_range=rng.choice([100, 1_000, 10**9]),
    )
    assert sum(1 for t in terms if t[2] is None) <= limit
    assert sum(1 for t in terms if t[2] is not None) <= limit
    for lo, hi, users in ranges:
        assert any(
            a <= lo and hi <= b and (named is None or (users is not None and set(users) <= named))
            for a, b, named in terms
        ), (lo, hi, users)
