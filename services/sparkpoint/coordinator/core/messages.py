"""Every event one job's checkpoint coordinator publishes, built in one place: the control events
to the agent that drives the job (trigger, complete, aborted, failover), each stamped with the
owner's epoch and addressed to that agent and attempt, and the lifecycle events of the audit
topic. Pure construction: what goes in each field, nothing decided here."""

from __future__ import annotations

from dataclasses import dataclass

from sparkpoint.common.events import (
    CheckpointEventType,
    CheckpointFailureReason,
    CheckpointLifecycleEvent,
    FailoverRequest,
    NotifyCheckpointAborted,
    NotifyCheckpointComplete,
    SnapshotType,
    TriggerCheckpoint,
)
from sparkpoint.coordinator.core.failures import FailoverDecision
from sparkpoint.coordinator.core.pending import PendingCheckpoint
from sparkpoint.coordinator.core.store import CompletedCheckpoint


@dataclass(frozen=True, slots=True)
class JobMessages:
    job_id: str
    owner_epoch: int
    agent_id: str | None
    """The agent that drives the job (None: the job names none); control events go to it."""
    attempt: int

    def trigger(
        self, pending: PendingCheckpoint, aligned_timeout_ms: int | None
    ) -> TriggerCheckpoint:
        request = pending.request
        return TriggerCheckpoint(
            self.job_id, self.owner_epoch, pending.checkpoint_id, pending.trigger_ms,
            request.snapshot_type, request.periodic, pending.unaligned, pending.target_location,
            aligned_timeout_ms, request.format_type, agent_id=self.agent_id, attempt=self.attempt,
        )  # fmt: skip

    def complete(self, checkpoint: CompletedCheckpoint) -> NotifyCheckpointComplete:
        return NotifyCheckpointComplete(
            self.job_id, self.owner_epoch, checkpoint.checkpoint_id, checkpoint.is_savepoint,
            checkpoint.external_path, checkpoint.completed_ms,
            agent_id=self.agent_id, attempt=self.attempt,
        )  # fmt: skip

    def aborted(
        self, checkpoint_id: int, reason: CheckpointFailureReason, now_ms: int, message: str
    ) -> NotifyCheckpointAborted:
        return NotifyCheckpointAborted(
            self.job_id, self.owner_epoch, checkpoint_id, reason, now_ms, message,
            agent_id=self.agent_id, attempt=self.attempt,
        )  # fmt: skip

    def failover(
        self, decision: FailoverDecision, restore: CompletedCheckpoint | None, now_ms: int
    ) -> FailoverRequest:
        """The job restarts from ``restore``, its latest checkpoint (from scratch when none)."""
        return FailoverRequest(
            self.job_id, self.owner_epoch, decision.reason, decision.message,
            decision.consecutive_failures, now_ms,
            failed_checkpoint_id=decision.checkpoint_id,
            restore_checkpoint_id=None if restore is None else restore.checkpoint_id,
            restore_external_path=None if restore is None else restore.external_path,
            agent_id=self.agent_id, attempt=self.attempt,
        )  # fmt: skip

    def lifecycle(
        self,
        checkpoint_id: int,
        event_type: CheckpointEventType,
        snapshot_type: SnapshotType,
        now_ms: int,
        failure_reason: CheckpointFailureReason | None = None,
        message: str | None = None,
        external_path: str | None = None,
        duration_ms: int | None = None,
        state_size_bytes: int | None = None,
    ) -> CheckpointLifecycleEvent:
        return CheckpointLifecycleEvent(
            self.job_id, self.owner_epoch, checkpoint_id, event_type, snapshot_type, now_ms,
            failure_reason=failure_reason, message=message, external_path=external_path,
            duration_ms=duration_ms, state_size_bytes=state_size_bytes,
        )  # fmt: skip
