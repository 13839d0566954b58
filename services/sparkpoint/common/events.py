"""The events sparkpoint services exchange, as plain frozen dataclasses.

Domain code builds and reads these; it never sees Avro. The codec (`sparkpoint.common.avro`)
converts them to and from Avro records at the edge, by schema name: every event class names the
schema it is written with in ``SCHEMA``, and the fields here mirror ``schemas/<Name>.avsc``.

Conventions: durations are in milliseconds (``*_ms``), sizes in bytes (``*_bytes``), timestamps
are epoch milliseconds (``timestamp-millis`` in the schemas), Avro enums are Python enums whose
member names are the symbols.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import ClassVar

NAMESPACE = "sparkpoint.events"


class CheckpointFailureReason(enum.Enum):
    """Why a checkpoint failed: Flink's CheckpointFailureReason, symbol for symbol."""

    PERIODIC_SCHEDULER_SHUTDOWN = "PERIODIC_SCHEDULER_SHUTDOWN"
    TOO_MANY_CHECKPOINT_REQUESTS = "TOO_MANY_CHECKPOINT_REQUESTS"
    MINIMUM_TIME_BETWEEN_CHECKPOINTS = "MINIMUM_TIME_BETWEEN_CHECKPOINTS"
    NOT_ALL_REQUIRED_TASKS_RUNNING = "NOT_ALL_REQUIRED_TASKS_RUNNING"
    IO_EXCEPTION = "IO_EXCEPTION"
    BLOCKING_OUTPUT_EXIST = "BLOCKING_OUTPUT_EXIST"
    CHECKPOINT_ASYNC_EXCEPTION = "CHECKPOINT_ASYNC_EXCEPTION"
    CHANNEL_STATE_SHARED_STREAM_EXCEPTION = "CHANNEL_STATE_SHARED_STREAM_EXCEPTION"
    CHECKPOINT_EXPIRED = "CHECKPOINT_EXPIRED"
    CHECKPOINT_SUBSUMED = "CHECKPOINT_SUBSUMED"
    CHECKPOINT_DECLINED = "CHECKPOINT_DECLINED"
    CHECKPOINT_DECLINED_TASK_NOT_READY = "CHECKPOINT_DECLINED_TASK_NOT_READY"
    CHECKPOINT_DECLINED_TASK_CLOSING = "CHECKPOINT_DECLINED_TASK_CLOSING"
    CHECKPOINT_DECLINED_SUBSUMED = "CHECKPOINT_DECLINED_SUBSUMED"
    CHECKPOINT_DECLINED_ON_CANCELLATION_BARRIER = "CHECKPOINT_DECLINED_ON_CANCELLATION_BARRIER"
    CHECKPOINT_DECLINED_INPUT_END_OF_STREAM = "CHECKPOINT_DECLINED_INPUT_END_OF_STREAM"
    CHECKPOINT_COORDINATOR_SHUTDOWN = "CHECKPOINT_COORDINATOR_SHUTDOWN"
    CHECKPOINT_COORDINATOR_SUSPEND = "CHECKPOINT_COORDINATOR_SUSPEND"
    JOB_FAILOVER_REGION = "JOB_FAILOVER_REGION"
    TASK_FAILURE = "TASK_FAILURE"
    TASK_CHECKPOINT_FAILURE = "TASK_CHECKPOINT_FAILURE"
    UNKNOWN_TASK_CHECKPOINT_NOTIFICATION_FAILURE = "UNKNOWN_TASK_CHECKPOINT_NOTIFICATION_FAILURE"
    FINALIZE_CHECKPOINT_FAILURE = "FINALIZE_CHECKPOINT_FAILURE"
    TRIGGER_CHECKPOINT_FAILURE = "TRIGGER_CHECKPOINT_FAILURE"


class JobStatus(enum.Enum):
    """Flink's JobStatus."""

    INITIALIZING = "INITIALIZING"
    CREATED = "CREATED"
    RUNNING = "RUNNING"
    FAILING = "FAILING"
    FAILED = "FAILED"
    CANCELLING = "CANCELLING"
    CANCELED = "CANCELED"
    FINISHED = "FINISHED"
    RESTARTING = "RESTARTING"
    SUSPENDED = "SUSPENDED"
    RECONCILING = "RECONCILING"

    @property
    def is_terminal(self) -> bool:
        return self in (JobStatus.FAILED, JobStatus.CANCELED, JobStatus.FINISHED)


