"""The checkpoint id counter kept on Kafka (Flink's ZooKeeper/Kubernetes checkpoint id
counters, on the compacted ``sparkpoint.checkpoint-store``): a job's counter is the
``checkpoint_id_counter`` of its store record.

It starts from the job's durable record, and every id it hands out is durable (the broker
acknowledged the record) before the id is returned, so a counter started again after a crash,
on this machine or another, never hands an id out twice. The record's other fields (retained
checkpoints, agent, status) are carried over unchanged.

The coordinator service keeps the same contract with one write less: it publishes the advanced
count in the same transaction as the trigger that uses the id, so no agent ever sees an id that
is not durable (see `sparkpoint.coordinator.service.pipeline.CommandExecutor`).
"""

from __future__ import annotations

import dataclasses
import threading
import time

from sparkpoint.common.avro import EventCodec
from sparkpoint.common.checkpoint_store import latest_store_record
from sparkpoint.common.events import CheckpointStoreRecord, JobStatus
from sparkpoint.common.kafka import EventPublisher, make_producer
from sparkpoint.common.topics import CHECKPOINT_STORE


class KafkaCheckpointIdCounter:
    def __init__(self, bootstrap: str, codec: EventCodec, job_id: str) -> None:
        self.job_id = job_id
        self._lock = threading.Lock()
        self._record = latest_store_record(bootstrap, codec, job_id) or CheckpointStoreRecord(
            job_id, 0, 1, [], int(time.time() * 1000)
        )
        # one record per batch: the store is replayed to its end offsets
        self._publisher = EventPublisher(make_producer(bootstrap, one_record_per_batch=True), codec)

    def get_and_increment(self) -> int:
        with self._lock:
            current = self._record.checkpoint_id_counter
            self._persist(current + 1)
            return current

    def get(self) -> int:
        return self._record.checkpoint_id_counter

    def set_count(self, count: int) -> None:
        if count < 1:
            raise ValueError(f"checkpoint ids start at 1, got {count}")
        with self._lock:
            if count > self._record.checkpoint_id_counter:
                self._persist(count)

    def shutdown(self, status: JobStatus) -> None:
        """The count stays on the topic whatever the status: a job id that comes back must not
        reuse an id its old checkpoints still carry on storage."""
        self._publisher.close(10)

    def _persist(self, count: int) -> None:
        record = dataclasses.replace(
            self._record, checkpoint_id_counter=count, updated_at=int(time.time() * 1000)
        )
        self._publisher.publish_sync(CHECKPOINT_STORE, self.job_id, record)
        self._record = record
