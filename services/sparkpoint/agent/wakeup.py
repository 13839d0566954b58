"""What the job's loop sleeps on between turns, as a Flink task's mailbox thread sleeps until a
mail arrives: a control event read (`control.reader`), or a future of the loop's thread pools
that ended (a round's stages, a snapshot copy, a split of restored channel state). A turn then
runs at once; with nothing of that, the loop turns again after a timeout (`loop.wait_s`), for
what has a deadline instead of a future (a paced round, an alignment timeout, a cancel).

Before, the loop turned every 5 ms while a round ran, to notice a finished stage or a trigger
soon: on the peers workload about 110 turns a second and 0.15 ms of the driver's CPU each,
most of the driver's Python time during a run (bench/peers.py, docs/jobs.md)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


class Wakeup:
    """Set from any thread; the loop waits on it."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def set(self, *_: object) -> None:
        """Wakes the loop (a future's done-callback passes the future: ignored)."""
        self._event.set()

    def wait(self, timeout_s: float) -> bool:
        """Sleeps until set or ``timeout_s`` passed; true when set. It is cleared before the
        turn that follows looks at anything, so what sets it during that turn wakes the next
        wait at once: a wake-up is never lost."""
        woken = self._event.wait(timeout_s)
        self._event.clear()
        return woken


class WakingPool(ThreadPoolExecutor):
    """A thread pool each of whose futures wakes the loop when it ends (after its result is
    set, so the turn that wakes sees it done)."""

    def __init__(self, wakeup: Wakeup, max_workers: int, thread_name_prefix: str) -> None:
        super().__init__(max_workers, thread_name_prefix=thread_name_prefix)
        self.wakeup = wakeup

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        future = super().submit(fn, *args, **kwargs)
        future.add_done_callback(self.wakeup.set)
        return future
