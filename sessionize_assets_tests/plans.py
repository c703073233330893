"""Reading what Spark really executed (local sessions only: the JVM's query execution)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pyspark.sql import DataFrame


def executed_nodes(df: DataFrame) -> Iterator[Any]:
    """Every node of `df`'s executed plan, through adaptive stages (run `df` first)."""

    def walk(node: Any) -> Iterator[Any]:
        yield node
        name = node.getClass().getSimpleName()
        if name.endswith("QueryStageExec"):
            yield from walk(node.plan())
        if name == "AdaptiveSparkPlanExec":
            yield from walk(node.finalPhysicalPlan())
        children = node.children()
        for i in range(children.size()):
            yield from walk(children.apply(i))

    yield from walk(df._jdf.queryExecution().executedPlan())


def metric(node: Any, name: str) -> int:
    """A node's SQL metric value."""
    return int(node.metrics().apply(name).value())
