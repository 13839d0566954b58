"""A job as Flink's REST API shows it: ``/jobs/overview``, ``/jobs/{id}``, ``/jobs/{id}/plan``,
``/jobs/{id}/exceptions`` and ``/jobs/{id}/config``, built from what the coordinator knows of the
job (its registration, its status history, its failures). Pure: the time comes in as an argument.

sparkpoint's job graph is two vertices, as Flink would show it: stage 1 (the source, the map and
the key extraction) and stage 2 (the keyed function and the sink), each with the job's
parallelism.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any

from sparkpoint.common.events import JobStatus
from sparkpoint.common.flink_ids import flink_job_id
from sparkpoint.common.options import without_effect
from sparkpoint.common.redaction import redact_options
from sparkpoint.common.restarts import RestartConfig
from sparkpoint.common.settings import ConfigError

if TYPE_CHECKING:
    from sparkpoint.coordinator.service.owned import OwnedJob

STAGES = ("Source: stage 1 (read, map, key by)", "Keyed stage 2 (keyed function) -> Sink")

JOB_STATES = (
    "INITIALIZING", "CREATED", "RUNNING", "FAILING", "FAILED", "CANCELLING", "CANCELED",
    "FINISHED", "RESTARTING", "SUSPENDED", "RECONCILING",
)  # fmt: skip
"""Flink's JobStatus: a job's ``timestamps`` name each (0: not reached)."""

TASK_STATES = (
    "CREATED", "SCHEDULED", "DEPLOYING", "RUNNING", "FINISHED", "CANCELING", "CANCELED",
    "FAILED", "RECONCILING", "INITIALIZING",
)  # fmt: skip


def vertex_id(job_id: str, stage: int) -> str:
    """A stable 32-hex id per stage of a job, as Flink's JobVertexID."""
    return hashlib.md5(f"{job_id}/{stage}".encode(), usedforsecurity=False).hexdigest()


def _times(job: OwnedJob, now_ms: int) -> tuple[int, int, int]:
    start = job.history.started_ms or job.registration.timestamp
    end = job.history.status_times.get(job.status.name, -1) if job.status.is_terminal else -1
    return start, end, (end if end >= 0 else now_ms) - start


def _task_state(status: JobStatus) -> str:
    return {
        JobStatus.RUNNING: "RUNNING",
        JobStatus.FINISHED: "FINISHED",
        JobStatus.CANCELED: "CANCELED",
        JobStatus.FAILED: "FAILED",
        JobStatus.RESTARTING: "CANCELING",
    }.get(status, "CREATED")


def _tasks(job: OwnedJob) -> dict[str, int]:
    """A job's task counts by state (lower case, with the total), as Flink's JobDetails."""
    count = job.registration.parallelism * len(STAGES)
    tasks = {state.lower(): 0 for state in TASK_STATES}
    tasks[_task_state(job.status).lower()] = count
    tasks["total"] = count
    return tasks


def _stage_tasks(job: OwnedJob) -> dict[str, int]:
    """One vertex's task counts by state (upper case, no total), as Flink's JobVertexDetails."""
    tasks = dict.fromkeys(TASK_STATES, 0)
    tasks[_task_state(job.status)] = job.registration.parallelism
    return tasks


VERTEX_METRICS = {
    "read-bytes": 0, "read-bytes-complete": False, "write-bytes": 0,
    "write-bytes-complete": False, "read-records": 0, "read-records-complete": False,
    "write-records": 0, "write-records-complete": False, "accumulated-backpressured-time": 0,
    "accumulated-idle-time": 0, "accumulated-busy-time": 0.0,
}  # fmt: skip
"""Flink's per-vertex IO metrics before any is known ("complete": false, as Flink says while it
has not collected them)."""


def vertex_io(job: OwnedJob, stage: int) -> dict[str, Any]:
    """A stage's IO metrics from the agent's newest heartbeat: the source stage sends what it
    reads, the keyed stage sends what the keyed function emits (the records it receives are
    the source stage's after the job's map, not counted)."""
    metrics = dict(VERTEX_METRICS)
    beat = job.progress
    if beat is None:
        return metrics
    if stage == 0:
        metrics |= {"write-records": beat.records_in, "write-records-complete": True}
    else:
        metrics |= {"write-records": beat.records_out, "write-records-complete": True}
    return metrics


def overview(job: OwnedJob, now_ms: int) -> dict[str, Any]:
    """One entry of ``GET /jobs/overview`` (Flink's JobDetails)."""
    start, end, duration = _times(job, now_ms)
    return {
        "jid": flink_job_id(job.job_id),
        "name": job.registration.job_name,
        "jobType": "STREAMING",
        "schedulerType": "Default",
        "state": job.status.name,
        "start-time": start,
        "end-time": end,
        "duration": duration,
        "last-modification": max(job.history.status_times.values(), default=start),
        "tasks": _tasks(job),
        "pending-operators": 0,
        "restarts": job.history.restarts,
        "sparkpoint": {"job_id": job.job_id},
    }


def application(job: OwnedJob, now_ms: int) -> dict[str, Any]:
    """One entry of ``GET /applications/overview`` (Flink 2.3: each job its own application)."""
    start, end, duration = _times(job, now_ms)
    return {
        "id": flink_job_id(job.job_id),
        "name": job.registration.job_name,
        "status": job.status.name,
        "start-time": start,
        "end-time": end,
        "duration": duration,
        "jobs": {job.status.name: 1},
    }


