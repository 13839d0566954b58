"""The coordinator service: every owned job's CheckpointCoordinator wired to Kafka, timers,
checkpoint storage and the REST API. This module only wires; each part is a module of its own:

- `ownership`: the partitions of ``sparkpoint.jobs`` this instance owns (consumer group,
  fencing writers, replay of the store and the overrides, epochs), and who owns the others;
- `registry`: the jobs running here and those that ended here, from the jobs topic (replay,
  admission, registration, status changes), each started by `starting`;
- `publisher`: one transaction per batch on the job's partition, and the store records as
  committed;
- `pipeline`: acknowledgements -> core -> commands (`CommandExecutor`) -> ``_metadata`` ->
  completion -> publication;
- `operations`: what the REST API asks (trigger, cancel, configuration, savepoints);
- `timers`, `rejections`, and the threads' own modules: `acks`, `writer`, `files`.

Durability. Every batch of events one input produces for a job is published in one transaction
on the job's partition; a batch that triggers a checkpoint also carries the job's store record
with the advanced id counter, so a new owner never reuses an id.

Threads. The jobs consumer and the coordinators consumer (`ownership`), the acknowledgement
reader (`acks`), the transactional writers (`writer`) and the file threads (`files`) run beside
the asyncio loop, which runs the coordinators, the timers and the REST API and gets the threads'
work as its own callbacks (`_post`). What the service keeps per job is in `owned`.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import Counter
from collections.abc import Callable, Collection
from typing import Any

from sparkpoint.common.avro import EventCodec
from sparkpoint.common.clock import SystemClock
from sparkpoint.common.events import (
    CheckpointSettings,
    CheckpointStoreRecord,
    CoordinatorAnnouncement,
    SavepointFormat,
)
from sparkpoint.common.kafka import Malformed
from sparkpoint.common.settings import CheckpointConfig
from sparkpoint.common.storage import Storage
from sparkpoint.coordinator.service.acks import AckReader
from sparkpoint.coordinator.service.files import FileWork
from sparkpoint.coordinator.service.operations import Operations, TriggerRequests
from sparkpoint.coordinator.service.owned import OwnedJob, TriggerRequest
from sparkpoint.coordinator.service.ownership import OwnedPartitions, Ownership
from sparkpoint.coordinator.service.pipeline import CheckpointPipeline, CommandExecutor
from sparkpoint.coordinator.service.publisher import Publisher
from sparkpoint.coordinator.service.registry import JobRegistry
from sparkpoint.coordinator.service.rejections import Rejections
from sparkpoint.coordinator.service.settings import ServiceSettings as ServiceSettings
from sparkpoint.coordinator.service.timers import Timers
from sparkpoint.coordinator.service.trace import StepTrace
from sparkpoint.coordinator.service.writer import PartitionWriter, TransactionTurns

log = logging.getLogger(__name__)

STOP_CHECK_S = 0.1
"""How often the running service looks whether it was asked to stop."""


class CoordinatorService:
    def __init__(self, settings: ServiceSettings, codec: EventCodec | None = None) -> None:
        self.settings = settings
        self.codec = codec or EventCodec()
        self.clock = SystemClock()
        self.storage = Storage(settings.roots())
        self.malformed = 0
        self._stop = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._threads: list[threading.Thread] = []
        self._trace: StepTrace | None = None
        self.turns = TransactionTurns(settings.transactions_in_flight)
        """Shared by this instance's partition writers: how many transactions are open at once."""
        self.timers = Timers()
        self.rejections = Rejections()
        self.files = FileWork(self.storage, self._post, start=False)
        """``_metadata`` writes and discards, on threads of their own (started by `run`)."""
        self.owned = OwnedPartitions()
        self.publisher = Publisher(self.owned.writer, self.owned.partition_of, self._stop.is_set)
        self._requests = TriggerRequests()
        self.executor = CommandExecutor(
            self.publisher, self.timers, self.files, self.clock, self._requests.answer
        )
        self.registry = JobRegistry(
            settings, self.clock, self.storage, self.owned, self.publisher,
            self.executor.execute, self.rejections, self.timers.cancel, self._later,
        )  # fmt: skip
        self.pipeline = CheckpointPipeline(
            self.registry.jobs, self.executor, self.files, self.clock, self.rejections
        )
        self.executor.finalize = self.pipeline.finalize  # the one edge bound after building
        pipeline = self.pipeline
        self.acks = AckReader(
            settings.bootstrap,
            f"{settings.instance_id}-acks",
            self.codec,
            lambda records: self._post(lambda: pipeline.on_acks(records)),
            self._report_malformed,
            self._stop,
        )
        self.ownership = Ownership(
            self.owned, settings, self.codec, self.clock, self.turns, self.acks, self.registry,
            self._post, self._stop, self._report_malformed,
        )  # fmt: skip
        self.operations = Operations(
            self.registry.jobs, self.registry.ended, self._requests, self.storage, self.clock,
            self.publisher, self.executor.execute, lambda job_id: self.owner_url(job_id),
        )  # fmt: skip

    # --- what the REST API, the tests and the benchmarks read -----------------------------------------

    @property
    def jobs(self) -> dict[str, OwnedJob]:
        return self.registry.jobs

    @property
    def ended(self) -> dict[str, OwnedJob]:
        return self.registry.ended

    @property
    def requests(self) -> dict[str, TriggerRequest]:
        return self._requests.by_id

    @property
    def writers(self) -> dict[int, PartitionWriter]:
        return self.owned.writers

    @writers.setter
    def writers(self, writers: dict[int, PartitionWriter]) -> None:
        self.owned.writers = writers

    @property
    def partition_count(self) -> int:
        return self.owned.count

    @partition_count.setter
    def partition_count(self, count: int) -> None:
        self.owned.count = count

    @property
    def owners(self) -> dict[int, CoordinatorAnnouncement]:
        return self.ownership.owners

    @property
    def partitions_lost(self) -> int:
        """Partitions taken from this instance while it ran (revoked, lost or fenced)."""
        return self.ownership.partitions_lost

    @property
    def ready(self) -> threading.Event:
        """Set once the first partitions are taken."""
        return self.ownership.ready

    @property
    def durable(self) -> dict[str, CheckpointStoreRecord]:
        """Every owned job's store record as it stands once what was submitted commits."""
        return self.publisher.durable

    @property
    def rejected(self) -> Counter[tuple[str, str]]:
        """(topic, kind) -> events refused because they may not touch a running job."""
        return self.rejections.counts

    @property
    def trace(self) -> StepTrace | None:
        """Installed by the latency benchmark: when each step of each checkpoint happened."""
        return self._trace

    @trace.setter
    def trace(self, trace: StepTrace | None) -> None:
        self._trace = trace
        self.acks.trace = self.pipeline.trace = self.executor.trace = trace

    # --- running ---------------------------------------------------------------------------------------

    async def run(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.files.start()
        self.ownership.open()
        self._threads = [
            threading.Thread(
                target=self.ownership.consume_jobs, name="sparkpoint-jobs", daemon=True
            ),
            threading.Thread(target=self.acks.run, name="sparkpoint-acks", daemon=True),
            threading.Thread(
                target=self.ownership.consume_announcements,
                name="sparkpoint-coordinators",
                daemon=True,
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
            self.ownership.close()
            await asyncio.to_thread(self.files.close)
            self.ownership.retire()

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

    def _later(self, delay_s: float, work: Callable[[], None]) -> None:
        """On the loop: run ``work`` on the loop after ``delay_s``, in order with the rest."""
        assert self._loop is not None
        self._loop.call_later(delay_s, self._post, work)

    def _report_malformed(self, malformed: Malformed) -> None:
        self.malformed += 1

    # --- routing (`ownership`) and lookups (`registry`) ---------------------------------------------

    def route(self, job_id: str, tried: Collection[int] = ()) -> tuple[str, int] | None:
        """Where a request for a job not here goes (`Ownership.route`)."""
        return self.ownership.route(job_id, self.registry.jobs, tried)

    def owner_url(self, job_id: str) -> str | None:
        """The REST address of the instance that owns ``job_id`` (a job id, or a Flink JobID
        this instance does not know), when it is another one."""
        routed = self.route(job_id)
        return None if routed is None else routed[0]

    def resolve(self, name: str) -> str:
        """The job id named by ``name`` (a job id, or a Flink JobID of a job known here)."""
        return self.registry.resolve(name)

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
