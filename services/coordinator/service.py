"""The coordinator service: every owned job's CheckpointCoordinator wired to Kafka, timers,
checkpoint storage and the REST API.

Ownership. Instances share the jobs by the Kafka partition of the job id: they form a consumer
group on ``sparkpoint.jobs`` and an instance owns the jobs of the partitions assigned to it. On
assignment, before it handles any registration of those partitions, it

1. opens a transactional producer per partition with a fixed ``transactional.id``, whose
   ``init_transactions`` fences the previous owner (a stale instance can no longer commit a
   trigger or a store record);
2. replays the overrides and the checkpoint store of those partitions (to the end offsets taken
   at start), and takes an ownership epoch one above any it finds there;
3. then reads the partition's registrations from the start and creates a coordinator per live
   job, with its overrides applied and its retained checkpoints restored; checkpoints that were
   pending under the old owner are simply never completed (their late acknowledgements are
   discarded) and the new owner triggers afresh.

Durability. Every batch of events one input produces for a job is published in one transaction
on the job's partition; a batch that triggers a checkpoint also carries the job's store record
with the advanced id counter, so a new owner never reuses an id.

Threads. Kafka consumers and the transactional producers run in their own threads; the asyncio
loop runs the coordinators, the timers and the REST API, so a slow job never holds up another.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import queue
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from services.common.avro import EventCodec
from services.common.clock import SystemClock, TimerQueue
from services.common.events import (
    AcknowledgeCheckpoint,
    CheckpointEventType,
    CheckpointFailureReason,
    CheckpointLifecycleEvent,
    CheckpointOverrides,
    CheckpointSettings,
    CheckpointStoreRecord,
    ConfigChange,
    CoordinatorAnnouncement,
    DeclineCheckpoint,
    Event,
    FailoverRequest,
    JobRegistered,
    JobStatus,
    JobStatusChanged,
    NotifyCheckpointAborted,
    NotifyCheckpointComplete,
    SnapshotType,
    TriggerCheckpoint,
)
from services.common.kafka import (
    ConsumerProfile,
    EventPublisher,
    EventSubscriber,
    Malformed,
    Received,
    make_consumer,
    make_producer,
    partition_of,
    replay_topic,
)
from services.common.settings import REST_FIELDS, CheckpointConfig, ConfigError
from services.common.storage import Storage
from services.common.topics import (
    ACKS,
    CHECKPOINT_EVENTS,
    CHECKPOINT_OVERRIDES,
    CHECKPOINT_STORE,
    CONFIG_CHANGES,
    CONTROL,
    COORDINATORS,
    JOBS,
    TopicSpec,
    topic_prefix,
)
from services.coordinator.commands import (
    CancelTimer,
    Command,
    DiscardState,
    FinalizeCheckpoint,
    Publish,
    RequestCompleted,
    RequestFailed,
    ScheduleTimer,
    Timer,
)
from services.coordinator.coordinator import CheckpointCoordinator, JobInfo
from services.coordinator.pending import AckResult
from services.coordinator.store import CompletedCheckpoint, InMemoryCheckpointIdCounter
from services.overrides.store import OverrideStore

log = logging.getLogger(__name__)

TOPIC_OF: dict[type, Any] = {
    TriggerCheckpoint: CONTROL,
    NotifyCheckpointComplete: CONTROL,
    NotifyCheckpointAborted: CONTROL,
    FailoverRequest: CONTROL,
    CheckpointLifecycleEvent: CHECKPOINT_EVENTS,
    CheckpointStoreRecord: CHECKPOINT_STORE,
    ConfigChange: CONFIG_CHANGES,
    CheckpointOverrides: CHECKPOINT_OVERRIDES,
}

POLL_TIMEOUT_S = 0.05
"""Consumer threads wake this often to notice stop requests and reassignments."""

MAX_BATCH = 500
"""Batches a writer commits in one transaction at most (group commit under load)."""

TRANSACTION_TIMEOUT_S = 10.0
"""Beginning, producing and committing one batch; longer means the broker is in trouble."""


LEFT_PENDING_WINDOW = 16
"""How many of the newest ids a new owner declares aborted (see `_left_pending`)."""


@dataclass(frozen=True)
class Tombstone:
    """Delete the job's record on a compacted topic (published with the job's other events)."""

    topic: TopicSpec


class UpdateInProgress(RuntimeError):
    """Another configuration update of the same job is being applied (409)."""


class UnknownJob(KeyError):
    """No job with that id is owned by this instance (404)."""


class NotOwner(RuntimeError):
    """This instance lost the partition while an operation was under way."""


@dataclass
class TriggerRequest:
    """A REST-triggered checkpoint or savepoint, answered through its request id."""

    request_id: str
    job_id: str
    savepoint: bool
    status: str = "IN_PROGRESS"
    checkpoint_id: int | None = None
    location: str | None = None
    failure: str | None = None


@dataclass
class OwnedJob:
    registration: JobRegistered
    partition: int
    base: CheckpointConfig
    core: CheckpointCoordinator
    overrides: CheckpointOverrides | None = None
    status: JobStatus = JobStatus.RUNNING
    updating: bool = False
    last_failover: FailoverRequest | None = None

    @property
    def job_id(self) -> str:
        return self.registration.job_id


# --- publishing: one transactional producer per owned partition -----------------------------------


class PartitionWriter:
    """Publishes batches for the jobs of one partition, in order, each batch one transaction.
    A fenced producer marks the writer dead: the partition is no longer ours."""

    def __init__(
        self,
        bootstrap: str,
        partition: int,
        codec: EventCodec,
        on_fenced: Callable[[PartitionWriter], None],
    ) -> None:
        self.partition = partition
        self.codec = codec
        self.on_fenced = on_fenced
        self.transactional_id = f"{topic_prefix()}coordinator-p{partition}"
        self._topic_of = {kind: spec.name() for kind, spec in TOPIC_OF.items()}  # resolved once
        # One record per batch: the audit and store topics are replayed to their end offsets,
        # which the embedded broker reports right only for one-record batches.
        self.producer: Producer = make_producer(
            bootstrap,
            transactional_id=self.transactional_id,
            client_id=f"sparkpoint-coordinator-p{partition}",
            one_record_per_batch=True,
        )
        self.producer.init_transactions(TRANSACTION_TIMEOUT_S)  # fences the previous owner
        self.alive = True
        self.accepting = True
        self._lock = threading.Lock()
        self._queue: queue.Queue[tuple[str, list[Event | Tombstone], Future[None]] | None] = (
            queue.Queue()
        )
        self._thread = threading.Thread(
            target=self._run, name=f"sparkpoint-writer-p{partition}", daemon=True
        )
        self._thread.start()

    def submit(self, key: str, events: Sequence[Event | Tombstone]) -> Future[None]:
        done: Future[None] = Future()
        with self._lock:
            if self.accepting and self.alive:
                self._queue.put((key, list(events), done))
                return done
        done.set_exception(NotOwner(f"partition {self.partition} is not ours any more"))
        return done

    def close(self) -> None:
        """Commits everything already queued, then stops; later submits fail at once."""
        with self._lock:
            if self.accepting:
                self.accepting = False
                self._queue.put(None)
        self._thread.join(TRANSACTION_TIMEOUT_S * 2)

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            batch = [first]
            closing = False
            # Group commit: everything queued meanwhile goes into the same transaction, in order.
            while len(batch) < MAX_BATCH:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    closing = True
                    break
                batch.append(item)
            self._commit_batch(batch)
            if closing:
                return

    def _commit_batch(self, batch: list[tuple[str, list[Event | Tombstone], Future[None]]]) -> None:
        if not self.alive:
            for _, _, done in batch:
                done.set_exception(NotOwner(f"partition {self.partition} is not ours any more"))
            return
        try:
            self._commit(batch)
        except KafkaException as exc:
            error: KafkaError = exc.args[0]
            if error.fatal() or error.code() == KafkaError._FENCED:
                self.alive = False
                log.error(
                    "partition %d: producer fenced, ownership lost: %s", self.partition, error.str()
                )
                self.on_fenced(self)
                failure: Exception = NotOwner(f"fenced on partition {self.partition}")
            else:
                self._abort()
                failure = exc
            for _, _, done in batch:
                done.set_exception(failure)
            return
        except Exception as exc:
            self._abort()
            for _, _, done in batch:
                done.set_exception(exc)
            return
        for _, _, done in batch:
            done.set_result(None)

    def _commit(self, batch: list[tuple[str, list[Event | Tombstone], Future[None]]]) -> None:
        producer = self.producer
        producer.begin_transaction()
        for key, events, _ in batch:
            for event in events:
                if isinstance(event, Tombstone):
                    producer.produce(
                        event.topic.name(), key=key.encode(), value=None, partition=self.partition
                    )
                    continue
                producer.produce(
                    self._topic_of[type(event)],
                    key=key.encode(),
                    value=self.codec.encode(event),
                    partition=self.partition,
                )
        producer.commit_transaction(TRANSACTION_TIMEOUT_S)

    def _abort(self) -> None:
        try:
            self.producer.abort_transaction(TRANSACTION_TIMEOUT_S)
        except KafkaException as exc:
            log.warning("partition %d: abort failed: %s", self.partition, exc)


# --- the service ------------------------------------------------------------------------------------


@dataclass
class ServiceSettings:
    bootstrap: str
    defaults: CheckpointConfig = field(default_factory=CheckpointConfig)
    instance_id: str = field(default_factory=lambda: f"coordinator-{uuid.uuid4().hex[:8]}")
    rest_url: str = ""


class CoordinatorService:
    def __init__(self, settings: ServiceSettings, codec: EventCodec | None = None) -> None:
        self.settings = settings
        self.codec = codec or EventCodec()
        self.clock = SystemClock()
        self.storage = Storage([settings.defaults.checkpoint_dir, settings.defaults.savepoint_dir])
        self.jobs: dict[str, OwnedJob] = {}
        self.requests: dict[str, TriggerRequest] = {}
        self.ended: dict[str, OwnedJob] = {}
        self.writers: dict[int, PartitionWriter] = {}
        self.epochs: dict[int, int] = {}
        self.malformed = 0
        self.timers = TimerQueue()
        self._timer_wakeup = asyncio.Event()
        self._stop = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._inbox: asyncio.Queue[Callable[[], None]] = asyncio.Queue()
        self._replayed_overrides: dict[str, CheckpointOverrides] = {}
        self._replayed_stores: dict[int, dict[str, CheckpointStoreRecord]] = {}
        self._ack_partitions: set[int] = set()
        self._ack_lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self.ready = threading.Event()
        self.partition_count = 0
        self.owners: dict[int, CoordinatorAnnouncement] = {}
        """For every partition, the newest announcement claiming it (read from the coordinators
        topic): where to redirect requests for jobs this instance does not own."""
        self._announcer: EventPublisher | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    # --- running ---------------------------------------------------------------------------------------

    async def run(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._announcer = EventPublisher(
            make_producer(self.settings.bootstrap, one_record_per_batch=True), self.codec
        )
        self._threads = [
            threading.Thread(target=self._consume_jobs, name="sparkpoint-jobs", daemon=True),
            threading.Thread(target=self._consume_acks, name="sparkpoint-acks", daemon=True),
            threading.Thread(
                target=self._consume_announcements, name="sparkpoint-coordinators", daemon=True
            ),
        ]
        for thread in self._threads:
            thread.start()
        timers = asyncio.create_task(self._run_timers())
        try:
            while not self._stop.is_set():
                try:
                    work = await asyncio.wait_for(self._inbox.get(), timeout=0.1)
                except TimeoutError:
                    continue
                try:
                    work()
                except Exception:
                    log.exception("coordinator work item failed")
        finally:
            timers.cancel()
            self._stop.set()
            for thread in self._threads:
                await asyncio.to_thread(thread.join, 10)
            for writer in self.writers.values():
                writer.close()
            self._announce(partitions=[])
            if self._announcer is not None:
                self._announcer.close(5)

    def stop(self) -> None:
        self._stop.set()

    def _post(self, work: Callable[[], None]) -> None:
        """From any thread: run ``work`` on the loop, in order."""
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._inbox.put_nowait, work)

    def _report_malformed(self, malformed: Malformed) -> None:
        self.malformed += 1

    # --- the jobs topic and ownership -----------------------------------------------------------------

    def _consume_jobs(self) -> None:
        consumer = make_consumer(
            self.settings.bootstrap,
            group_id=f"{topic_prefix()}coordinator",
            client_id=self.settings.instance_id,
        )
        subscriber = EventSubscriber(consumer, self.codec, self._report_malformed)
        subscriber.subscribe(
            [JOBS], on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_revoke
        )
        try:
            while not self._stop.is_set():
                for record in subscriber.poll(POLL_TIMEOUT_S):
                    self._post(lambda r=record: self._on_job_record(r))  # type: ignore[misc]
        finally:
            consumer.close()

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        owned = sorted(tp.partition for tp in partitions)
        self.partition_count = len(
            consumer.list_topics(JOBS.name(), timeout=10).topics[JOBS.name()].partitions
        )
        writers = {}
        for partition in owned:
            writers[partition] = PartitionWriter(
                self.settings.bootstrap, partition, self.codec, self._on_fenced
            )
        overrides, stores = self._replay(owned)
        epochs = {
            p: 1 + max((r.owner_epoch for r in stores.get(p, {}).values()), default=0)
            for p in owned
        }
        for tp in partitions:
            tp.offset = -2  # OFFSET_BEGINNING: every registration of the partition, again
        consumer.assign(partitions)

        def apply() -> None:
            self.writers.update(writers)
            self.epochs.update(epochs)
            self._replayed_overrides.update(overrides)
            self._replayed_stores.update(stores)
            with self._ack_lock:
                self._ack_partitions |= set(owned)
            log.info("%s owns partitions %s (epochs %s)", self.settings.instance_id, owned, epochs)
            self._announce()
            self.ready.set()

        self._post(apply)

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        lost = {tp.partition for tp in partitions}
        with self._ack_lock:
            self._ack_partitions -= lost
        # Commit what is queued for these partitions before the group moves on: the next owner
        # (maybe this instance again) replays the store and must see every id already used.
        for partition in lost:
            writer = self.writers.get(partition)
            if writer is not None:
                writer.close()
        self._post(lambda: self._drop_partitions(lost))

    def _on_fenced(self, writer: PartitionWriter) -> None:
        def drop() -> None:
            if self.writers.get(writer.partition) is writer:  # not a writer already replaced
                self._drop_partitions({writer.partition})

        self._post(drop)

    def _drop_partitions(self, partitions: set[int]) -> None:
        """Ownership lost: forget the jobs without publishing anything for them."""
        for job_id in [j for j, job in self.jobs.items() if job.partition in partitions]:
            job = self.jobs.pop(job_id)
            for command in job.core.suspend(self.clock.now_ms()):
                if isinstance(command, CancelTimer):
                    self.timers.cancel(command.timer)
            log.info("job %s released (partition %d)", job_id, job.partition)
        for partition in partitions:
            writer = self.writers.pop(partition, None)
            if writer is not None:
                threading.Thread(target=writer.close, daemon=True).start()
            self._replayed_stores.pop(partition, None)
        self._announce()

    # --- who owns what: the coordinators topic ------------------------------------------------------

    def _announce(self, partitions: list[int] | None = None) -> None:
        owned = sorted(self.writers) if partitions is None else partitions
        if self._announcer is None:
            return
        announcement = CoordinatorAnnouncement(
            self.settings.instance_id,
            self.settings.rest_url,
            owned,
            {str(p): self.epochs.get(p, 0) for p in owned},
            self.clock.now_ms(),
        )
        self._announcer.publish_nowait(COORDINATORS, self.settings.instance_id, announcement)
        self._announcer.producer.poll(0)

    def _consume_announcements(self) -> None:
        subscriber = EventSubscriber(
            make_consumer(self.settings.bootstrap, profile=ConsumerProfile.REPLAY),
            self.codec,
            self._report_malformed,
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

    def owner_url(self, job_id: str) -> str | None:
        """The REST address of the instance that owns ``job_id``, when it is another one."""
        if not self.partition_count:
            return None
        partition = partition_of(job_id, self.partition_count)
        if partition in self.writers:
            return None
        owner = self.owners.get(partition)
        if owner is None or owner.instance_id == self.settings.instance_id:
            return None
        return owner.rest_url

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
            self._report_malformed,
        )
        for record in store_records:
            event = record.event
            if record.key is None:
                continue
            if event is None:
                stores[record.partition].pop(record.key, None)
            elif isinstance(event, CheckpointStoreRecord):
                current = stores[record.partition].get(record.key)
                if current is None or (event.owner_epoch, event.checkpoint_id_counter) >= (
                    current.owner_epoch,
                    current.checkpoint_id_counter,
                ):
                    stores[record.partition][record.key] = event
        return overrides, stores

    def _on_job_record(self, record: Received) -> None:
        if record.partition not in self.writers or record.key is None:
            return
        event = record.event
        if event is None:
            self._end_job(record.key, JobStatus.CANCELED)
        elif isinstance(event, JobRegistered):
            if event.status.is_terminal:
                self._end_job(event.job_id, event.status)
            else:
                self._register(event, record.partition)
        elif isinstance(event, JobStatusChanged):
            job = self.jobs.get(event.job_id)
            if event.status.is_terminal:
                self._end_job(event.job_id, event.status)
            elif job is not None and event.end_of_input:
                # FLIP-147: bounded input ended; the final checkpoint goes now, not at the next tick
                self._execute(job, job.core.trigger_checkpoint(self.clock.now_ms()))
            elif job is not None and event.processing_backlog is not None:
                self._execute(
                    job, job.core.set_backlog(event.processing_backlog, self.clock.now_ms())
                )
        else:
            _skip_unexpected(record)

    def _register(self, registration: JobRegistered, partition: int) -> None:
        previous = self.jobs.get(registration.job_id)
        if previous is not None:
            same = (previous.registration.agent_id, previous.registration.attempt)
            if same == (registration.agent_id, registration.attempt):
                return  # the same registration read again (replay after reassignment)
            self._end_job(registration.job_id, None)  # a restart: a fresh coordinator, same stores
        try:
            base = CheckpointConfig.from_options(registration.configuration, self.settings.defaults)
        except ConfigError as exc:
            log.error(
                "job %s registration has an invalid configuration: %s", registration.job_id, exc
            )
            return
        stores = self._replayed_stores.get(partition, {})
        replayed = self._replayed_overrides.get(registration.job_id)
        overrides = previous.overrides if previous is not None else replayed
        config = base
        if overrides is not None:
            try:
                config = base.with_overrides(overrides.overrides)
            except ConfigError as exc:
                log.error(
                    "job %s: stored overrides no longer apply (%s); using its configuration",
                    registration.job_id,
                    exc,
                )
        subtasks = tuple(s.subtask_id for s in registration.subtasks)
        core = CheckpointCoordinator(
            JobInfo(registration.job_id, subtasks),
            config,
            InMemoryCheckpointIdCounter(),
            owner_epoch=self.epochs.get(partition, 1),
        )
        now = self.clock.now_ms()
        left_pending: list[Event] = []
        if previous is not None:  # what this instance knows is newer than the replayed store
            core.counter.set_count(previous.core.counter.get())
            core.restore(previous.core.store.checkpoints)
        elif (store := stores.get(registration.job_id)) is not None:
            core.counter.set_count(store.checkpoint_id_counter)
            core.restore([CompletedCheckpoint.from_record(r) for r in store.retained])
            left_pending = self._left_pending(registration.job_id, store, core.owner_epoch, now)
        if registration.restored_checkpoint_id is not None:
            core.counter.set_count(registration.restored_checkpoint_id + 1)
            core.stats.on_restored(
                registration.restored_checkpoint_id,
                registration.timestamp,
                False,
                registration.restored_external_path or "",
            )
        job = OwnedJob(registration, partition, base, core, overrides)
        self.jobs[registration.job_id] = job
        self.ended.pop(registration.job_id, None)
        log.info(
            "job %s registered (partition %d, %d subtasks)",
            registration.job_id,
            partition,
            len(subtasks),
        )
        if left_pending:
            self._publish(job, left_pending)
        self._execute(job, core.start(now))

    def _left_pending(
        self, job_id: str, store: CheckpointStoreRecord, epoch: int, now: int
    ) -> list[Event]:
        """The job moved here: checkpoints the previous owner triggered after its last retained
        one may still be pending with the agents. They will never complete; say so, as Flink
        aborts pending checkpoints on JobManager failover. The newest few ids are enough: at
        most max-concurrent checkpoints are ever pending."""
        last = max((r.checkpoint_id for r in store.retained), default=0)
        first = max(last + 1, store.checkpoint_id_counter - LEFT_PENDING_WINDOW)
        reason = CheckpointFailureReason.CHECKPOINT_COORDINATOR_SUSPEND
        message = "the coordinator of this job changed"
        events: list[Event] = []
        for checkpoint_id in range(first, store.checkpoint_id_counter):
            events.append(
                NotifyCheckpointAborted(job_id, epoch, checkpoint_id, reason, now, message)
            )
            events.append(
                CheckpointLifecycleEvent(
                    job_id, epoch, checkpoint_id, CheckpointEventType.FAILED, SnapshotType.CHECKPOINT,
                    now, failure_reason=reason, message=message,
                )
            )  # fmt: skip
        return events

    def _end_job(self, job_id: str, status: JobStatus | None) -> None:
        job = self.jobs.pop(job_id, None)
        if job is None:
            return
        commands = (
            job.core.shutdown(status, self.clock.now_ms())
            if status
            else job.core.suspend(self.clock.now_ms())
        )
        self._execute(job, commands)
        if status is not None:
            job.status = status
            self.ended[job_id] = job
            # what retention kept, and no overrides any more
            self._publish(
                job, [job.core.store_record(self.clock.now_ms()), Tombstone(CHECKPOINT_OVERRIDES)]
            )
            log.info("job %s ended: %s", job_id, status.name)

    # --- acknowledgements ---------------------------------------------------------------------------

    def _consume_acks(self) -> None:
        consumer = make_consumer(
            self.settings.bootstrap, client_id=f"{self.settings.instance_id}-acks"
        )
        subscriber = EventSubscriber(consumer, self.codec, self._report_malformed)
        assigned: set[int] = set()
        try:
            while not self._stop.is_set():
                with self._ack_lock:
                    wanted = set(self._ack_partitions)
                if wanted != assigned:
                    # New partitions start at their end: acknowledgements written before this
                    # instance owned the job belong to checkpoints it will not complete.
                    subscriber.assign([TopicPartition(ACKS.name(), p, -1) for p in sorted(wanted)])
                    assigned = wanted
                if not assigned:
                    time.sleep(POLL_TIMEOUT_S)
                    continue
                records = subscriber.poll(POLL_TIMEOUT_S)
                if records:
                    self._post(lambda rs=records: self._on_acks(rs))  # type: ignore[misc]
        finally:
            consumer.close()

    def _on_acks(self, records: Sequence[Received]) -> None:
        now = self.clock.now_ms()
        for record in records:
            event = record.event
            job = self.jobs.get(record.key or "")
            if job is None:
                log.info(
                    "acknowledgement for a job this instance does not own (%s[%d]@%d) skipped",
                    record.topic,
                    record.partition,
                    record.offset,
                )
                continue
            if isinstance(event, AcknowledgeCheckpoint):
                result, commands = job.core.on_acknowledge(event, now)
                if result in (AckResult.UNKNOWN, AckResult.DUPLICATE):
                    log.info(
                        "%s acknowledgement at %s[%d]@%d (checkpoint %d, %s)", result.name, record.topic,
                        record.partition, record.offset, event.checkpoint_id, event.subtask_id,
                    )  # fmt: skip
                self._execute(job, commands)
            elif isinstance(event, DeclineCheckpoint):
                self._execute(job, job.core.on_decline(event, now))
            else:
                _skip_unexpected(record)

    # --- timers -------------------------------------------------------------------------------------------

    async def _run_timers(self) -> None:
        while True:
            now = self.clock.now_ms()
            while (popped := self.timers.pop_due(now)) is not None:
                timer: Timer = popped[1]  # type: ignore[assignment]
                job = self.jobs.get(timer.job_id)
                if job is not None:
                    try:
                        self._execute(job, job.core.on_timer(timer, now))
                    except Exception:
                        log.exception("timer %s of job %s failed", timer.kind.value, timer.job_id)
            due = self.timers.next_due_ms()
            delay = 1.0 if due is None else max(0.0, (due - self.clock.now_ms()) / 1000)
            self._timer_wakeup.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._timer_wakeup.wait(), timeout=min(delay, 1.0))

    # --- carrying out commands -------------------------------------------------------------------------

    def _execute(self, job: OwnedJob, commands: Sequence[Command]) -> None:
        if not commands:
            return
        events: list[Event] = []
        rearm = False
        for command in commands:
            if isinstance(command, Publish):
                if isinstance(command.event, TriggerCheckpoint):
                    events.append(
                        job.core.store_record(self.clock.now_ms())
                    )  # the id counter, durable first
                events.append(command.event)
                if isinstance(command.event, FailoverRequest):
                    job.last_failover = command.event
            elif isinstance(command, ScheduleTimer):
                self.timers.schedule(command.timer, command.due_ms)
                rearm = True
            elif isinstance(command, CancelTimer):
                self.timers.cancel(command.timer)
            elif isinstance(command, FinalizeCheckpoint):
                task = asyncio.get_running_loop().create_task(self._finalize(job, command))
                self._tasks.add(task)  # the loop keeps only weak references to tasks
                task.add_done_callback(self._tasks.discard)
            elif isinstance(command, DiscardState):
                asyncio.get_running_loop().run_in_executor(None, self._discard, command)
            elif isinstance(command, RequestCompleted | RequestFailed):
                self._answer(command)
        if rearm:
            self._timer_wakeup.set()
        if events:
            self._publish(job, events)

    def _publish(self, job: OwnedJob, events: Sequence[Event | Tombstone]) -> Future[None]:
        writer = self.writers.get(job.partition)
        if writer is None:
            failed: Future[None] = Future()
            failed.set_exception(NotOwner(f"partition {job.partition} is not owned"))
            return failed
        done = writer.submit(job.job_id, events)
        done.add_done_callback(lambda f: _log_failure(job.job_id, f))
        return done

    async def _finalize(self, job: OwnedJob, command: FinalizeCheckpoint) -> None:
        metadata = json.dumps(
            {
                "job_id": command.job_id,
                "checkpoint_id": command.checkpoint_id,
                "snapshot_type": command.snapshot_type.name,
                "trigger_timestamp": command.trigger_ms,
                "subtasks": [
                    {
                        "subtask_id": ack.subtask_id,
                        "state_size": ack.state_size_bytes,
                        "state_handles": [
                            {"path": h.path, "kind": h.kind.name, "size": h.size_bytes, "shared": h.shared,
                             "key_groups": [h.key_group_start, h.key_group_end]}
                            for h in ack.state_handles
                        ],
                    }
                    for ack in command.acknowledgements
                ],
            },
            indent=1,
        ).encode()  # fmt: skip
        path = f"{command.external_path}/_metadata"
        try:
            await asyncio.to_thread(self.storage.write_atomic, path, metadata)
        except Exception as exc:
            log.error(
                "job %s checkpoint %d: writing %s failed: %s",
                command.job_id,
                command.checkpoint_id,
                path,
                exc,
            )
            if self.jobs.get(job.job_id) is job:
                self._execute(
                    job,
                    job.core.on_finalize_failed(
                        command.checkpoint_id, self.clock.now_ms(), str(exc)
                    ),
                )
            return
        if self.jobs.get(job.job_id) is job and command.checkpoint_id in job.core.pending:
            self._execute(job, job.core.on_finalized(command.checkpoint_id, self.clock.now_ms()))

    def _discard(self, command: DiscardState) -> None:
        try:
            self.storage.delete(command.discard.files, command.discard.directory)
        except Exception as exc:  # a failed discard leaves garbage, never breaks the job
            log.warning(
                "job %s: discarding checkpoint %d state failed: %s",
                command.job_id,
                command.discard.checkpoint_id,
                exc,
            )

    def _answer(self, command: RequestCompleted | RequestFailed) -> None:
        request = self.requests.get(command.request_id)
        if request is None:
            return
        if isinstance(command, RequestCompleted):
            request.status, request.checkpoint_id, request.location = (
                "COMPLETED",
                command.checkpoint_id,
                command.external_path,
            )
        else:
            request.status, request.failure = (
                "COMPLETED",
                f"{command.reason.name}: {command.message}",
            )

    # --- operations for the REST API (on the loop) ------------------------------------------------------

    def job(self, job_id: str) -> OwnedJob:
        job = self.jobs.get(job_id)
        if job is None:
            raise UnknownJob(job_id)
        return job

    def trigger(
        self,
        job_id: str,
        savepoint: bool,
        target_directory: str | None = None,
        terminate: bool = False,
        full: bool = False,
    ) -> TriggerRequest:
        job = self.job(job_id)
        if target_directory is not None:
            self.storage.check(target_directory)
        request = TriggerRequest(uuid.uuid4().hex, job_id, savepoint)
        self.requests[request.request_id] = request
        now = self.clock.now_ms()
        if savepoint:
            commands = job.core.trigger_savepoint(
                now, request.request_id, target_directory, terminate
            )
        else:
            commands = job.core.trigger_checkpoint(now, request.request_id, full=full)
        self._execute(job, commands)
        return request

    async def update_configuration(
        self, job_id: str, changes: CheckpointSettings, principal: str, request_id: str
    ) -> CheckpointConfig:
        """FLIP-571: validate, persist (acknowledged), apply, then publish the change event."""
        job = self.job(job_id)
        if job.updating:
            raise UpdateInProgress(job_id)
        job.updating = True
        try:
            current = job.core.config
            new_config = current.with_overrides(changes)  # raises ConfigError: 400
            merged = _merge(
                job.overrides.overrides if job.overrides else CheckpointSettings(), changes
            )
            version = (job.overrides.version if job.overrides else 0) + 1
            record = CheckpointOverrides(job_id, version, merged, request_id, self.clock.now_ms())
            await asyncio.wrap_future(self._publish(job, [record]))  # persisted before it applies
            live = self.jobs.get(job_id)
            if live is None:
                raise NotOwner(job_id)  # persisted: the next owner applies it on takeover
            if live is not job:  # the job restarted meanwhile: apply to its new coordinator
                current, new_config = live.core.config, live.core.config.with_overrides(changes)
                job = live
            job.overrides = record
            now = self.clock.now_ms()
            self._execute(job, job.core.apply_config(new_config, now))
            changed = [name for name, value in _rest_fields(changes).items() if value is not None]
            change = ConfigChange(
                job_id,
                request_id,
                principal,
                now,
                current.settings(),
                new_config.settings(),
                changed,
                version,
            )
            self._publish(job, [change])
            return new_config
        finally:
            job.updating = False


def _log_failure(job_id: str, done: Future[None]) -> None:
    error = done.exception()
    if error is not None:
        log.warning("publishing for job %s failed: %s", job_id, error)


def _skip_unexpected(record: Received) -> None:
    log.warning(
        "unexpected %s on %s[%d]@%d skipped",
        type(record.event).__name__,
        record.topic,
        record.partition,
        record.offset,
    )


def _rest_fields(settings: CheckpointSettings) -> dict[str, Any]:
    return {rest: getattr(settings, field) for rest, field in REST_FIELDS.items()}


def _merge(base: CheckpointSettings, changes: CheckpointSettings) -> CheckpointSettings:
    return dataclasses.replace(
        base,
        **{
            f.name: getattr(changes, f.name)
            for f in dataclasses.fields(changes)
            if getattr(changes, f.name) is not None
        },
    )
