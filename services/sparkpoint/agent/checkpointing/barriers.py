"""How one checkpoint's barrier is handled, as explicit states (Flink's ``BarrierHandlerState``
machine, reduced to what a driver-side channel log needs: the agent sees every channel at once,
so "all barriers received" is the moment of the trigger). Each state answers a round of the
loop by returning the next state; a state reaches the agent only through `BarrierControl`.

- **Aligned** (unaligned checkpoints off, every savepoint): `Aligning` without a switch; the
  keyed subtasks snapshot once everything before the barrier has been processed.
- **Unaligned** (``execution.checkpointing.unaligned.enabled``, aligned-checkpoint timeout 0):
  snapshotted at the trigger: the last completed state, and the records between that state and
  the barrier as channel state (`first_state` returns `Snapshotted`).
- **Aligned, then unaligned** (a timeout above 0): `Aligning` with a switch; when alignment has
  not happened by then, it snapshots unaligned, with the records still before the barrier as
  channel state (Flink's ``AlternatingWaitingForFirstBarrier`` ->
  ``AlternatingCollectingBarriersUnaligned``).

Where the barrier goes (`place_barriers`): an aligned-only barrier at the earliest consistent
cut of the channels (`earliest_cut`), any other after everything queued.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from sparkpoint.agent.rounds.channels import Channel, Partition, Segment, earliest_cut
from sparkpoint.common.events import TriggerCheckpoint

log = logging.getLogger(__name__)


class BarrierControl(Protocol):
    """All a barrier state may ask of the agent."""

    def aligned(self, checkpoint_id: int) -> bool:
        """Every channel has processed what lies before the barrier (and no restored channel
        state is still on its way in, which precedes every barrier)."""
        ...

    def snapshot(self, checkpoint_id: int, unaligned: bool) -> None: ...


@dataclass(frozen=True)
class Aligning:
    """The barrier is in every channel, and the subtasks wait for what lies before it."""

    checkpoint_id: int
    switch_at_ms: float | None = None
    """When it goes unaligned if not aligned by then; None: it waits for alignment."""

    def on_round(self, control: BarrierControl, now_ms: float) -> BarrierState:
        aligned = control.aligned(self.checkpoint_id)
        if aligned:
            control.snapshot(self.checkpoint_id, unaligned=False)
            return Snapshotted(self.checkpoint_id)
        if self.switch_at_ms is not None and now_ms >= self.switch_at_ms:
            log.info(
                "checkpoint %d not aligned in time: switching to unaligned", self.checkpoint_id
            )
            control.snapshot(self.checkpoint_id, unaligned=True)
            return Snapshotted(self.checkpoint_id)
        return self


@dataclass(frozen=True)
class Snapshotted:
    """The subtasks took their snapshot; rounds no longer matter to this checkpoint."""

    checkpoint_id: int

    def on_round(self, control: BarrierControl, now_ms: float) -> BarrierState:
        return self


BarrierState = Aligning | Snapshotted


def next_switch_ms(states: Iterable[BarrierState | None]) -> float | None:
    """When the first of these barriers (in checkpoint order) still aligning goes unaligned if
    it is not aligned by then (its aligned checkpoint timeout, monotonic ms); None when it
    waits for alignment however long, or none is aligning. Barriers are taken in order, so a
    later one's timeout matters only once the first is snapshotted: a loop that slept until a
    later one's passed moment would turn without pause behind an aligned-only first one."""
    first = next((s for s in states if isinstance(s, Aligning)), None)
    return None if first is None else first.switch_at_ms


def unaligned_allowed(trigger: TriggerCheckpoint) -> bool:
    """Unaligned snapshots are allowed for this trigger (never for savepoints)."""
    return trigger.unaligned and not trigger.snapshot_type.is_savepoint


def first_state(
    trigger: TriggerCheckpoint, received_ms: float, control: BarrierControl
) -> BarrierState:
    """The state a trigger starts in (Flink's ``aligned()`` / ``alternating()`` factories); an
    unaligned checkpoint with no timeout snapshots at once."""
    if not unaligned_allowed(trigger):
        return Aligning(trigger.checkpoint_id)
    timeout = max(0, trigger.aligned_checkpoint_timeout_ms or 0)
    if timeout == 0:
        control.snapshot(trigger.checkpoint_id, unaligned=True)
        return Snapshotted(trigger.checkpoint_id)
    return Aligning(trigger.checkpoint_id, received_ms + timeout)


def place_barriers(
    checkpoint_id: int,
    channels: list[Channel],
    aligned_only: bool,
    taken: dict[int, list[Segment]],
    positions: dict[Partition, int],
    restored_waiting: bool,
) -> dict[Partition, int] | None:
    """Places checkpoint ``checkpoint_id``'s barrier in every channel; returns the source
    positions the barrier stands for (None: ``positions``, where reading stands now).

    An aligned-only barrier goes at the earliest consistent cut (`earliest_cut`): right after
    the segments the stage-2 round in flight took (``taken``), with the sources where the
    segments behind it were read from. Those are read again after a restore instead of being
    waited for, so the checkpoint is aligned as soon as the round in flight ends, not a round
    later (Spark's checkpoints cut between micro-batches the same way). Not while restored
    channel state waits to enter the channels or an earlier barrier waits; any other barrier
    (unaligned: its channel state is what is queued) goes after everything queued."""
    cut = (
        earliest_cut(channels, taken, positions)
        if aligned_only and not restored_waiting and not any(c.barriers for c in channels)
        else None
    )
    if cut is None:
        for channel in channels:
            channel.add_barrier(checkpoint_id)
        return None
    sequences, cut_positions = cut
    for channel, sequence in zip(channels, sequences, strict=True):
        channel.add_barrier(checkpoint_id, sequence)
    return cut_positions
