"""Live input: records keep arriving while the job runs (what ``make run`` does), on the real
broker and real Spark. A round reads each partition up to the end it had when it was planned
(or for at most its time bound), so a record is processed and committed within seconds; the
agent's heartbeats carry its progress (records in and out, each partition's position and end),
which the coordinator shows in REST, Prometheus and Flink's vertex metrics; and exactly-once
holds through kill points while a producer writes the whole time.

Before this, a round of an unbounded source read until 50,000 records, three empty polls or the
end of the partition: with a producer writing 500 records a second per partition none came
soon, and the demo's first output appeared after about 100 s."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from sparkpoint.agent.example import (
    Payment,
    ensure_topic,
    generate,
    payments,
    reference_output,
)
from sparkpoint.agent.job import KafkaSource
from sparkpoint.agent.rounds.fetch import FetchTask, read_ranges
from sparkpoint.agent.sources.kafka import KafkaSourceReader
from sparkpoint.common.events import JobStatus
from sparkpoint.common.kafka import consumer_config, producer_config
from tests.agent_jobs import SlowPerRecord, build
from tests.conftest import KafkaUnderTest
from tests.integration.test_agent import difference, in_process, read_output, unique
from tests.running_coordinator import Running, coordinator_in_thread, wait

ROOT = Path(__file__).resolve().parents[2]

INTERVAL_S = 0.004
"""The live producer writes one payment every 4 ms (250 a second), for the whole test."""

COMMITTED_WITHIN_S = 10.0
"""How soon a record written while the job runs must be committed, checkpoints every second:
a few rounds and a checkpoint, with room for a loaded 2-core machine (measured here: 1-3 s).
It was about 100 s before rounds were bounded by what had arrived."""


class LiveProducer:
    """Writes the example job's payments one at a time, every `INTERVAL_S`, until stopped;
    remembers when each was written."""

    def __init__(self, bootstrap: str, topic: str, linger_ms: int = 5) -> None:
        self.producer = Producer(
            producer_config(bootstrap, client_id="live-producer") | {"linger.ms": linger_ms}
        )
        self.topic = topic
        self.written: dict[int, float] = {}
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="live-producer", daemon=True)

    def start(self) -> LiveProducer:
        self.thread.start()
        return self

    def _run(self) -> None:
        started = time.monotonic()
        for n, payment in enumerate(payments(None)):
            if self.stopping.is_set():
                break
            self.producer.produce(self.topic, payment.to_json(), payment.account.encode())
            self.written[payment.id] = time.time()
            self.producer.poll(0)
            ahead = (n + 1) * INTERVAL_S - (time.monotonic() - started)
            if ahead > 0:
                time.sleep(ahead)
        assert self.producer.flush(30) == 0

    def stop(self) -> list[Payment]:
        """Stops writing; every payment written, delivered."""
        self.stopping.set()
        self.thread.join(60)
        return list(payments(len(self.written)))


@pytest.fixture(scope="module")
def coordinator(
    kafka: KafkaUnderTest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Running]:
    with pytest.MonkeyPatch.context() as env:
        env.setenv("SPARKPOINT_TOPIC_PREFIX", f"t{uuid.uuid4().hex[:10]}.")
        yield from coordinator_in_thread(kafka, tmp_path_factory.mktemp("live"))


def new_topic(bootstrap: str, partitions: int = 4) -> str:
    topic = f"payments-{uuid.uuid4().hex[:8]}"
    ensure_topic(bootstrap, topic, partitions)
    return topic


# --- reading a partition that keeps growing ------------------------------------------------------


def task(bootstrap: str, topic: str, partition: int, start: int, **kwargs: Any) -> FetchTask:
    return FetchTask(bootstrap, topic, partition, start, None, 100_000, "account", 128, 2, **kwargs)


def high_watermark(bootstrap: str, topic: str, partition: int) -> int:
    consumer = Consumer(consumer_config(bootstrap))
    try:
        return int(
            consumer.get_watermark_offsets(TopicPartition(topic, partition), 10, cached=False)[1]
        )
    finally:
        consumer.close()


def test_a_round_ends_at_the_end_it_planned_while_a_producer_keeps_writing(
    kafka: KafkaUnderTest,
) -> None:
    """The partition never reports its end while records keep arriving (the embedded broker
    does not): the read stops at the planned end, and the next read goes on from there, no
    record skipped or read twice."""
    topic = new_topic(kafka.bootstrap, partitions=1)
    producer = LiveProducer(kafka.bootstrap, topic).start()
    try:
        wait(lambda: high_watermark(kafka.bootstrap, topic, 0) > 200, 30, "records")
        offsets: list[int] = []
        start = 0
        for _ in range(3):
            until = high_watermark(kafka.bootstrap, topic, 0)
            (read,) = read_ranges(
                [task(kafka.bootstrap, topic, 0, start, until=until, max_duration_s=30)]
            )
            assert read.next_offset >= until and not read.early
            offsets += read.offsets
            start = read.next_offset
    finally:
        producer.stop()
    assert offsets == list(range(len(offsets)))


def test_a_planned_end_reaches_the_whole_batch_the_broker_counts_short(
    kafka: KafkaUnderTest,
) -> None:
    """One batch of 500 records: the embedded broker's high watermark is its base offset + 1,
    a real broker's its end. Either way the read planned to that watermark takes all 500."""
    topic = new_topic(kafka.bootstrap, partitions=1)
    producer = Producer(producer_config(kafka.bootstrap) | {"linger.ms": 200})
    for payment in payments(500):
        producer.produce(topic, payment.to_json(), payment.account.encode(), partition=0)
    assert producer.flush(30) == 0
    until = high_watermark(kafka.bootstrap, topic, 0)
    if kafka.is_embedded:
        assert until < 500  # the defect this design must survive
    (read,) = read_ranges([task(kafka.bootstrap, topic, 0, 0, until=until, max_duration_s=30)])
    assert read.offsets == list(range(500)) and read.next_offset == 500


