"""Which partitions of ``sparkpoint.jobs`` this instance owns, and who owns the others.

Instances share the jobs by the Kafka partition of the job id: they form a consumer group on
``sparkpoint.jobs`` and an instance owns the jobs of the partitions assigned to it. On
assignment, before it hands on any record of those partitions, it

1. opens a transactional producer per partition with a fixed ``transactional.id``
   (`writer.PartitionWriter`), whose ``init_transactions`` fences the previous owner (a stale
   instance can no longer commit a trigger or a store record);
2. replays the overrides and the checkpoint store of those partitions (to the end offsets taken
   at start), and takes an ownership epoch one above any it finds there;
3. takes where the replay of the jobs topic ends and where reading the acks topic starts, and
   reads the partition's registrations from the start again.

What the jobs are is not known here: the records of the jobs topic, what the replay found
(`Takeover`), when a partition's history is read and which partitions were lost go to a
`PartitionListener` (the job registry), on the event loop. What is owned (`OwnedPartitions`) is
read by everything that publishes or answers for a job. Every instance announces what it owns on
the coordinators topic and reads the others' announcements, so a request for a job owned
elsewhere can be sent there (`route`)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection, Container, Iterable
from dataclasses import dataclass
from typing import Protocol

from confluent_kafka import Consumer, KafkaException, TopicPartition

from sparkpoint.common.avro import EventCodec
from sparkpoint.common.checkpoint_store import newer
from sparkpoint.common.clock import Clock
from sparkpoint.common.events import (
    CheckpointOverrides,
    CheckpointStoreRecord,
    CoordinatorAnnouncement,
)
from sparkpoint.common.flink_ids import candidate_partitions, is_flink_id
from sparkpoint.common.kafka import (
    ConsumerProfile,
    EventPublisher,
    EventSubscriber,
    Malformed,
    Received,
    make_consumer,
    make_producer,
    partition_of,
    replay_topic,
    true_end_offset,
)
from sparkpoint.common.topics import ACKS, CHECKPOINT_STORE, COORDINATORS, JOBS, topic_prefix
from sparkpoint.coordinator.service.settings import ServiceSettings
from sparkpoint.coordinator.service.writer import PartitionWriter, TransactionTurns
from sparkpoint.overrides.store import OverrideStore

log = logging.getLogger(__name__)

POLL_TIMEOUT_S = 0.05
"""Consumer threads wake this often to notice stop requests and reassignments."""


@dataclass(frozen=True)
class Takeover:
    """What the replay found for partitions just assigned: each job's overrides and store record
    as committed, and where each partition's history on the jobs topic ends (those with none
    are absent)."""

    partitions: list[int]
    overrides: dict[str, CheckpointOverrides]
    stores: dict[int, dict[str, CheckpointStoreRecord]]
    ends: dict[int, int]


class AckPartitions(Protocol):
    """Where the acknowledgement reader reads (`acks.AckReader` is one)."""

    def take(self, starts: dict[int, int]) -> None: ...
    def release(self, partitions: Iterable[int]) -> None: ...


class PartitionListener(Protocol):
    """What ownership hands on, on the loop (`registry.JobRegistry` is one)."""

    def take_over(self, takeover: Takeover) -> None:
        """Partitions just assigned, before any of their records."""

    def on_job_record(self, record: Received) -> None:
        """A record of an owned partition of the jobs topic."""

    def finish_replay(self, partition: int) -> None:
        """The partition's history on the jobs topic is read (its last records may have been
        malformed and skipped)."""

    def drop(self, partitions: set[int]) -> None:
        """Partitions revoked, lost or fenced: their jobs are forgotten without publishing
        anything for them (the writers are still there, and close right after)."""


class OwnedPartitions:
    """The partitions of the jobs topic this instance owns, each one's writer and ownership
    epoch, and how many partitions the topic has. Written by `Ownership` on the loop; read by
    everything that publishes or answers for a job."""

    def __init__(self) -> None:
        self.writers: dict[int, PartitionWriter] = {}
        self.epochs: dict[int, int] = {}
        self.count = 0

    def owns(self, partition: int) -> bool:
        return partition in self.writers

    def writer(self, partition: int) -> PartitionWriter | None:
        return self.writers.get(partition)

    def epoch(self, partition: int, default: int) -> int:
        return self.epochs.get(partition, default)

    def partition_of(self, job_id: str) -> int:
        return partition_of(job_id, self.count) if self.count else -1


class Ownership:
    def __init__(
        self,
        owned: OwnedPartitions,
        settings: ServiceSettings,
        codec: EventCodec,
        clock: Clock,
        turns: TransactionTurns,
        acks: AckPartitions,
        listener: PartitionListener,
        post: Callable[[Callable[[], None]], None],
        stop: threading.Event,
        on_malformed: Callable[[Malformed], None],
    ) -> None:
        self.owned = owned
        self.settings, self.codec, self.clock, self.turns = settings, codec, clock, turns
        self.acks, self.listener = acks, listener
        self._post, self._stop, self._on_malformed = post, stop, on_malformed
        self.partitions_lost = 0
        """Partitions taken from this instance while it ran (revoked, lost or fenced)."""
        self.owners: dict[int, CoordinatorAnnouncement] = {}
        """For every partition, the newest announcement claiming it (read from the coordinators
        topic): where to redirect requests for jobs this instance does not own."""
        self.ready = threading.Event()
        """Set once the first partitions are taken (and announced)."""
        self._announcer: EventPublisher | None = None
        self._replay_targets: dict[int, int] = {}
        """Partition -> end offset to replay to, for the jobs consumer thread."""
        self._replay_lock = threading.Lock()

    # --- running ------------------------------------------------------------------------------------------

    def open(self) -> None:
        """On the loop, before the threads start: the announcements' producer."""
        self._announcer = EventPublisher(
            make_producer(self.settings.bootstrap, one_record_per_batch=True), self.codec
        )

    def close(self) -> None:
        """After the threads stopped: the writers commit what is queued."""
        for writer in self.owned.writers.values():
            writer.close()

    def retire(self) -> None:
        """Once the files are done: owning nothing, said on the coordinators topic."""
        self._announce(partitions=[])
        if self._announcer is not None:
            self._announcer.close(5)

    def consume_jobs(self) -> None:
        """The jobs consumer thread: membership of the group, and every record of the owned
        partitions handed to the loop."""
        consumer = make_consumer(
            self.settings.bootstrap,
            group_id=f"{topic_prefix()}coordinator",
            client_id=self.settings.instance_id,
        )
        subscriber = EventSubscriber(consumer, self.codec, self._on_malformed)
        subscriber.subscribe(
            [JOBS], on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_revoke
        )
        try:
            while not self._stop.is_set():
                for record in subscriber.poll(POLL_TIMEOUT_S):
                    self._post(lambda r=record: self.listener.on_job_record(r))  # type: ignore[misc]
                self._check_replays(consumer)
        finally:
            consumer.close()

    def _check_replays(self, consumer: Consumer) -> None:
        """In the consumer thread: a partition whose position reached the end offset taken at
        assignment has been replayed (also when its last records were malformed and skipped)."""
        with self._replay_lock:
            waiting = dict(self._replay_targets)
        if not waiting:
            return
        topic = JOBS.name()
        try:
            positions = consumer.position([TopicPartition(topic, p) for p in waiting])
        except KafkaException:
            return
        for tp in positions:
            if tp.offset >= waiting[tp.partition]:
                with self._replay_lock:
                    self._replay_targets.pop(tp.partition, None)
                self._post(lambda p=tp.partition: self.listener.finish_replay(p))  # type: ignore[misc]

    # --- assignment, revocation, fencing -------------------------------------------------------------

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        owned = sorted(tp.partition for tp in partitions)
        self.owned.count = len(
            consumer.list_topics(JOBS.name(), timeout=10).topics[JOBS.name()].partitions
        )
        writers = {}
        for partition in owned:
            writers[partition] = PartitionWriter(
                self.settings.bootstrap, partition, self.codec, self._on_fenced, self.turns
            )
        overrides, stores = self._replay(owned)
        ends, ack_starts = self._end_offsets(owned)
        epochs = {
            p: 1 + max((r.owner_epoch for r in stores.get(p, {}).values()), default=0)
            for p in owned
        }
        with self._replay_lock:
            self._replay_targets.update({p: end for p, end in ends.items() if end > 0})
        for tp in partitions:
            tp.offset = -2  # OFFSET_BEGINNING: every registration of the partition, again
        consumer.assign(partitions)
        takeover = Takeover(owned, overrides, stores, {p: e for p, e in ends.items() if e > 0})

        def apply() -> None:
            self.owned.writers.update(writers)
            self.owned.epochs.update(epochs)
            self.listener.take_over(takeover)
            self.acks.take(ack_starts)
            log.info("%s owns partitions %s (epochs %s)", self.settings.instance_id, owned, epochs)
            self._announce()
            self.ready.set()

        self._post(apply)

    def _end_offsets(self, partitions: list[int]) -> tuple[dict[int, int], dict[int, int]]:
        """Per assigned partition, read through one consumer:

        - where the replay of the jobs topic ends: the true end offset now (see
          `true_end_offset`: agents may write batches of several records);
        - where reading the acks topic starts: its end now, taken before this instance triggers
          a checkpoint there, so no answer to one of its triggers can lie before it. (The
          embedded broker reports the last batch's base offset + 1: a few older answers are
          read again, and skipped as answers to checkpoints this instance does not track.)"""
        consumer = make_consumer(self.settings.bootstrap, profile=ConsumerProfile.REPLAY)
        try:
            acks = {
                p: int(
                    consumer.get_watermark_offsets(
                        TopicPartition(ACKS.name(), p), timeout=10, cached=False
                    )[1]
                )
                for p in partitions
            }
            jobs = {p: true_end_offset(consumer, JOBS.name(), p) for p in partitions}
            return jobs, acks
        finally:
            consumer.close()

    def _replay(
        self, partitions: list[int]
    ) -> tuple[dict[str, CheckpointOverrides], dict[int, dict[str, CheckpointStoreRecord]]]:
        overrides = OverrideStore(self.settings.bootstrap, self.codec).replay(partitions)
        stores: dict[int, dict[str, CheckpointStoreRecord]] = {p: {} for p in partitions}
        store_records = replay_topic(
            self.settings.bootstrap,
            self.codec,
            CHECKPOINT_STORE,
            partitions,
            self._on_malformed,
        )
        for record in store_records:
            event = record.event
            if record.key is None:
                continue
            if event is None:
                stores[record.partition].pop(record.key, None)
            elif (
                isinstance(event, CheckpointStoreRecord)
                and event.job_id == record.key
                and newer(event, stores[record.partition].get(record.key))
            ):
                stores[record.partition][record.key] = event
        return overrides, stores

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        lost = {tp.partition for tp in partitions}
        if not self._stop.is_set():
            self.partitions_lost += len(lost)
        self.acks.release(lost)
        with self._replay_lock:
            for partition in lost:
                self._replay_targets.pop(partition, None)
        # Commit what is queued for these partitions before the group moves on: the next owner
        # (maybe this instance again) replays the store and must see every id already used.
        for partition in lost:
            writer = self.owned.writers.get(partition)
            if writer is not None:
                writer.close()
        self._post(lambda: self._drop(lost))

    def _on_fenced(self, writer: PartitionWriter) -> None:
        self.partitions_lost += 1

        def drop() -> None:
            if self.owned.writers.get(writer.partition) is writer:  # not one already replaced
                self._drop({writer.partition})

        self._post(drop)

    def _drop(self, partitions: set[int]) -> None:
        """Ownership lost: the jobs are forgotten first, then the writers go."""
        self.listener.drop(partitions)
        for partition in partitions:
            writer = self.owned.writers.pop(partition, None)
            if writer is not None:
                threading.Thread(target=writer.close, daemon=True).start()
        self._announce()

    # --- who owns what: the coordinators topic ------------------------------------------------------

    def _announce(self, partitions: list[int] | None = None) -> None:
        owned = sorted(self.owned.writers) if partitions is None else partitions
        if self._announcer is None:
            return
        announcement = CoordinatorAnnouncement(
            self.settings.instance_id,
            self.settings.rest_url,
            owned,
            {str(p): self.owned.epochs.get(p, 0) for p in owned},
            self.clock.now_ms(),
        )
        self._announcer.publish_nowait(COORDINATORS, self.settings.instance_id, announcement)
        self._announcer.producer.poll(0)

    def consume_announcements(self) -> None:
        """The coordinators consumer thread: every instance's announcements, from the start."""
        subscriber = EventSubscriber(
            make_consumer(self.settings.bootstrap, profile=ConsumerProfile.REPLAY),
            self.codec,
            self._on_malformed,
        )
        topic = COORDINATORS.name()
        metadata = subscriber.consumer.list_topics(topic, timeout=10).topics.get(topic)
        if metadata is None or not metadata.partitions:
            log.warning("no %s topic: requests for jobs owned elsewhere answer 404", topic)
            return
        subscriber.assign([TopicPartition(topic, p, 0) for p in metadata.partitions])
        try:
            while not self._stop.is_set():
                for record in subscriber.poll(0.2):
                    if isinstance(record.event, CoordinatorAnnouncement):
                        self._post(lambda a=record.event: self._learn(a))  # type: ignore[misc]
        finally:
            subscriber.close()

    def _learn(self, announcement: CoordinatorAnnouncement) -> None:
        for partition, known in list(self.owners.items()):
            if (
                known.instance_id == announcement.instance_id
                and partition not in announcement.partitions
            ):
                del self.owners[partition]
        for partition in announcement.partitions:
            current = self.owners.get(partition)
            if current is None or announcement.timestamp >= current.timestamp:
                self.owners[partition] = announcement

    def route(
        self, job_id: str, running: Container[str], tried: Collection[int] = ()
    ) -> tuple[str, int] | None:
        """Where a request for ``job_id`` goes when this instance does not have the job: the
        REST address of the instance owning the first of its partitions (one for a job id; for
        a Flink JobID not ``running`` here, the one it names and the one of the text as a job
        id) that is not this instance's and not ``tried`` already, and that partition; None
        when there is none."""
        count = self.owned.count
        if not count:
            return None
        if is_flink_id(job_id) and job_id not in running:
            candidates = candidate_partitions(job_id, count)
        else:
            candidates = [partition_of(job_id, count)]
        for partition in candidates:
            if partition in self.owned.writers or partition in tried:
                continue
            owner = self.owners.get(partition)
            # an instance that announced no address is not asked
            if (
                owner is not None
                and owner.instance_id != self.settings.instance_id
                and owner.rest_url
            ):
                return owner.rest_url, partition
        return None
