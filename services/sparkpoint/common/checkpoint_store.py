"""Reading the coordinator's durable record of a job from ``sparkpoint.checkpoint-store``
(compacted, keyed by job id): its checkpoint id counter, the checkpoints retention kept, the
newest checkpoint that ever completed, its agent and its status. Several records of one job
may be there (compaction may not have run); the one with the highest (owner epoch, counter)
wins, as coordinators fold them."""

from __future__ import annotations

from sparkpoint.common.avro import EventCodec
from sparkpoint.common.events import CheckpointStoreRecord
from sparkpoint.common.kafka import make_consumer, partition_of, replay_topic
from sparkpoint.common.topics import CHECKPOINT_STORE


def newer(record: CheckpointStoreRecord, than: CheckpointStoreRecord | None) -> bool:
    """Whether ``record`` supersedes ``than`` (a later owner, or a higher counter)."""
    return than is None or (record.owner_epoch, record.checkpoint_id_counter) >= (
        than.owner_epoch,
        than.checkpoint_id_counter,
    )


def latest_store_record(
    bootstrap: str, codec: EventCodec, job_id: str
) -> CheckpointStoreRecord | None:
    """The coordinator's durable record of the job (``sparkpoint.checkpoint-store``): its id
    counter, the checkpoints retention kept, the newest one that ever completed, its status."""
    consumer = make_consumer(bootstrap)
    try:
        topic = CHECKPOINT_STORE.name()
        metadata = consumer.list_topics(topic, timeout=10).topics.get(topic)
        if metadata is None or not metadata.partitions:
            return None
        partition = partition_of(job_id, len(metadata.partitions))
    finally:
        consumer.close()
    latest: CheckpointStoreRecord | None = None
    for record in replay_topic(
        bootstrap, codec, CHECKPOINT_STORE, [partition], read_committed=True
    ):
        event = record.event
        if record.key != job_id or not isinstance(event, CheckpointStoreRecord):
            continue
        if event.job_id == job_id and newer(event, latest):
            latest = event
    return latest
