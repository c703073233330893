"""Folding many parts into a shallow tree (core/trees.py)."""

from __future__ import annotations

import pytest

from sessionize_assets.core.trees import fold_balanced


def _depth(node: object) -> int:
    return 1 + max(_depth(n) for n in node) if isinstance(node, tuple) else 0


@pytest.mark.parametrize("n", [1, 2, 3, 7, 8, 9, 200])
def test_fold_balanced_keeps_the_order_and_nests_log2_n_deep(n: int) -> None:
    items = [f"<{i}>" for i in range(n)]
    assert fold_balanced(items, lambda a, b: a + b) == "".join(items)
    tree = fold_balanced(items, lambda a, b: (a, b))
    assert _depth(tree) == (n - 1).bit_length()  # ceil(log2(n)); a left fold nests n - 1 deep


def test_fold_balanced_of_nothing_is_an_error() -> None:
    with pytest.raises(ValueError, match="at least one"):
        fold_balanced([], lambda a, b: a)
