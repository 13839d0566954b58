"""The subtask side of the checkpoint protocol (Flink's ``SubtaskCheckpointCoordinatorImpl``):
a trigger snapshots the sources and places barriers; once its barrier policy says so (aligned,
or unaligned at once or after the aligned-checkpoint timeout: `alignment`), every keyed subtask
snapshots its state versions, its staged sink output and, unaligned, its channel state
(`channel_state`), copied on a thread pool; each subtask acknowledges once its part is durable;
a completion commits the epochs it covers, an abort folds its epoch into the next.

`SubtaskCheckpointing` is mixed into the agent: the loop (`runtime`) schedules rounds and calls
`_on_trigger`, `_snapshot_due`, `_await_copies`, `_send_acks`, `_on_complete` and
`_on_aborted`; the attributes declared below are the agent's, set by it.
"""

from __future__ import annotations

import json
import logging
import posixpath
import time
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_for
from dataclasses import dataclass, field
from typing import Any

from fsspec.core import url_to_fs

from sparkpoint.agent.checkpointing.barriers import BarrierPolicy, Decision
from sparkpoint.agent.faults import crash_point
from sparkpoint.agent.recovery import channel_state
from sparkpoint.agent.recovery.restore import SOURCE_FORMAT
from sparkpoint.agent.recovery.split import ChannelRecovery
from sparkpoint.agent.rounds.channels import Channel, Segment, SegmentFiles, earliest_cut
from sparkpoint.agent.sinks import EpochCommitter
from sparkpoint.agent.sources.files import FileSourceReader
from sparkpoint.agent.sources.kafka import KafkaSourceReader
from sparkpoint.agent.state.backend import (
    StateBackend,
    Upload,
    copy_file,
    delete_files,
    link_or_copy_all,
    write_file,
)
from sparkpoint.common.events import (
    AcknowledgeCheckpoint,
    CheckpointFailureReason,
    DeclineCheckpoint,
    JobStatus,
    NotifyCheckpointAborted,
    NotifyCheckpointComplete,
    SnapshotType,
    StateHandle,
    StateHandleKind,
    TriggerCheckpoint,
)
from sparkpoint.common.kafka import EventPublisher
from sparkpoint.common.keygroups import KeyGroupRange
from sparkpoint.common.settings import CheckpointConfig, CheckpointingMode
from sparkpoint.common.topics import ACKS

log = logging.getLogger(__name__)

COPY_WAIT_S = 0.5
"""How long the loop waits for snapshot copies before it goes on with the next round."""


def now_ms() -> int:
    return int(time.time() * 1000)


Plan = list[tuple[Upload, str | None]]
"""What a subtask's snapshot references, and the working file each new copy is made from."""


@dataclass
class Copy:
    """One keyed subtask's snapshot in its asynchronous phase."""

    subtask: int
    future: Future[tuple[list[StateHandle], int]]
    """Resolves to the channel-state handles written (unaligned snapshots) and their bytes."""
    plan: Plan
    sync_ms: int
    started: float
    unaligned: bool = False

    def new_files(self) -> list[str]:
        return [upload.path for upload, source in self.plan if source is not None]


@dataclass
class PendingSnapshot:
    trigger: TriggerCheckpoint
    received: float
    final: bool
    """Taken after the end of a bounded input: its completion finishes the job."""
    acked: set[str] = field(default_factory=set)
    copies: list[Copy] = field(default_factory=list)
    snapshotted: bool = False
    aligned_ms: int = 0
    policy: BarrierPolicy | None = None
    """How its barrier is handled (None: at-least-once, snapshot at the trigger)."""
    unaligned: bool = False
    processed: dict[str, int] = field(default_factory=dict)
    """Bytes each keyed subtask processed between the trigger and its alignment (Flink's
    processedData)."""
    persisted: int = 0
    """Bytes of in-flight records its subtasks wrote as channel state (Flink's persistedData)."""


def split_done(copies: list[Copy]) -> tuple[list[Copy], list[Copy]]:
    """(finished, still running), each copy looked at once."""
    finished = [c.future.done() for c in copies]
    return (
        [c for c, f in zip(copies, finished, strict=True) if f],
        [c for c, f in zip(copies, finished, strict=True) if not f],
    )