def test_a_read_resuming_past_a_short_watermark_takes_the_rest_and_says_more_may_follow(
    kafka: KafkaUnderTest,
) -> None:
    """One batch of 1,000 records, read 500 at a time: on the embedded broker the high
    watermark is 1, so the second read starts past it, where the broker reports the end of the
    partition at offset 1. That stale report does not end the read (it ended it with nothing
    read, and the driver, seeing the watermark behind the position, never read the partition
    again: the drain test's hang). A read that took records beyond its planned end, or without
    one, says more may follow, so the driver reads on until a read finds nothing."""
    topic = new_topic(kafka.bootstrap, partitions=1)
    producer = Producer(producer_config(kafka.bootstrap) | {"linger.ms": 200})
    for payment in payments(1000):
        producer.produce(topic, payment.to_json(), payment.account.encode(), partition=0)
    assert producer.flush(30) == 0
    until = high_watermark(kafka.bootstrap, topic, 0)
    half = {"max_records": 500, "max_duration_s": 30}
    (first,) = read_ranges([replace(task(kafka.bootstrap, topic, 0, 0, until=until), **half)])
    assert first.offsets == list(range(500)) and first.early
    (rest,) = read_ranges([replace(task(kafka.bootstrap, topic, 0, 500), **half)])
    assert rest.offsets == list(range(500, 1000)) and rest.next_offset == 1000
    assert rest.more_may_follow, "read on: the end of the partition is unknown"
    (nothing,) = read_ranges([task(kafka.bootstrap, topic, 0, 1000)])
    assert not nothing.offsets and not nothing.more_may_follow

    # the driver's side: half read, and a read that found nothing (too slow a first fetch on a
    # loaded machine, say) must not leave the rest unread while the watermark stays behind
    reader = KafkaSourceReader(KafkaSource([topic]), kafka.bootstrap, parallelism=1)
    try:
        reader.start({(topic, 0): 500})
        planned = reader.plan()
        assert planned[(topic, 0)].until == 1000, "planned to the partition's true end"
        reader.positions[(topic, 0)] = 1000
        assert reader.plan() == {}, "then read to its end"
    finally:
        reader.close()


