"""The subtask side of the checkpoint protocol for every subtask of the job (Flink's
``SubtaskCheckpointCoordinatorImpl``), one per attempt of the job:

1. a trigger snapshots the sources at once and places barriers in the channels (`barriers`);
2. once its barrier state says so (aligned, or unaligned at once or after the aligned-checkpoint
   timeout), every keyed subtask snapshots its state versions, the sink epochs not yet visible
   and, unaligned, its channel state: the synchronous phase pins files, the copies run on the
   copier threads (`copies`);
3. each subtask acknowledges once its part is durable (`acks`);
4. a completion commits the epochs it covers (the sink's `EpochLedger`), an abort folds its
   epoch into the next.

It touches the attempt's parts it is given (channels, restored channel state, state backend,
source, ledger) and publishes only acknowledgements and declines; what ends the job is returned
to the agent, which announces it.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from fsspec.core import url_to_fs

from sparkpoint.agent.checkpointing.acks import Acknowledgements
from sparkpoint.agent.checkpointing.barriers import (
    first_state,
    next_switch_ms,
    place_barriers,
    unaligned_allowed,
)
from sparkpoint.agent.checkpointing.copies import (
    Fold,
    SubtaskCopy,
    copy_snapshot,
    fold_snapshot,
    self_contained,
)
from sparkpoint.agent.checkpointing.pending import Copied, Copy, Draining, PendingSnapshot
from sparkpoint.agent.faults import crash_point
from sparkpoint.agent.recovery.restore import SOURCE_FORMAT
from sparkpoint.agent.recovery.split import ChannelRecovery
from sparkpoint.agent.rounds.channels import (
    Channel,
    Partition,
    Segment,
    SegmentFiles,
    event_times_before,
)
from sparkpoint.agent.rounds.initial import InitialState
from sparkpoint.agent.sinks.ledger import EpochLedger
from sparkpoint.agent.sources.files import FileSourceReader
from sparkpoint.agent.sources.kafka import KafkaSourceReader
from sparkpoint.agent.state.backend import write_file
from sparkpoint.agent.state.books import StateBackend
from sparkpoint.common.events import (
    CheckpointFailureReason,
    NotifyCheckpointAborted,
    NotifyCheckpointComplete,
    SavepointFormat,
    SnapshotType,
    StateHandle,
    StateHandleKind,
    TriggerCheckpoint,
)
from sparkpoint.common.keygroups import KeyGroupRange
from sparkpoint.common.settings import CheckpointConfig, CheckpointingMode

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class JobShape:
    """What the job is to its checkpoints."""

    job_id: str
    ranges: list[KeyGroupRange]
    """Each keyed subtask's key groups."""
    config: CheckpointConfig
    shared_dir: str
    channel_dir: str
    fold: Fold | None = None
    """Folds a subtask's key groups into bases where the state lies (a Spark job): a canonical
    savepoint's state. None: savepoints copy the backend's files as they are (NATIVE)."""

    @property
    def parallelism(self) -> int:
        return len(self.ranges)


@dataclass
class Outcomes:
    """What became of the job's checkpoints, over every attempt (tests and the loop read it)."""

    completed: list[int] = field(default_factory=list)
    aborted: list[int] = field(default_factory=list)
    declined: list[int] = field(default_factory=list)
    latest_completed: str | None = None
    """The newest checkpoint (not savepoint) seen complete: what a restart restores."""


@dataclass
class AttemptParts:
    """The parts of one attempt of the job that snapshots read and change."""

    channels: list[Channel]
    restoring: ChannelRecovery
    backend: StateBackend
    source: KafkaSourceReader | FileSourceReader
    ledger: EpochLedger
    initial: InitialState | None = None
    """A fresh start's initial state, until its round is collected (`rounds.initial`)."""


