"""Load-day fingerprints carried across a compaction (plain Python, no Spark)."""

from __future__ import annotations

import datetime as dt

from sessionize_assets.ingest.load_days import carried_fingerprints

D1, D2, D3 = (dt.date(2024, 3, d) for d in (1, 2, 3))


def test_a_compaction_carries_the_days_consumed_as_they_were_just_before_it():
    consumed = {D1: "a1", D2: "b1", D3: "c1"}
    # D1 compacted as consumed; D2 changed by a writer before the compaction (pending: not
    # carried); D3 untouched by it.
    compaction = ({D1: "a1", D2: "b2", D3: "c1"}, {D1: "a9", D2: "b9", D3: "c1"})
    assert carried_fingerprints(consumed, [compaction]) == {D1: "a9"}


def test_compactions_carry_in_order_and_a_day_emptied_is_not_carried():
    consumed = {D1: "a1", D2: "b1"}
    first = ({D1: "a1", D2: "b1"}, {D1: "a2", D2: "b2"})
    second = ({D1: "a2", D2: "b2"}, {D1: "a3"})  # D2's files all gone: not a compaction of it
    assert carried_fingerprints(consumed, [first, second]) == {D1: "a3", D2: "b2"}
    # Out of order, the second finds nothing it applies to.
    assert carried_fingerprints(consumed, [second, first]) == {D1: "a2", D2: "b2"}
    assert carried_fingerprints(consumed, []) == {}
