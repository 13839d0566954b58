"""The coordinator's reader of the ``acks`` topic: acknowledgements, declines and heartbeats of
the jobs on the partitions this instance owns, decoded on a thread of their own and handed to
the event loop in batches.

Where each partition is read from: its end offset when the instance took the partition (taken
by the jobs consumer before the instance can trigger anything there), so no answer to one of
its own triggers is skipped, however late this reader gets to the partition. Partitions it
keeps are never re-positioned (incremental assign and unassign).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence

from confluent_kafka import TopicPartition

from sparkpoint.common.avro import EventCodec
from sparkpoint.common.events import AcknowledgeCheckpoint
from sparkpoint.common.kafka import (
    ConsumerProfile,
    EventSubscriber,
    Malformed,
    Received,
    make_consumer,
)
from sparkpoint.common.topics import ACKS
from sparkpoint.coordinator.service.trace import StepTrace, wall_ms

POLL_TIMEOUT_S = 0.05
"""The reader wakes this often to notice stop requests and partition changes."""


class AckReader:
    def __init__(
        self,
        bootstrap: str,
        client_id: str,
        codec: EventCodec,
        deliver: Callable[[Sequence[Received]], None],
        on_malformed: Callable[[Malformed], None],
        stop: threading.Event,
    ) -> None:
        self.bootstrap, self.client_id, self.codec = bootstrap, client_id, codec
        self.deliver = deliver
        self.on_malformed = on_malformed
        self.stop = stop
        self.trace: StepTrace | None = None
        self._lock = threading.Lock()
        self._wanted: dict[int, int] = {}
        """Partition -> the offset its reading starts at."""

    def take(self, starts: dict[int, int]) -> None:
        """Read these partitions from these offsets (any thread)."""
        with self._lock:
            self._wanted.update(starts)

    def release(self, partitions: Iterable[int]) -> None:
        with self._lock:
            for partition in partitions:
                self._wanted.pop(partition, None)

    def run(self) -> None:
        consumer = make_consumer(
            self.bootstrap, client_id=self.client_id, profile=ConsumerProfile.CONTROL
        )
        subscriber = EventSubscriber(consumer, self.codec, self.on_malformed)
        assigned: dict[int, int] = {}
        try:
            while not self.stop.is_set():
                with self._lock:
                    wanted = dict(self._wanted)
                lost, gained = ack_assignment_changes(assigned, wanted)
                if lost:
                    consumer.incremental_unassign([TopicPartition(ACKS.name(), p) for p in lost])
                if gained:
                    consumer.incremental_assign(
                        [TopicPartition(ACKS.name(), p, wanted[p]) for p in gained]
                    )
                assigned = wanted
                if not assigned:
                    time.sleep(POLL_TIMEOUT_S)
                    continue
                records = subscriber.poll(POLL_TIMEOUT_S)
                if records:
                    if self.trace is not None:
                        self._trace_received(records)
                    self.deliver(records)
        finally:
            consumer.close()

    def _trace_received(self, records: Sequence[Received]) -> None:
        assert self.trace is not None
        at = wall_ms()
        for record in records:
            if isinstance(record.event, AcknowledgeCheckpoint):
                ack = record.event
                self.trace.mark(ack.job_id, ack.checkpoint_id, "last_ack_received", at)


def ack_assignment_changes(
    assigned: dict[int, int], wanted: dict[int, int]
) -> tuple[list[int], list[int]]:
    """(acks partitions to let go, partitions to start reading): a partition taken again
    (revoked, then assigned back with a new start) counts as both."""
    lost = sorted(p for p in assigned if p not in wanted or wanted[p] != assigned[p])
    gained = sorted(p for p in wanted if p not in assigned or wanted[p] != assigned[p])
    return lost, gained
