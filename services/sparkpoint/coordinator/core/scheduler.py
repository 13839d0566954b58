"""The periodic trigger of one job: when the next periodic checkpoint (or savepoint) is due.

- The first trigger comes after a random delay uniform in [min pause, interval] (Flink spreads
  the jobs of a cluster this way), or at a stored next-trigger time after failover.
- After each firing the next is one interval later.
- A periodic request dropped for the min pause is retried when the pause ends.
- A changed interval moves the next trigger to one new interval after the last firing: earlier
  for a shorter interval (at once if that time has passed), later for a longer one.
"""

from __future__ import annotations

import random

from sparkpoint.coordinator.core.commands import CancelTimer, ScheduleTimer, Timer


class PeriodicTrigger:
    def __init__(self, timer: Timer) -> None:
        self.timer = timer
        self.interval_ms: int | None = None
        self.last_fired_ms: int | None = None
        self.due_ms: int | None = None
        self.waiting_for_pause = False

    @property
    def armed(self) -> bool:
        return self.due_ms is not None

    def start(
        self,
        interval_ms: int,
        now_ms: int,
        rng: random.Random,
        min_pause_ms: int,
        next_due_ms: int | None = None,
    ) -> ScheduleTimer:
        self.interval_ms = interval_ms
        if next_due_ms is None:
            next_due_ms = now_ms + rng.randint(min(min_pause_ms, interval_ms), interval_ms)
        self.due_ms = max(next_due_ms, now_ms)
        self.last_fired_ms = self.due_ms - interval_ms
        self.waiting_for_pause = False
        return ScheduleTimer(self.timer, self.due_ms)

    def fired(self, now_ms: int) -> ScheduleTimer:
        """The timer fired: the next one is an interval later."""
        assert self.interval_ms is not None, "a stopped trigger does not fire"
        self.last_fired_ms = now_ms
        self.waiting_for_pause = False
        self.due_ms = now_ms + self.interval_ms
        return ScheduleTimer(self.timer, self.due_ms)

    def retry_after_pause(self, now_ms: int, delay_ms: int) -> ScheduleTimer:
        self.waiting_for_pause = True
        self.due_ms = now_ms + delay_ms
        return ScheduleTimer(self.timer, self.due_ms)

    def set_interval(self, interval_ms: int, now_ms: int) -> ScheduleTimer | None:
        """Returns the timer at its new due time; the caller fires it at once when the due time
        is not in the future. While waiting for the min pause the retry time stands."""
        self.interval_ms = interval_ms
        if self.waiting_for_pause or self.last_fired_ms is None:
            return None
        self.due_ms = max(self.last_fired_ms + interval_ms, now_ms)
        return ScheduleTimer(self.timer, self.due_ms)

    def stop(self) -> CancelTimer | None:
        if self.due_ms is None:
            return None
        self.due_ms = None
        self.interval_ms = None
        self.last_fired_ms = None
        self.waiting_for_pause = False
        return CancelTimer(self.timer)
