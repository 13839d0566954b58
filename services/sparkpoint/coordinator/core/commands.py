"""What the coordinator core asks the service to do. The core never does I/O: it returns these,
and the service publishes, schedules, writes and deletes."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from sparkpoint.common.events import (
    AcknowledgeCheckpoint,
    CheckpointFailureReason,
    Event,
    SavepointFormat,
    SnapshotType,
)
from sparkpoint.coordinator.core.store import Discard


class TimerKind(enum.Enum):
    PERIODIC_CHECKPOINT = "periodic-checkpoint"
    PERIODIC_SAVEPOINT = "periodic-savepoint"
    CANCELLER = "canceller"


@dataclass(frozen=True, slots=True)
class Timer:
    """A timer of one job; scheduling the same timer again replaces its due time."""

    job_id: str
    kind: TimerKind
    checkpoint_id: int = 0


@dataclass(frozen=True, slots=True)
class Publish:
    """Publish an event; the service picks the topic by the event's type."""

    event: Event


@dataclass(frozen=True, slots=True)
class ScheduleTimer:
    timer: Timer
    due_ms: int


@dataclass(frozen=True, slots=True)
class CancelTimer:
    timer: Timer


@dataclass(frozen=True, slots=True)
class FinalizeCheckpoint:
    """Every subtask acknowledged: write ``<external_path>/_metadata`` atomically, then call
    ``on_finalized`` (or ``on_finalize_failed``)."""

    job_id: str
    checkpoint_id: int
    snapshot_type: SnapshotType
    trigger_ms: int
    external_path: str
    acknowledgements: tuple[AcknowledgeCheckpoint, ...]
    format_type: SavepointFormat = SavepointFormat.CANONICAL


@dataclass(frozen=True, slots=True)
class DiscardState:
    """Delete files nothing references any more (and the checkpoint directory, when given)."""

    job_id: str
    discard: Discard


@dataclass(frozen=True, slots=True)
class RequestCompleted:
    """A manual checkpoint or savepoint request ended well (REST trigger status)."""

    request_id: str
    checkpoint_id: int
    external_path: str


@dataclass(frozen=True, slots=True)
class RequestFailed:
    request_id: str
    reason: CheckpointFailureReason
    message: str


Command = (
    Publish
    | ScheduleTimer
    | CancelTimer
    | FinalizeCheckpoint
    | DiscardState
    | RequestCompleted
    | RequestFailed
)
