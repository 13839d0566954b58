"""The jobs this instance runs and those that ended here, from the records of the jobs topic.

A partition just taken is first read from the start, to the end offset taken at assignment
(`ReplayedPartition`): each job is then taken over as the previous owner left it (`adopt`),
running or ended, and its agent answered again. After that, each registration is judged
(`admit`: well-formed, and the lease of the agent that holds the job) and answered in the same
transaction as the job's store record; an accepted one gets a fresh coordinator (`starting`).
Status changes of the agent that drives a job restart it, end it, or set its backlog. Only the
agent that holds a job is heard; everything else is refused and counted (`Rejections`).

This registry may publish for a job (`Publisher`) and carry out its coordinator's commands (the
``execute`` it is given), and reads what ownership knows (`JobPartitions`); it never touches
Kafka itself."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from sparkpoint.common.clock import Clock
from sparkpoint.common.events import (
    CheckpointOverrides,
    Event,
    JobRegistered,
    JobStatus,
    JobStatusChanged,
    RegistrationResponse,
)
from sparkpoint.common.flink_ids import flink_job_id, is_flink_id
from sparkpoint.common.kafka import Received
from sparkpoint.common.limits import LEASE_TIMEOUT_MS, job_id_problem
from sparkpoint.common.storage import PathOutsideRoots, Storage
from sparkpoint.common.topics import CHECKPOINT_OVERRIDES
from sparkpoint.coordinator.core.admission import (
    ACCEPT,
    Admission,
    Refusal,
    admit,
    adopt,
    registration_problem,
    sender_problem,
)
from sparkpoint.coordinator.core.commands import CancelTimer, Command, Timer
from sparkpoint.coordinator.service.owned import OwnedJob
from sparkpoint.coordinator.service.ownership import Takeover
from sparkpoint.coordinator.service.publisher import Publisher
from sparkpoint.coordinator.service.rejections import Rejections, skip_unexpected
from sparkpoint.coordinator.service.settings import ServiceSettings
from sparkpoint.coordinator.service.starting import JobStarter
from sparkpoint.coordinator.service.writer import Tombstone

log = logging.getLogger(__name__)


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


class JobPartitions(Protocol):
    """What the registry asks of ownership (`ownership.OwnedPartitions` is one)."""

    def owns(self, partition: int) -> bool: ...
    def epoch(self, partition: int, default: int) -> int: ...
    def partition_of(self, job_id: str) -> int: ...


Execute = Callable[[OwnedJob, Sequence[Command]], None]


class JobRegistry:
    def __init__(
        self,
        settings: ServiceSettings,
        clock: Clock,
        storage: Storage,
        partitions: JobPartitions,
        publisher: Publisher,
        execute: Execute,
        rejections: Rejections,
        cancel_timer: Callable[[Timer], None],
        later: Callable[[float, Callable[[], None]], None],
    ) -> None:
        """``later(delay_s, work)`` runs ``work`` on the loop after ``delay_s``."""
        self.settings, self.clock, self.storage = settings, clock, storage
        self.partitions, self.publisher, self.execute = partitions, publisher, execute
        self.rejections, self.cancel_timer, self.later = rejections, cancel_timer, later
        self.starter = JobStarter(settings.defaults, storage, clock)
        self.jobs: dict[str, OwnedJob] = {}
        self.ended: dict[str, OwnedJob] = {}
        self._replaying: dict[int, ReplayedPartition] = {}
        self._replayed_overrides: dict[str, CheckpointOverrides] = {}

    # --- names ---------------------------------------------------------------------------------------------

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

    # --- partitions taken and lost (`ownership.PartitionListener`) -------------------------------------

    def take_over(self, takeover: Takeover) -> None:
        self._replayed_overrides.update(takeover.overrides)
        for partition in takeover.partitions:
            self.publisher.remember(takeover.stores.get(partition, {}))
            if partition in takeover.ends:
                self._replaying[partition] = ReplayedPartition(takeover.ends[partition])

    def drop(self, partitions: set[int]) -> None:
        """Ownership lost: forget the jobs without publishing anything for them."""
        for job_id in [j for j, job in self.jobs.items() if job.partition in partitions]:
            job = self.jobs.pop(job_id)
            for command in job.core.suspend(self.clock.now_ms()):
                if isinstance(command, CancelTimer):
                    self.cancel_timer(command.timer)
            log.info("job %s released (partition %d)", job_id, job.partition)
        self.publisher.forget(partitions)
        for partition in partitions:
            self._replaying.pop(partition, None)

    # --- the records of the jobs topic ------------------------------------------------------------

    def on_job_record(self, record: Received) -> None:
        if not self.partitions.owns(record.partition) or record.key is None:
            return
        replay = self._replaying.get(record.partition)
        if replay is not None:
            if record.offset < replay.end:
                replay.add(record)
                if record.offset == replay.end - 1:
                    self.finish_replay(record.partition)
                return
            self.finish_replay(record.partition)  # a live record: the history is complete
        event = record.event
        if event is None:
            self._on_tombstone(record)
        elif isinstance(event, JobRegistered):
            self._on_registration(record, event)
        elif isinstance(event, JobStatusChanged):
            self._on_status(record, event)
        else:
            skip_unexpected(record)

    def finish_replay(self, partition: int) -> None:
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
        self.later(
            LEASE_TIMEOUT_MS / 1000,
            lambda: self.on_job_record(record) if self.partitions.owns(record.partition) else None,
        )

    def _in_roots(self, path: str) -> bool:
        try:
            self.storage.check(path)
        except PathOutsideRoots:
            return False
        return True

    # --- registrations ------------------------------------------------------------------------------

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
        started = self.starter.start(
            registration,
            partition,
            self.partitions.epoch(partition, 1),
            adopted,
            (previous, self.ended.get(job_id)),
            self.publisher.durable.get(job_id),
            self._replayed_overrides.get(job_id),
        )
        if started is None:
            return None
        job, core = started.job, started.job.core
        self.jobs[job_id] = job
        self.ended.pop(job_id, None)
        log.info(
            "job %s %s: agent %s attempt %d, partition %d, %d subtasks, next checkpoint id %d",
            job_id, "taken over" if adopted else "registered", registration.agent_id,
            registration.attempt, partition, len(core.job.subtasks), core.counter.get(),
        )  # fmt: skip
        now = started.now_ms
        # the holder, durable in the same transaction as its acceptance; the record first: an
        # agent confirms a new owner's epoch by reading it, and the abort notices a takeover owes
        # carry that epoch (an agent that reads a notice first holds it until the record shows
        # the epoch, agent/control/membership.py: the record first spares it that wait)
        answer: list[Event] = [] if adopted else [self._response(job, registration, ACCEPT)]
        self.publisher.publish(job, [core.store_record(now), *started.left_pending, *answer])
        self.execute(job, core.start(now))
        return job

    def _response(
        self, job: OwnedJob | None, registration: JobRegistered, admission: Admission
    ) -> RegistrationResponse:
        held = admission.refusal in (Refusal.ATTEMPT, Refusal.LEASE_HELD)
        holder = job.holder() if job is not None and held else None
        now = self.clock.now_ms()
        partitions = self.partitions
        return RegistrationResponse(
            registration.job_id,
            partitions.epoch(partitions.partition_of(registration.job_id), 0),
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

    # --- status changes, tombstones, the end of a job ---------------------------------------------

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
            self.execute(job, job.core.suspend(now))
        elif event.status.is_terminal:
            self._end_job(event.job_id, event.status)
        elif event.end_of_input:
            # FLIP-147: bounded input ended; the final checkpoint goes now, not at the next tick
            self.execute(job, job.core.trigger_checkpoint(self.clock.now_ms()))
        elif event.processing_backlog is not None:
            self.execute(job, job.core.set_backlog(event.processing_backlog, self.clock.now_ms()))

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

    def _end_job(self, job_id: str, status: JobStatus | None) -> None:
        job = self.jobs.pop(job_id, None)
        if job is None:
            return
        commands = (
            job.core.shutdown(status, self.clock.now_ms())
            if status
            else job.core.suspend(self.clock.now_ms())
        )
        self.execute(job, commands)
        if status is not None:
            job.status = status
            job.history.record(status, self.clock.now_ms())
            self.ended[job_id] = job
            # what retention kept, and no overrides any more
            self.publisher.publish(
                job, [job.core.store_record(self.clock.now_ms()), Tombstone(CHECKPOINT_OVERRIDES)]
            )
            log.info("job %s ended: %s", job_id, status.name)
