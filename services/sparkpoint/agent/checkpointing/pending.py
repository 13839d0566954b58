"""What the agent keeps of a checkpoint between its trigger and its end: the pending snapshot,
its barrier state, and each keyed subtask's copy in its asynchronous phase."""

from __future__ import annotations

import time
from concurrent.futures import Future
from dataclasses import dataclass, field

from sparkpoint.agent.checkpointing.barriers import BarrierState, Snapshotted
from sparkpoint.agent.state.backend import physical
from sparkpoint.agent.state.books import Upload
from sparkpoint.common.events import StateHandle, TriggerCheckpoint


def now_ms() -> int:
    return int(time.time() * 1000)


Plan = list[tuple[Upload, str | None]]
"""What a subtask's snapshot references, and the working file each new copy is made from (a
canonical savepoint's folded bases: the file itself)."""


@dataclass(frozen=True)
class Copied:
    """What a keyed subtask's asynchronous phase made: the state files its snapshot references,
    and the channel-state handles it wrote (unaligned snapshots) with their bytes."""

    plan: Plan
    channel: list[StateHandle] = field(default_factory=list)
    persisted: int = 0

    def new_files(self) -> list[str]:
        """The files this snapshot wrote (a merged file once, however many segments it holds)."""
        return list(dict.fromkeys(physical(u.path) for u, source in self.plan if source))


@dataclass
class Copy:
    """One keyed subtask's snapshot in its asynchronous phase."""

    subtask: int
    future: Future[Copied]
    sync_ms: int
    started: float
    unaligned: bool = False

    def new_files(self) -> list[str]:
        """The files it made (once done; none when it failed)."""
        if not self.future.done() or self.future.exception() is not None:
            return []
        return self.future.result().new_files()


@dataclass
class PendingSnapshot:
    trigger: TriggerCheckpoint
    received: float
    final: bool
    """Taken after the end of a bounded input: its completion finishes the job."""
    barrier: BarrierState | None = None
    """Where its barrier stands (None: at-least-once, snapshotted at the trigger)."""
    acked: set[str] = field(default_factory=set)
    copies: list[Copy] = field(default_factory=list)
    aligned_ms: int = 0
    unaligned: bool = False
    processed: dict[str, int] = field(default_factory=dict)
    """Bytes each keyed subtask processed between the trigger and its alignment (Flink's
    processedData)."""
    persisted: int = 0
    """Bytes of in-flight records its subtasks wrote as channel state (Flink's persistedData)."""

    @property
    def snapshotted(self) -> bool:
        return self.barrier is None or isinstance(self.barrier, Snapshotted)

    @property
    def checkpoint_id(self) -> int:
        return self.trigger.checkpoint_id


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
