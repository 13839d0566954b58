"""A checkpoint that has been triggered and has not ended yet (Flink's PendingCheckpoint)."""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator

from sparkpoint.common.events import AcknowledgeCheckpoint, StateHandle
from sparkpoint.coordinator.core.decider import CheckpointRequest


class AckResult(enum.Enum):
    """What an acknowledgement did (Flink's TaskAcknowledgeResult)."""

    SUCCESS = "SUCCESS"
    DUPLICATE = "DUPLICATE"
    UNKNOWN = "UNKNOWN"
    DISCARDED = "DISCARDED"
    REFUSED = "REFUSED"
    """Not from the agent that drives the job, or its values or files are implausible: ignored,
    and nothing it names is deleted."""


class PendingCheckpoint:
    """Tracks which subtasks still have to acknowledge, and the canceller's deadline.

    Once disposed (completed or aborted) it accepts nothing: later acknowledgements are
    DISCARDED and their state is the caller's to discard."""

    __slots__ = (
        "acknowledgements",
        "checkpoint_id",
        "deadline_ms",
        "disposed",
        "not_yet_acknowledged",
        "request",
        "target_location",
        "trigger_ms",
        "unaligned",
    )

    def __init__(
        self,
        checkpoint_id: int,
        request: CheckpointRequest,
        trigger_ms: int,
        subtasks: Iterable[str],
        target_location: str,
        timeout_ms: int,
        unaligned: bool = False,
    ) -> None:
        self.checkpoint_id = checkpoint_id
        self.request = request
        self.trigger_ms = trigger_ms
        self.target_location = target_location
        self.unaligned = unaligned
        self.not_yet_acknowledged: set[str] = set(subtasks)
        if not self.not_yet_acknowledged:
            raise ValueError(f"checkpoint {checkpoint_id} has no subtask to acknowledge it")
        self.acknowledgements: dict[str, AcknowledgeCheckpoint] = {}
        self.deadline_ms = trigger_ms + timeout_ms
        self.disposed = False

    @property
    def is_savepoint(self) -> bool:
        return self.request.is_savepoint

    @property
    def fully_acknowledged(self) -> bool:
        return not self.not_yet_acknowledged

    @property
    def num_subtasks(self) -> int:
        return len(self.not_yet_acknowledged) + len(self.acknowledgements)

    def acknowledge(self, ack: AcknowledgeCheckpoint) -> AckResult:
        if self.disposed:
            return AckResult.DISCARDED
        subtask = ack.subtask_id
        if subtask in self.not_yet_acknowledged:
            self.not_yet_acknowledged.remove(subtask)
            self.acknowledgements[subtask] = ack
            return AckResult.SUCCESS
        if subtask in self.acknowledgements:
            return AckResult.DUPLICATE
        return AckResult.UNKNOWN

    def set_timeout(self, timeout_ms: int) -> int:
        """FLIP-571: a new timeout applies to this checkpoint too. Returns the new deadline."""
        self.deadline_ms = self.trigger_ms + timeout_ms
        return self.deadline_ms

    def state_handles(self) -> Iterator[StateHandle]:
        for ack in self.acknowledgements.values():
            yield from ack.state_handles

    def dispose(self) -> None:
        self.disposed = True
