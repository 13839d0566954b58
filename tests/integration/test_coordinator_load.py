"""The coordinator service loaded past what it can do: it keeps its partitions (the consumer
group's heartbeat and the writers' work do not starve each other), keeps completing every job's
checkpoints, and says nothing about lost ownership."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import TopicPartition

from sparkpoint.common.avro import EventCodec
from sparkpoint.common.events import (
    AcknowledgeCheckpoint,
    JobRegistered,
    JobStatus,
    NotifyCheckpointComplete,
    StateHandle,
    StateHandleKind,
    Subtask,
    TriggerCheckpoint,
)
from sparkpoint.common.kafka import EventPublisher, EventSubscriber, make_consumer, make_producer
from sparkpoint.common.keygroups import key_group_range
from sparkpoint.common.topics import ACKS, CONTROL, JOBS
from tests.conftest import KafkaUnderTest
from tests.running_coordinator import Running, coordinator_in_thread, wait

JOBS_UNDER_LOAD = 200
INTERVAL = "10ms"
"""200 jobs asking for a checkpoint every 10 ms: 20,000 a second, far past what one instance on
any machine completes, so the service runs saturated for the whole test."""

LOAD_S = 10.0


class Fleet:
    """Stands in for the agents of many jobs (one producer, one consumer, one thread): every
    subtask acknowledges each trigger at once."""

    def __init__(self, bootstrap: str, codec: EventCodec, jobs: int, subtasks: int = 2) -> None:
        self.bootstrap, self.codec = bootstrap, codec
        self.jobs = [f"load-{uuid.uuid4().hex[:6]}-{j}" for j in range(jobs)]
        self.subtasks = [f"keyed-{i}" for i in range(subtasks)]
        self.publisher = EventPublisher(make_producer(bootstrap), codec)
        self.completed: dict[str, list[int]] = {job: [] for job in self.jobs}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fleet", daemon=True)

    def start(self) -> Fleet:
        n = len(self.subtasks)
        ranges = [key_group_range(128, n, i) for i in range(n)]
        for job in self.jobs:
            self.publisher.publish_nowait(
                JOBS,
                job,
                JobRegistered(
                    job, "load", "fleet", 0, JobStatus.RUNNING, n, 128,
                    [Subtask(s, i, r.start, r.end) for i, (s, r) in enumerate(zip(self.subtasks, ranges, strict=True))],
                    {"execution.checkpointing.interval": INTERVAL, "execution.checkpointing.timeout": "60s"},
                    int(time.time() * 1000),
                ),
            )  # fmt: skip
        self.publisher.flush()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self.publisher.close(5)

    def _run(self) -> None:
        subscriber = EventSubscriber(make_consumer(self.bootstrap), self.codec)
        topic = CONTROL.name()
        partitions = subscriber.consumer.list_topics(topic, timeout=10).topics[topic].partitions
        subscriber.assign([TopicPartition(topic, p, 0) for p in partitions])
        try:
            while not self._stop.is_set():
                for record in subscriber.poll(0.01, max_records=5000):
                    event = record.event
                    if isinstance(event, TriggerCheckpoint) and event.job_id in self.completed:
                        for subtask in self.subtasks:
                            self.publisher.publish_nowait(
                                ACKS, event.job_id, self._ack(event, subtask)
                            )
                        self.publisher.producer.poll(0)
                    elif (
                        isinstance(event, NotifyCheckpointComplete)
                        and event.job_id in self.completed
                    ):
                        self.completed[event.job_id].append(event.checkpoint_id)
        finally:
            subscriber.close()

    @staticmethod
    def _ack(trigger: TriggerCheckpoint, subtask: str) -> AcknowledgeCheckpoint:
        handle = StateHandle(
            f"{trigger.target_location}/{subtask}", StateHandleKind.KEYED_STATE, 64
        )
        return AcknowledgeCheckpoint(
            trigger.job_id, trigger.checkpoint_id, subtask, 0, int(time.time() * 1000), [handle],
            64, 0, 0, 0, 0, False, 64, 0, agent_id="fleet",
        )  # fmt: skip


@pytest.fixture
def coordinator(
    kafka: KafkaUnderTest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Running]:
    monkeypatch.setenv("SPARKPOINT_TOPIC_PREFIX", f"l{uuid.uuid4().hex[:10]}.")
    yield from coordinator_in_thread(kafka, tmp_path)


def test_a_saturated_coordinator_keeps_its_partitions_and_every_job_progresses(
    coordinator: Running, codec: EventCodec, caplog: pytest.LogCaptureFixture
) -> None:
    service = coordinator.service
    owned = sorted(service.writers)
    fleet = Fleet(coordinator.bootstrap, codec, JOBS_UNDER_LOAD).start()
    try:
        wait(lambda: len(service.jobs) == JOBS_UNDER_LOAD, what="every job registered")
        with caplog.at_level(logging.WARNING):
            started = {job: len(ids) for job, ids in fleet.completed.items()}
            time.sleep(LOAD_S)
            progressed = {job: len(ids) - started[job] for job, ids in fleet.completed.items()}
            lost_words = [
                r.getMessage()
                for r in caplog.records
                if "not ours" in r.getMessage() or "fenced" in r.getMessage()
            ]
    finally:
        fleet.stop()
    assert service.partitions_lost == 0 and sorted(service.writers) == owned
    assert lost_words == []
    assert sorted(service.jobs) == sorted(fleet.jobs)
    starved = [job for job, count in progressed.items() if count == 0]
    assert starved == [], f"{len(starved)} jobs completed no checkpoint under load"
    for job, ids in fleet.completed.items():
        assert ids == sorted(set(ids)), f"{job}: completions out of order or repeated"
