"""The checkpoints of one job that were triggered and have not ended (Flink's map of pending
checkpoints), the canceller timer of each, and the ids that ended lately with their directories,
so a late acknowledgement is known for what it is: each checkpoint's life from its trigger to
its end (finished once its ``_metadata`` is written, or aborted).

It answers acknowledgements. Only the agent and attempt that drive the job are heard. A late
acknowledgement (its checkpoint ended) has its private files discarded: those in the
checkpoint's own directory, and copies in ``shared/`` that nothing references. An
acknowledgement for a checkpoint this coordinator does not know, or whose files lie anywhere
else, is refused and deletes nothing: what it names is left for the retention sweep. The last
acknowledgement of a checkpoint cancels its canceller and asks for ``_metadata`` to be written
(FinalizeCheckpoint). What a checkpoint's end entails beyond itself (older checkpoints subsumed, a
failover, the next request) is the coordinator's."""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Iterator, Sequence

from sparkpoint.common.events import (
    AcknowledgeCheckpoint,
    CheckpointEventType,
    CheckpointFailureReason,
    DeclineCheckpoint,
)
from sparkpoint.common.settings import CheckpointConfig
from sparkpoint.coordinator.core.admission import ack_problem
from sparkpoint.coordinator.core.commands import (
    CancelTimer,
    Command,
    DiscardState,
    FinalizeCheckpoint,
    Publish,
    RequestFailed,
    ScheduleTimer,
    Timer,
    TimerKind,
)
from sparkpoint.coordinator.core.decider import CheckpointRequest
from sparkpoint.coordinator.core.messages import JobMessages
from sparkpoint.coordinator.core.pending import AckResult, PendingCheckpoint
from sparkpoint.coordinator.core.stats import CheckpointStatsTracker
from sparkpoint.coordinator.core.store import Discard, DiscardGate, FileRegistry

log = logging.getLogger(__name__)

RECENT_IDS = 16
"""Recently ended checkpoints remembered (with their directories) to recognise late
acknowledgements (Flink keeps 16): their private files are discarded quietly."""

NO_COMMANDS: tuple[Command, ...] = ()

ABORTED_AS = {
    CheckpointFailureReason.CHECKPOINT_EXPIRED: CheckpointEventType.EXPIRED,
    CheckpointFailureReason.CHECKPOINT_SUBSUMED: CheckpointEventType.SUBSUMED,
}
"""The lifecycle event of an aborted checkpoint, by reason (FAILED for every other)."""


