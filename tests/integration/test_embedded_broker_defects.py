"""Known defects of the embedded broker (tansu), each pinned beside the workaround sparkpoint
relies on. Tests that assert a defect run only against the embedded broker (``embedded_only``):
if an upgrade fixes or changes one, its test fails and the workaround can be revisited. The
workaround tests run against any broker."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaException, Message, Producer, TopicPartition
from confluent_kafka.admin import NewPartitions

from sparkpoint.agent.rounds.fetch import FetchTask, read_ranges
from sparkpoint.common.avro import EventCodec
from sparkpoint.common.broker import EmbeddedBroker
from sparkpoint.common.kafka import (
    ConsumerProfile,
    EventPublisher,
    EventSubscriber,
    make_admin,
    make_consumer,
    make_producer,
    read_to_end,
    true_end_offset,
)
from sparkpoint.common.topics import JOBS, create_topics
from tests import factories
from tests.conftest import EMBEDDED, KafkaUnderTest
from tests.running_coordinator import coordinator_in_thread, wait

NewTopicFactory = Callable[..., str]


def values(consumer: Consumer, topic: str, seconds: float) -> list[bytes]:
    """Everything a consumer reads from partition 0 within ``seconds``."""
    consumer.assign([TopicPartition(topic, 0, 0)])
    seen: list[bytes] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for message in consumer.consume(500, 0.1):
            if message.error() is None:
                seen.append(message.value())
    consumer.close()
    return seen


def produce_batch(bootstrap: str, topic: str, count: int) -> None:
    """``count`` records that librdkafka puts into one batch (one produce call each, one flush)."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 100})
    for i in range(count):
        producer.produce(topic, value=b"%d" % i)
    producer.flush(10)


# --- end offsets ---------------------------------------------------------------------------------


def test_end_offset_is_wrong_for_multi_record_batches(
    embedded_only: KafkaUnderTest, new_topic: NewTopicFactory
) -> None:
    topic = new_topic()
    produce_batch(embedded_only.bootstrap, topic, 10)
    produce_batch(embedded_only.bootstrap, topic, 10)
    consumer = make_consumer(embedded_only.bootstrap)
    low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10, cached=False)
    # Apache Kafka answers 20; tansu answers the base offset of the last batch + 1.
    assert (low, high) == (0, 11)


def test_one_record_per_batch_gives_true_end_offsets_and_full_replay(
    kafka: KafkaUnderTest, new_topic: NewTopicFactory, codec: EventCodec
) -> None:
    topic = new_topic(partitions=2, **{"cleanup.policy": "compact"})
    publisher = EventPublisher(make_producer(kafka.bootstrap, one_record_per_batch=True), codec)
    written = [factories.overrides(version=v) for v in range(1, 41)]
    for i, event in enumerate(written):
        publisher.publish_nowait(topic, f"job-{i % 5}", event)
    assert publisher.flush(10) == 0

    consumer = make_consumer(kafka.bootstrap, profile=ConsumerProfile.REPLAY)
    watermarks = [
        consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)
        for p in (0, 1)
    ]
    replayed = read_to_end(EventSubscriber(consumer, codec), topic)

    assert sum(high for _, high in watermarks) == len(written)
    assert sorted(r.event.version for r in replayed if r.event) == list(range(1, 41))  # type: ignore[union-attr]


def test_a_replay_takes_the_whole_batch_that_holds_the_reported_end(
    kafka: KafkaUnderTest, new_topic: NewTopicFactory, codec: EventCodec
) -> None:
    """The coordinator's transactions write batches of many records; the broker reports the
    end of such a partition inside its last batch, and the replay reads that batch whole."""
    topic = new_topic(partitions=2, **{"cleanup.policy": "compact"})
    producer = Producer({"bootstrap.servers": kafka.bootstrap, "linger.ms": 100})
    written = [factories.overrides(version=v) for v in range(1, 41)]
    for i, event in enumerate(written):
        producer.produce(topic, key=f"job-{i % 5}".encode(), value=codec.encode(event))
        if i in (9, 29):
            producer.flush(10)  # three batches per partition at most, the last of several records
    producer.flush(10)

    replayed = read_to_end(
        EventSubscriber(make_consumer(kafka.bootstrap, profile=ConsumerProfile.REPLAY), codec),
        topic,
    )

    assert sorted(r.event.version for r in replayed if r.event) == list(range(1, 41))  # type: ignore[union-attr]