def test_a_read_stops_at_its_time_bound_says_more_may_follow_and_the_next_goes_on(
    kafka: KafkaUnderTest,
) -> None:
    """A backlog far larger than a round can read in its time: the read stops at its bound,
    flagged early (the partition is read again at once), and the next read goes on from there."""
    topic = new_topic(kafka.bootstrap, partitions=1)
    producer = Producer(producer_config(kafka.bootstrap) | {"linger.ms": 5, "batch.size": 1_000})
    for payment in payments(50_000):
        producer.produce(topic, payment.to_json(), partition=0)
        producer.poll(0)
    assert producer.flush(60) == 0
    until = high_watermark(kafka.bootstrap, topic, 0)
    # fetches of one small batch each: the backlog takes thousands of round trips, far beyond
    # the bound on any machine (with the defaults a fast machine reads 100,000 records in 0.15 s)
    slow = (
        ("message.max.bytes", "1000"),
        ("fetch.max.bytes", "1000"),
        ("max.partition.fetch.bytes", "1"),
    )
    # the worker's kept consumer meets the new topic first (learning of a topic takes it 0.4-1 s)
    read_ranges([task(kafka.bootstrap, topic, 0, 0, until=1, max_duration_s=30, properties=slow)])
    (first,) = read_ranges(
        [task(kafka.bootstrap, topic, 0, 0, until=until, max_duration_s=0.2, properties=slow)]
    )
    assert first.early and 0 < len(first.offsets) < 50_000
    assert first.offsets == list(range(len(first.offsets)))
    (after,) = read_ranges(
        [
            task(
                kafka.bootstrap,
                topic,
                0,
                first.next_offset,
                until=until,
                max_duration_s=1.0,
                properties=slow,
            )
        ]
    )
    assert after.offsets and after.offsets[0] == first.next_offset


def test_one_read_takes_several_partitions_each_from_its_own_position_with_a_kept_consumer(
    kafka: KafkaUnderTest,
) -> None:
    """Stage-1 tasks keep their consumer between rounds: it must read whatever partitions and
    positions the next task names, rewinds included (a restore)."""
    topic = new_topic(kafka.bootstrap, partitions=2)
    producer = Producer(producer_config(kafka.bootstrap))
    for payment in payments(400):
        producer.produce(topic, payment.to_json(), partition=payment.id % 2)
    assert producer.flush(30) == 0
    first = read_ranges(
        [
            task(kafka.bootstrap, topic, 0, 150, until=200, max_duration_s=30),
            task(kafka.bootstrap, topic, 1, 10, until=200, max_duration_s=30),
        ]
    )
    assert [(r.offsets[0], r.next_offset) for r in first] == [(150, 200), (10, 200)]
    (again,) = read_ranges([task(kafka.bootstrap, topic, 0, 5, until=200, max_duration_s=30)])
    assert again.offsets == list(range(5, 200))


def test_max_offsets_per_trigger_bounds_a_round_over_every_partition(kafka: KafkaUnderTest) -> None:
    topic = new_topic(kafka.bootstrap, partitions=4)
    producer = Producer(producer_config(kafka.bootstrap) | {"linger.ms": 0})
    for payment in payments(2_000):
        producer.produce(topic, payment.to_json(), partition=payment.id % 4)
    assert producer.flush(30) == 0
    reader = KafkaSourceReader(
        KafkaSource([topic], max_offsets_per_trigger=400), kafka.bootstrap, parallelism=2
    )
    try:
        reader.start(None)
        planned = reader.plan()
    finally:
        reader.close()
    assert len(planned) == 4 and sum(p.max_records for p in planned.values()) <= 400
    assert all(p.until is not None and p.until > 0 for p in planned.values())


# --- a job on live input -----------------------------------------------------------------------------


DEBLOAT = "taskmanager.network.memory.buffer-debloat."


