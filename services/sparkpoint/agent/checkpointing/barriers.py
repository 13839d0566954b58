"""How one checkpoint's barrier is handled: wait for alignment, or snapshot unaligned (Flink's
``BarrierHandlerState`` machine, reduced to what a driver-side channel log needs: the agent sees
every channel at once, so "all barriers received" is the moment of the trigger).

- **Aligned** (unaligned checkpoints off, every savepoint, at-least-once mode aside): the
  barrier waits at the tail of every channel; the keyed subtasks snapshot once everything
  before it has been processed.
- **Unaligned** (``execution.checkpointing.unaligned.enabled`` with an aligned-checkpoint
  timeout of 0): the subtasks snapshot at once: their last completed state, and the records
  between that state and the barrier as channel state.
- **Aligned, then unaligned** (a timeout above 0): the checkpoint starts aligned; when alignment
  has not happened within the timeout, it switches to unaligned, with the records still before
  the barrier as channel state (Flink's ``AlternatingWaitingForFirstBarrier`` ->
  ``AlternatingCollectingBarriersUnaligned``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Decision(enum.Enum):
    WAIT = "WAIT"
    ALIGNED = "ALIGNED"
    UNALIGNED = "UNALIGNED"


@dataclass(frozen=True)
class BarrierPolicy:
    unaligned: bool
    """Unaligned snapshots are allowed for this checkpoint (never for savepoints)."""
    timeout_ms: int
    """Aligned-checkpoint timeout: 0 means unaligned at once."""
    received_ms: float
    """When the agent received the trigger (its monotonic clock, in ms)."""

    @classmethod
    def for_trigger(
        cls, unaligned: bool, timeout_ms: int | None, is_savepoint: bool, received_ms: float
    ) -> BarrierPolicy:
        return cls(unaligned and not is_savepoint, max(0, timeout_ms or 0), received_ms)

    @property
    def at_once(self) -> bool:
        """Snapshot unaligned at the trigger, without placing a barrier to wait on."""
        return self.unaligned and self.timeout_ms == 0

    def decide(self, aligned: bool, now_ms: float) -> Decision:
        """Aligned wins whenever it has happened; else unaligned once allowed and due."""
        if aligned:
            return Decision.ALIGNED
        if self.unaligned and now_ms - self.received_ms >= self.timeout_ms:
            return Decision.UNALIGNED
        return Decision.WAIT

    def due_in_ms(self, now_ms: float) -> float | None:
        """How long until the switch to unaligned, or None when it never switches."""
        if not self.unaligned:
            return None
        return max(0.0, self.received_ms + self.timeout_ms - now_ms)
