"""The history document of one job, folded from audit events (sparkpoint.history.model)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from sparkpoint.common.events import (
    CheckpointEventType,
    CheckpointFailureReason,
    CheckpointLifecycleEvent,
    Event,
    JobStatus,
    JobStatusChanged,
    SnapshotType,
)
from sparkpoint.common.flink_ids import flink_job_id
from sparkpoint.history import model
from tests.factories import JOB, T0, config_change, job_registered

pytestmark = pytest.mark.unit


def lifecycle(
    checkpoint_id: int,
    kind: CheckpointEventType,
    at: int,
    epoch: int = 1,
    snapshot: SnapshotType = SnapshotType.CHECKPOINT,
    **details: object,
) -> CheckpointLifecycleEvent:
    return CheckpointLifecycleEvent(JOB, epoch, checkpoint_id, kind, snapshot, T0 + at, **details)  # type: ignore[arg-type]


def completed(
    checkpoint_id: int, at: int, duration: int, size: int = 100, **kw: object
) -> CheckpointLifecycleEvent:
    return lifecycle(
        checkpoint_id, CheckpointEventType.COMPLETED, at, duration_ms=duration,
        state_size_bytes=size, external_path=f"file:///cp/chk-{checkpoint_id}", **kw,
    )  # fmt: skip


def fold(events: list[Event], keep: int = model.CHECKPOINT_HISTORY) -> model.Doc:
    doc = model.new_job(JOB)
    for offset, event in enumerate(events):
        model.apply(doc, event, "audit", 0, offset, keep)
    return doc


def test_a_job_is_known_by_its_name_status_and_flink_job_id() -> None:
    doc = fold([job_registered()])
    overview = model.overview_json(doc)
    assert overview["jid"] == flink_job_id(JOB)
    assert (overview["name"], overview["state"], overview["start-time"]) == (
        "payments",
        "RUNNING",
        T0,
    )
    assert overview["tasks"]["running"] == 2
    finished = fold(
        [job_registered(), JobStatusChanged(JOB, "agent-a", 0, JobStatus.FINISHED, T0 + 9_000)]
    )
    assert model.overview_json(finished)["state"] == "FINISHED"
    assert model.overview_json(finished)["duration"] == 9_000


def test_checkpoints_are_counted_and_listed_newest_first_in_flinks_fields() -> None:
    doc = fold([
        lifecycle(1, CheckpointEventType.TRIGGERED, 0),
        completed(1, 40, 40, size=1_000),
        lifecycle(2, CheckpointEventType.TRIGGERED, 1_000),
        lifecycle(2, CheckpointEventType.EXPIRED, 1_600, duration_ms=600,
                  failure_reason=CheckpointFailureReason.CHECKPOINT_EXPIRED, message="timeout"),
        lifecycle(3, CheckpointEventType.TRIGGERED, 2_000),
    ])  # fmt: skip
    stats = model.checkpoints_json(doc)
    assert stats["counts"] == {
        "restored": 0,
        "total": 3,
        "in_progress": 1,
        "completed": 1,
        "failed": 1,
    }
    assert [e["id"] for e in stats["history"]] == [3, 2, 1]
    assert [e["status"] for e in stats["history"]] == ["IN_PROGRESS", "FAILED", "COMPLETED"]
    first = stats["history"][2]
    assert (first["trigger_timestamp"], first["latest_ack_timestamp"]) == (T0, T0 + 40)
    assert (first["end_to_end_duration"], first["state_size"]) == (40, 1_000)
    assert first["external_path"] == "file:///cp/chk-1"
    assert stats["history"][1]["failure_message"] == "CHECKPOINT_EXPIRED: timeout"
    assert stats["latest"]["completed"]["id"] == 1
    assert stats["latest"]["failed"]["id"] == 2
    assert stats["summary"]["end_to_end_duration"]["max"] == 40


def test_min_max_avg_cover_every_checkpoint_while_the_list_keeps_the_newest() -> None:
    events: list[Event] = []
    for i in range(1, 21):
        events += [
            lifecycle(i, CheckpointEventType.TRIGGERED, i * 1_000),
            completed(i, i * 1_000 + i, i),
        ]
    doc = fold(events, keep=5)
    stats = model.checkpoints_json(doc)
    assert [e["id"] for e in stats["history"]] == [20, 19, 18, 17, 16]
    duration = stats["summary"]["end_to_end_duration"]
    assert (duration["min"], duration["max"], duration["avg"]) == (1, 20, 10)
    assert duration["p50"] == 18.0  # over the kept ones
    assert stats["counts"]["completed"] == 20


def test_an_event_folded_again_changes_nothing() -> None:
    doc = model.new_job(JOB)
    events = [lifecycle(1, CheckpointEventType.TRIGGERED, 0), completed(1, 40, 40)]
    for offset, event in enumerate(events):
        assert model.apply(doc, event, "audit", 0, offset)
    before = json.dumps(doc, sort_keys=True)
    for offset, event in enumerate(events):
        assert not model.apply(doc, event, "audit", 0, offset)
    assert json.dumps(doc, sort_keys=True) == before
    assert model.apply(doc, completed(2, 90, 50), "audit", 1, 0)  # another partition: new
    assert doc["counts"]["completed"] == 2


def test_a_final_status_is_final() -> None:
    late_failure = lifecycle(1, CheckpointEventType.FAILED, 100, duration_ms=100,
                             failure_reason=CheckpointFailureReason.CHECKPOINT_COORDINATOR_SUSPEND)  # fmt: skip
    doc = fold([lifecycle(1, CheckpointEventType.TRIGGERED, 0), completed(1, 40, 40), late_failure])
    assert model.checkpoints_json(doc)["counts"]["failed"] == 0
    assert doc["history"][0]["status"] == "COMPLETED"


def test_a_completion_whose_trigger_was_not_seen_is_still_listed() -> None:
    doc = fold([completed(7, 500, 200)])
    entry = model.checkpoints_json(doc)["history"][0]
    assert (entry["id"], entry["status"], entry["trigger_timestamp"]) == (7, "COMPLETED", T0 + 300)


def test_a_subsumed_checkpoint_is_marked_discarded() -> None:
    doc = fold([
        lifecycle(1, CheckpointEventType.TRIGGERED, 0), completed(1, 40, 40),
        lifecycle(1, CheckpointEventType.SUBSUMED, 3_000),
    ])  # fmt: skip
    assert doc["history"][0]["discarded"] is True


def test_savepoints_are_kept_with_their_paths() -> None:
    doc = fold([
        lifecycle(4, CheckpointEventType.TRIGGERED, 0, snapshot=SnapshotType.SAVEPOINT),
        replace(completed(4, 80, 80), snapshot_type=SnapshotType.SAVEPOINT, external_path="s3://b/sp-4"),
    ])  # fmt: skip
    assert doc["savepoints"][0]["external_path"] == "s3://b/sp-4"
    stats = model.checkpoints_json(doc)
    assert stats["latest"]["savepoint"]["id"] == 4
    assert stats["latest"]["completed"] is None
    assert stats["history"][0]["is_savepoint"] is True


def test_configuration_changes_are_kept_and_the_overrides_in_force_follow_them() -> None:
    doc = fold([job_registered(), config_change()])
    change = doc["config_changes"][0]
    assert (change["principal"], change["changed_fields"]) == (
        "sre@example.com",
        ["checkpointTimeout"],
    )
    assert (change["old"]["checkpoint_timeout_ms"], change["new"]["checkpoint_timeout_ms"]) == (
        600_000,
        900_000,
    )
    assert doc["overrides"]["checkpoint_timeout_ms"] == 900_000
    assert model.job_json(doc)["configuration"] == {"execution.checkpointing.interval": "10s"}


def test_attempts_restores_and_failure_reasons_are_kept() -> None:
    restarted = replace(job_registered(), attempt=1, timestamp=T0 + 5_000,
                        restored_checkpoint_id=3, restored_external_path="file:///cp/chk-3")  # fmt: skip
    failing = JobStatusChanged(JOB, "agent-a", 0, JobStatus.RESTARTING, T0 + 4_000,
                               message="boom", exception_name="ValueError", restart_delay_ms=1_000)  # fmt: skip
    doc = fold([job_registered(), failing, restarted])
    assert [a["attempt"] for a in doc["attempts"]] == [0, 1]
    assert doc["attempts"][0]["status"] == "RESTARTING"
    assert doc["failures"][0]["exception_name"] == "ValueError"
    restored = model.checkpoints_json(doc)
    assert restored["counts"]["restored"] == 1
    assert restored["latest"]["restored"]["id"] == 3
    assert restored["latest"]["restored"]["is_savepoint"] is False


def test_a_restore_from_a_savepoint_is_known_whichever_topic_was_folded_first() -> None:
    restored = replace(job_registered(), attempt=1, timestamp=T0 + 5_000,
                       restored_checkpoint_id=4, restored_external_path="s3://b/sp-4")  # fmt: skip
    savepoint = [
        lifecycle(4, CheckpointEventType.TRIGGERED, 0, snapshot=SnapshotType.SAVEPOINT),
        replace(completed(4, 80, 80), snapshot_type=SnapshotType.SAVEPOINT, external_path="s3://b/sp-4"),
    ]  # fmt: skip
    for events in ([restored, *savepoint], [*savepoint, restored]):
        latest = model.checkpoints_json(fold(events))["latest"]["restored"]
        assert (latest["id"], latest["is_savepoint"]) == (4, True)


def test_what_happened_before_an_ownership_epoch_can_be_asked_for_alone() -> None:
    doc = fold([
        lifecycle(1, CheckpointEventType.TRIGGERED, 0, epoch=1), completed(1, 40, 40, epoch=1),
        lifecycle(2, CheckpointEventType.TRIGGERED, 1_000, epoch=1),
        lifecycle(2, CheckpointEventType.FAILED, 1_500, epoch=2, duration_ms=500),
        lifecycle(3, CheckpointEventType.TRIGGERED, 2_000, epoch=2), completed(3, 2_050, 50, epoch=2),
    ])  # fmt: skip
    before = model.checkpoints_json(doc, before_epoch=2)
    assert before["counts"]["completed"] == 1
    assert before["counts"]["failed"] == 0  # checkpoint 2 failed under epoch 2
    assert [e["id"] for e in before["history"]] == [2, 1]
    assert model.checkpoints_json(doc)["counts"]["completed"] == 2


def test_a_document_survives_a_json_round_trip_unchanged_in_meaning() -> None:
    events: list[Event] = [job_registered(), lifecycle(1, CheckpointEventType.TRIGGERED, 0)]
    doc = fold(events)
    copy = json.loads(json.dumps(doc))
    model.apply(copy, completed(1, 40, 40), "audit", 0, 2)
    assert model.checkpoints_json(copy)["counts"] == {
        "restored": 0, "total": 1, "in_progress": 0, "completed": 1, "failed": 0,
    }  # fmt: skip


def test_a_finished_job_started_again_and_rescaled_is_one_history_with_a_new_run() -> None:
    finished = JobStatusChanged(JOB, "agent-a", 0, JobStatus.FINISHED, T0 + 9_000)
    again = replace(
        job_registered(parallelism=4), attempt=0, agent_id="agent-b", timestamp=T0 + 60_000
    )
    doc = fold([job_registered(), lifecycle(1, CheckpointEventType.TRIGGERED, 0),
                completed(1, 40, 40), finished, again])  # fmt: skip
    overview = model.overview_json(doc)
    assert (overview["state"], overview["start-time"], overview["end-time"]) == (
        "RUNNING",
        T0 + 60_000,
        -1,
    )
    assert doc["parallelism"] == 4 and overview["tasks"]["running"] == 4
    assert [a["agent_id"] for a in doc["attempts"]] == ["agent-a", "agent-b"]
    assert model.checkpoints_json(doc)["counts"]["completed"] == 1, "the earlier run's are kept"


def test_checkpoints_left_pending_by_a_dead_owner_stop_counting_as_in_progress() -> None:
    """An owner that dies mid-checkpoint sends no final event: a later completion ends the
    older pending checkpoints (not a savepoint), and the pending list stays bounded whatever
    happens. A final event that comes late still counts."""
    doc = fold([
        lifecycle(1, CheckpointEventType.TRIGGERED, 0),
        lifecycle(2, CheckpointEventType.TRIGGERED, 10, snapshot=SnapshotType.SAVEPOINT),
        lifecycle(3, CheckpointEventType.TRIGGERED, 20, epoch=2),
        completed(3, 60, 40, epoch=2),
    ])  # fmt: skip
    assert doc["in_progress"] == [2]
    assert model.checkpoints_json(doc)["counts"]["in_progress"] == 1
    late = lifecycle(1, CheckpointEventType.FAILED, 70, duration_ms=70,
                     failure_reason=CheckpointFailureReason.CHECKPOINT_SUBSUMED)  # fmt: skip
    model.apply(doc, late, "audit", 0, 99, model.CHECKPOINT_HISTORY)
    assert model.checkpoints_json(doc)["counts"]["failed"] == 1
    assert model._find(doc, 1)["status"] == "FAILED"  # type: ignore[index]

    many = fold([lifecycle(i, CheckpointEventType.TRIGGERED, i) for i in range(1, 300)])
    assert many["in_progress"] == list(range(300 - model.IN_PROGRESS_KEPT, 300))
