"""Restored channel state taken up by a new attempt: each new subtask gets the segments of the
old subtasks whose key groups overlap its own (`adopt`), queued at once or, with checkpoints
during recovery, split by owner first by filter jobs on Spark (`FilterJobs`, the splitting
itself is `split`'s). Filter jobs reach Spark in the order submitted: the recovery pool is FIFO
by job, so the first job's tasks take the first free core."""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import CancelledError, Future
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from sparkpoint.agent.recovery import channel_state
from sparkpoint.agent.recovery.restore import Restored
from sparkpoint.agent.recovery.split import (
    FILTER_BATCH_BYTES,
    HELD_BATCH_BYTES,
    ChannelRecovery,
    FilterResult,
    FilterTask,
    filter_restored,
)
from sparkpoint.agent.rounds.channels import Channel
from sparkpoint.agent.spark.jobs import RECOVERY_POOL, SparkJobs
from sparkpoint.agent.spark.worker_gc import in_task
from sparkpoint.agent.state.backend import local_path
from sparkpoint.agent.wakeup import Wakeup, WakingPool
from sparkpoint.common.keygroups import KeyGroupRange

log = logging.getLogger(__name__)

FILTER_ORDER_WAIT_S = 5.0
"""How long a filter job waits for the one submitted before it to reach Spark's scheduler
(building and shipping a job takes milliseconds; the wait only orders them)."""


def adopt(
    job_id: str,
    restored: Restored,
    drop_checkpoint_id: int | None,
    ranges: list[KeyGroupRange],
    channels: list[Channel],
    channel_dir: str,
    during_recovery: bool,
    capacity_bytes: int,
) -> ChannelRecovery:
    """Lines up an unaligned checkpoint's channel state ahead of any new input.
    ``execution.state-recovery.without-channel-state.checkpoint-id`` (``drop_checkpoint_id``)
    drops it."""
    if restored.checkpoint_id == drop_checkpoint_id:
        log.warning(
            "job %s: DROPPING the channel state of checkpoint %d (%d segments, %d rows) as "
            "execution.state-recovery.without-channel-state.checkpoint-id says: the records "
            "in flight when it was taken are lost to this job",
            job_id, restored.checkpoint_id, len(restored.channel_state),
            sum(f.rows for f in restored.channel_state),
        )  # fmt: skip
        return ChannelRecovery()
    shares = channel_state.assign(restored.channel_state, ranges)
    batch = FILTER_BATCH_BYTES if local_path(channel_dir) is not None else HELD_BATCH_BYTES
    recovery = ChannelRecovery.adopt(
        restored.checkpoint_id, shares, ranges, channels, channel_dir, during_recovery,
        min(batch, capacity_bytes),
    )  # fmt: skip
    log.info(
        "job %s: %d segments of channel state queued ahead of new input%s",
        job_id, sum(len(f) for f in shares.values()),
        f" ({len(recovery.batches)} runs of files split by owner first)" if recovery.batches else "",
    )  # fmt: skip
    return recovery


@dataclass
class FilterJob:
    """A filter job on its way to Spark: the next one is submitted only once this one's tasks
    are queued (the recovery pool is FIFO by job, so its tasks then take the first free core).
    Setting an event before ``collect`` did not order them: both threads then raced to the
    scheduler, and the job splitting each subtask's first rows sometimes ran last."""

    cancelled: threading.Event = field(default_factory=threading.Event)
    """The attempt's: set when it ends."""
    built: threading.Event = field(default_factory=threading.Event)
    group: str | None = None
    """Its Spark job group, once built."""
    ended: threading.Event = field(default_factory=threading.Event)
    """Its collect returned or raised, or it was never submitted."""

    def wait_scheduled(self, sc: Any, timeout_s: float) -> None:
        """Returns once Spark's scheduler has the job (its status tracker lists it; the
        scheduler handles one submission at a time, so a job submitted after this one is
        queued after it), once it ended (failed before it got there, or cancelled), or after
        ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        if not self.built.wait(timeout_s) or self.group is None:
            return  # building it failed: its own thread reports that
        tracker = sc.statusTracker()
        while (
            not tracker.getJobIdsForGroup(self.group)
            and not self.ended.is_set()
            and not self.cancelled.is_set()
            and time.monotonic() < deadline
        ):
            time.sleep(0.002)


class FilterJobs:
    """Filter jobs of restored channel state, each on a thread of its own, submitted in turn."""

    def __init__(self, jobs: SparkJobs, job_id: str, wakeup: Wakeup) -> None:
        self.jobs = jobs
        self.job_id = job_id
        self.pool = WakingPool(wakeup, 2, thread_name_prefix="filter")
        self.last: FilterJob | None = None
        self.cancelled = threading.Event()
        """Set when the attempt ends: a filter job not yet submitted to Spark is not submitted."""

    def submit(self, tasks: list[FilterTask]) -> Future[list[FilterResult]]:
        after, this = self.last, FilterJob(self.cancelled)
        self.last = this
        return self.pool.submit(self._run, tasks, after, this)

    def _run(
        self, tasks: list[FilterTask], after: FilterJob | None, this: FilterJob
    ) -> list[FilterResult]:
        try:
            sc = self.jobs.context
            if after is not None:
                after.wait_scheduled(sc, FILTER_ORDER_WAIT_S)
            if this.cancelled.is_set():  # the attempt ended while this job waited its turn
                raise CancelledError("the split of restored channel state was cancelled")
            if self.jobs.resident:  # queued in order: `built` once its tasks wait (no group)
                try:
                    return self.jobs.run(
                        RECOVERY_POOL, "filter restored channel state", tasks, filter_restored,
                        queued=this.built.set,
                    )  # fmt: skip
                finally:
                    this.ended.set()
            sc.setLocalProperty("spark.scheduler.pool", RECOVERY_POOL)  # shares cores with rounds
            this.group = self.jobs.traffic.start_job(
                sc, f"{self.job_id} filter restored channel state", tasks
            )
            job = sc.parallelize(tasks, len(tasks)).map(partial(in_task, filter_restored))
        except BaseException:
            this.ended.set()
            raise
        finally:
            this.built.set()
        try:
            return job.collect()  # type: ignore[no-any-return]
        finally:
            this.ended.set()

    def end_attempt(self) -> None:
        """The attempt ended: jobs not yet submitted are not; the next attempt starts afresh."""
        self.cancelled.set()
        self.cancelled = threading.Event()
        self.last = None

    def shutdown(self) -> None:
        self.cancelled.set()
        self.pool.shutdown(wait=True)