class SnapshotType(enum.Enum):
    """What a trigger asks for; the savepoint kinds are never subsumed."""

    CHECKPOINT = "CHECKPOINT"
    FULL_CHECKPOINT = "FULL_CHECKPOINT"
    SAVEPOINT = "SAVEPOINT"
    SAVEPOINT_SUSPEND = "SAVEPOINT_SUSPEND"
    SAVEPOINT_TERMINATE = "SAVEPOINT_TERMINATE"

    @property
    def is_savepoint(self) -> bool:
        return self._name_.startswith("SAVEPOINT")  # not .name: an enum property, slow


class SavepointFormat(enum.Enum):
    """Flink's SavepointFormatType: CANONICAL is relocatable and rescalable."""

    CANONICAL = "CANONICAL"
    NATIVE = "NATIVE"


class StateHandleKind(enum.Enum):
    KEYED_STATE = "KEYED_STATE"
    OPERATOR_STATE = "OPERATOR_STATE"
    CHANNEL_STATE = "CHANNEL_STATE"
    SOURCE_POSITIONS = "SOURCE_POSITIONS"
    SINK_EPOCH = "SINK_EPOCH"


class CheckpointEventType(enum.Enum):
    TRIGGERED = "TRIGGERED"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    EXPIRED = "EXPIRED"
    SUBSUMED = "SUBSUMED"
    DISCARDED = "DISCARDED"


# --- nested records -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Subtask:
    subtask_id: str
    index: int
    key_group_start: int
    key_group_end: int


@dataclass(frozen=True, slots=True)
class StateHandle:
    path: str
    kind: StateHandleKind
    size_bytes: int
    key_group_start: int | None = None
    key_group_end: int | None = None
    shared: bool = False
    offset: int | None = None
    """A segment of a merged file (file merging): bytes ``offset`` .. ``offset + size_bytes`` of
    ``path``; None: the whole file."""
    segment: str | None = None
    """The name of the state file the segment holds (its kind, as a whole file's name says)."""


@dataclass(frozen=True, slots=True)
class CheckpointSettings:
    """Checkpoint settings a runtime change can touch; None means 'not set'."""

    checkpoint_interval_ms: int | None = None
    checkpoint_timeout_ms: int | None = None
    min_pause_ms: int | None = None
    max_concurrent_checkpoints: int | None = None
    tolerable_failed_checkpoints: int | None = None
    aligned_checkpoint_timeout_ms: int | None = None
    unaligned: bool | None = None


@dataclass(frozen=True, slots=True)
class SavepointRecord:
    checkpoint_id: int
    external_path: str
    trigger_timestamp: int
    completed_timestamp: int
    state_size_bytes: int
    format_type: str
    kind: str
    """manual, periodic, or stop (stop-with-savepoint)."""
    disposed: bool = False


@dataclass(frozen=True, slots=True)
class RetainedCheckpoint:
    checkpoint_id: int
    snapshot_type: SnapshotType
    periodic: bool
    trigger_timestamp: int
    completed_timestamp: int
    external_path: str
    state_size_bytes: int
    referenced_files: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class PartitionProgress:
    """Where one source partition stands (in `AgentHeartbeat`)."""

    topic: str
    partition: int
    position: int
    end: int
    """The high watermark as last seen; -1 when not known yet."""
    records_in_per_second: int
    last_advanced: int
    """Epoch ms when the position last moved; 0 when it has not moved in this attempt."""

    @property
    def lag(self) -> int:
        """Records behind the end (Flink's pendingRecords); 0 when the end is not known."""
        return max(0, self.end - self.position) if self.end >= 0 else 0


# --- events ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class JobRegistered:
    SCHEMA: ClassVar[str] = f"{NAMESPACE}.JobRegistered"
    job_id: str
    job_name: str
    agent_id: str
    attempt: int
    status: JobStatus
    parallelism: int
    max_parallelism: int
    subtasks: list[Subtask]
    configuration: dict[str, str]
    timestamp: int
    restored_checkpoint_id: int | None = None
    restored_external_path: str | None = None


