"""The exactly-once Kafka sink on the real broker: an epoch larger than the producer's queue is
published whole, with its marker, in one transaction; producer properties reach the producer; a
retried publishing task does not publish an epoch its lost attempt committed."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest
from confluent_kafka import Consumer, TopicPartition

from sparkpoint.agent.job import SIDE_OUTPUT, DeliveryGuarantee, KafkaSink
from sparkpoint.agent.rounds.frames import to_ipc
from sparkpoint.agent.sinks import kafka as sink_kafka
from sparkpoint.agent.sinks.kafka import TRANSACTION_HEADER, KafkaSinkWriter
from sparkpoint.common.avro import EventCodec
from sparkpoint.common.kafka import consumer_config, make_admin
from sparkpoint.common.topics import create_topics
from tests.conftest import KafkaUnderTest

QUEUE_MESSAGES = 1_000
"""The producer's queue in messages (librdkafka's default is 100,000): the epoch is 20x that,
so the queue is full when the marker comes."""


def read_all(bootstrap: str, topic: str, expected: int) -> list[tuple[bytes, bytes, str]]:
    """(key, value, transaction header) of the records of a one-partition topic: until
    ``expected`` arrived (or 30 s passed), then whatever more comes within a second."""
    consumer = Consumer(consumer_config(bootstrap))
    consumer.assign([TopicPartition(topic, 0, 0)])
    out: list[tuple[bytes, bytes, str]] = []
    deadline = time.monotonic() + 30
    try:
        while time.monotonic() < deadline:
            messages = consumer.consume(50_000, 1.0)
            for message in messages:
                if message.error() is None:
                    token = dict(message.headers() or []).get(TRANSACTION_HEADER) or b""
                    token = token.decode() if isinstance(token, bytes) else token
                    out.append((message.key() or b"", message.value() or b"", token))
            if len(out) >= expected and not messages:
                break
        return out
    finally:
        consumer.close()


def test_an_epoch_larger_than_the_producer_queue_is_published_whole_with_its_marker(
    kafka: KafkaUnderTest,
    topic_prefix: str,
    new_topic: Callable[..., str],
    codec: EventCodec,
    tmp_path: Path,
) -> None:
    create_topics(make_admin(kafka.bootstrap), partitions=1)
    topic = new_topic()
    rows = QUEUE_MESSAGES * 20
    staged = [tmp_path / "out-1.arrow", tmp_path / "out-2.arrow"]
    half = rows // 2
    for i, path in enumerate(staged):
        ids = range(i * half, (i + 1) * half)
        frame = pd.DataFrame({"user": [f"u{n % 1000}" for n in ids], "n": list(ids)})
        path.write_bytes(to_ipc(frame))
    sink = KafkaSink(topic, properties={"queue.buffering.max.messages": QUEUE_MESSAGES})
    writer = KafkaSinkWriter(sink, kafka.bootstrap, codec, "job-big", "agent-1", "user")
    try:
        count = writer.publish_epoch(7, [str(p) for p in staged])
        published = writer.published()
    finally:
        writer.close()

    assert count == rows
    assert published is not None and published.epoch == 7
    records = read_all(kafka.bootstrap, topic, rows)
    assert sorted(int(value.split(b'"n":')[1].rstrip(b"}")) for _, value, _ in records) == list(
        range(rows)
    )
    assert {key for key, _, _ in records} == {f"u{n}".encode() for n in range(1000)}
    assert len({token for _, _, token in records}) == 1, "one transaction"


def test_a_retried_publishing_task_does_not_publish_an_epoch_its_lost_attempt_committed(
    kafka: KafkaUnderTest,
    topic_prefix: str,
    new_topic: Callable[..., str],
    codec: EventCodec,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A cluster retries a failed Spark task: an attempt lost after its commit is followed by
    one that finds the epoch's marker (same staged files) and returns its count instead."""
    create_topics(make_admin(kafka.bootstrap), partitions=1)
    topic = new_topic()
    staged = []
    for name, rows in (("out-3.arrow", 100), ("out-4.arrow", 50)):
        path = tmp_path / name
        path.write_bytes(to_ipc(pd.DataFrame({"user": [f"u{n}" for n in range(rows)]})))
        staged.append(str(path))
    writer = KafkaSinkWriter(KafkaSink(topic), kafka.bootstrap, codec, "job-retried", "a-1", "user")
    assert writer.publish_epoch(3, [staged[0]]) == 100

    monkeypatch.setattr(sink_kafka, "_retried", lambda: True)
    assert writer.publish_epoch(3, [staged[0]]) == 100, "the committed attempt's count"
    assert writer.publish_epoch(4, [staged[1]]) == 50, "a retry of an unpublished epoch publishes"

    records = read_all(kafka.bootstrap, topic, 150)
    assert len(records) == 150
    assert len({token for _, _, token in records}) == 2, "two transactions, not three"


