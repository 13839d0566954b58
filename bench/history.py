"""The history service on 100,000 audit events: time to fold them from the topics, and time from
a restart (SIGKILL, then a new process) to serving every job's history again, recovered from the
table's changelog. Goal: restart to serving in under 5 s.

The events are what coordinators write for 20 jobs: registrations, checkpoint lifecycles
(TRIGGERED, COMPLETED or now and then FAILED, SUBSUMED), configuration changes. They are written
straight to the topics, as fast as the broker takes them, on a fresh embedded broker.

Prints its figures and writes them to bench/results/history.json.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sparkpoint.common.avro import EventCodec
from sparkpoint.common.broker import EmbeddedBroker
from sparkpoint.common.events import (
    CheckpointEventType,
    CheckpointFailureReason,
    CheckpointLifecycleEvent,
    CheckpointSettings,
    ConfigChange,
    Event,
    JobRegistered,
    JobStatus,
    SnapshotType,
    Subtask,
)
from sparkpoint.common.kafka import make_admin, make_producer
from sparkpoint.common.topics import (
    CHECKPOINT_EVENTS,
    CONFIG_CHANGES,
    JOBS,
    TopicSpec,
    create_topics,
)
from tests.running_history import HistoryProcess

EVENTS = 100_000
JOBS_COUNT = 20
GOAL_S = 5.0
RESULTS = Path(__file__).resolve().parent / "results" / "history.json"
T0 = 1_790_000_000_000


def audit_events(total: int, jobs: int) -> list[tuple[TopicSpec, str, Event]]:
    out: list[tuple[TopicSpec, str, Event]] = []
    per_job = total // jobs
    for j in range(jobs):
        job = f"bench-job-{j:02d}"
        subtasks = [Subtask(f"keyed-{i}", i, i * 64, i * 64 + 63) for i in range(2)]
        out.append((JOBS, job, JobRegistered(job, f"job {j}", "agent", 0, JobStatus.RUNNING, 2, 128, subtasks, {"execution.checkpointing.interval": "1s"}, T0)))  # fmt: skip
        checkpoint, at, start = 0, T0, len(out)
        while len(out) - start < per_job:
            checkpoint += 1
            at += 1_000
            kind = SnapshotType.SAVEPOINT if checkpoint % 500 == 0 else SnapshotType.CHECKPOINT
            out.append((CHECKPOINT_EVENTS, job, CheckpointLifecycleEvent(job, 1, checkpoint, CheckpointEventType.TRIGGERED, kind, at)))  # fmt: skip
            if checkpoint % 50 == 0:
                out.append((CHECKPOINT_EVENTS, job, CheckpointLifecycleEvent(job, 1, checkpoint, CheckpointEventType.FAILED, kind, at + 300, failure_reason=CheckpointFailureReason.CHECKPOINT_DECLINED, message="declined", duration_ms=300)))  # fmt: skip
                continue
            out.append((CHECKPOINT_EVENTS, job, CheckpointLifecycleEvent(job, 1, checkpoint, CheckpointEventType.COMPLETED, kind, at + 40 + checkpoint % 30, external_path=f"file:///cp/{job}/chk-{checkpoint}", duration_ms=40 + checkpoint % 30, state_size_bytes=400_000)))  # fmt: skip
            out.append((CHECKPOINT_EVENTS, job, CheckpointLifecycleEvent(job, 1, checkpoint - 1, CheckpointEventType.SUBSUMED, kind, at + 41)))  # fmt: skip
            if checkpoint % 1_000 == 0:
                old = CheckpointSettings(checkpoint_interval_ms=1_000)
                new = CheckpointSettings(checkpoint_interval_ms=2_000)
                out.append((CONFIG_CHANGES, job, ConfigChange(job, f"r{checkpoint}", "bench", at, old, new, ["checkpointInterval"], checkpoint)))  # fmt: skip
    return out[:total]


def publish(bootstrap: str, events: list[tuple[TopicSpec, str, Event]]) -> float:
    codec = EventCodec()
    producer = make_producer(bootstrap)
    began = time.monotonic()
    for index, (topic, key, event) in enumerate(events):
        producer.produce(topic.name(), key=key.encode(), value=codec.encode(event))
        if index % 10_000 == 0:
            producer.poll(0)
    producer.flush(120)
    return time.monotonic() - began


def caught_up(history: HistoryProcess, expected: dict[str, int]) -> bool:
    answer = history.get("/jobs/overview")
    if answer.status_code != 200:
        return False
    got = {j["sparkpoint.job_id"]: j["sparkpoint.checkpoints"] for j in answer.json()["jobs"]}
    return got == expected


def wait_until(condition: object, timeout_s: float) -> float:
    began = time.monotonic()
    while time.monotonic() - began < timeout_s:
        if condition():  # type: ignore[operator]
            return time.monotonic() - began
        time.sleep(0.02)
    raise RuntimeError(f"not within {timeout_s} s")


def changelog_records(bootstrap: str, group: str) -> int:
    from confluent_kafka import Consumer, TopicPartition

    topic = f"{group}-jobs-changelog"
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-count"})
    partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
    total = sum(
        consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in partitions
    )
    consumer.close()
    return total


def main() -> None:
    os.environ.setdefault("SPARKPOINT_TOPIC_PREFIX", "bench.")
    events = audit_events(EVENTS, JOBS_COUNT)
    expected: dict[str, int] = {}
    for _, job, event in events:
        if (
            isinstance(event, CheckpointLifecycleEvent)
            and event.event_type is CheckpointEventType.COMPLETED
        ):
            expected[job] = expected.get(job, 0) + 1
    with EmbeddedBroker() as broker, tempfile.TemporaryDirectory() as logs:
        create_topics(make_admin(broker.bootstrap))
        publish_s = publish(broker.bootstrap, events)
        history = HistoryProcess(broker.bootstrap, Path(logs))
        began = time.monotonic()
        history.start()
        first_ready_s = history.wait_ready(120)
        fold_s = wait_until(lambda: caught_up(history, expected), 600) + first_ready_s
        time.sleep(3)  # faust commits its offsets every 2.8 s
        records = changelog_records(broker.bootstrap, history.group)
        history.kill()
        previous = "SIGKILL"
        restarts = []
        for how in ("SIGTERM", "SIGTERM", "SIGTERM", "SIGKILL", "SIGKILL", "SIGKILL"):
            began = time.monotonic()
            history.start()
            history.wait_ready(120)
            ready_s = time.monotonic() - began
            wait_until(lambda: caught_up(history, expected), 120)
            serving_s = time.monotonic() - began
            restarts.append(
                {"after": previous, "ready_s": round(ready_s, 2), "serving_s": round(serving_s, 2)}
            )
            previous = how
            history.stop() if how == "SIGTERM" else history.kill()

    def median(after: str) -> float:
        return sorted(r["serving_s"] for r in restarts if r["after"] == after)[1]

    results = {
        "events": len(events),
        "jobs": JOBS_COUNT,
        "publish_s": round(publish_s, 2),
        "first_fold_s": round(fold_s, 2),
        "fold_events_per_s": round(len(events) / fold_s),
        "changelog_records": records,
        "restarts": restarts,
        "restart_to_serving_s_median_after_sigterm": median("SIGTERM"),
        "restart_to_serving_s_median_after_sigkill": median("SIGKILL"),
        "goal_s": GOAL_S,
        "goal_met": max(median("SIGTERM"), median("SIGKILL")) < GOAL_S,
    }
    print(json.dumps(results, indent=2))
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