def test_buffer_debloating_bounds_each_read_to_what_a_round_does_in_its_target(
    coordinator: Running, spark: Any
) -> None:
    """With debloating on, a round reads what a round processes in the target time (its fixed
    cost and cost per record fitted to the rounds before), below the source's own bound while
    a backlog is read, each partition its share; the output stays exact."""
    topic, output, records = new_topic(coordinator.bootstrap), unique("stats"), 24_000
    ensure_topic(coordinator.bootstrap, output)
    assert generate(coordinator.bootstrap, topic, records) == records
    settings = {DEBLOAT + "enabled": "true", DEBLOAT + "target": "1 s"}
    job = build(unique("debloat"), topic, output, max_records=2_500, settings=settings)
    job = replace(job, function=SlowPerRecord(0.2))  # 0.1 ms a record over two subtasks
    agent = in_process(job, coordinator, spark)
    assert agent.run() is JobStatus.FINISHED

    reads = [read for read in agent.stages.bounded_reads if read]
    assert reads, "the rounds were measured and bounded the reads after them"
    assert all(taken <= bound for read in reads for bound, taken in read), reads
    assert min(bound for read in reads for bound, _ in read) < 2_500, reads  # below its own
    got = read_output(coordinator.bootstrap, output)
    assert got == reference_output(payments(records), end_of_input=True), "exact"


def committed_seen(
    bootstrap: str, topic: str, seen: dict[int, float], stop: threading.Event
) -> None:
    """When each payment's running total first became visible to a read_committed reader."""
    consumer = Consumer(consumer_config(bootstrap, read_committed=True) | {"fetch.wait.max.ms": 10})
    partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
    consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
    try:
        while not stop.is_set():
            for message in consumer.consume(1000, 0.1):
                if message.error() is None:
                    row = json.loads(message.value() or b"{}")
                    if row.get("kind") == "total":
                        seen.setdefault(int(row["id"]), time.time())
    finally:
        consumer.close()


def test_records_written_while_the_job_runs_are_committed_within_seconds_and_progress_shows(
    coordinator: Running, spark: Any
) -> None:
    topic, output = new_topic(coordinator.bootstrap), unique("stats")
    ensure_topic(coordinator.bootstrap, output)
    job = build(unique("live"), topic, output, max_records=50_000, bounded=False)
    producer = LiveProducer(coordinator.bootstrap, topic).start()
    seen: dict[int, float] = {}
    stop = threading.Event()
    reader = threading.Thread(
        target=committed_seen, args=(coordinator.bootstrap, output, seen, stop)
    )
    reader.start()
    agent = in_process(job, coordinator, spark)
    running = threading.Thread(target=agent.run, daemon=True)
    running.start()
    try:
        wait(lambda: job.id in coordinator.service.jobs, 120, "the job registered")
        measured_from = time.time() + 5  # Spark's workers warm, the backlog of the start read
        time.sleep(5 + 10 + COMMITTED_WITHIN_S)
        measured_to = time.time() - COMMITTED_WITHIN_S  # 10 s of records measured
        with coordinator.client() as client:
            progress = client.get(f"/jobs/{job.id}/progress").json()
            details = client.get(f"/jobs/{job.id}").json()
            source, keyed = (v["id"] for v in details["vertices"])
            lag = client.get(
                f"/jobs/{job.id}/vertices/{source}/subtasks/metrics",
                params={"get": "pendingRecords"},
            ).json()
            pressure = client.get(f"/jobs/{job.id}/vertices/{source}/backpressure").json()
            metrics = client.get("/metrics").text
    finally:
        written = producer.stop()
        agent.stop()
        running.join(60)
        stop.set()
        reader.join(30)

    due = {i: at for i, at in producer.written.items() if measured_from <= at <= measured_to}
    positive = {p.id for p in written if p.amount > 0}
    late = {i: seen[i] - at for i, at in due.items() if i in positive and i in seen}
    missing = [i for i in due if i in positive and i not in seen]
    assert due and not missing, f"{len(missing)} of {len(due)} never committed"
    assert max(late.values()) <= COMMITTED_WITHIN_S, sorted(late.values())[-5:]

    assert progress["reported"] and not progress["stalled"] and progress["records_in"] > 0
    assert len(progress["partitions"]) == 4
    assert all(p["position"] > 0 for p in progress["partitions"])
    assert details["vertices"][0]["metrics"]["write-records"] > 0
    assert lag[0]["id"] == "pendingRecords" and lag[0]["sum"] >= 0 and keyed != source
    assert pressure["backpressureLevel"] in ("ok", "low", "high")
    assert f'flink_taskmanager_job_task_operator_pendingRecords{{job_id="{job.id}"' in metrics
    assert f'flink_taskmanager_job_task_numRecordsInPerSecond{{job_id="{job.id}"' in metrics