def test_the_true_end_reaches_the_last_batch_and_does_not_wait_for_records_still_arriving(
    kafka: KafkaUnderTest, new_topic: NewTopicFactory
) -> None:
    """A producer writes batches of several records for the whole test: `true_end_offset`
    reaches every record delivered before it was called, and returns without reading on until
    the producer pauses. (It read until 50 ms passed without a record, which never happens
    while a producer writes: it waited out its whole timeout, and a round's planning on the
    agent, with every checkpoint, stalled for 10 s on live input.)"""
    topic = new_topic()
    delivered: list[int] = []
    stop = threading.Event()

    def write() -> None:
        producer = Producer({"bootstrap.servers": kafka.bootstrap, "linger.ms": 5})

        def report(error: object, message: Message) -> None:
            if error is None:
                delivered.append(int(message.offset() or 0))

        while not stop.is_set():
            for i in range(20):  # a few records a batch, a batch about every 5 ms
                producer.produce(topic, value=b"%d" % i, on_delivery=report)
            producer.poll(0.005)
        producer.flush(10)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    try:
        wait(lambda: len(delivered) > 1_000, 30, "records delivered")
        consumer = make_consumer(kafka.bootstrap)
        before = max(delivered) + 1
        started = time.monotonic()
        end = true_end_offset(consumer, topic, 0, timeout_s=20)
        took = time.monotonic() - started
        consumer.close()
    finally:
        stop.set()
        writer.join(30)

    assert end >= before  # every record delivered before the call
    assert took < 10, f"read on for {took:.1f} s while the producer wrote (timeout 20 s)"


# --- transactions ------------------------------------------------------------------------------


def test_read_committed_does_not_hide_aborted_records(
    embedded_only: KafkaUnderTest, new_topic: NewTopicFactory
) -> None:
    topic = new_topic()
    producer = make_producer(embedded_only.bootstrap, transactional_id=f"{topic}-writer")
    producer.init_transactions(10)
    producer.begin_transaction()
    producer.produce(topic, value=b"aborted")
    producer.flush(10)
    producer.abort_transaction(10)
    producer.begin_transaction()
    producer.produce(topic, value=b"committed")
    producer.commit_transaction(10)

    seen = values(make_consumer(embedded_only.bootstrap, read_committed=True), topic, 1.5)

    # Apache Kafka shows only b"committed".
    assert seen == [b"aborted", b"committed"]


CRASHING_WRITER = textwrap.dedent(
    """
    import sys, time
    from confluent_kafka import Producer
    producer = Producer({"bootstrap.servers": sys.argv[1], "transactional.id": sys.argv[2],
                         "transaction.timeout.ms": 1000})
    producer.init_transactions(10)
    producer.begin_transaction()
    producer.produce(sys.argv[3], value=b"left-open")
    producer.flush(10)
    print("open", flush=True)
    time.sleep(600)
    """
)


def leave_a_transaction_open(bootstrap: str, topic: str, transactional_id: str) -> None:
    """A writer opens a transaction, writes, and is killed with SIGKILL; then another writer
    commits b"after" to the same partition."""
    writer = subprocess.Popen(
        [sys.executable, "-c", CRASHING_WRITER, bootstrap, transactional_id, topic],
        stdout=subprocess.PIPE,
    )
    assert writer.stdout is not None and writer.stdout.readline() == b"open\n"
    writer.kill()
    writer.wait()
    other = make_producer(bootstrap, transactional_id=f"{topic}-other")
    other.init_transactions(10)
    other.begin_transaction()
    other.produce(topic, value=b"after")
    other.commit_transaction(10)


