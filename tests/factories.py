"""Factories for events, named after what they build. Timestamps are fixed epoch ms."""

from __future__ import annotations

from dataclasses import replace

from sparkpoint.common.events import (
    AcknowledgeCheckpoint,
    AgentHeartbeat,
    CancelJob,
    CheckpointEventType,
    CheckpointFailureReason,
    CheckpointLifecycleEvent,
    CheckpointOverrides,
    CheckpointSettings,
    CheckpointStoreRecord,
    ConfigChange,
    CoordinatorAnnouncement,
    DeclineCheckpoint,
    Event,
    FailoverRequest,
    JobRegistered,
    JobStatus,
    JobStatusChanged,
    NotifyCheckpointAborted,
    NotifyCheckpointComplete,
    RegistrationResponse,
    RetainedCheckpoint,
    SavepointFormat,
    SinkEpochPublished,
    SnapshotType,
    StateHandle,
    StateHandleKind,
    Subtask,
    TriggerCheckpoint,
)
from sparkpoint.common.keygroups import key_group_range

T0 = 1_790_000_000_000
JOB = "job-0001"


def job_registered(
    job_id: str = JOB, parallelism: int = 2, max_parallelism: int = 128
) -> JobRegistered:
    ranges = [key_group_range(max_parallelism, parallelism, i) for i in range(parallelism)]
    subtasks = [Subtask(f"keyed-{i}", i, r.start, r.end) for i, r in enumerate(ranges)]
    return JobRegistered(
        job_id=job_id,
        job_name="payments",
        agent_id="agent-a",
        attempt=0,
        status=JobStatus.RUNNING,
        parallelism=parallelism,
        max_parallelism=max_parallelism,
        subtasks=subtasks,
        configuration={"execution.checkpointing.interval": "10s"},
        timestamp=T0,
    )


def job_finished(job_id: str = JOB) -> JobStatusChanged:
    return JobStatusChanged(job_id, "agent-a", 0, JobStatus.FINISHED, T0 + 9_000, False, "done")


def periodic_checkpoint_trigger(checkpoint_id: int = 7, job_id: str = JOB) -> TriggerCheckpoint:
    return TriggerCheckpoint(
        job_id=job_id,
        owner_epoch=3,
        checkpoint_id=checkpoint_id,
        trigger_timestamp=T0 + 1_000,
        snapshot_type=SnapshotType.CHECKPOINT,
        periodic=True,
        unaligned=False,
        target_location=f"/cp/{job_id}/chk-{checkpoint_id}",
        aligned_checkpoint_timeout_ms=30_000,
    )


def savepoint_trigger(checkpoint_id: int = 8, job_id: str = JOB) -> TriggerCheckpoint:
    return TriggerCheckpoint(
        job_id=job_id,
        owner_epoch=3,
        checkpoint_id=checkpoint_id,
        trigger_timestamp=T0 + 2_000,
        snapshot_type=SnapshotType.SAVEPOINT,
        periodic=False,
        unaligned=False,
        target_location="/sp/savepoint-job000-abc123",
        savepoint_format=SavepointFormat.NATIVE,
    )


def acknowledge(
    checkpoint_id: int = 7, subtask: int = 0, handles: int = 4
) -> AcknowledgeCheckpoint:
    return AcknowledgeCheckpoint(
        job_id=JOB,
        checkpoint_id=checkpoint_id,
        subtask_id=f"keyed-{subtask}",
        attempt=0,
        ack_timestamp=T0 + 1_500,
        state_handles=[
            StateHandle(
                f"/cp/{JOB}/shared/kg-{i}-v3.arrow", StateHandleKind.KEYED_STATE, 4096, i, i, True
            )
            for i in range(handles)
        ]
        + [StateHandle(f"/cp/{JOB}/chk-7/src-{subtask}", StateHandleKind.SOURCE_POSITIONS, 96)],
        state_size_bytes=4096 * handles + 96,
        alignment_duration_ms=3,
        sync_duration_ms=1,
        async_duration_ms=40,
        persisted_data_bytes=0,
        unaligned=False,
        checkpointed_size_bytes=4096 + 96,
        processed_data_bytes=10_240,
    )


def decline(checkpoint_id: int = 7) -> DeclineCheckpoint:
    return DeclineCheckpoint(
        JOB,
        checkpoint_id,
        "keyed-1",
        0,
        CheckpointFailureReason.CHECKPOINT_ASYNC_EXCEPTION,
        T0 + 1_600,
        "upload failed",
    )


def notify_complete(checkpoint_id: int = 7) -> NotifyCheckpointComplete:
    return NotifyCheckpointComplete(
        JOB, 3, checkpoint_id, False, f"/cp/{JOB}/chk-{checkpoint_id}", T0 + 1_700
    )