def vertex_index(job: OwnedJob, vertex: str) -> int | None:
    """Which stage ``vertex`` is (0: the source stage, 1: the keyed stage), None if neither."""
    found = [i for i in range(len(STAGES)) if vertex == vertex_id(job.job_id, i)]
    return found[0] if found else None


def plan(job: OwnedJob) -> dict[str, Any]:
    """``GET /jobs/{id}/plan``, and the plan in ``GET /jobs/{id}`` (Flink's JobPlanInfo)."""
    jid = flink_job_id(job.job_id)
    registration = job.registration
    return {
        "jid": jid,
        "name": registration.job_name,
        "type": "STREAMING",
        "nodes": [
            {
                "id": vertex_id(job.job_id, i),
                "parallelism": registration.parallelism,
                "operator": "",
                "operator_strategy": "",
                "description": name,
                "optimizer_properties": {},
                "inputs": [] if i == 0 else [{"num": 0, "id": vertex_id(job.job_id, 0), "ship_strategy": "HASH", "exchange": "pipelined_bounded"}],
            }
            for i, name in enumerate(STAGES)
        ],
    }  # fmt: skip


def details(job: OwnedJob, now_ms: int) -> dict[str, Any]:
    """``GET /jobs/{id}`` (Flink's JobDetailsInfo)."""
    start, end, duration = _times(job, now_ms)
    registration = job.registration
    jid = flink_job_id(job.job_id)
    vertices = [
        {
            "id": vertex_id(job.job_id, i),
            "slotSharingGroupId": vertex_id(job.job_id, -1),
            "name": name,
            "maxParallelism": registration.max_parallelism,
            "parallelism": registration.parallelism,
            "status": _task_state(job.status),
            "start-time": start,
            "end-time": end,
            "duration": duration,
            "tasks": _stage_tasks(job),
            "metrics": vertex_io(job, i),
        }
        for i, name in enumerate(STAGES)
    ]
    status_counts = {state: 0 for state in TASK_STATES}
    status_counts[_task_state(job.status)] = len(STAGES)
    return {
        "jid": jid,
        "application-id": jid,
        "name": registration.job_name,
        "isStoppable": False,
        "state": job.status.name,
        "job-type": "STREAMING",
        "schedulerType": "Default",
        "start-time": start,
        "end-time": end,
        "duration": duration,
        "maxParallelism": registration.max_parallelism,
        "now": now_ms,
        "timestamps": dict.fromkeys(JOB_STATES, 0) | job.history.status_times,
        "vertices": vertices,
        "status-counts": status_counts,
        "pending-operators": 0,
        "plan": plan(job),
        "sparkpoint": {
            "job_id": job.job_id,
            "agent_id": registration.agent_id,
            "attempt": registration.attempt,
            "restarts": job.history.restarts,
        },
    }  # fmt: skip


def exceptions(job: OwnedJob) -> dict[str, Any]:
    """``GET /jobs/{id}/exceptions`` (Flink's JobExceptionsInfoWithHistory), newest first."""
    entries: list[dict[str, Any]] = [
        {
            "exceptionName": failure.exception_name,
            "stacktrace": failure.stacktrace,
            "timestamp": failure.timestamp,
            "taskName": None,
            "endpoint": None,
            "taskManagerId": None,
            "failureLabels": {},
            "concurrentExceptions": [],
        }
        for failure in reversed(job.history.failures)
    ]
    return {"exceptionHistory": {"entries": entries, "truncated": False}}


def restart_strategy(job: OwnedJob) -> str:
    """The restart strategy in force, described as Flink's job config does."""
    try:
        config = RestartConfig.from_options(job.registration.configuration)
    except ConfigError:
        return "unknown"
    kind = config.kind(checkpointing=job.core.config.periodic)
    if kind == "fixed-delay":
        return f"Restart with fixed delay ({config.fixed_delay_ms} ms). #{config.fixed_delay_attempts} restart attempts."
    if kind == "failure-rate":
        return f"Failure rate restart with maximum of {config.failure_rate_max_failures} failures within interval {config.failure_rate_interval_ms} ms and fixed delay {config.failure_rate_delay_ms} ms."
    if kind == "exponential-delay":
        return (
            f"Restart with exponential delay: initial backoff {config.initial_backoff_ms} ms, "
            f"max backoff {config.max_backoff_ms} ms, multiplier {config.backoff_multiplier}, "
            f"reset threshold {config.reset_backoff_threshold_ms} ms, jitter {config.jitter_factor}."
        )
    return "No restart."


def config(job: OwnedJob) -> dict[str, Any]:
    """``GET /jobs/{id}/config`` (Flink's JobConfigInfo), and what sparkpoint does with the
    job's options: the effective checkpointing options, and those without effect here (keys
    only). A secret's value (a password, a token...: `sparkpoint.common.redaction`) is shown
    redacted."""
    registration = job.registration
    return {
        "jid": flink_job_id(job.job_id),
        "name": registration.job_name,
        "execution-config": {
            "execution-mode": "PIPELINED",
            "restart-strategy": restart_strategy(job),
            "job-parallelism": registration.parallelism,
            "object-reuse-mode": False,
            "user-config": redact_options(registration.configuration),
        },
        "sparkpoint": {
            "effective": job.core.config.to_options(),
            "no_effect": without_effect(registration.configuration),
        },
    }
