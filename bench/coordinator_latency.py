"""Trigger-to-completed latency of the coordinator service on the embedded broker, with agents
that acknowledge at once, and where its milliseconds go. Writes
bench/results/coordinator_latency.json.

Two runs, each a fresh coordinator (real Kafka I/O, transactions, timers, ``_metadata`` files;
the roots in memory unless ``--storage-dir`` says otherwise, see `recording.storage_dir`) on a
thread of this process, with a step trace installed (`sparkpoint.coordinator.service.trace`):
- one job of 8 subtasks, checkpoint interval 200 ms;
- 1,000 jobs of 4 subtasks, interval 1 s.

One "fleet" agent, in a process of its own so it takes no interpreter time from the coordinator,
stands in for all jobs (one producer, one consumer) and acknowledges every subtask as soon as it
sees a trigger. It records when it saw each trigger, when the broker acknowledged the last
answer, and when it saw the completion, on the same wall clock as the coordinator's trace.

Per checkpoint the breakdown is:

- trigger transaction: decided -> the transaction with the id counter and the trigger committed;
- delivery to the agent: committed -> the agent read the trigger (negative when the agent read
  it before the commit's answer reached the coordinator);
- ack produce: the agent read the trigger -> the broker acknowledged its last answer;
- ack consume: -> the coordinator's reader took the last answer off the broker;
- loop hop: -> the event loop handled it;
- metadata: -> ``_metadata`` written (scheduling the write included);
- completion: -> the coordinator completed the checkpoint (a loop hop);
- completion transaction: -> the notification's transaction committed;
- notification delivery: -> the agent read the notification.
"""

from __future__ import annotations

import argparse
import cProfile
import itertools
import multiprocessing
import os
import pstats
import shutil
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from recording import (
    cpu_since,
    percentiles,
    start_coordinator,
    storage_dir,
    thread_cpu,
    write_results,
)

from sparkpoint.coordinator.service.trace import wall_ms

PARTITIONS = 6
WARMUP_S = 3.0

SEGMENTS = (
    ("trigger transaction", "triggered", "trigger_committed"),
    ("delivery to the agent", "trigger_committed", "agent_saw_trigger"),
    ("ack produce", "agent_saw_trigger", "ack_delivered"),
    ("ack consume", "ack_delivered", "last_ack_received"),
    ("loop hop", "last_ack_received", "last_ack_handled"),
    ("metadata", "last_ack_handled", "metadata_written"),
    ("completion", "metadata_written", "completed"),
    ("completion transaction", "completed", "completion_committed"),
    ("notification delivery", "completion_committed", "agent_saw_completion"),
)


