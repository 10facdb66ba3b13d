"""`limits.json_depth` counts a parsed document's levels a level at a time: held here to a
recursive count written for this test, on shapes that tell levels from containers (empty
ones, scalars beside containers, a deep branch among shallow ones), and to its stop past
MAX_JSON_DEPTH."""

from __future__ import annotations

import random
from typing import Any

import pytest

from app.core import limits


def recursive_depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max((recursive_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((recursive_depth(v) for v in value), default=0)
    return 0


def random_document(rng: random.Random, depth: int) -> Any:
    kind = rng.random()
    if depth == 0 or kind < 0.3:
        return rng.choice([1, 2.5, "x", None, True])
    children = [random_document(rng, depth - 1) for _ in range(rng.randrange(0, 4))]
    if kind < 0.65:
        return children
    return {f"k{i}": child for i, child in enumerate(children)}


@pytest.mark.parametrize(
    "document",
    [5, "text", None, [], {}, [[]], {"a": {}}, [1, [2, [3]]], {"a": [1, {"b": []}], "c": 3}],
)
def test_the_depth_of_small_documents(document):
    assert limits.json_depth(document) == recursive_depth(document)


def test_the_depth_of_random_documents_is_the_recursive_count():
    rng = random.Random(0)
    for _ in range(300):
        document = random_document(rng, rng.randrange(0, 12))
        assert limits.json_depth(document) == recursive_depth(document), document


def test_a_deep_branch_among_wide_shallow_ones_is_found():
    deep: Any = "leaf"
    for _ in range(7):
        deep = {"next": deep}
    document = {"vocab": {f"t{i}": i for i in range(10_000)}, "merges": [["a", "b"]] * 10_000}
    document["model"] = [deep]
    assert limits.json_depth(document) == 1 + 1 + 7


def test_counting_stops_past_the_limit():
    deep: Any = []
    for _ in range(10 * limits.MAX_JSON_DEPTH):
        deep = [deep]
    assert limits.json_depth(deep) == limits.MAX_JSON_DEPTH + 1
