"""Which stretches of time a session run must read (plain Python, no Spark).

The session branch recomputes the sessions a run touched, each from the events in its own read
range. Reading `filtered_events` between the earliest and the latest of those ranges reads every
event day in between: one late event of a three-week-old session made the run read three weeks.
Instead the ranges are covered by a few disjoint spans, and the read asks for events inside any
span; Delta skips the files (one per load day and event day) whose timestamps lie outside them.

The spans only decide which files are opened: every row read is still joined with its session's
exact range, so a span may be wider than the ranges it covers, never narrower.
"""

from __future__ import annotations

from collections.abc import Iterable

MICROS_PER_HOUR = 3_600_000_000

# Few enough that the filter stays a short OR the planner and Delta's file skipping handle well.
MAX_SPANS = 32


def covering_spans(
    ranges: Iterable[tuple[int, int]], max_spans: int = MAX_SPANS
) -> list[tuple[int, int]]:
    """Disjoint `[lo, hi]` spans (sorted) that together contain every `[lo, hi]` of `ranges`,
    at most `max_spans` of them: overlapping or touching ranges merge, then the spans separated
    by the smallest gaps merge until few enough remain."""
    if max_spans < 1:
        raise ValueError("max_spans must be at least 1")
    spans: list[list[int]] = []
    for lo, hi in sorted((min(a, b), max(a, b)) for a, b in ranges):
        if spans and lo <= spans[-1][1]:
            spans[-1][1] = max(spans[-1][1], hi)
        else:
            spans.append([lo, hi])
    while len(spans) > max_spans:
        gaps = [(spans[i + 1][0] - spans[i][1], i) for i in range(len(spans) - 1)]
        # close every gap as small as the smallest one still needed to get under the limit
        closing = sorted(gaps)[: len(spans) - max_spans]
        for _, i in sorted(closing, key=lambda g: g[1], reverse=True):
            spans[i][1] = spans[i + 1][1]
            del spans[i + 1]
    return [(lo, hi) for lo, hi in spans]


# The users named in the read's filter, per span and in all: a span with more touched users than
# this reads all of its events (the filter would be too long to plan quickly), and past the total
# the spans with the most users lose their lists first.
MAX_USERS_PER_SPAN = 100
MAX_USERS_IN_FILTER = 400


def span_members(
    ranges: Iterable[tuple[int, int, Iterable[str] | None]],
    spans: list[tuple[int, int]],
    per_span: int = MAX_USERS_PER_SPAN,
    in_all: int = MAX_USERS_IN_FILTER,
) -> list[frozenset[str] | None]:
    """For each span, the keys (users) of the ranges inside it, so the read can also ask for
    those users' rows only and Delta can skip the files (clustered by user) that hold none of
    them. None: no list for that span (more than `per_span` keys, a range whose keys are not
    known, or past the `in_all` budget), so the span reads every user's events.

    Only narrows what a span reads to rows the exact per-range join keeps anyway: a range lies
    inside exactly one span (the spans are disjoint and cover every range)."""
    members: list[set[str] | None] = [set() for _ in spans]
    for lo, hi, keys in ranges:
        at = next((i for i, (a, b) in enumerate(spans) if a <= lo and hi <= b), None)
        if at is None:
            raise ValueError(f"range [{lo}, {hi}] is inside no span")
        found = members[at]
        if found is None:
            continue
        if keys is None:
            members[at] = None
            continue
        found.update(keys)
        if len(found) > per_span:
            members[at] = None
    budget = in_all
    kept: list[frozenset[str] | None] = [None] * len(spans)
    sized = sorted((len(m), i) for i, m in enumerate(members) if m is not None)
    for size, i in sized:  # the smallest lists first: they skip the most per user named
        if size > budget:
            break
        budget -= size
        kept[i] = frozenset(members[i] or ())
    return kept


# A range longer than this (a long chain's read, cut at the margins: days) with few users is a
# term of its own: merged into the crowded span of today's events, it would make that span read
# every user's events over its days.
LONG_RANGE = 24 * MICROS_PER_HOUR


def read_terms(
    ranges: Iterable[tuple[int, int, Iterable[str] | None]],
    max_spans: int = MAX_SPANS,
    per_span: int = MAX_USERS_PER_SPAN,
    in_all: int = MAX_USERS_IN_FILTER,
    long_range: int = LONG_RANGE,
) -> list[tuple[int, int, frozenset[str] | None]]:
    """The read's filter as terms `(lo, hi, users)`: the events in `[lo, hi]` of those users
    (None: of every user), at most `max_spans` terms of each kind.

    Overlapping ranges first merge into spans, except that a range longer than `long_range`
    whose users are known and few stays apart. A span of few users (`span_members`) stays a
    term of its own, and only spans of many users merge with each other to stay under the limit
    (`covering_spans`). So the hours of a few users' late events on an old day, or one user's
    long chain, never widen into a read of those days' every event; few-user terms merge with
    each other (their lists united) only past the limit, and past `in_all` users named in all,
    the largest lists read every user. Every range lies inside a term that reads all users or
    names its users."""
    listed = [
        (min(lo, hi), max(lo, hi), None if keys is None else frozenset(keys))
        for lo, hi, keys in ranges
    ]
    if not listed:
        return []

    def alone(r: tuple[int, int, frozenset[str] | None]) -> bool:
        return r[1] - r[0] > long_range and r[2] is not None and len(r[2]) <= per_span

    long = [r for r in listed if alone(r)]
    short = [r for r in listed if not alone(r)]
    exact = covering_spans(((lo, hi) for lo, hi, _ in short), max_spans=len(short) or 1)
    members = span_members(short, exact, per_span=per_span, in_all=len(listed) * per_span + 1)
    many = [span for span, named in zip(exact, members, strict=True) if named is None]
    few: list[tuple[int, int, frozenset[str]]] = [
        (lo, hi, named) for (lo, hi), named in zip(exact, members, strict=True) if named is not None
    ] + [(lo, hi, keys) for lo, hi, keys in long if keys is not None]
    # within the budget of users named, the smallest lists first; the rest read every user
    budget, kept = in_all, []
    for lo, hi, named in sorted(few, key=lambda t: (len(t[2]), t[0], t[1])):
        if len(named) <= budget:
            budget -= len(named)
            kept.append([lo, hi, named])
        else:
            many.append((lo, hi))
    terms: list[tuple[int, int, frozenset[str] | None]] = [
        (lo, hi, None) for lo, hi in (covering_spans(many, max_spans) if many else [])
    ]
    kept.sort(key=lambda t: (t[0], t[1]))
    while len(kept) > max_spans:
        i = min(range(len(kept) - 1), key=lambda k: kept[k + 1][0] - kept[k][1])
        kept[i] = [kept[i][0], max(kept[i][1], kept[i + 1][1]), kept[i][2] | kept[i + 1][2]]
        del kept[i + 1]
    return terms + [(lo, hi, frozenset(named)) for lo, hi, named in kept]
