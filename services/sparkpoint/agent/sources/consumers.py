"""The Kafka consumers of stage-1 tasks, kept in their Python worker between rounds.

A stage-1 task reads its partitions from planned positions. Making a consumer for each task
cost a connection and a close that waits for the fetch in flight (49 ms measured: the embedded
broker holds every fetch for its whole ``fetch.wait.max.ms``), once per partition and round.
Spark reuses its Python workers, so each worker keeps the consumers it made, connected, and
assigns a task's partition at the task's position (assigning again costs nothing on the
client). Between tasks a kept consumer holds no assignment and fetches nothing: fetching ahead
in the background (a consumer per partition and worker) doubled the embedded broker's CPU at
10,000 records/s and made every round slower, as each partition was fetched by every worker.

A worker keeps one consumer per cluster, a bootstrap address with its client properties (one
task runs in a worker at a time); one unused for `IDLE_CLOSE_S` is closed by the next task of
that worker.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaException, TopicPartition

from sparkpoint.common.kafka import consumer_config
from sparkpoint.common.kafka_config import Frozen

log = logging.getLogger(__name__)

IDLE_CLOSE_S = 60.0
"""A consumer no task used for this long is closed: its partition went to other workers, or
the job ended."""


@dataclass
class Kept:
    consumer: Consumer
    used: float


Cluster = tuple[str, Frozen]
"""A bootstrap address and the client properties to reach it with."""


class PartitionConsumers:
    """A worker's kept consumer per cluster."""

    def __init__(self, idle_close_s: float = IDLE_CLOSE_S) -> None:
        self.idle_close_s = idle_close_s
        self.kept: dict[Cluster, Kept] = {}
        self.lock = threading.Lock()

    def take(self, cluster: Cluster, starts: list[tuple[str, int, int]]) -> Consumer:
        """A consumer assigned each (topic, partition) at its start offset; give it back with
        `give_back`, or `discard` it after an error."""
        with self.lock:
            kept = self.kept.pop(cluster, None)
            idle = self._idle(time.monotonic())
        for consumer in idle:
            close(consumer)
        where = [TopicPartition(topic, partition, start) for topic, partition, start in starts]
        if kept is not None:
            try:
                kept.consumer.assign(where)
                return kept.consumer
            except KafkaException as exc:
                log.debug("a kept source consumer is not reusable: %s", exc)
                close(kept.consumer)
        bootstrap, properties = cluster
        consumer = Consumer(
            consumer_config(bootstrap, client_id="sparkpoint-source", properties=dict(properties))
            | {"enable.partition.eof": True}
        )
        consumer.assign(where)
        return consumer

    def give_back(self, cluster: Cluster, consumer: Consumer) -> None:
        """Keeps ``consumer`` for the next task of this worker, its partition unassigned (it
        fetches nothing meanwhile)."""
        try:
            consumer.unassign()
        except KafkaException as exc:
            log.debug("a source consumer could not let go of its partition: %s", exc)
            close(consumer)
            return
        with self.lock:
            previous = self.kept.get(cluster)
            self.kept[cluster] = Kept(consumer, time.monotonic())
        if previous is not None:  # two tasks at once in this process (not PySpark's workers)
            close(previous.consumer)

    def discard(self, consumer: Consumer) -> None:
        close(consumer)

    def _idle(self, now: float) -> list[Consumer]:
        stale = [k for k, kept in self.kept.items() if now - kept.used > self.idle_close_s]
        return [self.kept.pop(k).consumer for k in stale]


def close(consumer: Consumer) -> None:
    try:
        consumer.close()
    except Exception as exc:  # closing is best effort: the broker drops the connection anyway
        log.debug("closing a source consumer: %s", exc)


CONSUMERS = PartitionConsumers()
"""This worker's kept consumers."""