def fleet_agent(
    bootstrap: str,
    prefix: str,
    jobs: list[str],
    subtasks: int,
    interval: str,
    stop: Any,
    out: Any,
    partitions: int = PARTITIONS,
) -> None:
    """In its own process: registers the jobs, acknowledges every trigger at once, and sends back
    (job, checkpoint) -> the moments it saw the trigger, got its last answer acknowledged and saw
    the completion, plus each job's trigger timestamps."""
    os.environ["SPARKPOINT_TOPIC_PREFIX"] = prefix
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
    from sparkpoint.common.kafka import (
        ConsumerProfile,
        EventPublisher,
        EventSubscriber,
        make_consumer,
        make_producer,
    )
    from sparkpoint.common.keygroups import key_group_range
    from sparkpoint.common.topics import ACKS, CONTROL, JOBS

    codec = EventCodec()
    # sent at once, as the agents' own producers do (no linger)
    publisher = EventPublisher(make_producer(bootstrap, linger_ms=0), codec)
    names = [f"keyed-{i}" for i in range(subtasks)]
    ranges = [key_group_range(128, subtasks, i) for i in range(subtasks)]
    for job in jobs:
        registration = JobRegistered(
            job, "bench", "fleet", 0, JobStatus.RUNNING, subtasks, 128,
            [Subtask(s, i, r.start, r.end) for i, (s, r) in enumerate(zip(names, ranges, strict=True))],
            {"execution.checkpointing.interval": interval, "execution.checkpointing.timeout": "30s"},
            int(wall_ms()),
        )  # fmt: skip
        publisher.publish_nowait(JOBS, job, registration)
    publisher.flush()
    marks: dict[tuple[str, int], dict[str, float]] = {}
    trigger_times: dict[str, list[int]] = {j: [] for j in jobs}
    lock = threading.Lock()

    def delivered(key: tuple[str, int]) -> Any:
        def done(error: Any, message: Any) -> None:
            with lock:
                marks.setdefault(key, {})["ack_delivered"] = wall_ms()

        return done

    publisher._ensure_poller()  # delivery reports as they come, on the publisher's own thread
    subscriber = EventSubscriber(make_consumer(bootstrap, profile=ConsumerProfile.CONTROL), codec)
    subscriber.assign([TopicPartition(CONTROL.name(), p, 0) for p in range(partitions)])
    mine = set(jobs)
    while not stop.is_set():
        for record in subscriber.poll(0.01, max_records=5000):
            event = record.event
            if record.key not in mine:
                continue
            if isinstance(event, TriggerCheckpoint):
                key = (event.job_id, event.checkpoint_id)
                with lock:
                    marks.setdefault(key, {})["agent_saw_trigger"] = wall_ms()
                    marks[key]["trigger_timestamp"] = event.trigger_timestamp
                trigger_times[event.job_id].append(event.trigger_timestamp)
                for subtask in names:
                    ack = AcknowledgeCheckpoint(
                        event.job_id, event.checkpoint_id, subtask, 0, int(wall_ms()),
                        [StateHandle(f"{event.target_location}/{subtask}", StateHandleKind.KEYED_STATE, 64)],
                        64, 0, 0, 0, 0, False, 64, 0, agent_id="fleet",
                    )  # fmt: skip
                    publisher.publish_nowait(ACKS, event.job_id, ack, delivered(key))
            elif isinstance(event, NotifyCheckpointComplete):
                key = (event.job_id, event.checkpoint_id)
                with lock:
                    marks.setdefault(key, {})["agent_saw_completion"] = wall_ms()
                    marks[key]["completed_timestamp"] = event.completed_timestamp
    subscriber.close()
    publisher.close(5)
    with lock:
        out.send((marks, trigger_times))


