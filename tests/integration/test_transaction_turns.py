"""TransactionTurns: how many of an instance's partition writers have a transaction open at once,
and in which order the others get their turn."""

from __future__ import annotations

import itertools
import threading
import time
from typing import Any

import pytest

from sparkpoint.common.avro import EventCodec
from sparkpoint.common.events import JobStatus, JobStatusChanged
from sparkpoint.common.kafka import make_admin
from sparkpoint.common.topics import create_topics
from sparkpoint.coordinator.service.writer import PartitionWriter, TransactionTurns
from tests.conftest import KafkaUnderTest


def waiting(turns: TransactionTurns, count: int) -> None:
    """Returns once ``count`` threads wait for a turn (they queue in the order they asked)."""
    deadline = time.monotonic() + 10
    while len(turns._waiting) < count:
        assert time.monotonic() < deadline, "the waiters never queued"
        time.sleep(0.001)


def test_a_turn_is_needed_beyond_the_slots_and_turns_come_in_the_order_asked() -> None:
    turns = TransactionTurns(1)
    order: list[int] = []
    turns.__enter__()  # the first writer holds the only slot

    def writer(n: int) -> None:
        with turns:
            order.append(n)

    threads = []
    for n in range(5):
        thread = threading.Thread(target=writer, args=(n,))
        thread.start()
        waiting(turns, n + 1)  # each one queued before the next asks
        threads.append(thread)
    assert order == []  # nobody got in while the slot was held
    turns.__exit__(None, None, None)
    for thread in threads:
        thread.join(10)
    assert order == [0, 1, 2, 3, 4]
    assert turns._free == 1 and not turns._waiting


def test_two_slots_let_two_in_and_the_third_waits() -> None:
    turns = TransactionTurns(2)
    turns.__enter__()
    turns.__enter__()
    entered = threading.Event()

    def third() -> None:
        with turns:
            entered.set()

    thread = threading.Thread(target=third)
    thread.start()
    waiting(turns, 1)
    assert not entered.is_set()
    turns.__exit__(None, None, None)
    thread.join(10)
    assert entered.is_set()
    turns.__exit__(None, None, None)
    assert turns._free == 2


def test_a_turn_is_given_back_when_the_commit_raises() -> None:
    turns = TransactionTurns(1)
    with pytest.raises(RuntimeError), turns:
        raise RuntimeError("commit failed")
    assert turns._free == 1


def test_at_least_one_transaction_must_be_allowed() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        TransactionTurns(0)


def test_partition_writers_sharing_one_turn_never_overlap_their_transactions(
    kafka: KafkaUnderTest, topic_prefix: str, codec: EventCodec
) -> None:
    """Four writers on the real broker, batches submitted to all of them at once from four
    threads: with one turn no transaction begins before the one before it committed, every
    batch commits, and the waiting writers commit what queued meanwhile together."""
    create_topics(make_admin(kafka.bootstrap), partitions=4)
    turns = TransactionTurns(1)
    spans: list[tuple[float, float]] = []
    record = threading.Lock()
    writers = [PartitionWriter(kafka.bootstrap, p, codec, lambda w: None, turns) for p in range(4)]
    for writer in writers:
        commit = writer._commit

        def timed(batch: list[Any], commit: Any = commit) -> None:
            began = time.monotonic()
            commit(batch)
            with record:
                spans.append((began, time.monotonic()))

        writer._commit = timed  # type: ignore[method-assign]
    outcomes: list[Exception | None] = []

    def submit(writer: PartitionWriter) -> None:
        for n in range(40):
            event = JobStatusChanged(f"job-{writer.partition}", "agent", n, JobStatus.RUNNING, n)
            writer.submit(f"job-{writer.partition}", [event], outcomes.append)

    try:
        threads = [threading.Thread(target=submit, args=(w,)) for w in writers]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
    finally:
        for writer in writers:
            writer.close()
    assert outcomes == [None] * 160
    ordered = sorted(spans)
    assert all(end <= next_began for (_, end), (next_began, _) in itertools.pairwise(ordered))
    assert len(spans) < 160  # group commit: some transactions carried several batches
