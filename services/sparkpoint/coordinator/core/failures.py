"""Which checkpoint failures count toward `tolerable-failed-checkpoints`, and when they are too
many (Flink's CheckpointFailureManager).

The policy table is `COUNTED` below: one place, every reason of the enum. An unknown reason is an
error, never a silent default.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sparkpoint.common.events import CheckpointFailureReason as Reason

COUNTED: dict[Reason, bool] = {
    # Counted: the checkpoint could not be taken for a reason that may repeat.
    Reason.IO_EXCEPTION: True,
    Reason.CHECKPOINT_ASYNC_EXCEPTION: True,
    Reason.CHECKPOINT_DECLINED: True,
    Reason.CHECKPOINT_EXPIRED: True,
    Reason.FINALIZE_CHECKPOINT_FAILURE: True,
    # Ignored: admission decisions, shutdown, or failures handled by a task failover anyway.
    Reason.PERIODIC_SCHEDULER_SHUTDOWN: False,
    Reason.TOO_MANY_CHECKPOINT_REQUESTS: False,
    Reason.MINIMUM_TIME_BETWEEN_CHECKPOINTS: False,
    Reason.NOT_ALL_REQUIRED_TASKS_RUNNING: False,
    Reason.CHECKPOINT_SUBSUMED: False,
    Reason.CHECKPOINT_COORDINATOR_SUSPEND: False,
    Reason.CHECKPOINT_COORDINATOR_SHUTDOWN: False,
    Reason.CHANNEL_STATE_SHARED_STREAM_EXCEPTION: False,
    Reason.JOB_FAILOVER_REGION: False,
    Reason.CHECKPOINT_DECLINED_TASK_NOT_READY: False,
    Reason.CHECKPOINT_DECLINED_TASK_CLOSING: False,
    Reason.CHECKPOINT_DECLINED_ON_CANCELLATION_BARRIER: False,
    Reason.CHECKPOINT_DECLINED_SUBSUMED: False,
    Reason.CHECKPOINT_DECLINED_INPUT_END_OF_STREAM: False,
    Reason.TASK_FAILURE: False,
    Reason.TASK_CHECKPOINT_FAILURE: False,
    Reason.UNKNOWN_TASK_CHECKPOINT_NOTIFICATION_FAILURE: False,
    Reason.TRIGGER_CHECKPOINT_FAILURE: False,
    Reason.BLOCKING_OUTPUT_EXIST: False,
}


class UnknownFailureReason(ValueError):
    pass


def is_counted(reason: Reason) -> bool:
    try:
        return COUNTED[reason]
    except KeyError:
        raise UnknownFailureReason(f"unknown checkpoint failure reason: {reason!r}") from None


@dataclass(frozen=True, slots=True)
class FailoverDecision:
    """Too many consecutive counted failures: the job must fail over."""

    reason: Reason
    checkpoint_id: int
    consecutive_failures: int
    tolerable: int

    @property
    def message(self) -> str:
        return (
            f"{self.consecutive_failures} consecutive checkpoint failures exceed the "
            f"{self.tolerable} tolerable (last: checkpoint {self.checkpoint_id}, {self.reason.name})"
        )


@dataclass
class FailureManager:
    """Counts consecutive counted failures of checkpoints newer than the last success; each
    checkpoint id at most once. Savepoint failures never count."""

    tolerable: int
    last_succeeded_id: int = 0
    _counted_ids: set[int] = field(default_factory=set)
    _last_counted: tuple[int, Reason] | None = None

    @property
    def consecutive_failures(self) -> int:
        return len(self._counted_ids)

    def on_failure(
        self, checkpoint_id: int, reason: Reason, is_savepoint: bool
    ) -> FailoverDecision | None:
        if not is_counted(reason) or is_savepoint:
            return None
        if checkpoint_id <= self.last_succeeded_id or checkpoint_id in self._counted_ids:
            return None
        self._counted_ids.add(checkpoint_id)
        self._last_counted = (checkpoint_id, reason)
        return self._check()

    def on_success(self, checkpoint_id: int) -> None:
        self.last_succeeded_id = max(self.last_succeeded_id, checkpoint_id)
        self._counted_ids.clear()

    def set_tolerable(self, tolerable: int) -> FailoverDecision | None:
        """A runtime change of the threshold: if the failures already counted exceed the new
        one, the job fails over now, as it would have had the value been set from the start."""
        self.tolerable = tolerable
        return self._check()

    def _check(self) -> FailoverDecision | None:
        count = len(self._counted_ids)
        if count <= self.tolerable or self._last_counted is None:
            return None
        checkpoint_id, reason = self._last_counted
        self._counted_ids.clear()
        return FailoverDecision(reason, checkpoint_id, count, self.tolerable)
