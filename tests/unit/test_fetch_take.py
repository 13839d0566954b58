"""Stage 1's take of a fetch (`fetch.take`): runs of one partition are taken by list operations
(`PartitionRead.take_run`), and must leave every partition's read exactly as taking the messages
one at a time does: the records from the read's position up to its end or its record cap, the
rest ignored, the end of a partition and offsets out of order as before."""

from __future__ import annotations

import random

import pytest
from confluent_kafka import KafkaError, Message

from sparkpoint.agent.rounds.fetch import FetchTask, PartitionRead, one, take

TOPICS = ("a", "b")


def task(topic: str, partition: int, rng: random.Random, timestamps: bool) -> FetchTask:
    start = rng.randrange(0, 20)
    return FetchTask(
        bootstrap="", topic=topic, partition=partition, start=start,
        end=rng.choice([None, start + rng.randrange(0, 60)]),
        max_records=rng.choice([3, 25, 10_000]), key="k", max_parallelism=128, parallelism=1,
        until=rng.choice([None, start + 30]), kafka_timestamps=timestamps,
    )  # fmt: skip


def fetch(rng: random.Random, tasks: list[FetchTask], errors: bool) -> list[Message]:
    """Messages of several partitions in runs, offsets rising within each (with gaps, and from
    below each read's start), now and then an end of partition, once in a while out of order."""
    offsets = {(t.topic, t.partition): max(0, t.start - rng.randrange(0, 5)) for t in tasks}
    messages: list[Message] = []
    for _ in range(rng.randrange(1, 12)):
        topic, partition = rng.choice(sorted(offsets))
        for _ in range(rng.randrange(1, 15)):
            offset = offsets[(topic, partition)]
            if errors and rng.random() < 0.05:
                eof = KafkaError(KafkaError._PARTITION_EOF)
                messages.append(Message(topic=topic, partition=partition, offset=offset, error=eof))
                continue
            messages.append(
                Message(
                    topic=topic,
                    partition=partition,
                    offset=offset,
                    key=rng.choice([None, f"k{offset}".encode()]),
                    value=rng.choice([None, f"v{offset}".encode()]),
                    timestamp=(1, 1_000 + offset),
                )
            )
            step = rng.choice([1, 1, 1, 2, 7]) if rng.random() > 0.02 else -3
            offsets[(topic, partition)] = max(0, offset + step)
    return messages


def state(read: PartitionRead) -> tuple[object, ...]:
    return (
        read.values, read.keys, read.offsets, read.timestamps, read.next_offset, read.closed,
        read.early,
    )  # fmt: skip


@pytest.mark.parametrize("seed", range(300))
def test_a_fetch_taken_by_runs_leaves_every_read_as_one_at_a_time(seed: int) -> None:
    rng = random.Random(seed)
    timestamps = rng.random() < 0.5
    topics = TOPICS[: rng.randrange(1, 3)]
    tasks = [task(t, p, rng, timestamps) for t in topics for p in range(rng.randrange(1, 4))]
    fetches = [fetch(rng, tasks, errors=rng.random() < 0.5) for _ in range(3)]
    by_runs = {(t.topic, t.partition): PartitionRead(t) for t in tasks}
    one_by_one = {(t.topic, t.partition): PartitionRead(t) for t in tasks}
    for messages in fetches:
        take(by_runs, messages, topics[0] if len(topics) == 1 else None)
        for message in messages:
            one(one_by_one, message)
    for name, read in one_by_one.items():
        assert state(by_runs[name]) == state(read), name


def read_of(max_records: int) -> PartitionRead:
    return PartitionRead(
        FetchTask(
            bootstrap="",
            topic="t",
            partition=0,
            start=5,
            end=12,
            max_records=max_records,
            key="k",
            max_parallelism=128,
            parallelism=1,
        )
    )


def test_a_run_stops_at_the_record_cap_or_the_end_and_skips_what_is_before_the_start() -> None:
    messages = [Message(topic="t", partition=0, offset=o, value=b"%d" % o) for o in range(3, 14)]
    capped = read_of(max_records=4)
    take({("t", 0): capped}, messages, "t")
    assert capped.offsets == [5, 6, 7, 8]  # from the start, four at most
    assert capped.values == [b"5", b"6", b"7", b"8"]
    assert capped.closed and capped.early and capped.next_offset == 9
    ended = read_of(max_records=100)
    take({("t", 0): ended}, messages, "t")
    assert ended.offsets == list(range(5, 12))  # the end (12) is not taken
    assert ended.closed and not ended.early and ended.next_offset == 12
