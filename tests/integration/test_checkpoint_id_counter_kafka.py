"""The checkpoint id counter contract (tests/unit/test_checkpoint_id_counter.py) against the
counter kept on Kafka: the same tests, on the session's broker. A restart is a new counter for
the same job id, reading the job's record back from ``sparkpoint.checkpoint-store``."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator

import pytest

from sparkpoint.common.avro import EventCodec
from sparkpoint.common.kafka import make_admin
from sparkpoint.common.topics import create_topics
from sparkpoint.coordinator.core.store import CheckpointIdCounter
from sparkpoint.coordinator.service.kafka_counter import KafkaCheckpointIdCounter
from tests.conftest import KafkaUnderTest
from tests.unit.test_checkpoint_id_counter import (
    test_concurrent_increments_hand_out_1_to_n,
    test_ids_start_at_one,
    test_set_count_after_restore,
    test_set_count_never_moves_backwards,
    test_starts_at_one,
    test_strictly_increasing,
    test_survives_a_restart,
)

__all__ = [
    "test_concurrent_increments_hand_out_1_to_n",
    "test_ids_start_at_one",
    "test_set_count_after_restore",
    "test_set_count_never_moves_backwards",
    "test_starts_at_one",
    "test_strictly_increasing",
    "test_survives_a_restart",
]


@pytest.fixture
def make(
    kafka: KafkaUnderTest, topic_prefix: str, codec: EventCodec
) -> Iterator[Callable[[dict[str, int]], CheckpointIdCounter]]:
    create_topics(make_admin(kafka.bootstrap), partitions=2)
    made: list[KafkaCheckpointIdCounter] = []

    def counter(backing: dict[str, int]) -> CheckpointIdCounter:
        job = backing.setdefault("job", random.randrange(10**9))  # one job id per backing
        made.append(KafkaCheckpointIdCounter(kafka.bootstrap, codec, f"counter-{job}"))
        return made[-1]

    yield counter
