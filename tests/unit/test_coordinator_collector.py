"""The coordinator process's tuning of Python's cyclic garbage collector."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from sparkpoint.coordinator.main import GC_THRESHOLDS, tune_collector


@pytest.fixture
def collector() -> Iterator[None]:
    thresholds = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


def test_what_was_loaded_leaves_the_collectors_sight_and_it_collects_in_larger_batches(
    collector: None,
) -> None:
    loaded = len(gc.get_objects())
    tune_collector()
    assert gc.get_threshold() == GC_THRESHOLDS
    assert gc.get_threshold()[0] > 700  # Python's default youngest-generation threshold
    assert gc.get_freeze_count() >= loaded // 2
    assert len(gc.get_objects()) < loaded // 2


def test_the_collector_still_runs_by_itself(collector: None) -> None:
    tune_collector()
    runs: list[str] = []

    def heard(phase: str, info: dict[str, int]) -> None:
        runs.append(phase)

    class Node:
        partner: object = None

    gc.callbacks.append(heard)
    try:
        for _ in range(GC_THRESHOLDS[0]):  # two containers each: past the threshold
            first, second = Node(), Node()
            first.partner, second.partner = second, first
    finally:
        gc.callbacks.remove(heard)
    assert "start" in runs