class SubtaskCheckpointer:
    def __init__(
        self,
        shape: JobShape,
        parts: AttemptParts,
        acks: Acknowledgements,
        copier: ThreadPoolExecutor,
        segment_files: SegmentFiles,
        outcomes: Outcomes,
        taken: Callable[[], dict[int, list[Segment]]],
        highest_trigger: int = 0,
    ) -> None:
        self.shape = shape
        self.parts = parts
        self.acks = acks
        self.copier = copier
        self.segment_files = segment_files
        self.outcomes = outcomes
        self.taken = taken
        """The segments the stage-2 round in flight took, per subtask."""
        self.highest_trigger = highest_trigger
        self.pending: dict[int, PendingSnapshot] = {}
        self.end_of_input = False
        self.draining: Draining | None = None

    # --- trigger --------------------------------------------------------------------------------

    def trigger(self, trigger: TriggerCheckpoint, drained: bool = False) -> None:
        """Snapshots the sources and places the barrier. ``drained``: a stop-with-savepoint
        ``--drain`` handled again now that its input has ended (triggers with higher ids may
        have been handled meanwhile)."""
        checkpoint_id = trigger.checkpoint_id
        if checkpoint_id <= self.highest_trigger and not drained:
            return  # read again, or older than the restored checkpoint
        if trigger.snapshot_type is SnapshotType.SAVEPOINT_TERMINATE and not self.end_of_input:
            self.drain(trigger)  # this trigger is handled again once the input has ended
            return
        self.highest_trigger = max(self.highest_trigger, checkpoint_id)
        pending = PendingSnapshot(trigger, time.monotonic(), final=self.end_of_input)
        not_ready = self.parts.restoring.not_ready(self.parts.channels)
        if not_ready is None and self.parts.initial is not None:
            not_ready = self.parts.initial.not_ready()
        if not_ready is not None:  # recovering (`split`), or the initial state: not a failure
            subtask, why = not_ready
            log.info("job %s: checkpoint %d declined, %s %s", self.shape.job_id, checkpoint_id, subtask, why)  # fmt: skip
            reason = CheckpointFailureReason.CHECKPOINT_DECLINED_TASK_NOT_READY
            self.acks.decline(pending, subtask, reason, f"{subtask} {why}")
            crash_point("declined-in-recovery")
            return
        self.pending[checkpoint_id] = pending
        at_least_once = (
            self.shape.config.mode is CheckpointingMode.AT_LEAST_ONCE
            and not trigger.snapshot_type.is_savepoint
        )
        positions: dict[Partition, int] | None
        if at_least_once:
            positions = self._unprocessed_positions()
        else:
            positions = place_barriers(
                checkpoint_id, self.parts.channels, not unaligned_allowed(trigger), self.taken(),
                self.parts.source.positions, self.parts.restoring.holds_input(),
            )  # fmt: skip
        self._snapshot_sources(pending, positions, at_least_once)
        if at_least_once:
            self.snapshot(checkpoint_id, unaligned=False)  # no alignment: the state as it stands
        else:
            pending.barrier = first_state(trigger, pending.received * 1000, self)

    def _snapshot_sources(
        self, pending: PendingSnapshot, positions: dict[Partition, int] | None, at_least_once: bool
    ) -> None:
        """Sources snapshot at once: exactly-once, their positions are where the barrier stands
        in the channels; at-least-once, where the oldest record not yet processed was read.
        With event time, each source subtask's file also holds its partitions' highest event
        times at that cut, and keyed subtask i's watermark there (`time_snapshot`)."""
        trigger = pending.trigger
        for i in range(self.shape.parallelism):
            path = f"{trigger.target_location}/source-{i}.json"
            snapshot = {
                "format": SOURCE_FORMAT,
                "positions": self.parts.source.snapshot(i, positions),
                "end_of_input": self.end_of_input,
                **self.time_snapshot(i, trigger.checkpoint_id, positions, at_least_once),
            }
            data = json.dumps(snapshot).encode()
            started = time.monotonic()
            write_file(path, data)
            handle = StateHandle(path, StateHandleKind.SOURCE_POSITIONS, len(data))
            self.acks.acknowledge(
                pending, f"source-{i}", [handle], state_size=len(data), checkpointed=len(data),
                sync_ms=int((time.monotonic() - started) * 1000), async_ms=0,
            )  # fmt: skip

    def time_snapshot(
        self,
        subtask: int,
        checkpoint_id: int,
        positions: dict[Partition, int] | None,
        at_least_once: bool,
    ) -> dict[str, object]:
        """Source subtask ``subtask``'s partitions' highest event times at the cut (rewound with
        the positions where the cut lies behind reading), and keyed subtask ``subtask``'s
        watermark once everything before the barrier is processed (at-least-once: where it
        stands). Empty without event time."""
        source, channels = self.parts.source, self.parts.channels
        clock = source.watermarks
        if clock is None:
            return {}
        rewound = event_times_before(channels, positions) if positions else {}
        owned = [p for p in source.partitions if source.owner(p) == subtask]
        channel = channels[subtask]
        barrier = dict(channel.barriers).get(checkpoint_id)
        watermark = (
            channel.watermark if at_least_once or barrier is None else channel.watermark_at(barrier)
        )
        groups = self.shape.ranges[subtask]
        return {
            "event_time": clock.snapshot(owned, rewound),
            "watermark": {"key_groups": [groups.start, groups.end], "value": watermark},
        }

    def _unprocessed_positions(self) -> dict[Partition, int]:
        """Where an at-least-once snapshot's sources restart: before every record still queued
        (those processed meanwhile are processed again after a restore, never lost)."""
        positions = dict(self.parts.source.positions)
        for channel in self.parts.channels:
            for partition, offset in channel.unprocessed_from().items():
                positions[partition] = min(positions.get(partition, offset), offset)
        return positions

    def drain(self, trigger: TriggerCheckpoint) -> None:
        """Stop-with-savepoint ``--drain`` (Flink's SAVEPOINT_TERMINATE): the input ends where
        reading stands; once every record read is processed, the keyed function's end-of-input
        hook runs (windows fire, as Flink's MAX_WATERMARK fires them) and the savepoint is taken
        with the input ended. The job then finishes; a restore from that savepoint finds
        nothing left to do, as in Flink, where a drained job is not meant to be resumed."""
        if self.draining is not None:
            return
        log.info(
            "job %s: stop-with-savepoint %d with --drain: the input ends here",
            self.shape.job_id, trigger.checkpoint_id,
        )  # fmt: skip
        self.draining = Draining(trigger, self.parts.source.end_here())

    # --- alignment and the snapshot (BarrierControl) -----------------------------------------------

    def snapshot_due(self, now_ms: float) -> None:
        """Each pending checkpoint's barrier state takes the round, oldest first: a barrier still
        waiting holds the later ones back (barriers are in order)."""
        for checkpoint_id in sorted(self.pending):
            pending = self.pending[checkpoint_id]
            if pending.barrier is None:
                continue
            pending.barrier = pending.barrier.on_round(self, now_ms)
            if not pending.snapshotted:
                return

    def next_switch_ms(self) -> float | None:
        """When the oldest pending checkpoint still aligning goes unaligned (`next_switch_ms`):
        nothing wakes the loop for it, so its sleep ends then (`JobLoop.wait_s`)."""
        return next_switch_ms(self.pending[i].barrier for i in sorted(self.pending))

    def aligned(self, checkpoint_id: int) -> bool:
        # restored segments still waiting to enter a channel precede every barrier
        return (
            all(c.aligned(checkpoint_id) for c in self.parts.channels)
            and not self.parts.restoring.holds_input()
        )

    def snapshot(self, checkpoint_id: int, unaligned: bool) -> None:
        """Seals the epoch and snapshots every keyed subtask: the state of the rounds that
        completed so far and, unaligned, the segments still before the barrier (the round in
        flight included) as channel state. Copies run on the copier threads."""
        pending = self.pending[checkpoint_id]
        trigger = pending.trigger
        pending.unaligned = unaligned
        pending.aligned_ms = int((time.monotonic() - pending.received) * 1000)
        channels = self.parts.channels
        in_flight = {
            i: self.parts.restoring.channel_state(channel, checkpoint_id) if unaligned else []
            for i, channel in enumerate(channels)
        }
        for channel in channels:
            channel.remove_barrier(checkpoint_id)
        self.parts.ledger.seal(checkpoint_id)
        unpublished = self.parts.ledger.unpublished()  # one view for every subtask's manifest
        if trigger.snapshot_type.is_savepoint:
            unpublished = self_contained(unpublished, trigger.target_location)
        for i in range(self.shape.parallelism):
            pending.copies.append(self._snapshot_subtask(pending, i, unpublished, in_flight[i]))
        log.debug("job %s: checkpoint %d aligned after %d ms", self.shape.job_id, checkpoint_id, pending.aligned_ms)  # fmt: skip

    def _snapshot_subtask(
        self,
        pending: PendingSnapshot,
        subtask: int,
        unpublished: dict[int, list[tuple[int, str]]],
        in_flight: list[Segment],
    ) -> Copy:
        """Keyed subtask ``subtask``'s synchronous phase; its copy runs on the copier threads. A
        canonical savepoint folds each key group into one base (`fold_snapshot`); anything else
        references the backend's files, copying those not copied before."""
        trigger = pending.trigger
        full = trigger.snapshot_type is not SnapshotType.CHECKPOINT
        incremental = self.shape.config.incremental and not full
        started = time.monotonic()
        groups = self.shape.ranges[subtask]
        target = trigger.target_location
        manifest = {
            str(epoch): sorted(path for owner, path in outputs if owner == subtask)
            for epoch, outputs in unpublished.items()
        }
        rest = SubtaskCopy(
            subtask, groups, f"{target}/sink-{subtask}.json", manifest, in_flight, target,
            self.shape.channel_dir, self.parts.channels[subtask].watermark,
        )  # fmt: skip
        self.segment_files.pin(s.path for s in in_flight)
        backend = self.parts.backend
        fold = self.shape.fold
        future: Future[Copied]
        if (
            fold is not None
            and trigger.snapshot_type.is_savepoint
            and trigger.savepoint_format is SavepointFormat.CANONICAL
        ):
            state, pinned = backend.canonical(groups, target)
            future = self.copier.submit(
                fold_snapshot, state, pinned, fold, rest, backend, self.segment_files
            )
        else:
            plan = backend.plan(
                trigger.checkpoint_id, groups, incremental, target, self.shape.shared_dir
            )
            future = self.copier.submit(copy_snapshot, plan, rest, backend, self.segment_files)
        sync_ms = int((time.monotonic() - started) * 1000)
        return Copy(subtask, future, sync_ms, time.monotonic(), pending.unaligned)

    def processed(self, subtask: int, size: int) -> None:
        """A round processed ``size`` bytes of ``subtask``'s channel: counted for every
        checkpoint still aligning (Flink's processedData)."""
        for pending in self.pending.values():
            if not pending.snapshotted:
                key = f"keyed-{subtask}"
                pending.processed[key] = pending.processed.get(key, 0) + size

    # --- acknowledgements ------------------------------------------------------------------------

    def await_copies(self, stages: Sequence[Future[Any]] = ()) -> None:
        self.acks.await_copies(self.pending.values(), stages)

    def send_acks(self) -> None:
        self.acks.send(self.pending.values())

    # --- the end of a checkpoint ------------------------------------------------------------------

    def complete(self, event: NotifyCheckpointComplete) -> bool:
        """Commits the epochs checkpoint ``event.checkpoint_id`` covers; true when its completion
        finishes the job (a final checkpoint, or a stop-with-savepoint)."""
        checkpoint_id = event.checkpoint_id
        pending = self.pending.get(checkpoint_id)
        if pending is None or not self._completed_on_storage(pending, event):
            return False
        del self.pending[checkpoint_id]
        self.parts.backend.complete(checkpoint_id, event.is_savepoint)
        restoring = self.parts.restoring
        restored = (
            restoring.restored_queued(self.parts.channels) if restoring.during_recovery else 0
        )
        log.info(
            "job %s: checkpoint %d completed%s", self.shape.job_id, checkpoint_id,
            f" during recovery ({restored} restored segments not processed yet)" if restored else "",
        )  # fmt: skip
        crash_point("after-complete")
        if pending.persisted:
            crash_point("after-complete-in-flight")
        self.parts.ledger.commit_through(checkpoint_id)
        self.outcomes.completed.append(checkpoint_id)
        if not event.is_savepoint:
            self.outcomes.latest_completed = event.external_path
        for older in [c for c in self.pending if c < checkpoint_id and self.pending[c].snapshotted]:
            # subsumed (Flink's notifyCheckpointComplete covers earlier checkpoints)
            self.acks.orphans += self.pending.pop(older).copies
        stopped = pending.trigger.snapshot_type in (
            SnapshotType.SAVEPOINT_SUSPEND, SnapshotType.SAVEPOINT_TERMINATE,
        )  # fmt: skip
        if stopped:
            log.info("job %s: stopped with savepoint %s", self.shape.job_id, event.external_path)
        elif pending.final:
            log.info("job %s: final checkpoint %d completed", self.shape.job_id, checkpoint_id)
        return stopped or pending.final

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
            log.warning("job %s: checking %s/_metadata failed: %s", self.shape.job_id, where, exc)
            found = False
        if not found:
            log.error(
                "job %s: completion of checkpoint %d ignored: no _metadata at %s (the notice names %s)",
                self.shape.job_id, event.checkpoint_id, where, event.external_path,
            )  # fmt: skip
        return found

    def abort(self, event: NotifyCheckpointAborted) -> bool:
        """Drops checkpoint ``event.checkpoint_id``: its barrier, its copies (their new files go
        once done) and, folded into the next epoch, its sink output. True when it was the final
        checkpoint: the agent asks for the next."""
        checkpoint_id = event.checkpoint_id
        draining = self.draining
        if draining is not None and draining.trigger.checkpoint_id == checkpoint_id:
            log.warning(
                "job %s: stop-with-savepoint %d aborted while draining (%s): reading goes on",
                self.shape.job_id, checkpoint_id, event.reason.name,
            )  # fmt: skip
            self.parts.source.resume(draining.ends)
            self.draining = None
        self.outcomes.aborted.append(checkpoint_id)
        self.parts.backend.abort(checkpoint_id)
        pending = self.pending.pop(checkpoint_id, None)
        if pending is not None:
            for channel in self.parts.channels:
                channel.remove_barrier(checkpoint_id)
            self.acks.orphans += pending.copies
        self.parts.ledger.fold(checkpoint_id)
        if pending is None or not pending.final:
            return False
        log.info(
            "job %s: final checkpoint %d aborted (%s); waiting for the next",
            self.shape.job_id, checkpoint_id, event.reason.name,
        )  # fmt: skip
        return True