@dataclass(frozen=True, slots=True)
class JobStatusChanged:
    SCHEMA: ClassVar[str] = f"{NAMESPACE}.JobStatusChanged"
    job_id: str
    agent_id: str
    attempt: int
    status: JobStatus
    timestamp: int
    processing_backlog: bool | None = None
    message: str | None = None
    end_of_input: bool = False
    exception_name: str | None = None
    stacktrace: str | None = None
    restart_delay_ms: int | None = None


@dataclass(frozen=True, slots=True)
class TriggerCheckpoint:
    SCHEMA: ClassVar[str] = f"{NAMESPACE}.TriggerCheckpoint"
    job_id: str
    owner_epoch: int
    checkpoint_id: int
    trigger_timestamp: int
    snapshot_type: SnapshotType
    periodic: bool
    unaligned: bool
    target_location: str
    aligned_checkpoint_timeout_ms: int | None = None
    savepoint_format: SavepointFormat = SavepointFormat.CANONICAL
    agent_id: str | None = None
    attempt: int | None = None


@dataclass(frozen=True, slots=True)
class NotifyCheckpointComplete:
    SCHEMA: ClassVar[str] = f"{NAMESPACE}.NotifyCheckpointComplete"
    job_id: str
    owner_epoch: int
    checkpoint_id: int
    is_savepoint: bool
    external_path: str
    completed_timestamp: int
    agent_id: str | None = None
    attempt: int | None = None


@dataclass(frozen=True, slots=True)
class NotifyCheckpointAborted:
    SCHEMA: ClassVar[str] = f"{NAMESPACE}.NotifyCheckpointAborted"
    job_id: str
    owner_epoch: int
    checkpoint_id: int
    reason: CheckpointFailureReason
    timestamp: int
    message: str | None = None
    agent_id: str | None = None
    attempt: int | None = None


@dataclass(frozen=True, slots=True)
class FailoverRequest:
    SCHEMA: ClassVar[str] = f"{NAMESPACE}.FailoverRequest"
    job_id: str
    owner_epoch: int
    reason: CheckpointFailureReason
    message: str
    consecutive_failures: int
    timestamp: int
    failed_checkpoint_id: int | None = None
    restore_checkpoint_id: int | None = None
    restore_external_path: str | None = None
    agent_id: str | None = None
    attempt: int | None = None


@dataclass(frozen=True, slots=True)
class CancelJob:
    """Cancel the job: the agent ends it CANCELED, as Ctrl-C does (no savepoint)."""

    SCHEMA: ClassVar[str] = f"{NAMESPACE}.CancelJob"
    job_id: str
    owner_epoch: int
    timestamp: int
    requested_by: str | None = None
    agent_id: str | None = None
    attempt: int | None = None


@dataclass(frozen=True, slots=True)
class AcknowledgeCheckpoint:
    SCHEMA: ClassVar[str] = f"{NAMESPACE}.AcknowledgeCheckpoint"
    job_id: str
    checkpoint_id: int
    subtask_id: str
    attempt: int
    ack_timestamp: int
    state_handles: list[StateHandle]
    state_size_bytes: int
    alignment_duration_ms: int
    sync_duration_ms: int
    async_duration_ms: int
    persisted_data_bytes: int
    unaligned: bool
    checkpointed_size_bytes: int = 0
    processed_data_bytes: int = 0
    agent_id: str | None = None


@dataclass(frozen=True, slots=True)
class DeclineCheckpoint:
    SCHEMA: ClassVar[str] = f"{NAMESPACE}.DeclineCheckpoint"
    job_id: str
    checkpoint_id: int
    subtask_id: str
    attempt: int
    reason: CheckpointFailureReason
    timestamp: int
    message: str | None = None
    agent_id: str | None = None


@dataclass(frozen=True, slots=True)
class CheckpointOverrides:
    SCHEMA: ClassVar[str] = f"{NAMESPACE}.CheckpointOverrides"
    job_id: str
    version: int
    overrides: CheckpointSettings
    request_id: str
    updated_at: int


