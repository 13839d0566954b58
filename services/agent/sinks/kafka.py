"""The Kafka sink. Records are JSON values keyed by the key column.

Exactly-once (the two-phase commit of Flink's KafkaSink, with the commit moved to the moment
the checkpoint completes):

1. records of epoch n (everything stage 2 emitted before barrier n) are staged as files with
   checkpoint n;
2. when checkpoint n completes, one Kafka transaction holds all of epoch n's records and a
   `SinkEpochPublished` marker for n on ``sparkpoint.sink-markers``;
3. on restore from checkpoint k, every epoch <= k above the newest marker is published again.

The transactional id is fixed per job and sink, so a restarted agent's ``init_transactions``
aborts whatever a killed predecessor left open (zombie fencing).
"""

from __future__ import annotations

import logging
import time

from confluent_kafka import Consumer, Producer, TopicPartition

from services.agent.faults import crash_point
from services.agent.job import DeliveryGuarantee, KafkaSink
from services.agent.sinks import read_outputs
from services.common.avro import EventCodec, UndecodableEvent
from services.common.events import SinkEpochPublished
from services.common.kafka import (
    ConsumerProfile,
    consumer_config,
    partition_of,
    producer_config,
    true_end_offset,
)
from services.common.topics import SINK_MARKERS, topic_prefix

log = logging.getLogger(__name__)

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
            config = producer_config(self.bootstrap, client_id=f"sparkpoint-sink-{self.job_id}")
            config["linger.ms"] = 5
            if self.exactly_once:
                config["transactional.id"] = f"{topic_prefix()}sink-{self.job_id}-{self.sink.topic}"
                config["transaction.timeout.ms"] = int(TRANSACTION_TIMEOUT_S * 1000)
            self._producer = Producer(config)
            if self.exactly_once:
                self._producer.init_transactions(30)
        return self._producer

    def _produce(self, outputs: list[str], halfway: bool = False) -> int:
        frame = read_outputs(outputs)
        if not len(frame):
            return 0
        keys = frame[self.key_column].astype(str).tolist() if self.key_column in frame else None
        lines = frame.to_json(orient="records", lines=True).splitlines()
        producer = self.producer
        for i, line in enumerate(lines):
            while True:
                try:
                    producer.produce(
                        self.sink.topic, value=line.encode(), key=keys[i].encode() if keys else None
                    )
                    break
                except BufferError:
                    producer.poll(0.05)
            if halfway and i == len(lines) // 2:
                producer.flush(30)
                crash_point("mid-publish")
        return len(lines)

    def publish_epoch(self, epoch: int, outputs: list[str]) -> int:
        producer = self.producer
        producer.begin_transaction()
        try:
            count = self._produce(outputs, halfway=True)
            marker = SinkEpochPublished(
                self.job_id, self.sink.topic, epoch, count, self.agent_id, int(time.time() * 1000)
            )
            producer.produce(
                self.markers, value=self.codec.encode(marker), key=self.job_id.encode()
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

    def published_epoch(self) -> int:
        """The newest marker of this job and sink (read committed, to the true end)."""
        config = consumer_config(
            self.bootstrap, profile=ConsumerProfile.REPLAY, read_committed=True
        )
        consumer = Consumer(config)
        try:
            metadata = consumer.list_topics(self.markers, timeout=10).topics[self.markers]
            partition = partition_of(self.job_id, len(metadata.partitions))
            end = true_end_offset(consumer, self.markers, partition)
            consumer.assign([TopicPartition(self.markers, partition, 0)])
            newest = 0
            position = 0
            deadline = time.monotonic() + 60
            while position < end and time.monotonic() < deadline:
                for message in consumer.consume(10_000, 0.2):
                    value = message.value()
                    if message.error() is not None or value is None:
                        continue
                    if message.key() != self.job_id.encode():
                        continue
                    try:
                        event = self.codec.decode(value)
                    except UndecodableEvent as exc:
                        log.warning(
                            "malformed marker skipped: %s[%d]@%d: %s",
                            self.markers, partition, message.offset(), exc.reason,
                        )  # fmt: skip
                        continue
                    if isinstance(event, SinkEpochPublished) and event.sink == self.sink.topic:
                        newest = max(newest, event.epoch)
                # the position, not the last offset: commit markers take offsets too
                position = max(
                    position, consumer.position([TopicPartition(self.markers, partition)])[0].offset
                )
            return newest
        finally:
            consumer.close()

    def close(self) -> None:
        if self._producer is not None:
            self._producer.flush(30)