def test_open_transaction_of_a_killed_writer_is_aborted_by_its_successor(
    kafka: KafkaUnderTest, new_topic: NewTopicFactory
) -> None:
    topic = new_topic()
    leave_a_transaction_open(kafka.bootstrap, topic, f"{topic}-writer")

    # The open transaction pins the last stable offset: a read_committed reader stops before it.
    stuck = values(make_consumer(kafka.bootstrap, read_committed=True), topic, 3.0)
    successor = make_producer(kafka.bootstrap, transactional_id=f"{topic}-writer")
    successor.init_transactions(10)
    released = values(make_consumer(kafka.bootstrap, read_committed=True), topic, 1.5)

    assert b"after" not in stuck
    assert b"after" in released


def test_open_transaction_never_times_out(
    embedded_only: KafkaUnderTest, new_topic: NewTopicFactory
) -> None:
    topic = new_topic()
    leave_a_transaction_open(embedded_only.bootstrap, topic, f"{topic}-writer")

    # transaction.timeout.ms was 1 s; Apache Kafka aborts it within its abort-check interval.
    seen = values(make_consumer(embedded_only.bootstrap, read_committed=True), topic, 4.0)
    assert b"after" not in seen


# --- fetch wait and one-record batches -------------------------------------------------------------

MANY = 14_000
"""Measured on a fresh broker: a 10 ms reader gets all of 8,000 within 5 s, but only 300-700
of 12,000 (the cliff is in between); producing 14,000 takes about 3 s. The starvation itself is
not pinned: where the cliff lies depends on the machine's load (under a loaded run of the whole
suite a 10 ms reader took all 14,000 in 5 s, twice), so a test of it failed by chance. The
tests below guard the workaround, the profiles' longer waits."""


@pytest.fixture(scope="module")
def quiet_broker(kafka: KafkaUnderTest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A broker of this module's own when the one under test is embedded: the suite's broker,
    busy with every other module's topics, took 16-21 s to take `MANY` one-record batches (a
    fresh one about 3 s)."""
    if not kafka.is_embedded:
        yield kafka.bootstrap
        return
    with EmbeddedBroker(log_file=tmp_path_factory.mktemp("quiet") / "tansu.log") as broker:
        yield broker.bootstrap


@pytest.fixture(scope="module")
def many_single_record_batches(quiet_broker: str) -> str:
    from confluent_kafka.admin import NewTopic

    topic = f"many-batches-{int(time.time() * 1000)}"
    admin = make_admin(quiet_broker)
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    producer = make_producer(quiet_broker, one_record_per_batch=True)
    for i in range(MANY):
        producer.produce(topic, key=b"job-%d" % (i % 100), value=b"x" * 200)
        if i % 1000 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0
    return topic


@pytest.mark.parametrize("profile", [ConsumerProfile.REPLAY, ConsumerProfile.LIVE])
def test_the_replay_and_live_profiles_read_many_one_record_batches_to_the_end(
    quiet_broker: str, many_single_record_batches: str, profile: ConsumerProfile
) -> None:
    consumer = make_consumer(quiet_broker, profile=profile)
    consumer.assign([TopicPartition(many_single_record_batches, 0, 0)])
    count = 0
    deadline = time.monotonic() + 60
    while count < MANY and time.monotonic() < deadline:
        count += sum(1 for m in consumer.consume(1000, 0.5) if m.error() is None)
    consumer.close()
    assert count == MANY


def test_a_source_task_reads_a_partition_of_many_one_record_batches_whole(
    quiet_broker: str, many_single_record_batches: str
) -> None:
    """What a producer without linger writes: with a 10 ms fetch wait a stage-1 task read 7 of
    20,000 such records, then counted its idle polls and stopped (measured)."""
    task = FetchTask(
        quiet_broker, many_single_record_batches, 0, 0, None, MANY, "k", 128, 2,
        until=MANY, max_duration_s=60,
    )  # fmt: skip
    started = time.monotonic()
    (read,) = read_ranges([task])
    assert (len(read.values), read.next_offset) == (MANY, MANY), time.monotonic() - started
    assert read.offsets == list(range(MANY))


HISTORY = 20_000
"""Records in the jobs partition a new owner replays: past the cliff of a 10 ms reader."""


def test_a_new_owner_replays_a_jobs_topic_of_many_one_record_batches(
    embedded_only: KafkaUnderTest,
    quiet_broker: str,
    codec: EventCodec,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Agents write the jobs topic one record per batch, and the embedded broker never compacts
    it: an instance taking a partition replays every registration and status change ever
    written there. With a 10 ms fetch wait its reader served none of 50 jobs within 180 s of
    20,000 such records (measured); with LIVE's 50 ms it serves them all within seconds."""
    monkeypatch.setenv("SPARKPOINT_TOPIC_PREFIX", f"t{uuid.uuid4().hex[:10]}.")
    create_topics(make_admin(quiet_broker), partitions=1)  # all of them in one partition
    publisher = EventPublisher(make_producer(quiet_broker, one_record_per_batch=True), codec)
    jobs = [f"job-{i:02d}" for i in range(50)]
    for i in range(HISTORY):
        registration = factories.job_registered(jobs[i % len(jobs)])
        publisher.publish_nowait(JOBS, registration.job_id, replace(registration, attempt=i))
        if i % 1000 == 0:
            publisher.producer.poll(0)
    publisher.flush()
    broker = KafkaUnderTest(quiet_broker, EMBEDDED)
    with contextmanager(coordinator_in_thread)(broker, tmp_path) as running:
        wait(lambda: set(running.service.jobs) == set(jobs), 60.0, "every job served")
        assert {job.registration.attempt for job in running.service.jobs.values()} == set(
            range(HISTORY - len(jobs), HISTORY)
        )