def notify_aborted(checkpoint_id: int = 7) -> NotifyCheckpointAborted:
    return NotifyCheckpointAborted(
        JOB, 3, checkpoint_id, CheckpointFailureReason.CHECKPOINT_EXPIRED, T0 + 9_000
    )


def failover_request() -> FailoverRequest:
    return FailoverRequest(
        JOB,
        3,
        CheckpointFailureReason.CHECKPOINT_EXPIRED,
        "4 consecutive failures > 3 tolerable",
        4,
        T0 + 20_000,
        failed_checkpoint_id=11,
        restore_checkpoint_id=7,
        restore_external_path="/cp/x/chk-7",
    )


def cancel_job() -> CancelJob:
    return CancelJob(JOB, 3, T0 + 30_000, "alice@10.0.0.1", agent_id="agent-1", attempt=0)


def overrides(version: int = 1, interval_ms: int | None = 5_000) -> CheckpointOverrides:
    return CheckpointOverrides(
        JOB,
        version,
        CheckpointSettings(checkpoint_interval_ms=interval_ms, checkpoint_timeout_ms=900_000),
        f"req-{version}",
        T0 + 3_000,
    )


def config_change() -> ConfigChange:
    return ConfigChange(
        job_id=JOB,
        request_id="req-1",
        principal="sre@example.com",
        changed_at=T0 + 3_000,
        old=CheckpointSettings(10_000, 600_000, 0, 1, 0, 0),
        new=CheckpointSettings(10_000, 900_000, 0, 1, 0, 0),
        changed_fields=["checkpointTimeout"],
        override_version=1,
    )


def checkpoint_failed_event() -> CheckpointLifecycleEvent:
    return CheckpointLifecycleEvent(
        JOB,
        3,
        9,
        CheckpointEventType.FAILED,
        SnapshotType.CHECKPOINT,
        T0 + 4_000,
        failure_reason=CheckpointFailureReason.CHECKPOINT_DECLINED,
        message="keyed-1 declined",
        duration_ms=120,
    )


def checkpoint_store_record() -> CheckpointStoreRecord:
    retained = [
        RetainedCheckpoint(
            6, SnapshotType.CHECKPOINT, True, T0, T0 + 50, "/cp/x/chk-6", 100, ["/cp/x/shared/a"]
        ),
        RetainedCheckpoint(7, SnapshotType.SAVEPOINT, False, T0 + 60, T0 + 90, "/sp/s-7", 120, []),
    ]
    return CheckpointStoreRecord(JOB, 3, 8, retained, T0 + 100)


def coordinator_announcement() -> CoordinatorAnnouncement:
    return CoordinatorAnnouncement(
        "coordinator-a", "http://10.0.0.5:8081", [0, 3], {"0": 4, "3": 2}, T0
    )


def sink_epoch_published() -> SinkEpochPublished:
    return SinkEpochPublished(JOB, "payment-totals", 7, 1_250, "agent-a", T0 + 5_000)


def end_of_input() -> JobStatusChanged:
    return JobStatusChanged(JOB, "agent-a", 0, JobStatus.RUNNING, T0 + 8_000, end_of_input=True)


def registration_refused() -> RegistrationResponse:
    return RegistrationResponse(
        JOB, 3, "agent-b", 0, False, T0 + 10_000,
        reason="job job-0001 is driven by agent agent-a (attempt 0), last heard from 400 ms ago",
        refusal="LEASE_HELD", holder_agent_id="agent-a", holder_attempt=0, holder_seen_ms_ago=400,
    )  # fmt: skip


def registration_accepted() -> RegistrationResponse:
    return RegistrationResponse(JOB, 3, "agent-a", 1, True, T0 + 10_000, checkpoint_id_counter=12)


def heartbeat() -> AgentHeartbeat:
    return AgentHeartbeat(JOB, "agent-a", 0, T0 + 11_000)


def addressed_trigger() -> TriggerCheckpoint:
    return replace(periodic_checkpoint_trigger(9), agent_id="agent-a", attempt=2)


def one_of_each() -> list[Event]:
    """One event of every type, with optional fields both set and unset across the list."""
    return [
        job_registered(),
        job_finished(),
        periodic_checkpoint_trigger(),
        savepoint_trigger(),
        acknowledge(),
        decline(),
        notify_complete(),
        notify_aborted(),
        failover_request(),
        cancel_job(),
        overrides(),
        config_change(),
        checkpoint_failed_event(),
        checkpoint_store_record(),
        coordinator_announcement(),
        sink_epoch_published(),
        end_of_input(),
        registration_refused(),
        registration_accepted(),
        heartbeat(),
        addressed_trigger(),
    ]
