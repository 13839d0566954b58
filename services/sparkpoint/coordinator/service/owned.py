"""What the coordinator service keeps per owned job, and the errors its operations raise for
the REST layer to answer (404, 409, 307...)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from sparkpoint.common.events import (
    AgentHeartbeat,
    CheckpointOverrides,
    FailoverRequest,
    JobRegistered,
    JobStatus,
    JobStatusChanged,
)
from sparkpoint.common.settings import CheckpointConfig
from sparkpoint.coordinator.core.admission import Holder
from sparkpoint.coordinator.core.coordinator import CheckpointCoordinator


class UpdateInProgress(RuntimeError):
    """Another configuration update of the same job is being applied (409)."""


class UnknownJob(KeyError):
    """No job with that id is owned by this instance (404)."""


class DisposalRefused(ValueError):
    """A path that may not be disposed: not a savepoint, or a checkpoint a job restores from."""


class OwnedElsewhere(Exception):
    """The savepoint's job is owned by another instance: the request goes there."""

    def __init__(self, job_id: str) -> None:
        super().__init__(job_id)
        self.job_id = job_id


@dataclass
class TriggerRequest:
    """A REST-triggered checkpoint or savepoint, answered through its request id."""

    request_id: str
    job_id: str
    savepoint: bool
    status: str = "IN_PROGRESS"
    checkpoint_id: int | None = None
    location: str | None = None
    failure: str | None = None
    disposal: bool = False
    """A savepoint disposal (``/savepoint-disposal``), not a trigger."""


@dataclass
class OwnedJob:
    registration: JobRegistered
    partition: int
    base: CheckpointConfig
    core: CheckpointCoordinator
    overrides: CheckpointOverrides | None = None
    status: JobStatus = JobStatus.RUNNING
    updating: bool = False
    last_failover: FailoverRequest | None = None
    last_seen_ms: int = 0
    """When this coordinator last heard from the job's agent (its own clock)."""
    progress: AgentHeartbeat | None = None
    """The newest heartbeat of the agent that drives the job: its records in and out, where its
    source partitions stand (`progress_views`)."""
    history: JobHistory = field(default_factory=lambda: JobHistory())

    @property
    def job_id(self) -> str:
        return self.registration.job_id

    def holder(self) -> Holder:
        return Holder(self.registration.agent_id, self.registration.attempt, self.last_seen_ms)


EXCEPTION_HISTORY = 16
"""Failures kept per job for ``GET /jobs/{id}/exceptions`` (Flink's web.exception-history-size)."""


@dataclass(frozen=True)
class Failure:
    """One entry of a job's exception history."""

    exception_name: str
    stacktrace: str
    timestamp: int
    message: str | None
    restarting: bool


@dataclass
class JobHistory:
    """What a job keeps across restarts of its agent (Flink keeps it across task restarts): when
    it started, each status's first time, how often it restarted, its recent failures."""

    started_ms: int = 0
    status_times: dict[str, int] = field(default_factory=dict)
    restarts: int = 0
    failures: deque[Failure] = field(default_factory=lambda: deque(maxlen=EXCEPTION_HISTORY))

    def record(self, status: JobStatus, at_ms: int) -> None:
        self.status_times.setdefault(status.name, at_ms)

    def failed(self, event: JobStatusChanged) -> None:
        if event.exception_name is None:
            return
        self.failures.append(
            Failure(
                event.exception_name,
                event.stacktrace or "",
                event.timestamp,
                event.message,
                event.status is JobStatus.RESTARTING,
            )
        )


class TriggerIdInUse(Exception):
    """A client-chosen trigger id already names another job's or kind's operation."""

    def __init__(self, trigger_id: str) -> None:
        super().__init__(trigger_id)
        self.trigger_id = trigger_id