def scenario(
    bootstrap: str,
    storage: Path,
    name: str,
    jobs: int,
    subtasks: int,
    interval_ms: int,
    seconds: float,
    cprofile: bool = False,
) -> dict[str, object]:
    from sparkpoint.coordinator.service.trace import StepTrace

    prefix = f"b{uuid.uuid4().hex[:8]}."
    os.environ["SPARKPOINT_TOPIC_PREFIX"] = prefix
    root = Path(tempfile.mkdtemp(prefix="sparkpoint-bench-", dir=storage))
    service = start_coordinator(bootstrap, root, PARTITIONS)
    trace = service.trace = StepTrace()
    job_ids = [f"bench-{uuid.uuid4().hex[:6]}-{j}" for j in range(jobs)]
    context = multiprocessing.get_context("spawn")
    stop = context.Event()
    receive, send = context.Pipe(duplex=False)
    agent = context.Process(
        target=fleet_agent,
        args=(bootstrap, prefix, job_ids, subtasks, f"{interval_ms}ms", stop, send),
    )
    agent.start()
    deadline = time.monotonic() + 120
    while len(service.jobs) < jobs and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(WARMUP_S)
    window = (wall_ms(), wall_ms() + seconds * 1000)
    threads_before = thread_cpu()
    profiler = cProfile.Profile()
    if cprofile:  # the event loop's thread: enabled and disabled from there
        service._post(profiler.enable)
    cpu = time.process_time()
    time.sleep(seconds)
    cpu = time.process_time() - cpu
    if cprofile:
        service._post(profiler.disable)
        time.sleep(0.5)
    threads = cpu_since(threads_before)
    stop.set()
    agent_marks, trigger_times = receive.recv()
    agent.join(30)
    service.stop()
    time.sleep(1)
    steps: list[dict[str, float]] = []
    for checkpoint in trace.traces():
        at = {**checkpoint.at, **agent_marks.get((checkpoint.job_id, checkpoint.checkpoint_id), {})}
        if window[0] <= at.get("triggered", 0) < window[1] and "agent_saw_completion" in at:
            steps.append(at)
    breakdown = {
        label: percentiles([round(s[end] - s[begin], 2) for s in steps if begin in s and end in s])
        for label, begin, end in SEGMENTS
    }
    latency = [s["completed_timestamp"] - s["trigger_timestamp"] for s in steps]
    coordinator = [round(s["completion_committed"] - s["triggered"], 2) for s in steps]
    observed = [round(s["agent_saw_completion"] - s["triggered"], 2) for s in steps]
    gaps = [b - a for times in trigger_times.values() for a, b in itertools.pairwise(times)]
    # A gap of about two intervals is a periodic trigger dropped because the previous checkpoint
    # was still pending (max concurrent 1): that is scheduling policy, not timer imprecision.
    on_time = [abs(gap - interval_ms) for gap in gaps if gap < 1.5 * interval_ms]
    skipped = sum(1 for gap in gaps if gap >= 1.5 * interval_ms)
    result: dict[str, object] = {
        "jobs": jobs,
        "subtasks_per_job": subtasks,
        "interval_ms": interval_ms,
        "measured_seconds": seconds,
        "completed_checkpoints": len(steps),
        "completions_per_s": round(len(steps) / seconds, 1),
        "trigger_to_completed_ms": percentiles(latency),
        "decided_to_completion_committed_ms": percentiles(coordinator),
        "decided_to_agent_sees_completion_ms": percentiles(observed),
        "breakdown_ms": breakdown,
        "trigger_jitter_ms": percentiles(on_time),
        "periodic_triggers_skipped_while_pending": skipped,
        "partitions_lost": service.partitions_lost,
        "coordinator_cpu_s_per_1000_checkpoints": round(1000 * cpu / max(1, len(steps)), 2),
        "cpu_s_by_thread": threads,
    }
    figures = percentiles(latency)
    print(
        f"  {name}: {len(steps)} checkpoints, trigger->completed p50 {figures.get('p50')} ms "
        f"p99 {figures.get('p99')} ms; {skipped} periodic triggers skipped while one was "
        f"pending; {service.partitions_lost} partitions lost"
    )
    print(f"    {'step':<24}{'p50':>8}{'p90':>8}{'p99':>8}  ms")
    for label, figures in breakdown.items():
        print(
            f"    {label:<24}{figures.get('p50', 0):>8.1f}{figures.get('p90', 0):>8.1f}"
            f"{figures.get('p99', 0):>8.1f}"
        )
    print(
        f"    coordinator CPU: {result['coordinator_cpu_s_per_1000_checkpoints']} s per 1,000 "
        f"checkpoints; seconds by thread: {threads}"
    )
    if cprofile:
        print("    the event loop's thread, by own time:")
        stats = pstats.Stats(profiler, stream=sys.stdout)
        stats.sort_stats("tottime").print_stats(25)
    return result


