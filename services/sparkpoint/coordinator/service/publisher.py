"""Publishing for the jobs this instance owns: every batch of events one input produces for a job
goes, in one transaction, to the writer of the job's partition (`writer.PartitionWriter`), and
the job's store record as it stands once what was submitted commits is kept here (``durable``):
replayed on assignment, then updated with each record this instance writes, so a job started
again here continues the id counter where the last trigger left it, before that trigger's
transaction has even committed."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import Future
from typing import Protocol

from sparkpoint.common.events import CheckpointStoreRecord, Event
from sparkpoint.coordinator.service.owned import OwnedJob
from sparkpoint.coordinator.service.writer import Done, NotOwner, Tombstone

log = logging.getLogger(__name__)


class Writer(Protocol):
    """A partition's transactional writer, as `Publisher` uses it."""

    def submit(self, key: str, events: Sequence[Event | Tombstone], done: Done = ...) -> None: ...


class Publisher:
    def __init__(
        self,
        writer_of: Callable[[int], Writer | None],
        partition_of: Callable[[str], int],
        stopping: Callable[[], bool],
    ) -> None:
        self._writer_of = writer_of
        """The writer of an owned partition, None for any other (asked at each publication)."""
        self._partition_of = partition_of
        self._stopping = stopping
        self.durable: dict[str, CheckpointStoreRecord] = {}
        """Every owned job's store record as it stands once what was submitted commits."""

    def remember(self, records: Mapping[str, CheckpointStoreRecord]) -> None:
        """Store records replayed for partitions just taken."""
        self.durable.update(records)

    def forget(self, partitions: Collection[int]) -> None:
        """Partitions lost: the next owner replays what was committed."""
        for job_id in [j for j in self.durable if self._partition_of(j) in partitions]:
            del self.durable[job_id]

    def publish(
        self, job: OwnedJob, events: Sequence[Event | Tombstone], done: Done | None = None
    ) -> None:
        self.publish_to(job.job_id, job.partition, events, done)

    def publish_to(
        self,
        job_id: str,
        partition: int,
        events: Sequence[Event | Tombstone],
        done: Done | None = None,
    ) -> None:
        """Hands one batch to the partition's writer; ``done`` hears (on the writer's thread)
        how it ended, and failures are logged either way."""

        def finished(error: Exception | None) -> None:
            if error is not None:
                self._log_failure(job_id, error)
            if done is not None:
                done(error)

        writer = self._writer_of(partition)
        if writer is None:
            finished(NotOwner(f"partition {partition} is not owned"))
            return
        for event in events:
            if isinstance(event, CheckpointStoreRecord):
                # what the store holds once this commits; ids only grow, so a later read of the
                # job's counter never sees less than what any trigger after it used
                self.durable[job_id] = event
        writer.submit(job_id, events, finished)

    async def published(self, job: OwnedJob, events: Sequence[Event | Tombstone]) -> None:
        """Publishes and waits until the batch committed (raises why it did not)."""
        future: Future[None] = Future()

        def settle(error: Exception | None) -> None:
            if error is None:
                future.set_result(None)
            else:
                future.set_exception(error)

        self.publish(job, events, settle)
        await asyncio.wrap_future(future)

    def _log_failure(self, job_id: str, error: Exception) -> None:
        if isinstance(error, NotOwner) and self._stopping():
            # shutting down: the writers closed under work still on its way; the next owner
            # replays what was committed and triggers afresh
            log.debug("publishing for job %s after the writers closed: %s", job_id, error)
        else:
            log.warning("publishing for job %s failed: %s", job_id, error)