def test_an_at_least_once_record_the_broker_refuses_fails_the_task_instead_of_vanishing(
    kafka: KafkaUnderTest, topic_prefix: str, codec: EventCodec, new_topic: Callable[..., str]
) -> None:
    """A producer's flush returns once every record is delivered or failed: the at-least-once
    sink asks librdkafka for its failures, so a refused record fails the stage-2 task (the job
    restarts and reads it again) rather than being counted as written. The producer is not kept
    after it; the next one writes."""
    refused = KafkaSink("not a/valid topic", delivery_guarantee=DeliveryGuarantee.AT_LEAST_ONCE)
    emit = KafkaSinkWriter(refused, kafka.bootstrap, codec, "job-alo", "a-1", "user").direct()
    assert emit is not None
    frame = pd.DataFrame({"user": ["u1", "u2"], "n": [1, 2]})
    with pytest.raises(
        RuntimeError, match=r"2 records to not a/valid topic not delivered: .*Invalid topic"
    ):
        emit(frame)

    topic = new_topic()
    sink = KafkaSink(topic, delivery_guarantee=DeliveryGuarantee.AT_LEAST_ONCE)
    written = KafkaSinkWriter(sink, kafka.bootstrap, codec, "job-alo", "a-1", "user").direct()
    assert written is not None and written(frame) == 2
    assert sorted(key for key, _, _ in read_all(kafka.bootstrap, topic, 2)) == [b"u1", b"u2"]


def test_rows_naming_a_side_output_go_to_its_topic_in_the_epochs_transaction(
    kafka: KafkaUnderTest,
    topic_prefix: str,
    new_topic: Callable[..., str],
    codec: EventCodec,
    tmp_path: Path,
) -> None:
    """A window's late records (``side_output`` "late") go to the side output's topic, in the
    same transaction as the epoch's main output, without the routing column; a row naming a
    side output the sink does not route fails the epoch, naming those it does."""
    create_topics(make_admin(kafka.bootstrap), partitions=1)
    main, late = new_topic(), new_topic()
    frame = pd.DataFrame(
        {
            "user": ["u1", "u2", "u3", "u4"],
            "n": [1, 2, 3, 4],
            SIDE_OUTPUT: [None, "late", "", "late"],
        }
    )
    staged = tmp_path / "out-1.arrow"
    staged.write_bytes(to_ipc(frame))
    sink = KafkaSink(main, side_outputs={"late": late})
    writer = KafkaSinkWriter(sink, kafka.bootstrap, codec, "job-side", "agent-1", "user")
    try:
        assert writer.publish_epoch(1, [str(staged)]) == 4
        wrong = tmp_path / "out-2.arrow"
        wrong.write_bytes(to_ipc(frame.assign(**{SIDE_OUTPUT: "early"})))
        with pytest.raises(ValueError, match=r"'early'.*side_outputs: \['late'\]"):
            writer.publish_epoch(2, [str(wrong)])
    finally:
        writer.close()

    in_main, in_late = read_all(kafka.bootstrap, main, 2), read_all(kafka.bootstrap, late, 2)
    assert sorted(key for key, _, _ in in_main) == [b"u1", b"u3"]
    assert sorted(key for key, _, _ in in_late) == [b"u2", b"u4"]
    assert all(SIDE_OUTPUT.encode() not in value for _, value, _ in in_main + in_late)
    assert len({token for _, _, token in in_main + in_late}) == 1, "one transaction"