class InFlight:
    def __init__(
        self,
        messages: JobMessages,
        agent_id: str,
        subtasks: tuple[str, ...],
        job_dir: str,
        registry: FileRegistry,
    ) -> None:
        self.messages = messages
        self.job_id, self.agent_id, self.attempt = messages.job_id, agent_id, messages.attempt
        self.subtasks = subtasks
        self._subtask_set = frozenset(subtasks)
        self.job_dir = job_dir
        self.registry = registry
        """The completed store's: a pending checkpoint holds the files acknowledged for it."""
        self.pending: dict[int, PendingCheckpoint] = {}
        self.gate = DiscardGate(registry, self.pending)
        """What a checkpoint's end lets go waits for the others pending (the completed store's
        subsumptions go through it too)."""
        self.recent: OrderedDict[int, str] = OrderedDict()
        """Recently ended checkpoint id -> its directory, newest last, at most RECENT_IDS."""
        self.cancellers: dict[int, Timer] = {}

    def trigger(
        self,
        checkpoint_id: int,
        request: CheckpointRequest,
        now_ms: int,
        location: str,
        config: CheckpointConfig,
        stats: CheckpointStatsTracker,
    ) -> list[Command]:
        """A checkpoint triggered now, pending until it ends: expecting every subtask, with a
        canceller at the deadline; the trigger goes to the agent, TRIGGERED to the audit."""
        unaligned = config.unaligned and not request.is_savepoint
        subtasks = self.subtasks
        pending = PendingCheckpoint(
            checkpoint_id, request, now_ms, subtasks, location, config.timeout_ms, unaligned
        )
        self.pending[checkpoint_id] = pending
        stats.on_triggered(
            checkpoint_id, request.snapshot_type, now_ms, subtasks, pending.acknowledgements,
            unaligned,
        )  # fmt: skip
        timer = Timer(self.job_id, TimerKind.CANCELLER, checkpoint_id)
        self.cancellers[checkpoint_id] = timer
        aligned_timeout = (
            config.aligned_checkpoint_timeout_ms
            if unaligned and config.aligned_checkpoint_timeout_ms
            else None
        )
        triggered = CheckpointEventType.TRIGGERED
        return [
            ScheduleTimer(timer, pending.deadline_ms),
            Publish(self.messages.trigger(pending, aligned_timeout)),
            Publish(
                self.messages.lifecycle(checkpoint_id, triggered, request.snapshot_type, now_ms)
            ),
        ]

    def oldest_first(self) -> list[PendingCheckpoint]:
        return sorted(self.pending.values(), key=lambda p: p.checkpoint_id)

    def acknowledge(
        self, ack: AcknowledgeCheckpoint
    ) -> tuple[AckResult, Sequence[Command], str | None]:
        """(what it did, the commands, why it was refused when it was)."""
        if ack.agent_id != (self.agent_id or None) or ack.attempt != self.attempt:
            reason = (
                f"from agent {ack.agent_id} attempt {ack.attempt}; the job is driven by "
                f"agent {self.agent_id} attempt {self.attempt}"
            )
            return AckResult.REFUSED, NO_COMMANDS, reason
        pending = self.pending.get(ack.checkpoint_id)
        location = (
            pending.target_location if pending is not None else self.recent.get(ack.checkpoint_id)
        )
        problem = ack_problem(ack, location, self.job_dir, self._subtask_set)
        if problem is not None:
            return AckResult.REFUSED, NO_COMMANDS, problem
        if pending is None:
            return AckResult.DISCARDED, self._discard_late(ack), None
        result = pending.acknowledge(ack)
        if result is AckResult.SUCCESS:
            if ack.state_handles:
                self.registry.acquire(h.path for h in ack.state_handles)
            if pending.fully_acknowledged:
                return result, self._fully_acknowledged(pending), None
        return result, NO_COMMANDS, None

    def _discard_late(self, ack: AcknowledgeCheckpoint) -> Sequence[Command]:
        """A late acknowledgement's files that provably belong to it alone: inside its
        checkpoint's directory (already discarded with the checkpoint), or copies in ``shared/``
        that no retained or pending checkpoint references."""
        free = self.registry.unreferenced(h.path for h in ack.state_handles)
        if not free:
            return NO_COMMANDS
        discard = Discard(ack.checkpoint_id, tuple(free), None, "late acknowledgement")
        return tuple(DiscardState(self.job_id, d) for d in self.gate.let_go([discard]))

    def _fully_acknowledged(self, pending: PendingCheckpoint) -> list[Command]:
        commands: list[Command] = []
        timer = self.cancellers.pop(pending.checkpoint_id, None)
        if timer is not None:
            commands.append(CancelTimer(timer))
        commands.append(
            FinalizeCheckpoint(
                self.job_id,
                pending.checkpoint_id,
                pending.request.snapshot_type,
                pending.trigger_ms,
                pending.target_location,
                tuple(pending.acknowledgements.values()),
                pending.request.format_type,
            )
        )
        return commands

    def declined(self, decline: DeclineCheckpoint) -> PendingCheckpoint | None:
        """The pending checkpoint a decline ends, if it is heard and names one."""
        if decline.agent_id != (self.agent_id or None) or decline.attempt != self.attempt:
            log.info(
                "decline of checkpoint %d of job %s from agent %s attempt %d refused: not the agent that drives the job",
                decline.checkpoint_id, decline.job_id, decline.agent_id, decline.attempt,
            )  # fmt: skip
            return None
        pending = self.pending.get(decline.checkpoint_id)
        if (
            pending is None
            or decline.subtask_id
            not in pending.not_yet_acknowledged | pending.acknowledgements.keys()
        ):
            log.info(
                "decline of checkpoint %d of job %s by %s ignored (not pending or unknown subtask)",
                decline.checkpoint_id,
                decline.job_id,
                decline.subtask_id,
            )
            return None
        return pending

    def expired(self, timer: Timer, now_ms: int) -> PendingCheckpoint | None:
        """A canceller fired: the checkpoint that expired with it, if one did."""
        self.cancellers.pop(timer.checkpoint_id, None)
        pending = self.pending.get(timer.checkpoint_id)
        if pending is None or pending.fully_acknowledged or now_ms < pending.deadline_ms:
            return None
        return pending

    def finish(self, checkpoint_id: int) -> PendingCheckpoint:
        """A fully acknowledged checkpoint whose ``_metadata`` is written: no longer pending."""
        pending = self.pending.pop(checkpoint_id, None)
        if pending is None or not pending.fully_acknowledged:
            raise ValueError(
                f"checkpoint {checkpoint_id} of job {self.job_id} is not ready to complete"
            )
        pending.dispose()
        self._remember(pending)
        return pending

    def abort(
        self,
        pending: PendingCheckpoint,
        reason: CheckpointFailureReason,
        now_ms: int,
        message: str,
        stats: CheckpointStatsTracker,
    ) -> list[Command]:
        """An aborted checkpoint, no longer pending: its canceller cancelled, the files only it
        held discarded (with its directory), the agent told, the audit event, the request's
        answer. Whether the failure counts toward a failover is the coordinator's."""
        checkpoint_id = pending.checkpoint_id
        del self.pending[checkpoint_id]
        pending.dispose()
        self._remember(pending)
        commands: list[Command] = []
        timer = self.cancellers.pop(checkpoint_id, None)
        if timer is not None:
            commands.append(CancelTimer(timer))
        free = self.registry.release(h.path for h in pending.state_handles())
        mine = (
            [Discard(checkpoint_id, tuple(free), pending.target_location, reason.name)]
            if free or pending.acknowledgements
            else []
        )
        # with what waited for this checkpoint among others
        commands.extend(DiscardState(self.job_id, d) for d in self.gate.let_go(mine))
        commands.append(Publish(self.messages.aborted(checkpoint_id, reason, now_ms, message)))
        event = self.messages.lifecycle(
            checkpoint_id, ABORTED_AS.get(reason, CheckpointEventType.FAILED),
            pending.request.snapshot_type, now_ms, failure_reason=reason, message=message,
            duration_ms=now_ms - pending.trigger_ms,
        )  # fmt: skip
        commands.append(Publish(event))
        stats.on_failed(checkpoint_id, now_ms, f"{reason.name}: {message}")
        if pending.request.request_id is not None:
            commands.append(RequestFailed(pending.request.request_id, reason, message))
        return commands

    def set_timeout(
        self, timeout_ms: int, now_ms: int
    ) -> Iterator[tuple[PendingCheckpoint, ScheduleTimer | None]]:
        """FLIP-571: a new timeout applies to the pending checkpoints too, oldest first, one at a
        time (one the caller ended meanwhile is passed over, as is one fully acknowledged): its
        canceller moved to the new deadline, or None when that has passed already."""
        for pending in self.oldest_first():
            if pending.checkpoint_id not in self.pending or pending.fully_acknowledged:
                continue
            deadline = pending.set_timeout(timeout_ms)
            if deadline > now_ms:
                yield pending, ScheduleTimer(self.cancellers[pending.checkpoint_id], deadline)
            else:
                yield pending, None

    def _remember(self, pending: PendingCheckpoint) -> None:
        self.recent[pending.checkpoint_id] = pending.target_location
        while len(self.recent) > RECENT_IDS:
            self.recent.popitem(last=False)
