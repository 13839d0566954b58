"""The coordinators' timers on the event loop: one queue for every job's periodic triggers and
cancellers, a task that fires what is due, and a wake-up when a nearer timer is scheduled (the
task otherwise sleeps until the next due time, a second at most)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from sparkpoint.common.clock import Clock, TimerQueue
from sparkpoint.coordinator.core.commands import Timer

WAIT_AT_MOST_S = 1.0
"""The task looks at the queue at least this often, whatever is scheduled."""


class Timers:
    def __init__(self) -> None:
        self.queue = TimerQueue()
        self._wakeup = asyncio.Event()

    def schedule(self, timer: Timer, due_ms: int) -> None:
        """Schedules ``timer`` (again: its new due time replaces the old). `wake` the task
        once after scheduling, so it does not sleep past the new time."""
        self.queue.schedule(timer, due_ms)

    def cancel(self, timer: Timer) -> None:
        self.queue.cancel(timer)

    def wake(self) -> None:
        self._wakeup.set()

    async def run(self, clock: Clock, fire: Callable[[Timer, int], None]) -> None:
        """Fires every due timer, in order, with the time it fires at, until cancelled."""
        while True:
            now = clock.now_ms()
            while (popped := self.queue.pop_due(now)) is not None:
                timer: Timer = popped[1]  # type: ignore[assignment]
                fire(timer, now)
            due = self.queue.next_due_ms()
            delay = WAIT_AT_MOST_S if due is None else max(0.0, (due - clock.now_ms()) / 1000)
            self._wakeup.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wakeup.wait(), timeout=min(delay, WAIT_AT_MOST_S))
