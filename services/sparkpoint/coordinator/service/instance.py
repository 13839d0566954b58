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

Threads. The jobs consumer (here), the acknowledgement reader (`acks.py`), the transactional
writers (`writer.py`) and the file threads (`files.py`) run beside the asyncio loop, which runs
the coordinators, the timers and the REST API and gets the threads' work as its own callbacks.
What the service keeps per job is in `owned.py`.

Acknowledgements, the cores' commands, ``_metadata`` and completion go through `pipeline.py`;
publication through `publisher.py`; the timers are `timers.py`'s; refused events are counted by
`rejections.py`; what the REST API asks is done by `operations.py`.
"""

from __future__ import annotations

import asyncio
import logging
import posixpath
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition

from sparkpoint.common.avro import EventCodec
from sparkpoint.common.checkpoint_store import newer
from sparkpoint.common.clock import SystemClock
from sparkpoint.common.events import (
    CheckpointEventType,
    CheckpointFailureReason,
    CheckpointLifecycleEvent,
    CheckpointOverrides,
    CheckpointSettings,
    CheckpointStoreRecord,
    CoordinatorAnnouncement,
    Event,
    JobRegistered,
    JobStatus,
    JobStatusChanged,
    NotifyCheckpointAborted,
    RegistrationResponse,
    SavepointFormat,
    SnapshotType,
)
from sparkpoint.common.flink_ids import candidate_partitions, flink_job_id, is_flink_id
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
from sparkpoint.common.limits import LEASE_TIMEOUT_MS, job_id_problem
from sparkpoint.common.metadata import BadMetadata, SnapshotMetadata
from sparkpoint.common.settings import CheckpointConfig, ConfigError, RecoveryConfig
from sparkpoint.common.storage import CHECKPOINT_DIR, PathOutsideRoots, Storage
from sparkpoint.common.topics import (
    ACKS,
    CHECKPOINT_OVERRIDES,
    CHECKPOINT_STORE,
    COORDINATORS,
    JOBS,
    topic_prefix,
)
from sparkpoint.coordinator.core.admission import (
    ACCEPT,
    Admission,
    Refusal,
    admit,
    adopt,
    registration_problem,
    sender_problem,
)
from sparkpoint.coordinator.core.commands import (
    CancelTimer,
)
from sparkpoint.coordinator.core.coordinator import CheckpointCoordinator, JobInfo
from sparkpoint.coordinator.core.store import CompletedCheckpoint
from sparkpoint.coordinator.service.acks import AckReader
from sparkpoint.coordinator.service.files import FileWork
from sparkpoint.coordinator.service.memory_counter import InMemoryCheckpointIdCounter
from sparkpoint.coordinator.service.operations import Operations, TriggerRequests
from sparkpoint.coordinator.service.owned import (
    JobHistory,
    OwnedJob,
    TriggerRequest,
)
from sparkpoint.coordinator.service.pipeline import CheckpointPipeline, CommandExecutor
from sparkpoint.coordinator.service.publisher import Publisher
from sparkpoint.coordinator.service.rejections import Rejections, skip_unexpected
from sparkpoint.coordinator.service.timers import Timers
from sparkpoint.coordinator.service.trace import StepTrace
from sparkpoint.coordinator.service.writer import (
    PartitionWriter,
    Tombstone,
    TransactionTurns,
)
from sparkpoint.overrides.store import OverrideStore

log = logging.getLogger(__name__)

POLL_TIMEOUT_S = 0.05
"""Consumer threads wake this often to notice stop requests and reassignments."""

STOP_CHECK_S = 0.1
"""How often the running service looks whether it was asked to stop."""

LEFT_PENDING_WINDOW = 16
"""How many of the newest ids a new owner declares aborted (see `_left_pending`)."""


@dataclass
class ReplayedPartition:
    """A partition of the jobs topic being read from the start after its assignment, up to the
    end offset taken then: each job's well-keyed registrations and status changes, in order."""

    end: int
    jobs: dict[str, list[Received]] = field(default_factory=dict)

    def add(self, record: Received) -> None:
        event = record.event
        if isinstance(event, JobRegistered | JobStatusChanged) and event.job_id == record.key:
            self.jobs.setdefault(event.job_id, []).append(record)


