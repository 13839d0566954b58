"""The collector in Spark's Python workers (`sparkpoint.agent.spark.worker_gc`): each task freezes
what the worker holds, so that PySpark's full collection after the task traverses only what the
task allocated; every `UNFREEZE_EVERY` tasks the collection after the task is a full one."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from sparkpoint.agent.spark import worker_gc


@pytest.fixture(autouse=True)
def thawed(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(worker_gc, "_tasks", 0)
    gc.unfreeze()
    yield
    gc.unfreeze()  # this test process's objects back to the collector


def test_a_task_runs_with_what_the_worker_held_frozen_and_returns_its_result() -> None:
    held = [object() for _ in range(10)]
    assert gc.get_freeze_count() == 0
    seen: list[int] = []

    def work(task: int) -> int:
        seen.append(gc.get_freeze_count())
        return task * 2

    assert worker_gc.in_task(work, 21) == 42
    assert seen[0] >= len(held)  # the objects alive before the task were frozen for it


def test_only_what_a_task_allocates_is_left_to_the_collection_after_it() -> None:
    held = [[i] for i in range(100)]  # the worker's objects before the task
    worker_gc.before_task()
    made = [[i] for i in range(100)]  # the task's own
    traversed = {id(o) for o in gc.get_objects()}  # what a collection looks at (not the frozen)
    assert not any(id(h) in traversed for h in held)
    assert all(id(m) in traversed for m in made)


def test_every_so_many_tasks_the_collection_after_one_is_full_again() -> None:
    for _ in range(worker_gc.UNFREEZE_EVERY - 1):
        worker_gc.before_task()
        assert gc.get_freeze_count() > 0
    worker_gc.before_task()
    assert gc.get_freeze_count() == 0  # this task's collection traverses everything
    worker_gc.before_task()
    assert gc.get_freeze_count() > 0


def test_a_cycle_that_became_garbage_while_frozen_is_collected_after_the_next_unfreeze() -> None:
    class Node:
        other: object = None

    a, b = Node(), Node()
    a.other, b.other = b, a
    ref = weakref.ref(a)
    worker_gc.before_task()  # the cycle is frozen with the rest
    del a, b
    gc.collect()
    assert ref() is not None  # frozen: the collector does not look at it
    while worker_gc._tasks % worker_gc.UNFREEZE_EVERY != worker_gc.UNFREEZE_EVERY - 1:
        worker_gc.before_task()
    worker_gc.before_task()  # unfreezes
    gc.collect()
    assert ref() is None
