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


def read_terms(
    ranges: Iterable[tuple[int, int, Iterable[str] | None]],
    max_spans: int = MAX_SPANS,
    per_span: int = MAX_USERS_PER_SPAN,
    in_all: int = MAX_USERS_IN_FILTER,
) -> list[tuple[int, int, frozenset[str] | None]]:
    """The read's filter as terms `(lo, hi, users)`: the events in `[lo, hi]` of those users
    (None: of every user), at most `max_spans` terms of each kind.

    Overlapping ranges first merge into spans; a span of few users (`span_members`) stays a
    term of its own, and only spans of many users merge with each other to stay under the limit
    (`covering_spans`). So the hours of a few users' late events on an old day never widen into
    a read of that day's every event; neighbouring few-user spans merge (their lists united) only
    past the limit. Every range lies inside a term that reads all users or names its users."""
    listed = [(min(lo, hi), max(lo, hi), keys) for lo, hi, keys in ranges]
    if not listed:
        return []
    exact = covering_spans(((lo, hi) for lo, hi, _ in listed), max_spans=len(listed))
    members = span_members(listed, exact, per_span=per_span, in_all=in_all)
    many = [span for span, named in zip(exact, members, strict=True) if named is None]
    terms: list[tuple[int, int, frozenset[str] | None]] = [
        (lo, hi, None) for lo, hi in (covering_spans(many, max_spans) if many else [])
    ]
    few = [
        [lo, hi, named] for (lo, hi), named in zip(exact, members, strict=True) if named is not None
    ]
    while len(few) > max_spans:
        i = min(range(len(few) - 1), key=lambda k: few[k + 1][0] - few[k][1])
        few[i] = [few[i][0], max(few[i][1], few[i + 1][1]), few[i][2] | few[i + 1][2]]
        del few[i + 1]
    return terms + [(lo, hi, frozenset(named)) for lo, hi, named in few]
