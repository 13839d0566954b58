"""The exactly-once Kafka sink on the real broker: an epoch larger than the producer's queue is
published whole, with its marker, in one transaction; producer properties reach the producer; a
retried publishing task does not publish an epoch its lost attempt committed."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest
from confluent_kafka import Consumer, TopicPartition

from sparkpoint.agent.job import SIDE_OUTPUT, DeliveryGuarantee, KafkaSink
from sparkpoint.agent.rounds.frames import to_ipc
from sparkpoint.agent.sinks import PublishedEpoch, outputs_digest
from sparkpoint.agent.sinks import kafka as sink_kafka
from sparkpoint.agent.sinks.ahead import AheadPublisher
from sparkpoint.agent.sinks.kafka import TRANSACTION_HEADER, KafkaSinkWriter
from sparkpoint.common.avro import EventCodec
from sparkpoint.common.kafka import consumer_config, make_admin
from sparkpoint.common.topics import create_topics
from sparkpoint.testing.cluster import committed_values
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


@pytest.mark.parametrize("rows", [2, 200_000], ids=["small", "large"])
def test_an_at_least_once_record_the_broker_refuses_fails_the_task_instead_of_vanishing(
    kafka: KafkaUnderTest,
    topic_prefix: str,
    codec: EventCodec,
    new_topic: Callable[..., str],
    rows: int,
) -> None:
    """A producer's flush returns once every record is delivered or failed: the at-least-once
    sink asks librdkafka for its failures, so a refused record fails the stage-2 task (the job
    restarts and reads it again) rather than being counted as written. A producer that learnt
    the topic's fate while the frame was being queued refuses the rest at once (nearly always
    in an epoch of 200,000 records, now and then in one of two): that fails the task the same
    way, with the same words. The producer is not kept after it; the next one writes."""
    refused = KafkaSink("not a/valid topic", delivery_guarantee=DeliveryGuarantee.AT_LEAST_ONCE)
    emit = KafkaSinkWriter(refused, kafka.bootstrap, codec, "job-alo", "a-1", "user").direct()
    assert emit is not None
    refusal = r"\d+ records to not a/valid topic not delivered: .*(Invalid|Unknown) topic"
    with pytest.raises(RuntimeError, match=refusal):
        emit(pd.DataFrame({"user": [f"u{i}" for i in range(rows)], "n": range(rows)}))

    frame = pd.DataFrame({"user": ["u1", "u2"], "n": [1, 2]})

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


# --- writing ahead (`sinks.ahead`) -------------------------------------------------------------------


def staged_users(tmp_path: Path, name: str, users: range) -> str:
    path = tmp_path / name
    path.write_bytes(to_ipc(pd.DataFrame({"user": [f"u{n}" for n in users]})))
    return str(path)


def ahead_writer(kafka: KafkaUnderTest, codec: EventCodec, topic: str, job: str) -> KafkaSinkWriter:
    return KafkaSinkWriter(
        KafkaSink(topic), kafka.bootstrap, codec, job, "a-1", "user", write_ahead=AheadPublisher
    )


def committed_users(bootstrap: str, topic: str) -> list[str]:
    return sorted(v.decode() for v in committed_values(bootstrap, topic))


def test_written_ahead_output_is_invisible_until_its_epoch_commits_with_the_rest(
    kafka: KafkaUnderTest,
    topic_prefix: str,
    new_topic: Callable[..., str],
    codec: EventCodec,
    tmp_path: Path,
) -> None:
    """Files written ahead wait in the open transaction (a read_committed reader sees none of
    them); the commit adds the epoch's other files and the marker: one transaction, its marker
    naming the epoch and all of its files."""
    create_topics(make_admin(kafka.bootstrap), partitions=1)
    topic = new_topic()
    first, second = (
        staged_users(tmp_path, "a.arrow", range(300)),
        staged_users(tmp_path, "b.arrow", range(300, 400)),
    )
    writer = ahead_writer(kafka, codec, topic, "job-ahead")
    try:
        assert writer.writes_ahead
        writer.write_ahead([first])
        time.sleep(1.0)  # time to produce: still nothing committed
        assert read_committed_count(kafka.bootstrap, topic) == 0
        assert writer.publish_epoch(5, [first, second]) == 400
        published = writer.published()
    finally:
        writer.close()

    assert published == PublishedEpoch(5, outputs_digest([first, second]))
    records = read_all(kafka.bootstrap, topic, 400)
    assert len(records) == 400 and len({token for _, _, token in records}) == 1


def test_a_commit_refuses_an_open_transaction_holding_another_epochs_files_and_aborts_it(
    kafka: KafkaUnderTest,
    topic_prefix: str,
    new_topic: Callable[..., str],
    codec: EventCodec,
    tmp_path: Path,
) -> None:
    """The ledger writes ahead only the oldest epoch's files; were a later epoch's written, its
    commit would publish them before their checkpoint completed. The process refuses, aborts,
    and the next epoch starts a clean transaction; `abort_ahead` drops what was written."""
    create_topics(make_admin(kafka.bootstrap), partitions=1)
    topic = new_topic()
    later, own = (
        staged_users(tmp_path, "l.arrow", range(50)),
        staged_users(tmp_path, "o.arrow", range(50, 60)),
    )
    dropped, kept = (
        staged_users(tmp_path, "d.arrow", range(60, 70)),
        staged_users(tmp_path, "k.arrow", range(70, 75)),
    )
    writer = ahead_writer(kafka, codec, topic, "job-refused")
    try:
        writer.write_ahead([later])
        with pytest.raises(RuntimeError, match="not epoch 1's"):
            writer.publish_epoch(1, [own])
        assert writer.publish_epoch(1, [own]) == 10, "a clean transaction after the refusal"
        writer.write_ahead([dropped])
        writer.abort_ahead()
        assert writer.publish_epoch(2, [kept]) == 5
    finally:
        writer.close()

    assert committed_users(kafka.bootstrap, topic) == sorted(
        f'{{"user":"u{n}"}}' for n in [*range(50, 60), *range(70, 75)]
    )


def test_a_write_ahead_process_that_died_fails_the_commit_by_name(
    kafka: KafkaUnderTest, topic_prefix: str, new_topic: Callable[..., str], codec: EventCodec,
    tmp_path: Path,
) -> None:  # fmt: skip
    create_topics(make_admin(kafka.bootstrap), partitions=1)
    topic = new_topic()
    writer = ahead_writer(kafka, codec, topic, "job-dead")
    try:
        writer.write_ahead([staged_users(tmp_path, "x.arrow", range(5))])
        ahead = writer.ahead
        assert isinstance(ahead, AheadPublisher) and ahead.started() and ahead.pid is not None
        os.kill(ahead.pid, signal.SIGKILL)
        with pytest.raises(RuntimeError, match=r"publisher process \(pid \d+\) ended"):
            writer.publish_epoch(1, [])
    finally:
        writer.close()
    assert committed_users(kafka.bootstrap, topic) == []


def read_committed_count(bootstrap: str, topic: str) -> int:
    consumer = Consumer(consumer_config(bootstrap, read_committed=True))
    consumer.assign([TopicPartition(topic, 0, 0)])
    try:
        return sum(1 for m in consumer.consume(10_000, 1.0) if m.error() is None)
    finally:
        consumer.close()


def test_a_sink_whose_write_ahead_process_cannot_start_publishes_each_epoch_whole(
    kafka: KafkaUnderTest,
    topic_prefix: str,
    new_topic: Callable[..., str],
    codec: EventCodec,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """(The fork server could not start, or its process did not answer.) The writer says so and publishes every file of the epoch when it completes, as on a
    cluster: what it meant to write ahead is not lost."""
    create_topics(make_admin(kafka.bootstrap), partitions=1)
    topic = new_topic()
    monkeypatch.setattr(AheadPublisher, "started", lambda _: False)
    writer = ahead_writer(kafka, codec, topic, "job-fallback")
    first, second = (
        staged_users(tmp_path, "f.arrow", range(7)),
        staged_users(tmp_path, "s.arrow", range(7, 10)),
    )
    try:
        writer.write_ahead([first])
        assert not writer.writes_ahead and writer.ahead is None
        assert writer.publish_epoch(1, [first, second]) == 10
    finally:
        writer.close()
    assert len(committed_users(kafka.bootstrap, topic)) == 10