def guarantee_cost(bootstrap: str, rounds: int = 300) -> dict[str, object]:
    """What the trigger's transaction costs against publishing the same three records without
    one: the store record with the id counter, the TRIGGERED event and the trigger, each on its
    topic's partition 0. Transactional: begin, produce, commit (as the coordinator's writer does;
    its fixed transactional.id is what fences a previous owner). Plain: an idempotent producer
    (acks=all) and its delivery reports, which durability alone would need."""
    from sparkpoint.common.avro import EventCodec
    from sparkpoint.common.events import (
        CheckpointEventType,
        CheckpointLifecycleEvent,
        CheckpointStoreRecord,
        SnapshotType,
        TriggerCheckpoint,
    )
    from sparkpoint.common.kafka import make_admin, make_producer
    from sparkpoint.common.topics import CHECKPOINT_EVENTS, CHECKPOINT_STORE, CONTROL, create_topics

    os.environ["SPARKPOINT_TOPIC_PREFIX"] = f"g{uuid.uuid4().hex[:8]}."
    create_topics(make_admin(bootstrap), partitions=PARTITIONS)
    codec = EventCodec()
    now = int(wall_ms())
    records = [
        (CHECKPOINT_STORE.name(), codec.encode(CheckpointStoreRecord("job", 1, 7, [], now))),
        (
            CHECKPOINT_EVENTS.name(),
            codec.encode(
                CheckpointLifecycleEvent(
                    "job", 1, 7, CheckpointEventType.TRIGGERED, SnapshotType.CHECKPOINT, now
                )
            ),
        ),
        (
            CONTROL.name(),
            codec.encode(
                TriggerCheckpoint(
                    "job", 1, 7, now, SnapshotType.CHECKPOINT, True, False, "/tmp/chk-7"
                )
            ),
        ),
    ]
    transactional = make_producer(
        bootstrap, transactional_id=f"{uuid.uuid4().hex}", client_id="bench-txn", linger_ms=0
    )
    transactional.init_transactions(10)
    plain = make_producer(bootstrap, client_id="bench-plain", linger_ms=0)
    with_txn: list[float] = []
    without: list[float] = []
    for _ in range(rounds):
        start = wall_ms()
        transactional.begin_transaction()
        for topic, value in records:
            transactional.produce(topic, value=value, key=b"job", partition=0)
        transactional.commit_transaction(10)
        with_txn.append(round(wall_ms() - start, 2))
        start = wall_ms()
        for topic, value in records:
            plain.produce(topic, value=value, key=b"job", partition=0)
        plain.flush(10)
        without.append(round(wall_ms() - start, 2))
    transaction, idempotent = percentiles(with_txn), percentiles(without)
    print(
        f"  what the trigger's transaction costs: {transaction.get('p50')} ms p50 against "
        f"{idempotent.get('p50')} ms for the same records produced idempotently without one"
    )
    return {"transaction_ms": transaction, "idempotent_produce_ms": idempotent}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=1000, help="jobs of the many-jobs run")
    parser.add_argument("--seconds", type=float, default=30, help="measured seconds per run")
    parser.add_argument(
        "--cprofile", action="store_true", help="profile the event loop of the many-jobs run"
    )
    parser.add_argument(
        "--storage-dir", help="where the checkpoint roots go (default: /dev/shm where it exists)"
    )
    args = parser.parse_args()
    from sparkpoint.common.broker import EmbeddedBroker
    from sparkpoint.coordinator.main import tune_collector

    storage = Path(
        tempfile.mkdtemp(prefix="sparkpoint-latency-", dir=storage_dir(args.storage_dir))
    )
    tune_collector()  # as `sparkpoint coordinator` does; the service runs in this process
    print(
        "coordinator latency on the embedded broker, agents acknowledging at once; "
        f"checkpoint roots in {storage.parent}"
    )
    with EmbeddedBroker() as broker:
        one_job = scenario(broker.bootstrap, storage, "1 job x 8 subtasks @ 200 ms", 1, 8, 200, 20)
        many = scenario(
            broker.bootstrap,
            storage,
            f"{args.jobs} jobs x 4 subtasks @ 1 s",
            args.jobs,
            4,
            1000,
            args.seconds,
            args.cprofile,
        )
        guarantee = guarantee_cost(broker.bootstrap)
    shutil.rmtree(storage, ignore_errors=True)
    results = {
        "benchmark": "coordinator_latency",
        "storage": str(storage.parent),
        "guarantee_cost": guarantee,
        "one_job_8_subtasks": one_job,
        f"{args.jobs}_jobs_4_subtasks": many,
    }
    path = write_results("coordinator_latency", results)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
