"""The loop of one attempt of the job (Flink's task mailbox, on the driver): it only plans and
calls. One turn (`JobLoop.turn`):

1. read the control topic without blocking: triggers, completions, aborts, a failover request
   (raised as `Restart`), a cancel;
2. collect the stages that finished (`rounds`): segments into the channels, output staged,
   restored channel state admitted (`recovery.split`);
3. snapshot the checkpoints now aligned (`checkpointing.snapshots`), before the next round
   takes what lies behind their barriers;
4. start the next round when none is in flight: one Spark job, stage 2 over what the channels
   hold and stage 1 reading more (`rounds`);
5. acknowledge the snapshot copies that finished, collect replaced state files;
6. at the end of a bounded input: the end-of-input round, then the final checkpoint;
7. sleep until a control event arrives or a future of its pools ends (`wakeup`), or a short
   timeout for what has a deadline instead.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from sparkpoint.agent.attempt import Attempt
from sparkpoint.agent.control.link import ControlLink
from sparkpoint.agent.faults import crash_point
from sparkpoint.agent.recovery.filter_jobs import FilterJobs
from sparkpoint.agent.rounds.channels import SegmentFiles
from sparkpoint.agent.rounds.rounds import Rounds
from sparkpoint.agent.sinks import EpochCommitter, SinkWriter
from sparkpoint.agent.sources.backlog import BacklogReports
from sparkpoint.agent.state.books import StateBackend
from sparkpoint.agent.wakeup import Wakeup
from sparkpoint.common.events import (
    CancelJob,
    FailoverRequest,
    JobStatus,
    NotifyCheckpointAborted,
    NotifyCheckpointComplete,
    TriggerCheckpoint,
)

log = logging.getLogger(__name__)

IDLE_WAIT_S = 0.05
"""How long the loop sleeps when there is nothing to fetch or process and nothing wakes it."""

IN_FLIGHT_WAIT_S = 0.25
"""How long the loop sleeps at most while a stage runs. What it waits for wakes it at once
(`wakeup`): a control event read, a stage, a snapshot copy or a split of restored state that
ended, a failed commit, a stop; and the sleep ends when a checkpoint still aligning is due to go
unaligned (`wait_s`). This only bounds what might have been missed. It was 25 ms: on the peers
workload about 30 turns a round that found nothing, 0.28 ms of the agent's CPU each, a quarter
of its process's CPU during a run (docs/jobs.md)."""


class Restart(Exception):
    """A failover request: restart the job from its latest completed checkpoint (or ``path``).
    Its text is the coordinator's reason, as the agent's log shows it."""

    def __init__(self, path: str | None, why: str = "") -> None:
        super().__init__(why or "failover requested")
        self.path = path


