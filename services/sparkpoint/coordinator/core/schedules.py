"""A job's two periodic triggers, the checkpoints' and the periodic savepoints' (FLIP-10): started
and stopped with the job's coordinator, and moved when a configuration change (FLIP-571) or the
sources' backlog (FLIP-309) changes the interval in force. Each `PeriodicTrigger` knows when it
is due; this says which of them to start, stop or move, and when a moved checkpoint trigger is
already due (the coordinator then fires it at once)."""

from __future__ import annotations

import random

from sparkpoint.coordinator.core.commands import Command, Timer, TimerKind
from sparkpoint.coordinator.core.scheduler import PeriodicTrigger


class PeriodicSchedules:
    def __init__(self, job_id: str, rng: random.Random) -> None:
        self.checkpoints = PeriodicTrigger(Timer(job_id, TimerKind.PERIODIC_CHECKPOINT))
        self.savepoints = PeriodicTrigger(Timer(job_id, TimerKind.PERIODIC_SAVEPOINT))
        self.rng = rng
        """The coordinator's own: the first trigger's spread draws from it."""

    def start(
        self,
        interval_ms: int | None,
        min_pause_ms: int,
        savepoint_interval_ms: int | None,
        now_ms: int,
        next_trigger_ms: int | None,
    ) -> list[Command]:
        """``next_trigger_ms`` re-arms a stored schedule of the checkpoint trigger."""
        commands: list[Command] = []
        if interval_ms is not None:
            commands.append(
                self.checkpoints.start(interval_ms, now_ms, self.rng, min_pause_ms, next_trigger_ms)
            )
        every = savepoint_interval_ms
        if every is not None:
            commands.append(self.savepoints.start(every, now_ms, self.rng, every, now_ms + every))
        return commands

    def stop(self) -> list[Command]:
        return [
            stop for stop in (self.checkpoints.stop(), self.savepoints.stop()) if stop is not None
        ]

    def move_checkpoints(
        self, before: int | None, after: int | None, now_ms: int, min_pause_ms: int
    ) -> tuple[list[Command], bool]:
        """The checkpoint interval in force changes from ``before`` to ``after`` (None: no
        periodic checkpoints): the commands, and whether the moved trigger is due now."""
        if after is None:
            stop = self.checkpoints.stop()
            return ([] if stop is None else [stop]), False
        if before is None or not self.checkpoints.armed:
            return [self.checkpoints.start(after, now_ms, self.rng, min_pause_ms)], False
        moved = self.checkpoints.set_interval(after, now_ms)
        if moved is None:
            return [], False
        return [moved], moved.due_ms <= now_ms

    def move_pause(
        self, last_completion_ms: int | None, min_pause_ms: int, now_ms: int
    ) -> tuple[list[Command], bool]:
        """The min pause changed (the interval did not): a trigger waiting for the pause to end
        waits for the new one. The commands, and whether it is due now."""
        if not self.checkpoints.waiting_for_pause:
            return [], False
        assert last_completion_ms is not None
        delay = max(0, last_completion_ms + min_pause_ms - now_ms)
        return [self.checkpoints.retry_after_pause(now_ms, delay)], delay == 0

    def move_savepoints(self, before: int | None, after: int | None, now_ms: int) -> list[Command]:
        """The periodic savepoint interval changes from ``before`` to ``after``."""
        if before == after:
            return []
        if after is None:
            stop = self.savepoints.stop()
            return [] if stop is None else [stop]
        if not self.savepoints.armed:
            return [self.savepoints.start(after, now_ms, self.rng, after, now_ms + after)]
        moved = self.savepoints.set_interval(after, now_ms)
        return [] if moved is None else [moved]
