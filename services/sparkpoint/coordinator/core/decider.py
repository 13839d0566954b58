"""Admission control for checkpoint requests (Flink's CheckpointRequestDecider).

Every request is queued, then the decider picks at most one to run now. Queue order: savepoints
first, then forced requests, then manual before periodic, then older before newer. Rules, checked
in this order for the request at the head of the queue:

1. ``pending >= max_concurrent``: a forced request (savepoints are forced) runs anyway; a
   periodic one is dropped (TOO_MANY_CHECKPOINT_REQUESTS; the scheduler fires again next
   interval); a manual one waits for a pending checkpoint to end.
2. A periodic, non-forced request within ``min_pause`` of the end of the last checkpoint is
   dropped (MINIMUM_TIME_BETWEEN_CHECKPOINTS) and the periodic trigger is rescheduled to the
   end of the pause; that is not a failure.
3. Otherwise it runs.

The queue holds at most ``max_queued`` requests: when it is full of manual requests a new one is
dropped, otherwise the lowest-priority (periodic) request is evicted. Pure: the clock and the
counts come in as arguments.
"""

from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass, field

from sparkpoint.common.events import CheckpointFailureReason, SavepointFormat, SnapshotType

DEFAULT_MAX_QUEUED = 1000
"""Flink's default: enough for any burst of user requests, small enough to sort cheaply."""


@dataclass(eq=False)
class CheckpointRequest:
    """A request to take a snapshot. Identity is the object: two equal requests are two requests."""

    snapshot_type: SnapshotType
    periodic: bool
    timestamp_ms: int
    request_id: str | None = None
    forced: bool = False
    target_directory: str | None = None
    format_type: SavepointFormat = SavepointFormat.CANONICAL
    sequence: int = field(default=0, compare=False)

    @property
    def is_savepoint(self) -> bool:
        return self.snapshot_type.is_savepoint

    @property
    def is_forced(self) -> bool:
        """Savepoints are always forced: they ignore max concurrent and min pause."""
        return self.forced or self.is_savepoint

    def priority(self) -> tuple[bool, bool, bool, int, int]:
        return (
            not self.is_savepoint,
            not self.is_forced,
            self.periodic,
            self.timestamp_ms,
            self.sequence,
        )


@dataclass
class Decision:
    """What to do now: run ``execute`` (if any), fail ``dropped``, and if
    ``reschedule_periodic_in_ms`` is set, move the periodic trigger that far into the future."""

    execute: CheckpointRequest | None = None
    dropped: list[tuple[CheckpointRequest, CheckpointFailureReason]] = field(default_factory=list)
    reschedule_periodic_in_ms: int | None = None


class RequestDecider:
    def __init__(
        self, max_concurrent: int, min_pause_ms: int, max_queued: int = DEFAULT_MAX_QUEUED
    ):
        if max_concurrent < 1 or max_queued < 1:
            raise ValueError("max_concurrent and max_queued must be >= 1")
        self.max_concurrent = max_concurrent
        self.min_pause_ms = min_pause_ms
        self.max_queued = max_queued
        self._queue: list[CheckpointRequest] = []
        self._sequence = itertools.count()

    @property
    def queued(self) -> int:
        return len(self._queue)

    def submit(
        self, request: CheckpointRequest, pending: int, last_completion_ms: int | None, now_ms: int
    ) -> Decision:
        """Queues ``request`` and decides what (if anything) runs now."""
        request.sequence = next(self._sequence)
        decision = Decision()
        if len(self._queue) >= self.max_queued and not self._queue[-1].periodic:
            decision.dropped.append((request, CheckpointFailureReason.TOO_MANY_CHECKPOINT_REQUESTS))
            return decision
        bisect.insort(self._queue, request, key=CheckpointRequest.priority)
        if len(self._queue) > self.max_queued:
            evicted = self._queue.pop()
            decision.dropped.append((evicted, CheckpointFailureReason.TOO_MANY_CHECKPOINT_REQUESTS))
        self._choose(decision, pending, last_completion_ms, now_ms)
        return decision

    def choose_queued(self, pending: int, last_completion_ms: int | None, now_ms: int) -> Decision:
        """After a checkpoint ended or a setting changed: may a queued request run now?"""
        decision = Decision()
        self._choose(decision, pending, last_completion_ms, now_ms)
        return decision

    def abort_all(self) -> list[CheckpointRequest]:
        queued, self._queue = self._queue, []
        return queued

    def _choose(
        self, decision: Decision, pending: int, last_completion_ms: int | None, now_ms: int
    ) -> None:
        queue = self._queue
        if pending >= self.max_concurrent:
            while queue and queue[0].periodic and not queue[0].is_forced:
                decision.dropped.append(
                    (queue.pop(0), CheckpointFailureReason.TOO_MANY_CHECKPOINT_REQUESTS)
                )
            if queue and queue[0].is_forced:
                decision.execute = queue.pop(0)
            return
        if not queue:
            return
        first = queue[0]
        if first.periodic and not first.is_forced and last_completion_ms is not None:
            wait = last_completion_ms + self.min_pause_ms - now_ms
            if wait > 0:
                decision.dropped.append(
                    (queue.pop(0), CheckpointFailureReason.MINIMUM_TIME_BETWEEN_CHECKPOINTS)
                )
                decision.reschedule_periodic_in_ms = wait
                return
        decision.execute = queue.pop(0)