# --- admin operations that do not work --------------------------------------------------------------


def test_create_partitions_is_unsupported(
    embedded_only: KafkaUnderTest, new_topic: NewTopicFactory
) -> None:
    topic = new_topic()
    admin = make_admin(embedded_only.bootstrap)
    future = admin.create_partitions([NewPartitions(topic, 3)])[topic]
    with pytest.raises(KafkaException, match="not supported"):
        future.result(10)


def test_delete_records_fails(embedded_only: KafkaUnderTest, new_topic: NewTopicFactory) -> None:
    topic = new_topic()
    produce_batch(embedded_only.bootstrap, topic, 3)
    admin = make_admin(embedded_only.bootstrap)
    with pytest.raises(KafkaException):
        for future in admin.delete_records([TopicPartition(topic, 0, 2)]).values():
            future.result(10)


def test_offsets_for_times_answers_offset_zero_for_every_timestamp(
    embedded_only: KafkaUnderTest, new_topic: NewTopicFactory
) -> None:
    topic = new_topic()
    producer = make_producer(embedded_only.bootstrap, one_record_per_batch=True)
    base = int(time.time() * 1000)
    for i in range(10):
        producer.produce(topic, value=b"x", timestamp=base + i * 1000)
    producer.flush(10)
    consumer = make_consumer(embedded_only.bootstrap)

    middle, future = consumer.offsets_for_times(
        [TopicPartition(topic, 0, base + 5000), TopicPartition(topic, 0, base + 100_000)],
        timeout=10,
    )
    consumer.close()

    # Apache Kafka answers 5 and -1 (no such record).
    assert (middle.offset, future.offset) == (0, 0)


def test_compaction_never_runs(embedded_only: KafkaUnderTest, new_topic: NewTopicFactory) -> None:
    topic = new_topic(
        **{"cleanup.policy": "compact", "segment.ms": "100", "min.cleanable.dirty.ratio": "0.01"}
    )
    producer = make_producer(embedded_only.bootstrap, one_record_per_batch=True)
    for version in range(5):
        producer.produce(topic, key=b"job", value=b"v%d" % version)
        producer.flush(10)
    time.sleep(1.0)
    producer.produce(topic, key=b"other", value=b"roll")
    producer.flush(10)

    seen = values(
        make_consumer(embedded_only.bootstrap, profile=ConsumerProfile.REPLAY), topic, 1.5
    )

    # Every superseded value is still there: replays must keep the latest per key themselves.
    assert seen[:5] == [b"v0", b"v1", b"v2", b"v3", b"v4"]