class JobLoop:
    def __init__(
        self,
        job_id: str,
        attempt: Attempt,
        stages: Rounds,
        link: ControlLink,
        sink: SinkWriter,
        committer: EpochCommitter,
        filter_jobs: FilterJobs,
        segment_files: SegmentFiles,
        janitor: ThreadPoolExecutor,
        channel_dir: str,
        max_parallelism: int,
        stopping: Callable[[], bool],
        cancel: Callable[[], None],
        after_turn: Callable[[], None],
        wakeup: Wakeup,
    ) -> None:
        self.job_id = job_id
        self.attempt = attempt
        self.parts = attempt.parts
        self.checkpointer = attempt.checkpointer
        self.stages = stages
        self.link = link
        self.sink = sink
        self.emit = sink.direct()
        """At-least-once: what stage-2 tasks call to make output visible (fixed per attempt)."""
        self.committer = committer
        self.filter_jobs = filter_jobs
        self.segment_files = segment_files
        self.janitor = janitor
        self.channel_dir = channel_dir
        self.max_parallelism = max_parallelism
        self.stopping = stopping
        """Whether the job was asked to stop (Ctrl-C, SIGTERM, a cancel)."""
        self.cancel = cancel
        self.after_turn = after_turn
        self.wakeup = wakeup
        self._collecting: Future[list[str]] | None = None
        self.backlog_reports = BacklogReports(owner_epoch=link.membership.owner_epoch)
        """What the coordinator was told of the backlog (this attempt registered without)."""

    def run(self) -> JobStatus:
        """Turns until the job ends; returns how it ended."""
        if self.attempt.finished_before:
            log.info("job %s: restored from its final checkpoint (its input ended there): finished", self.job_id)  # fmt: skip
            return JobStatus.FINISHED
        self.link.listen(self.wakeup.set)
        self.committer.listen(self.wakeup.set)
        while True:
            ended = self.turn()
            if ended is not None:
                return ended

    def turn(self) -> JobStatus | None:
        if self.stopping():
            return JobStatus.CANCELED
        self.committer.check()
        if self.read_control(0):
            return JobStatus.FINISHED
        busy = self.collect()
        busy |= self.recover_channels()
        self.checkpointer.snapshot_due(time.monotonic() * 1000)
        busy |= self.start_round()
        self.report_backlog()
        self.checkpointer.await_copies([*self.stages.in_flight(), *self.parts.restoring.futures])
        self.checkpointer.send_acks()
        self.collect_garbage(self.parts.backend)
        busy |= self.end_of_input()
        self.after_turn()
        in_flight = bool(self.stages.in_flight() or self.parts.restoring.futures)
        if not busy and self.wakeup.wait(self.wait_s(in_flight)) and self.read_control(0):
            return JobStatus.FINISHED
        return None

    def wait_s(self, in_flight: bool) -> float:
        """How long a turn with nothing to do sleeps unless woken: while a stage runs, until an
        aligning checkpoint's timeout at most `IN_FLIGHT_WAIT_S`; until the next round may
        start when rounds are paced; else `IDLE_WAIT_S`."""
        if in_flight:
            switch_ms = self.checkpointer.next_switch_ms()
            if switch_ms is None:
                return IN_FLIGHT_WAIT_S
            return min(IN_FLIGHT_WAIT_S, max(0.0, switch_ms / 1000 - time.monotonic()))
        pause = self.stages.pause_left()
        return pause if 0 < pause < IDLE_WAIT_S else IDLE_WAIT_S

    def collect(self, wait: bool = False) -> bool:
        """Applies the stages that finished: stage 1's segments join the channels, stage 2's
        output is staged (exactly-once) and counted toward the checkpoints aligning."""
        parts = self.parts
        fetched = self.stages.collect_fetch(wait, parts.source, parts.channels)
        if fetched:
            crash_point("mid-batch")
            # the latest completed checkpoint holds keyed state (its copies are the base of the
            # next), so a restore finds some: a checkpoint completed before any round wrote
            # state restored nothing (a clean clone's local-recovery test restored 0 files)
            if self.checkpointer.outcomes.completed and parts.backend.confirmed:
                crash_point("mid-batch-after-complete")
        processed = self.stages.collect_process(
            wait, parts.channels, parts.backend, self.segment_files
        )
        if processed is not None:
            for subtask, size in processed.bytes_per_subtask.items():
                self.checkpointer.processed(subtask, size)
            parts.ledger.stage(processed.outputs)
        return fetched > 0 or processed is not None

    def start_round(self, end_of_input: bool = False) -> bool:
        parts = self.parts
        return self.stages.start(
            parts.channels, parts.backend, self.emit, parts.source,
            parts.restoring.holds_input(), end_of_input, parts.initial,
        )  # fmt: skip

    def report_backlog(self) -> None:
        """FLIP-309: tells the coordinator when the source starts or stops processing backlog
        (it then checkpoints at ``interval-during-backlog``), and tells a coordinator that took
        the job over meanwhile again (its record of the job starts without backlog)."""
        source = self.parts.source
        backlog = source.backlog.processing(source.positions)
        if not self.backlog_reports.news(backlog, self.link.membership.owner_epoch):
            return
        log.info("job %s: %s backlog", self.job_id, "processing" if backlog else "done processing")
        self.link.announce(JobStatus.RUNNING, processing_backlog=backlog)

    def recover_channels(self) -> bool:
        """Filter jobs and admission of restored channel state (`recovery.split`)."""
        restoring = self.parts.restoring
        if not restoring.waiting and not restoring.futures:
            return False
        return restoring.step(
            self.parts.channels, self.channel_dir, self.max_parallelism, self.filter_jobs.submit,
        )  # fmt: skip

    def collect_garbage(self, backend: StateBackend) -> None:
        """One collection at a time on the janitor's thread, when a round replaced files."""
        if backend.has_garbage and (self._collecting is None or self._collecting.done()):
            self._collecting = self.janitor.submit(backend.collect_garbage)

    def end_of_input(self) -> bool:
        """Bounded sources read to their end with everything processed: the keyed function's
        end-of-input hook runs, then the coordinator is asked for the final checkpoint
        (FLIP-147); a stop-with-savepoint ``--drain`` takes its savepoint instead."""
        checkpointer, parts = self.checkpointer, self.parts
        drained = all(not c.segments for c in parts.channels) and not parts.restoring.holds_input()
        if (
            checkpointer.end_of_input
            or not parts.source.finished()
            or self.stages.in_flight()
            or not drained
        ):
            return False
        self.collect(wait=True)
        self.start_round(end_of_input=True)
        self.collect(wait=True)
        checkpointer.end_of_input = True
        if checkpointer.draining is not None:  # stop-with-savepoint --drain: its savepoint, now
            trigger, checkpointer.draining = checkpointer.draining.trigger, None
            log.info("job %s: drained; taking savepoint %d", self.job_id, trigger.checkpoint_id)
            checkpointer.trigger(trigger, drained=True)
            return True
        log.info("job %s: end of input; asking for the final checkpoint", self.job_id)
        self.link.announce(JobStatus.RUNNING, end_of_input=True)
        return True

    def read_control(self, timeout_s: float) -> bool:
        """Handles the control events that arrived; true when the job finished."""
        return any(self.on_control(event) for event in self.link.read(timeout_s))

    def on_control(self, event: object) -> bool:
        """Handles one control event; true when the job finished."""
        checkpointer = self.checkpointer
        if isinstance(event, TriggerCheckpoint):
            checkpointer.trigger(event)
        elif isinstance(event, NotifyCheckpointComplete):
            return checkpointer.complete(event)
        elif isinstance(event, NotifyCheckpointAborted):
            if checkpointer.abort(event):
                self.link.announce(JobStatus.RUNNING, end_of_input=True)
        elif isinstance(event, FailoverRequest):
            raise Restart(
                event.restore_external_path,
                f"the coordinator asked for a failover: {event.reason.value} "
                f"({event.consecutive_failures} in a row): {event.message}",
            )
        elif isinstance(event, CancelJob):
            log.info(
                "job %s: cancelled by %s", self.job_id, event.requested_by or "the coordinator"
            )
            self.cancel()  # CANCELED at the start of the next turn, as Ctrl-C
        return False
