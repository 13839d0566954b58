"""The typed publish/subscribe layer against a real broker."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import pytest
from confluent_kafka import KafkaException, TopicPartition

from sparkpoint.common.avro import MAGIC, EventCodec
from sparkpoint.common.kafka import (
    ConsumerProfile,
    EventPublisher,
    EventSubscriber,
    Malformed,
    Received,
    make_admin,
    make_consumer,
    make_producer,
    partition_offsets,
    read_to_end,
)
from sparkpoint.common.kafka_errors import ErrorKind, classify
from tests import factories
from tests.conftest import KafkaUnderTest

NewTopicFactory = Callable[..., str]


def replay(kafka: KafkaUnderTest, codec: EventCodec, **kwargs: object) -> EventSubscriber:
    return EventSubscriber(
        make_consumer(kafka.bootstrap, profile=ConsumerProfile.REPLAY), codec, **kwargs
    )  # type: ignore[arg-type]


def test_every_event_type_round_trips_through_the_broker(
    kafka: KafkaUnderTest, new_topic: NewTopicFactory, codec: EventCodec
) -> None:
    topic = new_topic()
    publisher = EventPublisher(make_producer(kafka.bootstrap), codec)
    sent = factories.one_of_each()
    deliveries = [publisher.publish_sync(topic, "job-0001", event) for event in sent]

    received = read_to_end(replay(kafka, codec), topic)

    assert [r.event for r in received] == sent
    assert [(r.topic, r.partition, r.offset) for r in received] == [
        (d.topic, d.partition, d.offset) for d in deliveries
    ]
    assert {r.key for r in received} == {"job-0001"}


def test_async_publish_resolves_once_the_broker_acknowledged(
    kafka: KafkaUnderTest, new_topic: NewTopicFactory, codec: EventCodec
) -> None:
    topic = new_topic()
    publisher = EventPublisher(make_producer(kafka.bootstrap), codec)

    async def publish_all() -> list[int]:
        deliveries = await asyncio.gather(
            *(
                publisher.publish(topic, "job-a", factories.acknowledge(subtask=i))
                for i in range(20)
            )
        )
        return sorted(d.offset for d in deliveries)

    offsets = asyncio.run(publish_all())
    publisher.close()

    assert offsets == list(range(20))
    # Batched writes: the embedded broker's end offset is wrong here, so read by count.
    subscriber = replay(kafka, codec)
    subscriber.assign([TopicPartition(topic, 0, 0)])
    received: list[Received] = []
    deadline = time.monotonic() + 30
    while len(received) < 20 and time.monotonic() < deadline:
        received.extend(subscriber.poll(0.2))
    assert sorted(r.event.subtask_id for r in received) == sorted(f"keyed-{i}" for i in range(20))  # type: ignore[union-attr]


def test_malformed_messages_are_reported_with_their_position_and_skipped(
    kafka: KafkaUnderTest,
    new_topic: NewTopicFactory,
    codec: EventCodec,
    caplog: pytest.LogCaptureFixture,
) -> None:
    topic = new_topic()
    good = codec.encode(factories.notify_complete())
    raw = make_producer(kafka.bootstrap, one_record_per_batch=True)
    payloads = [
        good,
        b"not avro at all",
        good[: len(good) - 3],  # truncated body
        MAGIC + b"\xff" * 8 + good[10:],  # unknown fingerprint
        good,
    ]
    for payload in payloads:
        raw.produce(topic, key=b"job-0001", value=payload)
    raw.flush(10)
    reported: list[Malformed] = []

    with caplog.at_level(logging.WARNING, logger="sparkpoint.common.kafka"):
        received = read_to_end(replay(kafka, codec, on_malformed=reported.append), topic)

    assert [r.offset for r in received] == [0, 4]
    assert [(m.topic, m.partition, m.offset) for m in reported] == [
        (topic, 0, 1),
        (topic, 0, 2),
        (topic, 0, 3),
    ]
    assert "no single-object marker" in reported[0].reason
    assert "truncated or corrupt body" in reported[1].reason
    assert "unknown schema fingerprint ffffffffffffffff" in reported[2].reason
    assert f"{topic}[0]@3" in caplog.text


def test_a_tombstone_is_received_as_no_event(
    kafka: KafkaUnderTest, new_topic: NewTopicFactory, codec: EventCodec
) -> None:
    topic = new_topic(**{"cleanup.policy": "compact"})
    publisher = EventPublisher(make_producer(kafka.bootstrap, one_record_per_batch=True), codec)
    publisher.publish_sync(topic, "job-0001", factories.overrides())
    publisher.publish_sync(topic, "job-0001", None)

    received = read_to_end(replay(kafka, codec), topic)

    assert [type(r.event).__name__ for r in received] == ["CheckpointOverrides", "NoneType"]


def test_read_to_end_stops_at_the_end_offsets_taken_at_start(
    kafka: KafkaUnderTest, new_topic: NewTopicFactory, codec: EventCodec
) -> None:
    topic = new_topic(partitions=3)
    publisher = EventPublisher(make_producer(kafka.bootstrap, one_record_per_batch=True), codec)
    for version in range(1, 31):
        publisher.publish_nowait(topic, f"job-{version % 7}", factories.overrides(version=version))
    publisher.flush()

    everything = read_to_end(replay(kafka, codec), topic)
    only_some = read_to_end(replay(kafka, codec), topic, partitions=[0])

    assert len(everything) == 30
    assert {r.partition for r in only_some} == {0}
    assert 0 < len(only_some) < 30


def test_a_fenced_producer_error_is_fatal(
    kafka: KafkaUnderTest, new_topic: NewTopicFactory
) -> None:
    topic = new_topic()
    zombie = make_producer(kafka.bootstrap, transactional_id=f"{topic}-writer")
    zombie.init_transactions(10)
    make_producer(kafka.bootstrap, transactional_id=f"{topic}-writer").init_transactions(10)

    with pytest.raises(KafkaException) as raised:
        zombie.begin_transaction()
        zombie.produce(topic, value=b"x")
        zombie.commit_transaction(10)

    assert classify(raised.value.args[0]) is ErrorKind.FATAL


def test_producers_place_keys_where_partition_of_says(
    kafka: KafkaUnderTest, new_topic: NewTopicFactory, codec: EventCodec
) -> None:
    from sparkpoint.common.kafka import partition_of

    topic = new_topic(partitions=6)
    publisher = EventPublisher(make_producer(kafka.bootstrap), codec)
    for i in range(30):
        job_id = f"job-{i}"
        delivered = publisher.publish_sync(topic, job_id, factories.notify_complete())
        assert delivered.partition == partition_of(job_id, 6), job_id


@pytest.mark.parametrize("read_committed", [False, True], ids=["uncommitted", "committed"])
def test_partition_offsets_asks_every_partition_at_once_what_a_consumer_asks_one_by_one(
    kafka: KafkaUnderTest, new_topic: NewTopicFactory, read_committed: bool
) -> None:
    """A round's planning asks every source partition's end in one request: the same offsets a
    consumer of the same isolation level reports per partition (the latest, and the earliest),
    a transaction left open included, and partitions of two topics in one call."""
    first, second = new_topic(partitions=3), new_topic(partitions=2)
    producer = make_producer(kafka.bootstrap)
    for i in range(70):
        producer.produce(first, b"x", partition=i % 3 if i < 60 else 1)
    producer.produce(second, b"y", partition=1)
    producer.flush(10)
    open_transaction = make_producer(kafka.bootstrap, transactional_id=f"t-{time.time_ns()}")
    open_transaction.init_transactions(10)
    open_transaction.begin_transaction()
    open_transaction.produce(first, b"z", partition=2)
    open_transaction.flush(10)
    partitions = [(first, 0), (first, 1), (first, 2), (second, 0), (second, 1)]
    consumer = make_consumer(kafka.bootstrap, read_committed=read_committed)
    try:
        one_by_one = {
            p: consumer.get_watermark_offsets(TopicPartition(*p), timeout=10, cached=False)
            for p in partitions
        }
        latest = partition_offsets(
            make_admin(kafka.bootstrap), partitions, read_committed=read_committed
        )
        earliest = partition_offsets(make_admin(kafka.bootstrap), partitions, latest=False)
    finally:
        consumer.close()
        open_transaction.abort_transaction(10)

    assert latest == {p: high for p, (_, high) in one_by_one.items()}
    assert earliest == {p: low for p, (low, _) in one_by_one.items()}
    assert latest[(second, 0)] == 0 and latest[(second, 1)] >= 1
    assert partition_offsets(make_admin(kafka.bootstrap), []) == {}
