"""Trigger-to-completed latency of the coordinator service on the embedded broker, with agents
that acknowledge at once. Writes bench/results/coordinator_latency.json.

Two runs, each a fresh coordinator (real Kafka I/O, transactions, timers, ``_metadata`` on
local disk):
- one job of 8 subtasks, checkpoint interval 200 ms;
- 200 jobs of 4 subtasks, interval 1 s.

One "fleet" agent stands in for all jobs (one producer, one consumer) and acknowledges every
subtask as soon as it sees a trigger. Per completed checkpoint it records the coordinator-side
latency (``completed_timestamp - trigger_timestamp``) and the agent-side one (trigger timestamp
to the moment the agent read the completion). Trigger jitter is how far each job's consecutive
triggers are from one interval apart.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import tempfile
import threading
import time
import uuid
from pathlib import Path

from confluent_kafka import TopicPartition
from recording import percentiles, write_results

from services.common.avro import EventCodec
from services.common.broker import EmbeddedBroker, free_port
from services.common.events import (
    AcknowledgeCheckpoint,
    JobRegistered,
    JobStatus,
    NotifyCheckpointComplete,
    StateHandle,
    StateHandleKind,
    Subtask,
    TriggerCheckpoint,
)
from services.common.kafka import (
    EventPublisher,
    EventSubscriber,
    make_admin,
    make_consumer,
    make_producer,
)
from services.common.keygroups import key_group_range
from services.common.settings import CheckpointConfig
from services.common.topics import ACKS, CONTROL, JOBS, create_topics
from services.coordinator.main import serve
from services.coordinator.service import CoordinatorService, ServiceSettings

PARTITIONS = 6
WARMUP_S = 3.0


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class FleetAgent:
    def __init__(
        self, bootstrap: str, codec: EventCodec, jobs: int, subtasks: int, interval: str
    ) -> None:
        self.bootstrap, self.codec = bootstrap, codec
        self.jobs = [f"bench-{uuid.uuid4().hex[:6]}-{j}" for j in range(jobs)]
        self.subtasks = [f"keyed-{i}" for i in range(subtasks)]
        self.interval = interval
        self.publisher = EventPublisher(make_producer(bootstrap), codec)
        self.latency_ms: list[int] = []
        self.observed_ms: list[int] = []
        self.trigger_times: dict[str, list[int]] = {j: [] for j in self.jobs}
        self.triggered_at: dict[tuple[str, int], int] = {}
        self.measuring = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        n = len(self.subtasks)
        ranges = [key_group_range(128, n, i) for i in range(n)]
        for job in self.jobs:
            registration = JobRegistered(
                job, "bench", "fleet", 0, JobStatus.RUNNING, n, 128,
                [Subtask(s, i, r.start, r.end) for i, (s, r) in enumerate(zip(self.subtasks, ranges, strict=True))],
                {"execution.checkpointing.interval": self.interval, "execution.checkpointing.timeout": "30s"},
                now_ms(),
            )  # fmt: skip
            self.publisher.publish_nowait(JOBS, job, registration)
        self.publisher.flush()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self.publisher.close()

    def _run(self) -> None:
        subscriber = EventSubscriber(make_consumer(self.bootstrap), self.codec)
        subscriber.assign([TopicPartition(CONTROL.name(), p, 0) for p in range(PARTITIONS)])
        mine = set(self.jobs)
        while not self._stop.is_set():
            for record in subscriber.poll(0.01, max_records=5000):
                event = record.event
                if record.key not in mine:
                    continue
                if isinstance(event, TriggerCheckpoint):
                    self.trigger_times[event.job_id].append(event.trigger_timestamp)
                    self.triggered_at[(event.job_id, event.checkpoint_id)] = event.trigger_timestamp
                    for subtask in self.subtasks:
                        ack = AcknowledgeCheckpoint(
                            event.job_id, event.checkpoint_id, subtask, 0, now_ms(),
                            [StateHandle(f"{event.target_location}/{subtask}", StateHandleKind.KEYED_STATE, 64)],
                            64, 0, 0, 0, 0, False, 64, 0, agent_id="fleet",
                        )  # fmt: skip
                        self.publisher.publish_nowait(ACKS, event.job_id, ack)
                    self.publisher.producer.poll(0)
                elif isinstance(event, NotifyCheckpointComplete) and self.measuring:
                    triggered = self.triggered_at.get((event.job_id, event.checkpoint_id))
                    if triggered is not None:
                        self.latency_ms.append(event.completed_timestamp - triggered)
                        self.observed_ms.append(now_ms() - triggered)
        subscriber.close()


def scenario(
    bootstrap: str,
    codec: EventCodec,
    name: str,
    jobs: int,
    subtasks: int,
    interval_ms: int,
    seconds: float,
) -> dict[str, object]:
    os.environ["SPARKPOINT_TOPIC_PREFIX"] = f"b{uuid.uuid4().hex[:8]}."
    create_topics(make_admin(bootstrap), partitions=PARTITIONS)
    root = Path(tempfile.mkdtemp(prefix="sparkpoint-bench-"))
    defaults = CheckpointConfig(
        checkpoint_dir=str(root / "checkpoints"), savepoint_dir=str(root / "savepoints")
    )
    service = CoordinatorService(ServiceSettings(bootstrap, defaults))
    thread = threading.Thread(
        target=lambda: asyncio.run(serve(service, "127.0.0.1", free_port())), daemon=True
    )
    thread.start()
    service.ready.wait(30)
    agent = FleetAgent(bootstrap, codec, jobs, subtasks, f"{interval_ms}ms")
    agent.start()
    deadline = time.monotonic() + 60
    while len(service.jobs) < jobs and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(WARMUP_S)
    agent.measuring = True
    time.sleep(seconds)
    agent.measuring = False
    agent.stop()
    service.stop()
    thread.join(20)
    gaps = [b - a for times in agent.trigger_times.values() for a, b in itertools.pairwise(times)]
    # A gap of about two intervals is a periodic trigger dropped because the previous checkpoint
    # was still pending (max concurrent 1): that is scheduling policy, not timer imprecision.
    on_time = [abs(gap - interval_ms) for gap in gaps if gap < 1.5 * interval_ms]
    skipped = sum(1 for gap in gaps if gap >= 1.5 * interval_ms)
    result = {
        "jobs": jobs,
        "subtasks_per_job": subtasks,
        "interval_ms": interval_ms,
        "measured_seconds": seconds,
        "completed_checkpoints": len(agent.latency_ms),
        "completions_per_s": round(len(agent.latency_ms) / seconds, 1),
        "trigger_to_completed_ms": percentiles(agent.latency_ms),
        "trigger_to_agent_sees_completion_ms": percentiles(agent.observed_ms),
        "trigger_jitter_ms": percentiles(on_time),
        "periodic_triggers_skipped_while_pending": skipped,
    }
    latency = result["trigger_to_completed_ms"]
    print(
        f"  {name}: {result['completed_checkpoints']} checkpoints, trigger->completed p50 {latency.get('p50')} ms "  # type: ignore[union-attr]
        f"p99 {latency.get('p99')} ms; jitter p99 {result['trigger_jitter_ms'].get('p99')} ms; "
        f"{skipped} periodic triggers skipped while one was pending"  # type: ignore[union-attr]
    )
    return result


def main() -> None:
    codec = EventCodec()
    print("coordinator latency on the embedded broker, agents acknowledging at once")
    with EmbeddedBroker() as broker:
        one_job = scenario(broker.bootstrap, codec, "1 job x 8 subtasks @ 200 ms", 1, 8, 200, 20)
        many = scenario(broker.bootstrap, codec, "200 jobs x 4 subtasks @ 1 s", 200, 4, 1000, 30)
    results = {
        "benchmark": "coordinator_latency",
        "one_job_8_subtasks": one_job,
        "200_jobs_4_subtasks": many,
    }
    path = write_results("coordinator_latency", results)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