def test_without_a_backlog_rounds_start_at_most_once_per_buffer_timeout(
    coordinator: Running, spark: Any
) -> None:
    """``execution.buffer-timeout.interval``: records arriving one at a time are processed in a
    round per interval (what arrived meanwhile), not in rounds back to back; they still arrive.
    Unpaced, this input runs a round every few hundred ms or less."""
    topic, output = new_topic(coordinator.bootstrap), unique("stats")
    ensure_topic(coordinator.bootstrap, output)
    interval_s = 1.0
    settings = {"execution.buffer-timeout.interval": f"{int(interval_s * 1000)}ms"}
    job = build(unique("paced"), topic, output, bounded=False, settings=settings)
    producer = LiveProducer(coordinator.bootstrap, topic).start()
    agent = in_process(job, coordinator, spark)
    running = threading.Thread(target=agent.run, daemon=True)
    running.start()
    try:
        wait(lambda: agent.processed_rows > 0, 120, "the first records processed")
        time.sleep(1)  # past the start's backlog
        rows, rounds, since = agent.processed_rows, agent.rounds, time.monotonic()
        time.sleep(6)
        rows, rounds = agent.processed_rows - rows, agent.rounds - rounds
        elapsed = time.monotonic() - since
    finally:
        producer.stop()
        agent.stop()
        running.join(60)

    assert rows > 0, "nothing processed while records arrived"
    assert 1 <= rounds <= elapsed / interval_s + 1, (rounds, elapsed)


def test_a_backlog_at_the_start_is_reported_and_checkpoints_wait_for_the_backlog_interval(
    coordinator: Running, spark: Any
) -> None:
    """FLIP-309: the records a topic held when the job started are its backlog. The agent tells
    the coordinator when it starts and stops processing it, and with
    ``interval-during-backlog: 0`` no periodic checkpoint is triggered meanwhile; once the
    backlog is read (a producer writing all along), checkpoints come every interval again."""
    topic, output = new_topic(coordinator.bootstrap), unique("stats")
    ensure_topic(coordinator.bootstrap, output)
    generate(coordinator.bootstrap, topic, 24_000)
    settings = {"execution.checkpointing.interval-during-backlog": "0"}
    # 24 rounds of 250 records per partition: longer than an interval on a fast machine too
    job = build(unique("backlog"), topic, output, max_records=250, bounded=False, settings=settings)
    producer = LiveProducer(coordinator.bootstrap, topic).start()
    agent = in_process(job, coordinator, spark)
    running = threading.Thread(target=agent.run, daemon=True)
    running.start()
    backlog: list[tuple[float, bool]] = []  # (ms since the epoch, the coordinator's view)
    try:
        wait(lambda: job.id in coordinator.service.jobs, 120, "the job registered")
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            owned = coordinator.service.jobs.get(job.id)
            state = owned is not None and owned.core.backlog
            if not backlog or backlog[-1][1] != state:
                backlog.append((time.time() * 1000, state))
            if len(backlog) >= 3:  # without, with, without again
                break
            time.sleep(0.01)
        time.sleep(4)  # checkpoints every second again
        with coordinator.client() as client:
            history = client.get(f"/jobs/{job.id}/checkpoints").json()["history"]
    finally:
        producer.stop()
        agent.stop()
        running.join(60)

    assert [state for _, state in backlog] == [False, True, False], backlog
    began, ended = backlog[1][0], backlog[2][0]
    triggered = sorted(c["trigger_timestamp"] for c in history)
    assert ended - began > 1_500, "the backlog took more than an interval to read"
    assert not [t for t in triggered if began + 100 < t < ended - 100], (began, ended, triggered)
    after = [c for c in history if c["trigger_timestamp"] >= ended and c["status"] == "COMPLETED"]
    assert len(after) >= 2, history


