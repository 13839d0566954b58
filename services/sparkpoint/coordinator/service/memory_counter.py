"""The checkpoint id counter held in memory (Flink's StandaloneCheckpointIDCounter), one of the
implementations of `sparkpoint.coordinator.core.store.CheckpointIdCounter` beside the Kafka one
(`kafka_counter`). The service gives every job's coordinator one and keeps the count durable
itself: the store record with the advanced count goes out in the same transaction as the trigger
that uses the id. It lives outside the pure core because it takes a lock: increments may come
from several threads (the counters' contract test checks it)."""

from __future__ import annotations

import threading

from sparkpoint.common.events import JobStatus


class InMemoryCheckpointIdCounter:
    """The counter held in memory; ``backing`` stands for the storage a restarted counter reads
    (a dict shared between instances), so restarts can be tested without Kafka."""

    def __init__(self, backing: dict[str, int] | None = None) -> None:
        self._backing = backing if backing is not None else {}
        self._backing.setdefault("next", 1)
        self._lock = threading.Lock()

    def get_and_increment(self) -> int:
        with self._lock:
            current = self._backing["next"]
            self._backing["next"] = current + 1
            return current

    def get(self) -> int:
        return self._backing["next"]

    def set_count(self, count: int) -> None:
        if count < 1:
            raise ValueError(f"checkpoint ids start at 1, got {count}")
        with self._lock:
            self._backing["next"] = max(self._backing["next"], count)

    def shutdown(self, status: JobStatus) -> None:
        """Nothing to release. The count is kept even for a terminal status: a job id that
        comes back must not reuse an id its old checkpoints still carry on storage."""
