"""Combining many parts into one shallow tree.

Spark Connect sends a query plan as nested protobuf messages, and protobuf decoders refuse a
message nested deeper than about a hundred levels ("Error parsing message with type
'spark.connect.Expression'"). Folding n filters or frames left to right nests them n deep; pairing
them level by level nests them log2(n) deep and means the same thing for an associative operation
(OR of conditions, union of frames).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")


def fold_balanced(items: Sequence[T], combine: Callable[[T, T], T]) -> T:
    """`combine` over `items` as a balanced binary tree, keeping their order (the left operand
    always precedes the right one): depth ceil(log2(n)) instead of n - 1."""
    if not items:
        raise ValueError("fold_balanced needs at least one item")
    level = list(items)
    while len(level) > 1:
        paired = [combine(level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)]
        level = paired + ([level[-1]] if len(level) % 2 else [])
    return level[0]
