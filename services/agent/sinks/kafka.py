"""The Kafka sink. Records are values in the sink's format (JSON by default) keyed by the key
column.

Exactly-once (the two-phase commit of Flink's KafkaSink, with the commit moved to the moment
the checkpoint completes):

1. records of epoch n (everything stage 2 emitted before barrier n) are staged as files with
   checkpoint n;
2. when checkpoint n completes, one Kafka transaction holds all of epoch n's records and a
   `SinkEpochPublished` marker for n on ``sparkpoint.sink-markers``;
3. on restore from checkpoint k, every epoch <= k above the newest marker is published again;
   the marker carries a digest of the staged files it published, so a restore whose checkpoint
   names other files for the marker's epoch refuses instead of guessing (`unpublished`).

The transactional id is fixed per job and sink, so a restarted agent's ``init_transactions``
aborts whatever a killed predecessor left open (zombie fencing).
"""

from __future__ import annotations

import logging
import time
import uuid

from confluent_kafka import Producer

from services.agent.faults import armed, crash_point
from services.agent.job import DeliveryGuarantee, KafkaSink
from services.agent.sinks import PublishedEpoch, outputs_digest, read_outputs
from services.common.avro import EventCodec
from services.common.events import SinkEpochPublished
from services.common.kafka import (
    partition_of,
    producer_config,
    replay_topic,
)
from services.common.topics import SINK_MARKERS, topic_prefix

log = logging.getLogger(__name__)

TRANSACTION_HEADER = "sparkpoint.transaction"
"""Header of every record an exactly-once epoch publishes: the token of its transaction, also
in the epoch's marker. On a broker that shows aborted transactions to ``read_committed``
readers (the embedded one), a record is committed exactly when a marker carries its token."""

TRANSACTION_TIMEOUT_S = 120.0
"""How long one epoch's commit may take (a million records take a few seconds here)."""


class KafkaSinkWriter:
    def __init__(
        self,
        sink: KafkaSink,
        bootstrap: str,
        codec: EventCodec,
        job_id: str,
        agent_id: str,
        key: str,
    ) -> None:
        self.sink = sink
        self.bootstrap = bootstrap
        self.codec = codec
        self.job_id = job_id
        self.agent_id = agent_id
        self.key_column = sink.key_column or key
        self.exactly_once = sink.delivery_guarantee is DeliveryGuarantee.EXACTLY_ONCE
        self.markers = SINK_MARKERS.name()
        self._producer: Producer | None = None

    @property
    def producer(self) -> Producer:
        if self._producer is None:
            transactional_id = (
                f"{topic_prefix()}sink-{self.job_id}-{self.sink.topic}"
                if self.exactly_once
                else None
            )
            config = producer_config(
                self.bootstrap,
                client_id=f"sparkpoint-sink-{self.job_id}",
                transactional_id=transactional_id,
            )
            config["linger.ms"] = 5
            config |= {k: v for k, v in self.sink.properties.items() if k != "transactional.id"}
            if self.exactly_once:
                config["transaction.timeout.ms"] = int(TRANSACTION_TIMEOUT_S * 1000)
            producer = Producer(config)
            if self.exactly_once:
                producer.init_transactions(30)
            self._producer = producer  # only once usable: a failed start builds it again
        return self._producer

    def _produce(
        self, outputs: list[str], halfway: bool = False, transaction: str | None = None
    ) -> int:
        frame = read_outputs(outputs)
        if not len(frame):
            return 0
        values = self.sink.value_format.encode(frame)
        keys: list[bytes | None] = (
            [k.encode() for k in frame[self.key_column].astype(str).tolist()]
            if self.key_column in frame
            else [None] * len(values)
        )
        headers: dict[str, str | bytes | None] | None = (
            {TRANSACTION_HEADER: transaction} if transaction else None
        )
        crash_halfway = halfway and armed("mid-publish")
        middle = len(values) // 2 + 1 if crash_halfway else len(values)
        self._send(values[:middle], keys[:middle], headers)
        if crash_halfway:  # half of the records delivered, the transaction open
            self.producer.flush(30)
            crash_point("mid-publish")
            self._send(values[middle:], keys[middle:], headers)
        return len(values)

    def _send(
        self,
        values: list[bytes],
        keys: list[bytes | None],
        headers: dict[str, str | bytes | None] | None,
        topic: str | None = None,
    ) -> None:
        """Queues records in the producer (to the sink's topic unless another is named), waiting
        for room whenever its queue is full: an epoch may hold more records than the queue."""
        produce, topic = self.producer.produce, topic or self.sink.topic
        for value, key in zip(values, keys, strict=True):
            while True:
                try:
                    produce(topic, value=value, key=key, headers=headers)
                    break
                except BufferError:
                    self.producer.poll(0.05)

    def publish_epoch(self, epoch: int, outputs: list[str]) -> int:
        producer = self.producer
        producer.begin_transaction()
        transaction = uuid.uuid4().hex
        try:
            count = self._produce(outputs, halfway=True, transaction=transaction)
            marker = SinkEpochPublished(
                self.job_id, self.sink.topic, epoch, count, self.agent_id, int(time.time() * 1000),
                outputs_digest=outputs_digest(outputs), transaction=transaction,
            )  # fmt: skip
            self._send(
                [self.codec.encode(marker)], [self.job_id.encode()], None, topic=self.markers
            )
            producer.commit_transaction(TRANSACTION_TIMEOUT_S)
        except Exception:
            producer.abort_transaction(30)
            raise
        log.info(
            "job %s: epoch %d published to %s (%d records)",
            self.job_id,
            epoch,
            self.sink.topic,
            count,
        )
        return count

    def write_now(self, outputs: list[str]) -> int:
        count = self._produce(outputs)
        remaining = self.producer.flush(60)
        if remaining:
            raise RuntimeError(f"{remaining} records to {self.sink.topic} not delivered")
        return count

    def published(self) -> PublishedEpoch | None:
        """The newest marker of this job and sink. Markers are written one per transaction, so
        the end offsets are right on the embedded broker too. A read that fails raises: a
        restore never guesses that nothing was published."""
        partitions = self.producer.list_topics(self.markers, timeout=10).topics[self.markers]
        partition = partition_of(self.job_id, len(partitions.partitions))
        records = replay_topic(
            self.bootstrap, self.codec, self.markers, [partition], read_committed=True
        )
        markers = [
            r.event
            for r in records
            if r.key == self.job_id
            and isinstance(r.event, SinkEpochPublished)
            and r.event.sink == self.sink.topic
        ]
        if not markers:
            return None
        newest = max(markers, key=lambda m: m.epoch)
        return PublishedEpoch(newest.epoch, newest.outputs_digest)

    def close(self) -> None:
        if self._producer is not None:
            self._producer.flush(30)