# --- the service ------------------------------------------------------------------------------------


@dataclass
class ServiceSettings:
    bootstrap: str
    defaults: CheckpointConfig = field(default_factory=CheckpointConfig)
    instance_id: str = field(default_factory=lambda: f"coordinator-{uuid.uuid4().hex[:8]}")
    rest_url: str = ""
    history_url: str | None = None
    """The history service (`sparkpoint history`): checkpoint statistics from before this
    instance owned a job are added from it (`sparkpoint.coordinator.service.earlier`)."""
    transactions_in_flight: int = 1
    """How many of this instance's partition writers may have a transaction open at once
    (`sparkpoint.coordinator.service.writer.TransactionTurns`)."""

    def roots(self) -> list[str]:
        """The storage roots: every path the coordinator writes or deletes lies inside one."""
        return [self.defaults.checkpoint_dir, self.defaults.savepoint_dir]


class CoordinatorService:
    def __init__(self, settings: ServiceSettings, codec: EventCodec | None = None) -> None:
        self.settings = settings
        self.codec = codec or EventCodec()
        self.clock = SystemClock()
        self.storage = Storage(settings.roots())
        self.jobs: dict[str, OwnedJob] = {}
        self.ended: dict[str, OwnedJob] = {}
        self.writers: dict[int, PartitionWriter] = {}
        self.turns = TransactionTurns(settings.transactions_in_flight)
        """Shared by this instance's partition writers: how many transactions are open at once."""
        self.epochs: dict[int, int] = {}
        self.malformed = 0
        self.timers = Timers()
        self._stop = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._replayed_overrides: dict[str, CheckpointOverrides] = {}
        self.rejections = Rejections()
        self.files = FileWork(self.storage, self._post, start=False)
        """``_metadata`` writes and discards, on threads of their own (started by `run`)."""
        self.publisher = Publisher(
            lambda partition: self.writers.get(partition), self._partition_of, self._stop.is_set
        )
        self._requests = TriggerRequests()
        self.executor = CommandExecutor(
            self.publisher, self.timers, self.files, self.clock, self._requests.answer
        )
        self.pipeline = CheckpointPipeline(
            self.jobs, self.executor, self.files, self.clock, self.rejections
        )
        self.executor.finalize = self.pipeline.finalize  # the one edge bound after building
        self.operations = Operations(
            self.jobs, self.ended, self._requests, self.storage, self.clock, self.publisher,
            self.executor.execute, lambda job_id: self.owner_url(job_id),
        )  # fmt: skip
        self._replaying: dict[int, ReplayedPartition] = {}
        self._replay_targets: dict[int, int] = {}
        """Partition -> end offset to replay to, for the jobs consumer thread."""
        self._replay_lock = threading.Lock()
        pipeline = self.pipeline
        self.acks = AckReader(
            settings.bootstrap,
            f"{settings.instance_id}-acks",
            self.codec,
            lambda records: self._post(lambda: pipeline.on_acks(records)),
            self._report_malformed,
            self._stop,
        )
        self._threads: list[threading.Thread] = []
        self.ready = threading.Event()
        self.partition_count = 0
        self.owners: dict[int, CoordinatorAnnouncement] = {}
        """For every partition, the newest announcement claiming it (read from the coordinators
        topic): where to redirect requests for jobs this instance does not own."""
        self._announcer: EventPublisher | None = None
        self.partitions_lost = 0
        """Partitions taken from this instance while it ran (revoked, lost or fenced)."""
        self._trace: StepTrace | None = None

    @property
    def trace(self) -> StepTrace | None:
        """Installed by the latency benchmark: when each step of each checkpoint happened."""
        return self._trace

    @trace.setter
    def trace(self, trace: StepTrace | None) -> None:
        self._trace = trace
        self.acks.trace = self.pipeline.trace = self.executor.trace = trace

    @property
    def requests(self) -> dict[str, TriggerRequest]:
        return self._requests.by_id

    @property
    def durable(self) -> dict[str, CheckpointStoreRecord]:
        """Every owned job's store record as it stands once what was submitted commits."""
        return self.publisher.durable

    @property
    def rejected(self) -> Counter[tuple[str, str]]:
        """(topic, kind) -> events refused because they may not touch a running job."""
        return self.rejections.counts

    # --- running ---------------------------------------------------------------------------------------

    async def run(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.files.start()
        self._announcer = EventPublisher(
            make_producer(self.settings.bootstrap, one_record_per_batch=True), self.codec
        )
        self._threads = [
            threading.Thread(target=self._consume_jobs, name="sparkpoint-jobs", daemon=True),
            threading.Thread(target=self.acks.run, name="sparkpoint-acks", daemon=True),
            threading.Thread(
                target=self._consume_announcements, name="sparkpoint-coordinators", daemon=True
            ),
        ]
        for thread in self._threads:
            thread.start()
        timers = asyncio.create_task(self.timers.run(self.clock, self.pipeline.on_timer))
        try:
            while not self._stop.is_set():
                await asyncio.sleep(STOP_CHECK_S)
        finally:
            timers.cancel()
            self._stop.set()
            for thread in self._threads:
                await asyncio.to_thread(thread.join, 10)
            for writer in self.writers.values():
                writer.close()
            await asyncio.to_thread(self.files.close)
            self._announce(partitions=[])
            if self._announcer is not None:
                self._announcer.close(5)

    def stop(self) -> None:
        self._stop.set()

    def _post(self, work: Callable[[], None]) -> None:
        """From any thread: run ``work`` on the loop, in order (the loop's own queue of
        callbacks: no task, no timer per item)."""
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._run_work, work)

    def _run_work(self, work: Callable[[], None]) -> None:
        if self._stop.is_set():
            return  # stopping: what the threads still hand over is dropped, as before a restart
        try:
            work()
        except Exception:
            log.exception("coordinator work item failed")

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
                self._post(lambda p=tp.partition: self._finish_replay(p))  # type: ignore[misc]

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        owned = sorted(tp.partition for tp in partitions)
        self.partition_count = len(
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

        def apply() -> None:
            self.writers.update(writers)
            self.epochs.update(epochs)
            self._replayed_overrides.update(overrides)
            for partition in owned:
                self.publisher.remember(stores.get(partition, {}))
                if ends.get(partition, 0) > 0:
                    self._replaying[partition] = ReplayedPartition(ends[partition])
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
            writer = self.writers.get(partition)
            if writer is not None:
                writer.close()
        self._post(lambda: self._drop_partitions(lost))

    def _on_fenced(self, writer: PartitionWriter) -> None:
        self.partitions_lost += 1

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
        self.publisher.forget(partitions)  # the next owner replays what was committed
        for partition in partitions:
            writer = self.writers.pop(partition, None)
            if writer is not None:
                threading.Thread(target=writer.close, daemon=True).start()
            self._replaying.pop(partition, None)
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
        """The REST address of the instance that owns ``job_id`` (a job id, or a Flink JobID
        this instance does not know), when it is another one."""
        routed = self.route(job_id)
        return None if routed is None else routed[0]

    def route(self, job_id: str, tried: Collection[int] = ()) -> tuple[str, int] | None:
        """Where a request for ``job_id`` goes when this instance does not have the job: the
        REST address of the instance owning the first of its partitions (one for a job id; for
        a Flink JobID the one it names and the one of the text as a job id) that is not this
        instance's and not ``tried`` already, and that partition; None when there is none."""
        if not self.partition_count:
            return None
        if is_flink_id(job_id) and job_id not in self.jobs:
            candidates = candidate_partitions(job_id, self.partition_count)
        else:
            candidates = [partition_of(job_id, self.partition_count)]
        for partition in candidates:
            if partition in self.writers or partition in tried:
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

    def resolve(self, name: str) -> str:
        """The job id named by ``name``: a job id, or the Flink JobID of a job running or ended
        here. Anything else comes back as it is (the caller finds no such job)."""
        if name in self.jobs or name in self.ended or not is_flink_id(name):
            return name
        wanted = name.lower()
        for job_id in (*self.jobs, *self.ended):
            if flink_job_id(job_id) == wanted:
                return job_id
        return name

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
            elif (
                isinstance(event, CheckpointStoreRecord)
                and event.job_id == record.key
                and newer(event, stores[record.partition].get(record.key))
            ):
                stores[record.partition][record.key] = event
        return overrides, stores

    def _partition_of(self, job_id: str) -> int:
        return partition_of(job_id, self.partition_count) if self.partition_count else -1

    def _on_job_record(self, record: Received) -> None:
        if record.partition not in self.writers or record.key is None:
            return
        replay = self._replaying.get(record.partition)
        if replay is not None:
            if record.offset < replay.end:
                replay.add(record)
                if record.offset == replay.end - 1:
                    self._finish_replay(record.partition)
                return
            self._finish_replay(record.partition)  # a live record: the history is complete
        event = record.event
        if event is None:
            self._on_tombstone(record)
        elif isinstance(event, JobRegistered):
            self._on_registration(record, event)
        elif isinstance(event, JobStatusChanged):
            self._on_status(record, event)
        else:
            skip_unexpected(record)

    def _finish_replay(self, partition: int) -> None:
        """The partition's history is read: take over its jobs as the previous owner left them
        (`adopt`), running or ended, and answer their agents again. Registrations that came
        after the adopted one were never answered (the previous owner was gone): the adopted
        agent's own are judged now; another agent's once the adopted agent's lease, which
        starts at the takeover, has had time to run out, or to be renewed by its heartbeats."""
        replay = self._replaying.pop(partition, None)
        if replay is None:
            return
        roots = ", ".join(self.settings.roots())
        for job_id, records in replay.jobs.items():
            kept = [
                r
                for r in records
                if not isinstance(r.event, JobRegistered)
                or registration_problem(r.event, job_id, self._in_roots, roots) is None
            ]
            history = [
                r.event for r in kept if isinstance(r.event, JobRegistered | JobStatusChanged)
            ]
            adoption = adopt(history, self.publisher.durable.get(job_id))
            if adoption is None:
                continue
            job = self._start_job(adoption.registration, partition, adopted=True)
            if adoption.status.is_terminal:
                self._end_job(job_id, adoption.status)
            elif job is not None:
                self._respond(job.job_id, partition, adoption.registration, ACCEPT)
            adopted_at = max(i for i, e in enumerate(history) if e is adoption.registration)
            for record in kept[adopted_at + 1 :]:
                event = record.event
                if not isinstance(event, JobRegistered):
                    continue
                same_agent = event.agent_id == adoption.registration.agent_id
                if same_agent or job_id not in self.jobs:
                    self._on_registration(record, event)
                else:
                    self._judge_later(record)
        log.info("partition %d replayed: %d jobs", partition, len(replay.jobs))

    def _judge_later(self, record: Received) -> None:
        assert self._loop is not None
        self._loop.call_later(
            LEASE_TIMEOUT_MS / 1000,
            self._post,
            lambda: self._on_job_record(record) if record.partition in self.writers else None,
        )

    def _well_formed(self, record: Received, registration: JobRegistered) -> bool:
        problem = registration_problem(
            registration, record.key, self._in_roots, ", ".join(self.settings.roots())
        )
        if problem is None:
            return True
        self.rejections.reject(record, "registration", problem)
        if job_id_problem(registration.job_id) is None and record.key == registration.job_id:
            self._respond(
                registration.job_id,
                record.partition,
                registration,
                Admission.refuse(Refusal.INVALID, problem),
            )
        return False

    def _on_registration(self, record: Received, registration: JobRegistered) -> None:
        if not self._well_formed(record, registration):
            return
        job = self.jobs.get(registration.job_id)
        now = self.clock.now_ms()
        admission = admit(registration, job.holder() if job else None, now)
        if admission.duplicate:
            assert job is not None
            self._respond(job.job_id, job.partition, registration, admission)
            return
        if not admission.accepted:
            assert job is not None and admission.reason is not None
            self.rejections.reject(record, "registration", admission.reason)
            self._respond(job.job_id, job.partition, registration, admission)
            # compaction keeps the newest record per job: make it the holder's again
            self.publisher.publish(job, [job.registration])
            return
        self._start_job(registration, record.partition)

    def _start_job(
        self, registration: JobRegistered, partition: int, adopted: bool = False
    ) -> OwnedJob | None:
        """A fresh coordinator for an accepted registration (a new job, a restart, a takeover of
        a job whose agent died, or a job taken over with its partition)."""
        job_id = registration.job_id
        previous = self.jobs.get(job_id)
        if previous is not None:
            self._end_job(job_id, None)  # a restart: a fresh coordinator, same stores
        try:
            base = CheckpointConfig.from_options(registration.configuration, self.settings.defaults)
        except ConfigError as exc:  # the defaults and the job's options together are invalid
            log.error(
                "job %s: its configuration is invalid with this coordinator's defaults: %s",
                job_id,
                exc,
            )
            return None
        replayed = self._replayed_overrides.get(job_id)
        overrides = previous.overrides if previous is not None else replayed
        config = base
        if overrides is not None:
            try:
                config = base.with_overrides(overrides.overrides)
            except ConfigError as exc:
                log.error(
                    "job %s: stored overrides no longer apply (%s); using its configuration",
                    job_id,
                    exc,
                )
        subtasks = tuple(s.subtask_id for s in registration.subtasks)
        core = CheckpointCoordinator(
            JobInfo(job_id, subtasks, registration.agent_id, registration.attempt),
            config,
            InMemoryCheckpointIdCounter(),
            owner_epoch=self.epochs.get(partition, 1),
        )
        if previous is not None:  # a restart: the job's statistics go on
            core.stats = previous.core.stats
        now = self.clock.now_ms()
        durable = self.publisher.durable.get(job_id)
        ended = self.ended.get(job_id)
        left_pending: list[Event] = []
        core.counter.set_count(self._next_id(registration, config, durable, previous, ended))
        if previous is not None:  # what this instance knows is newer than any store record
            core.restore(
                previous.core.store.checkpoints,
                last_completed_id=previous.core.last_completed_id,
                savepoints=previous.core.savepoints,
            )
        elif durable is not None:
            core.restore(
                [CompletedCheckpoint.from_record(r) for r in durable.retained],
                last_completed_id=durable.last_completed_checkpoint_id,
                savepoints=durable.savepoints,
            )
            if adopted and durable.job_status in (None, JobStatus.RUNNING.name):
                left_pending = self._left_pending(job_id, durable, core.owner_epoch, now)
        if previous is None and registration.restored_external_path is not None:
            self._claim(core, registration, config)
        if registration.restored_checkpoint_id is not None:
            core.stats.on_restored(
                registration.restored_checkpoint_id,
                registration.timestamp,
                False,
                registration.restored_external_path or "",
            )
        history = (
            previous.history if previous else JobHistory(started_ms=registration.timestamp or now)
        )
        history.record(JobStatus.RUNNING, now)
        job = OwnedJob(
            registration, partition, base, core, overrides, last_seen_ms=now, history=history
        )
        self.jobs[job_id] = job
        self.ended.pop(job_id, None)
        log.info(
            "job %s %s: agent %s attempt %d, partition %d, %d subtasks, next checkpoint id %d",
            job_id, "taken over" if adopted else "registered", registration.agent_id,
            registration.attempt, partition, len(subtasks), core.counter.get(),
        )  # fmt: skip
        # the holder, durable in the same transaction as its acceptance
        answer = [] if adopted else [self._response(job, registration, ACCEPT)]
        self.publisher.publish(job, [*left_pending, core.store_record(now), *answer])
        self.executor.execute(job, core.start(now))
        return job

    def _claim(
        self, core: CheckpointCoordinator, registration: JobRegistered, config: CheckpointConfig
    ) -> None:
        """CLAIM mode (``execution.state-recovery.claim-mode``): the snapshot the job restored
        becomes a retained checkpoint of the job, which retention subsumes and deletes like any
        other. NO_CLAIM (the default): never touched (the agent's first checkpoint is full)."""
        path = registration.restored_external_path
        if (
            path is None
            or RecoveryConfig.from_options(registration.configuration).claim_mode != "CLAIM"
        ):
            return
        held = next((c for c in core.store.checkpoints if c.external_path == path), None)
        if held is not None and not held.is_savepoint:
            return  # already a checkpoint of the job's own
        if held is not None:  # a savepoint it keeps: from now on a checkpoint retention deletes
            core.store.remove(held)  # (its files are claimed below, not discarded)
        try:
            data = self.storage.read(f"{path}/_metadata")
            metadata = SnapshotMetadata.from_json(data, path)
        except (OSError, BadMetadata, PathOutsideRoots) as exc:
            log.error("job %s: cannot claim %s: %s", registration.job_id, path, exc)
            return
        now = self.clock.now_ms()
        claimed = CompletedCheckpoint(
            metadata.checkpoint_id, SnapshotType.CHECKPOINT, False, metadata.trigger_ms, now,
            path, metadata.state_size, tuple(metadata.files()),
        )  # fmt: skip
        core.restore([claimed])
        log.info(
            "job %s claimed %s (checkpoint %d)", registration.job_id, path, claimed.checkpoint_id
        )

    def _next_id(
        self,
        registration: JobRegistered,
        config: CheckpointConfig,
        durable: CheckpointStoreRecord | None,
        previous: OwnedJob | None,
        ended: OwnedJob | None,
    ) -> int:
        """The job's next checkpoint id: above every id it ever used. The durable store record
        (updated with every record this instance writes), the coordinators of its earlier
        runs here, the checkpoint it restored, and, when no store record exists (a new job, or a
        broker that lost its topics), the checkpoint directories on storage."""
        candidates = [1]
        if durable is not None:
            candidates.append(durable.checkpoint_id_counter)
        for earlier in (previous, ended):
            if earlier is not None:
                candidates.append(earlier.core.counter.get())
        if registration.restored_checkpoint_id is not None:
            candidates.append(registration.restored_checkpoint_id + 1)
        if durable is None:
            candidates.append(
                self._directories_floor(
                    f"{config.checkpoint_dir.rstrip('/')}/{registration.job_id}"
                )
            )
        return max(candidates)

    def _directories_floor(self, job_dir: str) -> int:
        """One above the highest ``chk-<id>`` directory under ``job_dir`` (1 when none)."""
        try:
            names = [posixpath.basename(d.rstrip("/")) for d in self.storage.list_dirs(job_dir)]
        except Exception as exc:  # storage trouble must not block a registration
            log.warning("listing %s for used checkpoint ids failed: %s", job_dir, exc)
            return 1
        ids = [int(m.group(1)) for n in names if (m := CHECKPOINT_DIR.match(n))]
        return max(ids, default=0) + 1

    def _in_roots(self, path: str) -> bool:
        try:
            self.storage.check(path)
        except PathOutsideRoots:
            return False
        return True

    def _response(
        self, job: OwnedJob | None, registration: JobRegistered, admission: Admission
    ) -> RegistrationResponse:
        held = admission.refusal in (Refusal.ATTEMPT, Refusal.LEASE_HELD)
        holder = job.holder() if job is not None and held else None
        now = self.clock.now_ms()
        return RegistrationResponse(
            registration.job_id,
            self.epochs.get(self._partition_of(registration.job_id), 0),
            registration.agent_id,
            registration.attempt,
            admission.accepted,
            now,
            reason=admission.reason,
            refusal=admission.refusal.name if admission.refusal else None,
            holder_agent_id=holder.agent_id if holder else None,
            holder_attempt=holder.attempt if holder else None,
            holder_seen_ms_ago=now - holder.last_seen_ms if holder else None,
            checkpoint_id_counter=job.core.counter.get()
            if job is not None and admission.accepted
            else None,
        )

    def _respond(
        self, job_id: str, partition: int, registration: JobRegistered, admission: Admission
    ) -> None:
        response = self._response(self.jobs.get(job_id), registration, admission)
        self.publisher.publish_to(job_id, partition, [response])

    def _on_status(self, record: Received, event: JobStatusChanged) -> None:
        job = self.jobs.get(event.job_id)
        problem = (
            f"key {record.key!r} is not the job id"
            if record.key != event.job_id
            else sender_problem(
                job.holder() if job else None, event.agent_id, event.attempt, "status change"
            )
        )
        if problem is not None:
            if (
                job is not None or event.job_id not in self.ended
            ):  # a late word of an ended job is no news
                self.rejections.reject(record, "status", problem)
            return
        assert job is not None
        now = self.clock.now_ms()
        job.last_seen_ms = now
        if event.exception_name is not None or event.status is JobStatus.RESTARTING:
            job.history.failed(event)
            self.publisher.publish(job, [event])  # the audit topic keeps the job's failures
        if event.status is JobStatus.RESTARTING:
            # Flink stops checkpointing while a job restarts; the agent's next registration
            # (the next attempt) brings a fresh coordinator with the same stores and history
            job.status = JobStatus.RESTARTING
            job.history.restarts += 1
            job.history.record(JobStatus.RESTARTING, now)
            self.executor.execute(job, job.core.suspend(now))
        elif event.status.is_terminal:
            self._end_job(event.job_id, event.status)
        elif event.end_of_input:
            # FLIP-147: bounded input ended; the final checkpoint goes now, not at the next tick
            self.executor.execute(job, job.core.trigger_checkpoint(self.clock.now_ms()))
        elif event.processing_backlog is not None:
            self.executor.execute(
                job, job.core.set_backlog(event.processing_backlog, self.clock.now_ms())
            )

    def _on_tombstone(self, record: Received) -> None:
        """A tombstone on the jobs topic removes an ended job's record; a running job's agent
        ends its job with a status, never with a tombstone."""
        job_id = record.key or ""
        if job_id in self.jobs:
            self.rejections.reject(
                record, "tombstone", f"a tombstone for the running job {job_id} is ignored"
            )
            return
        self.ended.pop(job_id, None)

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
                NotifyCheckpointAborted(
                    job_id, epoch, checkpoint_id, reason, now, message,
                    agent_id=store.agent_id, attempt=store.attempt,
                )
            )  # fmt: skip
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
        self.executor.execute(job, commands)
        if status is not None:
            job.status = status
            job.history.record(status, self.clock.now_ms())
            self.ended[job_id] = job
            # what retention kept, and no overrides any more
            self.publisher.publish(
                job, [job.core.store_record(self.clock.now_ms()), Tombstone(CHECKPOINT_OVERRIDES)]
            )
            log.info("job %s ended: %s", job_id, status.name)

    # --- operations for the REST API, on the loop (`operations`) ---------------------------------------

    def job(self, job_id: str) -> OwnedJob:
        return self.operations.job(job_id)

    def trigger(
        self,
        job_id: str,
        savepoint: bool,
        target_directory: str | None = None,
        terminate: bool = False,
        full: bool = False,
        format_type: SavepointFormat = SavepointFormat.CANONICAL,
        trigger_id: str | None = None,
        drain: bool = False,
    ) -> TriggerRequest:
        return self.operations.trigger(
            job_id, savepoint, target_directory, terminate, full, format_type, trigger_id, drain
        )

    async def cancel(self, job_id: str, principal: str) -> None:
        await self.operations.cancel(job_id, principal)

    async def update_configuration(
        self, job_id: str, changes: CheckpointSettings, principal: str, request_id: str
    ) -> CheckpointConfig:
        return await self.operations.update_configuration(job_id, changes, principal, request_id)

    async def dispose_savepoint(self, path: str) -> TriggerRequest:
        return await self.operations.dispose_savepoint(path)

    async def savepoints_of(self, job: OwnedJob) -> list[dict[str, Any]]:
        return await self.operations.savepoints_of(job)