@dataclass(frozen=True)
class Draining:
    """A stop-with-savepoint ``--drain`` waiting for the input it ended to be processed."""

    trigger: TriggerCheckpoint
    ends: dict[tuple[str, int], int]
    """The source's ends before the drain (restored if the savepoint is aborted first)."""


class SubtaskCheckpointing:
    """Snapshot, acknowledge, complete, abort: for every subtask of the agent's job."""

    job_id: str
    agent_id: str
    parallelism: int
    config: CheckpointConfig
    ranges: list[KeyGroupRange]
    subtasks: list[str]
    shared_dir: str
    channel_dir: str
    channels: list[Channel]
    restoring: ChannelRecovery
    segment_files: SegmentFiles
    source: KafkaSourceReader | FileSourceReader
    backend: StateBackend
    copier: ThreadPoolExecutor
    publisher: EventPublisher
    committer: EpochCommitter
    pending: dict[int, PendingSnapshot]
    orphans: list[Copy]
    committing: dict[int, list[tuple[int, str]]]
    sealed: dict[int, list[tuple[int, str]]]
    unsealed: list[tuple[int, str]]
    end_of_input: bool
    draining: Draining | None
    highest_trigger: int
    _round: tuple[int, dict[int, list[Segment]]] | None
    latest_completed: str | None
    completed_checkpoints: list[int]
    aborted_checkpoints: list[int]
    declined_checkpoints: list[int]

    @property
    def attempt(self) -> int:
        raise NotImplementedError

    def _announce(
        self, status: JobStatus, message: str | None = None, end_of_input: bool = False
    ) -> None:
        raise NotImplementedError

    def _end(self, status: JobStatus) -> bool:
        raise NotImplementedError

    def _on_trigger(self, trigger: TriggerCheckpoint, drained: bool = False) -> None:
        """``drained``: a stop-with-savepoint ``--drain`` handled again now that its input has
        ended (triggers with higher ids may have been handled meanwhile)."""
        checkpoint_id = trigger.checkpoint_id
        if checkpoint_id <= self.highest_trigger and not drained:
            return  # read again, or older than the restored checkpoint
        if trigger.snapshot_type is SnapshotType.SAVEPOINT_TERMINATE and not self.end_of_input:
            self._drain(trigger)  # this trigger is handled again once the input has ended
            return
        self.highest_trigger = max(self.highest_trigger, checkpoint_id)
        pending = PendingSnapshot(trigger, time.monotonic(), final=self.end_of_input)
        not_ready = self.restoring.not_ready(self.channels)
        if (
            not_ready is not None
        ):  # recovering (sparkpoint.agent.recovery.split): not counted as a failure
            subtask, why = not_ready
            log.info(
                "job %s: checkpoint %d declined, %s %s", self.job_id, checkpoint_id, subtask, why
            )
            reason = CheckpointFailureReason.CHECKPOINT_DECLINED_TASK_NOT_READY
            self._decline(pending, subtask, reason, f"{subtask} {why}")
            crash_point("declined-in-recovery")
            return
        self.pending[checkpoint_id] = pending
        at_least_once = (
            self.config.mode is CheckpointingMode.AT_LEAST_ONCE
            and not trigger.snapshot_type.is_savepoint
        )
        positions = self._unprocessed_positions() if at_least_once else None
        if not at_least_once:
            pending.policy = BarrierPolicy.for_trigger(
                trigger.unaligned, trigger.aligned_checkpoint_timeout_ms,
                trigger.snapshot_type.is_savepoint, pending.received * 1000,
            )  # fmt: skip
            positions = self._place_barriers(checkpoint_id, pending.policy)
        # sources snapshot at once: exactly-once, their positions are where the barrier enters
        # the channels; at-least-once, where the oldest record not yet processed was read
        for i in range(self.parallelism):
            path = f"{trigger.target_location}/source-{i}.json"
            snapshot = {
                "format": SOURCE_FORMAT,
                "positions": self.source.snapshot(i, positions),
                "end_of_input": self.end_of_input,
            }
            data = json.dumps(snapshot).encode()
            started = time.monotonic()
            write_file(path, data)
            handle = StateHandle(path, StateHandleKind.SOURCE_POSITIONS, len(data))
            self._acknowledge(
                pending, f"source-{i}", [handle], state_size=len(data), checkpointed=len(data),
                sync_ms=int((time.monotonic() - started) * 1000), async_ms=0,
            )  # fmt: skip

        if at_least_once:
            self._snapshot(checkpoint_id, pending)  # no alignment: the state as it stands
        elif pending.policy is not None and pending.policy.at_once:
            self._snapshot(checkpoint_id, pending, unaligned=True)  # no wait for the rounds

    def _place_barriers(
        self, checkpoint_id: int, policy: BarrierPolicy
    ) -> dict[tuple[str, int], int] | None:
        """Places the checkpoint's barrier in every channel; returns the source positions the
        barrier stands for (None: where reading stands now).

        An aligned barrier goes at the earliest consistent cut: right after the segments the
        stage-2 round in flight took (before everything queued when none is), with the sources
        snapshotted where the segments left behind it were read from. Those are read again
        after a restore instead of being waited for: the checkpoint is aligned as soon as the
        round in flight ends, not a round later (Spark's checkpoints cut between micro-batches
        the same way). The cut is taken only where it splits no source fetch between the two
        sides of the barrier, no restored channel state is queued and no earlier barrier waits;
        else, and for unaligned checkpoints (their channel state is what is queued), the
        barrier goes after everything queued, with the sources where reading stands."""
        early = (
            not policy.unaligned
            and not self.restoring.holds_input()
            and not any(c.barriers for c in self.channels)
        )
        taken = self._round[1] if self._round is not None else {}
        cut = earliest_cut(self.channels, taken, self.source.positions) if early else None
        if cut is None:
            for channel in self.channels:
                channel.add_barrier(checkpoint_id)
            return None
        sequences, positions = cut
        for channel, sequence in zip(self.channels, sequences, strict=True):
            channel.add_barrier(checkpoint_id, sequence)
        return positions

    def _unprocessed_positions(self) -> dict[tuple[str, int], int]:
        """Where an at-least-once snapshot's sources restart: before every record still queued
        (those processed meanwhile are processed again after a restore, never lost)."""
        positions = dict(self.source.positions)
        for channel in self.channels:
            for partition, offset in channel.unprocessed_from().items():
                positions[partition] = min(positions.get(partition, offset), offset)
        return positions

    def _snapshot_due(self) -> None:
        """Snapshots the checkpoints whose barriers are aligned, or whose aligned-checkpoint
        timeout ran out (they go unaligned), oldest first."""
        now = time.monotonic() * 1000
        for checkpoint_id in sorted(self.pending):
            pending = self.pending[checkpoint_id]
            if pending.snapshotted:
                continue
            aligned = all(c.aligned(checkpoint_id) for c in self.channels) and not (
                self.restoring.holds_input()
            )  # restored segments still waiting to enter a channel precede every barrier
            policy = pending.policy
            decision = policy.decide(aligned, now) if policy else Decision.ALIGNED
            if decision is Decision.WAIT:
                return  # barriers are in order: a later one cannot be aligned before this one
            if decision is Decision.UNALIGNED:
                log.info(
                    "job %s: checkpoint %d not aligned after %d ms: switching to unaligned",
                    self.job_id, checkpoint_id, policy.timeout_ms if policy else 0,
                )  # fmt: skip
            self._snapshot(checkpoint_id, pending, unaligned=decision is Decision.UNALIGNED)

    def _snapshot(
        self, checkpoint_id: int, pending: PendingSnapshot, unaligned: bool = False
    ) -> None:
        """Seals the epoch and snapshots every keyed subtask: the state of the rounds that
        completed so far and, unaligned, the segments still before the barrier (the round in
        flight included) as channel state. Copies run on the copier threads."""
        trigger = pending.trigger
        pending.snapshotted = True
        pending.unaligned = unaligned
        pending.aligned_ms = int((time.monotonic() - pending.received) * 1000)
        in_flight = {
            i: self.restoring.channel_state(channel, checkpoint_id) if unaligned else []
            for i, channel in enumerate(self.channels)
        }
        for channel in self.channels:
            channel.remove_barrier(checkpoint_id)
        self.sealed[checkpoint_id] = self.unsealed
        self.unsealed = []
        full = trigger.snapshot_type is not SnapshotType.CHECKPOINT
        incremental = self.config.incremental and not full
        unpublished = self._unpublished_epochs()  # one view for every subtask's manifest
        if trigger.snapshot_type.is_savepoint:
            unpublished = self._self_contained(unpublished, trigger.target_location)
        for i, groups in enumerate(self.ranges):
            started = time.monotonic()
            plan = self.backend.plan(
                checkpoint_id, groups, incremental, trigger.target_location, self.shared_dir
            )
            manifest = {
                str(epoch): sorted(path for subtask, path in outputs if subtask == i)
                for epoch, outputs in unpublished.items()
            }
            self.segment_files.pin(s.path for s in in_flight[i])
            future = self.copier.submit(
                self._copy, plan, f"{trigger.target_location}/sink-{i}.json", manifest,
                i, in_flight[i], trigger.target_location,
            )  # fmt: skip
            sync_ms = int((time.monotonic() - started) * 1000)
            pending.copies.append(Copy(i, future, plan, sync_ms, time.monotonic(), unaligned))
        log.debug(
            "job %s: checkpoint %d aligned after %d ms",
            self.job_id,
            checkpoint_id,
            pending.aligned_ms,
        )

    def _unpublished_epochs(self) -> dict[int, list[tuple[int, str]]]:
        """Epochs whose output is not visible yet: sealed ones, and those handed to the
        committer that it has not published. A snapshot names both (as Flink's committer
        state keeps committables until they are committed): a checkpoint completing while an
        earlier epoch is still being published must not lose that epoch if it is restored."""
        done = self.committer.published_through
        for epoch in [e for e in self.committing if e <= done]:
            del self.committing[epoch]
        return {**self.committing, **self.sealed}

    def _self_contained(
        self, epochs: dict[int, list[tuple[int, str]]], target: str
    ) -> dict[int, list[tuple[int, str]]]:
        """A savepoint keeps copies of the staged output it names (relative paths inside it), so
        it restores anywhere, even where this agent's working files are gone. Copied now: the
        committer may publish and delete the originals at any moment after this round. An
        epoch is kept whole or not at all, for every subtask at once: a file already gone means
        the committer published the epoch (it deletes only after publishing), and a restore
        must never see part of an epoch (its digest would not match what the sink published)."""
        kept: dict[int, list[tuple[int, str]]] = {}
        for epoch, outputs in epochs.items():
            names = []
            try:
                for subtask, path in outputs:
                    name = f"sink/{posixpath.basename(path)}"
                    copy_file(path, f"{target}/{name}")
                    names.append((subtask, name))
            except FileNotFoundError:  # published meanwhile: the restore needs none of it
                delete_files([f"{target}/{name}" for _, name in names])
                continue
            kept[epoch] = names
        return kept

    def _copy(
        self, plan: Plan, manifest_path: str, manifest: dict[str, list[str]],
        subtask: int, in_flight: list[Segment], target: str,
    ) -> tuple[list[StateHandle], int]:  # fmt: skip
        """A keyed subtask's asynchronous phase: new state files, its sink manifest, and its
        channel state (unaligned: the in-flight segments, linked or copied)."""
        try:
            # immutable files: linked where storage allows, on an object store copied together
            link_or_copy_all((source, upload.path) for upload, source in plan if source)
            write_file(manifest_path, json.dumps(manifest).encode())
            if not in_flight:
                return [], 0
            groups = self.ranges[subtask]
            return channel_state.persist(
                in_flight, self.channel_dir, target, subtask, (groups.start, groups.end)
            )
        finally:
            self.backend.release(s for _, s in plan)
            self.segment_files.release(s.path for s in in_flight)

    def _await_copies(self, stages: Sequence[Future[Any]] = ()) -> None:
        """Waits for the snapshot copies in flight (local copies take milliseconds) and
        acknowledges each as it finishes, so every subtask's acknowledgement of a checkpoint
        goes out in this turn of the loop, not one per turn; a stage that finishes first ends
        the wait (the next round is not held up), and slow storage never holds the loop for
        longer than `COPY_WAIT_S`."""
        deadline = time.monotonic() + COPY_WAIT_S
        while remaining := [
            c.future for p in self.pending.values() for c in p.copies if not c.future.done()
        ]:
            timeout = deadline - time.monotonic()
            if timeout <= 0:
                return
            done, _ = wait_for([*remaining, *stages], timeout=timeout, return_when=FIRST_COMPLETED)
            self._send_acks()
            if any(stage in done for stage in stages) or not done:
                return

    def _send_acks(self) -> None:
        """Acknowledges (or declines) every keyed snapshot whose copies finished. Copies finish
        on other threads: each is judged done once, so one finishing meanwhile is answered on
        the next call, never dropped unanswered."""
        done, self.orphans = split_done(self.orphans)
        for copy in done:
            delete_files(copy.new_files())
        for checkpoint_id in sorted(self.pending):
            pending = self.pending[checkpoint_id]
            done, pending.copies = split_done(pending.copies)
            for copy in done:
                self._answer(pending, copy)

    def _answer(self, pending: PendingSnapshot, copy: Copy) -> None:
        subtask = f"keyed-{copy.subtask}"
        error = copy.future.exception()
        if error is not None:
            log.error(
                "job %s: snapshot %d of %s failed: %s",
                self.job_id, pending.trigger.checkpoint_id, subtask, error,
            )  # fmt: skip
            self._decline(
                pending, subtask, CheckpointFailureReason.CHECKPOINT_ASYNC_EXCEPTION, str(error)
            )
            return
        handles = [
            StateHandle(u.path, StateHandleKind.KEYED_STATE, u.size, u.group, u.group, u.shared)
            for u, _ in copy.plan
        ]
        manifest = f"{pending.trigger.target_location}/sink-{copy.subtask}.json"
        handles.append(StateHandle(manifest, StateHandleKind.SINK_EPOCH, 0))
        channel_handles, persisted = copy.future.result()
        pending.persisted += persisted
        self._acknowledge(
            pending, subtask, handles + channel_handles,
            state_size=sum(u.size for u, _ in copy.plan) + persisted,
            checkpointed=sum(u.size for u, source in copy.plan if source is not None) + persisted,
            sync_ms=copy.sync_ms,
            async_ms=int((time.monotonic() - copy.started) * 1000),
            persisted=persisted, unaligned=copy.unaligned,
        )  # fmt: skip

    def _acknowledge(
        self, pending: PendingSnapshot, subtask: str, handles: list[StateHandle], *,
        state_size: int, checkpointed: int, sync_ms: int, async_ms: int,
        persisted: int = 0, unaligned: bool = False,
    ) -> None:  # fmt: skip
        """Publishes a subtask's acknowledgement; alignment is 0 for sources (they snapshot at
        the trigger, before any alignment). ``persisted``: bytes of in-flight records written
        as channel state (Flink's persistedData)."""
        ack = AcknowledgeCheckpoint(
            self.job_id, pending.trigger.checkpoint_id, subtask, self.attempt, now_ms(), handles,
            state_size, pending.aligned_ms, sync_ms, async_ms, persisted, unaligned, checkpointed,
            pending.processed.get(subtask, 0), agent_id=self.agent_id,
        )  # fmt: skip
        self.publisher.publish_nowait(ACKS, self.job_id, ack)
        pending.acked.add(subtask)
        if len(pending.acked) == len(self.subtasks):
            self.publisher.flush(10)
            crash_point("after-ack")
        self.publisher.producer.poll(0)

    def _decline(
        self, pending: PendingSnapshot, subtask: str, reason: CheckpointFailureReason, message: str
    ) -> None:
        decline = DeclineCheckpoint(
            self.job_id,
            pending.trigger.checkpoint_id,
            subtask,
            self.attempt,
            reason,
            now_ms(),
            message,
            agent_id=self.agent_id,
        )
        self.declined_checkpoints.append(pending.trigger.checkpoint_id)
        self.publisher.publish_nowait(ACKS, self.job_id, decline)
        self.publisher.producer.poll(0)

    def _on_complete(self, event: NotifyCheckpointComplete) -> bool:
        checkpoint_id = event.checkpoint_id
        pending = self.pending.get(checkpoint_id)
        if pending is None or not self._completed_on_storage(pending, event):
            return False
        del self.pending[checkpoint_id]
        self.backend.complete(checkpoint_id, event.is_savepoint)
        restored = (
            self.restoring.restored_queued(self.channels) if self.restoring.during_recovery else 0
        )
        log.info(
            "job %s: checkpoint %d completed%s", self.job_id, checkpoint_id,
            f" during recovery ({restored} restored segments not processed yet)" if restored else "",
        )  # fmt: skip
        crash_point("after-complete")
        if pending.persisted:
            crash_point("after-complete-in-flight")
        for epoch in sorted(e for e in self.sealed if e <= checkpoint_id):
            outputs = self.sealed.pop(epoch)
            if outputs:
                self.committing[epoch] = outputs
                self.committer.submit(epoch, [path for _, path in outputs])
        self.completed_checkpoints.append(checkpoint_id)
        if not event.is_savepoint:
            self.latest_completed = event.external_path
        for older in [c for c in self.pending if c < checkpoint_id and self.pending[c].snapshotted]:
            # subsumed (Flink's notifyCheckpointComplete covers earlier checkpoints)
            self.orphans += self.pending.pop(older).copies
        if pending.trigger.snapshot_type in (
            SnapshotType.SAVEPOINT_SUSPEND,
            SnapshotType.SAVEPOINT_TERMINATE,
        ):
            log.info("job %s: stopped with savepoint %s", self.job_id, event.external_path)
            return self._end(JobStatus.FINISHED)
        if pending.final:
            log.info("job %s: final checkpoint %d completed", self.job_id, checkpoint_id)
            return self._end(JobStatus.FINISHED)
        return False

    def _completed_on_storage(
        self, pending: PendingSnapshot, event: NotifyCheckpointComplete
    ) -> bool:
        """A completion commits sink output, so it is checked against storage first: the
        coordinator writes ``_metadata`` before it says so, where the trigger said it would."""
        where = pending.trigger.target_location
        try:
            fs, path = url_to_fs(f"{where}/_metadata")
            found = event.external_path == where and fs.exists(path)
        except OSError as exc:
            log.warning("job %s: checking %s/_metadata failed: %s", self.job_id, where, exc)
            found = False
        if not found:
            log.error(
                "job %s: completion of checkpoint %d ignored: no _metadata at %s (the notice names %s)",
                self.job_id, event.checkpoint_id, where, event.external_path,
            )  # fmt: skip
        return found

    def _drain(self, trigger: TriggerCheckpoint) -> None:
        """Stop-with-savepoint ``--drain`` (Flink's SAVEPOINT_TERMINATE): the input ends where
        reading stands; once every record read is processed, the keyed function's end-of-input
        hook runs (windows fire, as Flink's MAX_WATERMARK fires them) and the savepoint is taken
        with the input ended. The job then finishes; a restore from that savepoint finds
        nothing left to do, as in Flink, where a drained job is not meant to be resumed."""
        if self.draining is not None:
            return
        log.info(
            "job %s: stop-with-savepoint %d with --drain: the input ends here",
            self.job_id, trigger.checkpoint_id,
        )  # fmt: skip
        self.draining = Draining(trigger, self.source.end_here())

    def _on_aborted(self, event: NotifyCheckpointAborted) -> None:
        checkpoint_id = event.checkpoint_id
        if self.draining is not None and self.draining.trigger.checkpoint_id == checkpoint_id:
            log.warning(
                "job %s: stop-with-savepoint %d aborted while draining (%s): reading goes on",
                self.job_id, checkpoint_id, event.reason.name,
            )  # fmt: skip
            self.source.resume(self.draining.ends)
            self.draining = None
        self.aborted_checkpoints.append(checkpoint_id)
        self.backend.abort(checkpoint_id)
        pending = self.pending.pop(checkpoint_id, None)
        if pending is not None:
            for channel in self.channels:
                channel.remove_barrier(checkpoint_id)
            self.orphans += pending.copies
        outputs = self.sealed.pop(checkpoint_id, None)
        if outputs:  # the epoch folds into the next one
            later = sorted(e for e in self.sealed if e > checkpoint_id)
            if later:
                self.sealed[later[0]] = outputs + self.sealed[later[0]]
            else:
                self.unsealed = outputs + self.unsealed
        if pending is not None and pending.final:
            log.info(
                "job %s: final checkpoint %d aborted (%s); waiting for the next",
                self.job_id,
                checkpoint_id,
                event.reason.name,
            )
            self._announce(JobStatus.RUNNING, end_of_input=True)
