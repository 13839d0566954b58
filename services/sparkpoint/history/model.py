"""The history of one job, folded from its audit events: pure logic, no I/O, no clock.

A job's history is one JSON document (a plain dict), so the history service can keep it as the
value of a faust table and recover it from the table's changelog. ``apply`` folds one event into
it; applying the same event twice changes nothing (``applied`` remembers the offset read last
from every topic partition), so a history service that restarts between writing a document and
committing its input offsets stays exact.

What a document holds, bounded whatever the job's age:

- status and attempts (the last ``ATTEMPTS_KEPT`` registrations), failure reasons;
- checkpoint counts over the whole life of the job, per coordinator ownership epoch too (so a
  coordinator can add what happened before it owned the job), min/max/sum of duration and state
  size over every completed checkpoint, the latest completed/savepoint/failed/restored, and the
  last ``checkpoint_history`` checkpoints in Flink's statistics fields;
- the configuration the job registered with, every runtime change (who, when, old -> new) and
  the overrides in force;
- savepoints with their paths.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from sparkpoint.common.events import (
    CheckpointEventType,
    CheckpointLifecycleEvent,
    CheckpointSettings,
    ConfigChange,
    Event,
    JobRegistered,
    JobStatus,
    JobStatusChanged,
    SnapshotType,
)
from sparkpoint.common.flink_ids import flink_job_id
from sparkpoint.coordinator.core.stats import PERCENTILES, percentile

Doc = dict[str, Any]

CHECKPOINT_HISTORY = 50
"""Checkpoints listed in detail per job (Flink's ``web.checkpoints.history`` is 10): the
dashboard's duration chart draws them. Percentiles are over these; min/max/avg over all."""

ATTEMPTS_KEPT = 20
FAILURES_KEPT = 20
CHANGES_KEPT = 500
SAVEPOINTS_KEPT = 100
IN_PROGRESS_KEPT = 100
"""Checkpoints counted as in progress at most (the newest): an owner that died mid-checkpoint
sends no final event for it."""

ENDED = {JobStatus.FINISHED.value, JobStatus.CANCELED.value, JobStatus.FAILED.value}
FAILED_TYPES = {CheckpointEventType.FAILED, CheckpointEventType.EXPIRED}
SUMMARY_METRICS = ("end_to_end_duration", "state_size")


def new_job(job_id: str) -> Doc:
    return {
        "job_id": job_id,
        "jid": flink_job_id(job_id),
        "name": job_id,
        "status": JobStatus.CREATED.value,
        "start_time": -1,
        "end_time": -1,
        "last_modification": -1,
        "parallelism": 0,
        "attempts": [],
        "failures": [],
        "configuration": {},
        "overrides": {},
        "config_changes": [],
        "config_change_count": 0,
        "savepoints": [],
        "counts": {"completed": 0, "failed": 0, "restored": 0},
        "epochs": {},
        "summary": {
            name: {"count": 0, "total": 0, "min": None, "max": None} for name in SUMMARY_METRICS
        },
        "latest": {"completed": None, "savepoint": None, "failed": None, "restored": None},
        "in_progress": [],
        "history": [],
        "applied": {},
        "events": 0,
    }


def apply(
    doc: Doc,
    event: Event,
    topic: str,
    partition: int,
    offset: int,
    checkpoint_history: int = CHECKPOINT_HISTORY,
) -> bool:
    """Folds ``event`` (read at topic/partition/offset) into ``doc``; False when it was already
    applied (or says nothing the history keeps)."""
    where = f"{topic}:{partition}"
    if offset <= doc["applied"].get(where, -1):
        return False
    doc["applied"][where] = offset
    match event:
        case JobRegistered():
            _registered(doc, event)
        case JobStatusChanged():
            _status_changed(doc, event)
        case CheckpointLifecycleEvent():
            _lifecycle(doc, event, checkpoint_history)
        case ConfigChange():
            _config_change(doc, event)
        case _:
            return False
    doc["events"] += 1
    return True


# --- the job ---------------------------------------------------------------------------------


def _touch(doc: Doc, timestamp: int) -> None:
    doc["last_modification"] = max(doc["last_modification"], timestamp)


def _registered(doc: Doc, event: JobRegistered) -> None:
    doc["name"] = event.job_name or event.job_id
    doc["parallelism"] = event.parallelism
    doc["configuration"] = dict(event.configuration)
    if doc["start_time"] < 0 or doc["status"] in ENDED:
        doc["start_time"] = event.timestamp
        doc["end_time"] = -1
    doc["status"] = event.status.value
    attempt = {
        "attempt": event.attempt,
        "agent_id": event.agent_id,
        "registered_at": event.timestamp,
        "status": event.status.value,
        "parallelism": event.parallelism,
        "restored_checkpoint_id": event.restored_checkpoint_id,
        "restored_external_path": event.restored_external_path,
    }
    doc["attempts"] = [*doc["attempts"], attempt][-ATTEMPTS_KEPT:]
    if event.restored_checkpoint_id is not None:
        doc["counts"]["restored"] += 1
        doc["latest"]["restored"] = {
            "id": event.restored_checkpoint_id,
            "restore_timestamp": event.timestamp,
            "external_path": event.restored_external_path,
        }
    _touch(doc, event.timestamp)


def _is_savepoint_path(doc: Doc, path: str | None) -> bool:
    return path is not None and any(s["external_path"] == path for s in doc["savepoints"])


def _status_changed(doc: Doc, event: JobStatusChanged) -> None:
    doc["status"] = event.status.value
    for attempt in reversed(doc["attempts"]):
        if attempt["attempt"] == event.attempt and attempt["agent_id"] == event.agent_id:
            attempt["status"] = event.status.value
            break
    if event.status.value in ENDED:
        doc["end_time"] = event.timestamp
    if event.exception_name or (event.status is JobStatus.FAILED and event.message):
        failure = {
            "timestamp": event.timestamp,
            "attempt": event.attempt,
            "status": event.status.value,
            "exception_name": event.exception_name,
            "message": event.message,
            "restart_delay_ms": event.restart_delay_ms,
        }
        doc["failures"] = [*doc["failures"], failure][-FAILURES_KEPT:]
    _touch(doc, event.timestamp)


def _config_change(doc: Doc, event: ConfigChange) -> None:
    change = {
        "request_id": event.request_id,
        "principal": event.principal,
        "changed_at": event.changed_at,
        "changed_fields": list(event.changed_fields),
        "old": _settings(event.old),
        "new": _settings(event.new),
        "override_version": event.override_version,
    }
    doc["config_changes"] = [*doc["config_changes"], change][-CHANGES_KEPT:]
    doc["config_change_count"] += 1
    doc["overrides"] = _settings(event.new)
    _touch(doc, event.changed_at)


def _settings(settings: CheckpointSettings) -> dict[str, Any]:
    return {k: v for k, v in dataclasses.asdict(settings).items() if v is not None}


# --- checkpoints -----------------------------------------------------------------------------


def _lifecycle(doc: Doc, event: CheckpointLifecycleEvent, keep: int) -> None:
    kind = event.event_type
    _touch(doc, event.timestamp)
    entry = _find(doc, event.checkpoint_id)
    if kind is CheckpointEventType.TRIGGERED:
        if entry is None:
            _remember(doc, _entry(event), keep)
            in_progress = sorted({*doc["in_progress"], event.checkpoint_id})
            doc["in_progress"] = in_progress[-IN_PROGRESS_KEPT:]
        return
    if kind in (CheckpointEventType.SUBSUMED, CheckpointEventType.DISCARDED):
        if entry is not None and entry["status"] == "COMPLETED":
            entry["discarded"] = True
        return
    if entry is not None and entry["status"] != "IN_PROGRESS":
        return  # a final status is final: a late FAILED for a completed id changes nothing
    doc["in_progress"] = [i for i in doc["in_progress"] if i != event.checkpoint_id]
    if kind is CheckpointEventType.COMPLETED and not event.snapshot_type.is_savepoint:
        _drop_subsumed_pending(doc, event.checkpoint_id)
    if entry is None:  # its trigger was not seen, or is no longer among the kept entries
        entry = _remember(doc, _entry(event), keep)
    epoch = doc["epochs"].setdefault(str(event.owner_epoch), {"completed": 0, "failed": 0})
    duration = event.duration_ms if event.duration_ms is not None else 0
    if kind is CheckpointEventType.COMPLETED:
        entry.update(
            status="COMPLETED",
            className=".CompletedCheckpointStatistics",
            latest_ack_timestamp=event.timestamp,
            end_to_end_duration=duration,
            state_size=event.state_size_bytes or 0,
            checkpointed_size=event.state_size_bytes or 0,
            external_path=event.external_path,
            discarded=False,
        )
        doc["counts"]["completed"] += 1
        epoch["completed"] += 1
        for name in SUMMARY_METRICS:
            _add(doc["summary"][name], entry[name])
        if entry["is_savepoint"]:
            doc["latest"]["savepoint"] = dict(entry)
            _savepoint(doc, entry)
        else:
            doc["latest"]["completed"] = dict(entry)
    elif kind in FAILED_TYPES:
        reason = event.failure_reason.name if event.failure_reason else kind.value
        entry.update(
            status="FAILED",
            className=".FailedCheckpointStatistics",
            end_to_end_duration=duration,
            failure_timestamp=event.timestamp,
            failure_message=f"{reason}: {event.message}" if event.message else reason,
            external_path=None,
        )
        doc["counts"]["failed"] += 1
        epoch["failed"] += 1
        doc["latest"]["failed"] = dict(entry)


def _entry(event: CheckpointLifecycleEvent) -> Doc:
    savepoint = event.snapshot_type.is_savepoint
    trigger = event.timestamp
    if event.event_type is not CheckpointEventType.TRIGGERED and event.duration_ms is not None:
        trigger = event.timestamp - event.duration_ms
    return {
        "className": ".PendingCheckpointStatistics",
        "id": event.checkpoint_id,
        "status": "IN_PROGRESS",
        "is_savepoint": savepoint,
        "savepointFormat": "CANONICAL" if savepoint else None,
        "checkpoint_type": _checkpoint_type(event.snapshot_type),
        "trigger_timestamp": trigger,
        "latest_ack_timestamp": -1,
        "end_to_end_duration": 0,
        "state_size": 0,
        "checkpointed_size": 0,
        "owner_epoch": event.owner_epoch,
    }


def _checkpoint_type(snapshot: SnapshotType) -> str:
    if snapshot is SnapshotType.SAVEPOINT:
        return "SAVEPOINT"
    return "SYNC_SAVEPOINT" if snapshot.is_savepoint else "CHECKPOINT"


def _remember(doc: Doc, entry: Doc, keep: int) -> Doc:
    """Newest first, as Flink lists them; the oldest beyond ``keep`` are dropped."""
    history = sorted([entry, *doc["history"]], key=lambda e: e["id"], reverse=True)
    doc["history"] = history[:keep]
    return entry


def _drop_subsumed_pending(doc: Doc, checkpoint_id: int) -> None:
    """A completed checkpoint ends every older one still pending but savepoints (Flink's
    CheckpointCoordinator aborts them as subsumed): they no longer count as in progress, even
    if no final event of theirs ever comes (an owner that died mid-checkpoint sends none)."""

    def savepoint(pending: int) -> bool:
        entry = _find(doc, pending)
        return entry is not None and bool(entry["is_savepoint"])

    doc["in_progress"] = [i for i in doc["in_progress"] if i > checkpoint_id or savepoint(i)]


def _find(doc: Doc, checkpoint_id: int) -> Doc | None:
    return next((e for e in doc["history"] if e["id"] == checkpoint_id), None)


def _add(summary: Doc, value: int) -> None:
    summary["count"] += 1
    summary["total"] += value
    summary["min"] = value if summary["min"] is None else min(summary["min"], value)
    summary["max"] = value if summary["max"] is None else max(summary["max"], value)


def _savepoint(doc: Doc, entry: Doc) -> None:
    savepoint = {
        "id": entry["id"],
        "external_path": entry["external_path"],
        "trigger_timestamp": entry["trigger_timestamp"],
        "completed_timestamp": entry["latest_ack_timestamp"],
        "state_size": entry["state_size"],
        "checkpoint_type": entry["checkpoint_type"],
    }
    doc["savepoints"] = [*doc["savepoints"], savepoint][-SAVEPOINTS_KEPT:]


# --- Flink's shapes --------------------------------------------------------------------------


def checkpoints_json(doc: Doc, before_epoch: int | None = None) -> Doc:
    """``GET /jobs/:id/checkpoints`` in Flink's shape. ``before_epoch``: only what happened
    before that coordinator ownership epoch (what a coordinator that took the job over adds)."""
    history = doc["history"]
    if before_epoch is not None:
        history = [e for e in history if e["owner_epoch"] < before_epoch]
        counts = {"completed": 0, "failed": 0}
        for epoch, numbers in doc["epochs"].items():
            if int(epoch) < before_epoch:
                counts["completed"] += numbers["completed"]
                counts["failed"] += numbers["failed"]
        in_progress = 0
    else:
        counts = {"completed": doc["counts"]["completed"], "failed": doc["counts"]["failed"]}
        in_progress = len(doc["in_progress"])
    completed = [e for e in history if e["status"] == "COMPLETED"]
    summary = {}
    for name in ("end_to_end_duration", "state_size", "checkpointed_size"):
        source = doc["summary"]["state_size" if name == "checkpointed_size" else name]
        summary[name] = _summary_json(source, sorted(e[name] for e in completed))
    for name in ("processed_data", "persisted_data", "alignment_buffered"):
        summary[name] = _summary_json(None, [])
    return {
        "counts": {
            "restored": doc["counts"]["restored"],
            "total": counts["completed"] + counts["failed"] + in_progress,
            "in_progress": in_progress,
            "completed": counts["completed"],
            "failed": counts["failed"],
        },
        "summary": summary,
        "latest": dict(doc["latest"]) | {"restored": _restored(doc)},
        "history": [_public(e) for e in history],
    }


def _restored(doc: Doc) -> Doc | None:
    """The latest restore; whether it was from a savepoint is decided when asked, since the
    savepoint's completion and the registration that restored it are on different topics and
    may be folded in either order."""
    restored: Doc | None = doc["latest"]["restored"]
    if restored is None:
        return None
    return restored | {"is_savepoint": _is_savepoint_path(doc, restored["external_path"])}


def _summary_json(source: Doc | None, ordered: list[int]) -> Doc:
    result: Doc = {
        "min": (source or {}).get("min") or 0,
        "max": (source or {}).get("max") or 0,
        "avg": source["total"] // source["count"] if source and source["count"] else 0,
    }
    for name, p in PERCENTILES:
        result[name] = percentile(ordered, p)
    return result


def _public(entry: Doc) -> Doc:
    return {k: v for k, v in entry.items() if k != "owner_epoch"} | {
        "num_subtasks": 0,
        "num_acknowledged_subtasks": 0,
        "processed_data": 0,
        "persisted_data": 0,
        "alignment_buffered": 0,
        "unaligned": entry.get("checkpoint_type") == "UNALIGNED_CHECKPOINT",
        "tasks": {},
    }


def overview_json(doc: Doc) -> Doc:
    """One entry of ``GET /jobs/overview``."""
    end = doc["end_time"]
    start = doc["start_time"]
    last = doc["last_modification"]
    duration = (end if end >= 0 else last) - start if start >= 0 else 0
    return {
        "jid": doc["jid"],
        "name": doc["name"],
        "state": doc["status"],
        "start-time": start,
        "end-time": end,
        "duration": max(0, duration),
        "last-modification": last,
        "tasks": _tasks(doc),
        "sparkpoint.job_id": doc["job_id"],
        "sparkpoint.checkpoints": doc["counts"]["completed"],
    }


def _tasks(doc: Doc) -> Doc:
    names = ("running", "canceling", "canceled", "total", "created", "scheduled", "deploying",
             "reconciling", "finished", "failed", "initializing", "pending")  # fmt: skip
    tasks = dict.fromkeys(names, 0)
    count = doc["parallelism"]
    tasks["total"] = count
    state = doc["status"].lower()
    if state in tasks:
        tasks[state] = count
    return tasks


def job_json(doc: Doc) -> Doc:
    """``GET /jobs/:id`` of the history service: the overview plus what the history keeps about
    the job itself (attempts, failures, configuration in force, savepoints)."""
    return overview_json(doc) | {
        "parallelism": doc["parallelism"],
        "attempts": doc["attempts"],
        "failures": doc["failures"],
        "configuration": doc["configuration"],
        "overrides": doc["overrides"],
        "config_change_count": doc["config_change_count"],
        "savepoints": doc["savepoints"],
        "events": doc["events"],
    }
