"""The spans a session run reads: every range covered, few spans, nothing merged needlessly."""

from __future__ import annotations

import random

import pytest

from sessionize_assets.core.read_spans import covering_spans


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
