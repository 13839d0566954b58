"""Python's cyclic garbage collector in Spark's Python workers, kept to what a task allocates.

PySpark's daemon reuses a worker for task after task and, after each one, calls ``gc.collect()``:
a full collection that traverses every object the process tracks, and a worker of the agent
tracks hundreds of thousands (pandas, pyarrow and numpy as imported, the job's module, the kept
consumers and producers). Measured with py-spy over the agent's workers on the embedded broker
(`bench/latency.py`, the running-sum job, `local[2]`): that one line took 36% of the workers'
CPU at 10,000 records/s and 68% at 1,000 records/s, a fixed cost of each of the several tasks a
second that rounds, epochs' commits and restores run.

So each task first freezes what the worker holds (`gc.freeze`: moved to a permanent generation
that collections skip; everything there is alive, as the daemon's collection after the previous
task has just run): the collection after the task then traverses only what the task allocated and
still holds, and the collector's own runs during the task skip the frozen objects too. Objects
frozen stay freed by reference counting as ever; only a reference cycle among them that becomes
garbage waits, until every `UNFREEZE_EVERY` tasks the worker's objects are unfrozen and the
collection after that task is a full one again.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")

UNFREEZE_EVERY = 100
"""Tasks of a worker between full collections (about half a minute of rounds)."""

_tasks = 0


def before_task() -> None:
    """Freezes the worker's objects before a task; every `UNFREEZE_EVERY` tasks, unfreezes them
    so that the daemon's collection after the task is a full one."""
    global _tasks
    _tasks += 1
    if _tasks % UNFREEZE_EVERY == 0:
        gc.unfreeze()
    else:
        gc.freeze()


def in_task(work: Callable[[T], R], task: T) -> R:
    """``work(task)`` as a Spark task's body, the collector first kept to what it allocates."""
    before_task()
    return work(task)