@dataclass(frozen=True, slots=True)
class ConfigChange:
    SCHEMA: ClassVar[str] = f"{NAMESPACE}.ConfigChange"
    job_id: str
    request_id: str
    principal: str
    changed_at: int
    old: CheckpointSettings
    new: CheckpointSettings
    changed_fields: list[str]
    override_version: int


@dataclass(frozen=True, slots=True)
class CheckpointLifecycleEvent:
    SCHEMA: ClassVar[str] = f"{NAMESPACE}.CheckpointLifecycleEvent"
    job_id: str
    owner_epoch: int
    checkpoint_id: int
    event_type: CheckpointEventType
    snapshot_type: SnapshotType
    timestamp: int
    failure_reason: CheckpointFailureReason | None = None
    message: str | None = None
    external_path: str | None = None
    duration_ms: int | None = None
    state_size_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class CheckpointStoreRecord:
    SCHEMA: ClassVar[str] = f"{NAMESPACE}.CheckpointStoreRecord"
    job_id: str
    owner_epoch: int
    checkpoint_id_counter: int
    retained: list[RetainedCheckpoint]
    updated_at: int
    agent_id: str | None = None
    attempt: int | None = None
    last_completed_checkpoint_id: int | None = None
    job_status: str | None = None
    externalized_retention: str | None = None
    savepoints: list[SavepointRecord] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class SinkEpochPublished:
    SCHEMA: ClassVar[str] = f"{NAMESPACE}.SinkEpochPublished"
    job_id: str
    sink: str
    epoch: int
    records: int
    agent_id: str
    timestamp: int
    outputs_digest: str | None = None
    transaction: str | None = None


@dataclass(frozen=True, slots=True)
class CoordinatorAnnouncement:
    SCHEMA: ClassVar[str] = f"{NAMESPACE}.CoordinatorAnnouncement"
    instance_id: str
    rest_url: str
    partitions: list[int]
    owner_epochs: dict[str, int]
    timestamp: int


@dataclass(frozen=True, slots=True)
class RegistrationResponse:
    SCHEMA: ClassVar[str] = f"{NAMESPACE}.RegistrationResponse"
    job_id: str
    owner_epoch: int
    agent_id: str
    attempt: int
    accepted: bool
    timestamp: int
    reason: str | None = None
    refusal: str | None = None
    holder_agent_id: str | None = None
    holder_attempt: int | None = None
    holder_seen_ms_ago: int | None = None
    checkpoint_id_counter: int | None = None


@dataclass(frozen=True, slots=True)
class AgentHeartbeat:
    SCHEMA: ClassVar[str] = f"{NAMESPACE}.AgentHeartbeat"
    job_id: str
    agent_id: str
    attempt: int
    timestamp: int
    records_in: int = 0
    records_out: int = 0
    records_in_per_second: int = 0
    records_out_per_second: int = 0
    backpressured_ms_per_second: int = 0
    partitions: list[PartitionProgress] = field(default_factory=list)
    source_watermark: int = -(2**63)
    """The sources' watermark (Long.MIN_VALUE: none, or no event time)."""
    watermarks: list[int] = field(default_factory=list)
    """Each keyed subtask's watermark, by index (empty: no event time)."""


Event = (
    JobRegistered
    | JobStatusChanged
    | TriggerCheckpoint
    | NotifyCheckpointComplete
    | NotifyCheckpointAborted
    | FailoverRequest
    | CancelJob
    | AcknowledgeCheckpoint
    | DeclineCheckpoint
    | CheckpointOverrides
    | ConfigChange
    | CheckpointLifecycleEvent
    | CheckpointStoreRecord
    | CoordinatorAnnouncement
    | SinkEpochPublished
    | RegistrationResponse
    | AgentHeartbeat
)

EVENT_TYPES: tuple[type[Event], ...] = (
    JobRegistered,
    JobStatusChanged,
    TriggerCheckpoint,
    NotifyCheckpointComplete,
    NotifyCheckpointAborted,
    FailoverRequest,
    CancelJob,
    AcknowledgeCheckpoint,
    DeclineCheckpoint,
    CheckpointOverrides,
    ConfigChange,
    CheckpointLifecycleEvent,
    CheckpointStoreRecord,
    CoordinatorAnnouncement,
    SinkEpochPublished,
    RegistrationResponse,
    AgentHeartbeat,
)
