"""A long-running process keeps what it loaded at its start out of the garbage collector's way."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from ductor_project.core.heap import freeze_startup_heap


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


def cycle() -> weakref.ref[Node]:
    """A reference cycle nothing else holds: only the cyclic collector can free it."""
    first, second = Node(), Node()
    first.other, second.other = second, first
    return weakref.ref(first)


@pytest.fixture
def unfrozen() -> Iterator[None]:
    gc.unfreeze()
    try:
        yield
    finally:
        gc.unfreeze()  # the test process's objects are collected as before


@pytest.mark.usefixtures("unfrozen")
def test_what_lives_at_the_freeze_is_left_out_of_collections_and_what_comes_after_is_not() -> None:
    kept = [Node() for _ in range(1000)]
    garbage_before = cycle()
    freeze_startup_heap()
    assert garbage_before() is None  # what was garbage already went first
    assert gc.get_freeze_count() >= len(kept)
    garbage_after = cycle()
    gc.collect()
    assert garbage_after() is None  # a cycle made after the freeze is still collected
    assert kept[0].other is None
