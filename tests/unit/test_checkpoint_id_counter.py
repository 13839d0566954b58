"""The contract every checkpoint id counter passes (Flink's CheckpointIDCounterTestBase).
Add an implementation to IMPLEMENTATIONS and it runs every test here."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from sparkpoint.common.events import JobStatus
from sparkpoint.coordinator.core.store import CheckpointIdCounter
from sparkpoint.coordinator.service.memory_counter import InMemoryCheckpointIdCounter

# Each entry makes a counter over a given backing: two counters made over the same backing are the
# same counter before and after a restart.
Factory = Callable[[dict[str, int]], CheckpointIdCounter]
IMPLEMENTATIONS: dict[str, Factory] = {"in-memory": InMemoryCheckpointIdCounter}


@pytest.fixture(params=sorted(IMPLEMENTATIONS))
def make(request: pytest.FixtureRequest) -> Factory:
    return IMPLEMENTATIONS[request.param]


def test_starts_at_one(make: Factory) -> None:
    counter = make({})
    assert counter.get() == 1
    assert counter.get_and_increment() == 1
    assert counter.get() == 2


def test_strictly_increasing(make: Factory) -> None:
    counter = make({})
    ids = [counter.get_and_increment() for _ in range(100)]
    assert ids == list(range(1, 101))


def test_concurrent_increments_hand_out_1_to_n(make: Factory) -> None:
    counter = make({})
    handed: list[int] = []
    lock = threading.Lock()

    def take(n: int) -> None:
        mine = [counter.get_and_increment() for _ in range(n)]
        with lock:
            handed.extend(mine)

    threads = [threading.Thread(target=take, args=(250,)) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(handed) == list(range(1, 2001))


def test_survives_a_restart(make: Factory) -> None:
    backing: dict[str, int] = {}
    first = make(backing)
    for _ in range(5):
        first.get_and_increment()
    first.shutdown(JobStatus.SUSPENDED)
    assert make(backing).get_and_increment() == 6


def test_set_count_after_restore(make: Factory) -> None:
    counter = make({})
    counter.set_count(58)  # restored from savepoint 57
    assert counter.get_and_increment() == 58


def test_set_count_never_moves_backwards(make: Factory) -> None:
    counter = make({})
    for _ in range(10):
        counter.get_and_increment()
    counter.set_count(3)
    assert counter.get_and_increment() == 11


def test_ids_start_at_one(make: Factory) -> None:
    with pytest.raises(ValueError):
        make({}).set_count(0)