# --- exactly-once through kill points, a producer writing the whole time ----------------------------


def agent(
    coordinator: Running, name: str, topic: str, output: str, crash_at: str | None
) -> subprocess.Popen[str]:
    env = dict(os.environ) | {
        "TEST_JOB_NAME": name, "TEST_INPUT": topic, "TEST_OUTPUT": output, "TEST_BOUNDED": "0",
        "TEST_MAX_RECORDS": "2000", "PYTHONPATH": str(ROOT),
    }  # fmt: skip
    env.pop("SPARKPOINT_CRASH_AT", None)
    if crash_at:
        env["SPARKPOINT_CRASH_AT"] = crash_at
    command = [
        sys.executable, "-m", "sparkpoint.cli", "-v", "agent", "tests/agent_jobs.py:job",
        "--bootstrap", coordinator.bootstrap, "--master", "local[2]",
        "--checkpoint-dir", str(coordinator.root / "checkpoints"), "--restore", "latest",
    ]  # fmt: skip
    return subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )


KILL_POINTS = ("mid-batch-after-complete:2", "after-ack:2", "mid-publish", "after-complete:2")


def exactly_once_through(coordinator: Running, name: str, points: tuple[str, ...]) -> str:
    """The agent of job ``name`` kills itself at each of ``points`` in turn and is started
    again with ``--restore latest``, while payments keep arriving; then the producer stops, the
    job catches up, and stop-with-savepoint ``--drain`` ends it. Asserts the committed output is
    exactly the reference of every payment written (its windows fired by the drain) and the
    job FINISHED; returns the last agent's log."""
    topic, output = new_topic(coordinator.bootstrap), unique("stats")
    ensure_topic(coordinator.bootstrap, output)
    producer = LiveProducer(coordinator.bootstrap, topic, linger_ms=20).start()
    try:
        for point in points:
            process = agent(coordinator, name, topic, output, point)
            _, err = process.communicate(timeout=240)
            assert process.returncode == -signal.SIGKILL, (
                f"expected SIGKILL at {point}:\n{err[-3000:]}"
            )
    finally:
        written = producer.stop()
    expected = reference_output(written, end_of_input=True)
    last = agent(coordinator, name, topic, output, None)
    try:
        totals = {row for row in expected if row[0] == "total"}
        wait(
            lambda: totals <= set(read_output(coordinator.bootstrap, output)), 180,
            "every payment's total committed",
        )  # fmt: skip
        with coordinator.client() as client:
            body = {"targetDirectory": str(coordinator.root / "savepoints"), "drain": True}
            assert client.post(f"/jobs/{name}/stop", json=body).status_code == 200
        _, err = last.communicate(timeout=120)
    finally:
        if last.poll() is None:
            last.kill()
    assert last.returncode == 0, err[-3000:]
    got = read_output(coordinator.bootstrap, output)
    assert got == expected, difference(got, expected)
    with coordinator.client() as client:
        assert client.get(f"/jobs/{name}").json()["state"] == JobStatus.FINISHED.name
    return err


# a campaign of kill points (75 s): `make chaos`; live input through a failure also runs in
# `make test`, from a user's project (tests/user_project: a coordinator killed while a producer
# writes) and through the agent's own kill points at fixed input (test_agent.py)
@pytest.mark.spark
@pytest.mark.chaos
def test_exactly_once_through_kill_points_while_a_producer_writes(coordinator: Running) -> None:
    exactly_once_through(coordinator, unique("killed-live"), KILL_POINTS)
