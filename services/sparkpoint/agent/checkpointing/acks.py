"""Acknowledgements and declines of the job's subtasks (on ``sparkpoint.acks``): a source subtask
acknowledges at the trigger, a keyed subtask once its snapshot's copies are durable; a snapshot
that failed is declined. Copies finish on other threads: the loop collects the finished ones
each turn (`send`) and may wait a little for those in flight (`await_copies`), so that every
subtask's acknowledgement of a checkpoint goes out in the same turn."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future
from concurrent.futures import wait as wait_for
from typing import Any

from sparkpoint.agent.checkpointing.pending import Copy, PendingSnapshot, now_ms, split_done
from sparkpoint.agent.faults import crash_point
from sparkpoint.agent.state.backend import delete_files, split_segment
from sparkpoint.agent.state.books import Upload
from sparkpoint.common.events import (
    AcknowledgeCheckpoint,
    CheckpointFailureReason,
    DeclineCheckpoint,
    StateHandle,
    StateHandleKind,
)
from sparkpoint.common.kafka import EventPublisher
from sparkpoint.common.topics import ACKS

log = logging.getLogger(__name__)

COPY_WAIT_S = 0.5
"""How long the loop waits for snapshot copies before it goes on with the next round."""


class Acknowledgements:
    def __init__(
        self,
        publisher: EventPublisher,
        job_id: str,
        agent_id: str,
        attempt: Callable[[], int],
        subtasks: int,
        declined: list[int],
    ) -> None:
        self.publisher = publisher
        self.job_id = job_id
        self.agent_id = agent_id
        self.attempt = attempt
        self.subtasks = subtasks
        """Source and keyed subtasks: a checkpoint is fully acknowledged by all of them."""
        self.declined = declined
        self.orphans: list[Copy] = []
        """Copies of snapshots that will never be acknowledged: their new files go when done."""

    def await_copies(
        self, pending: Iterable[PendingSnapshot], stages: Sequence[Future[Any]] = ()
    ) -> None:
        """Waits for the snapshot copies in flight (local copies take milliseconds) and
        acknowledges each as it finishes; a stage that finishes first ends the wait (the next
        round is not held up), and slow storage never holds the loop longer than
        `COPY_WAIT_S`."""
        snapshots = list(pending)
        deadline = time.monotonic() + COPY_WAIT_S
        while remaining := [c.future for p in snapshots for c in p.copies if not c.future.done()]:
            timeout = deadline - time.monotonic()
            if timeout <= 0:
                return
            done, _ = wait_for([*remaining, *stages], timeout=timeout, return_when=FIRST_COMPLETED)
            self.send(snapshots)
            if any(stage in done for stage in stages) or not done:
                return

    def send(self, pending: Iterable[PendingSnapshot]) -> None:
        """Acknowledges (or declines) every keyed snapshot whose copies finished; each copy is
        judged done once, so one finishing meanwhile is answered next time, never dropped."""
        done, self.orphans = split_done(self.orphans)
        for copy in done:
            delete_files(copy.new_files())
        for snapshot in sorted(pending, key=lambda p: p.checkpoint_id):
            done, snapshot.copies = split_done(snapshot.copies)
            for copy in done:
                self._answer(snapshot, copy)

    def _answer(self, pending: PendingSnapshot, copy: Copy) -> None:
        subtask = f"keyed-{copy.subtask}"
        error = copy.future.exception()
        if error is not None:
            log.error(
                "job %s: snapshot %d of %s failed: %s",
                self.job_id, pending.checkpoint_id, subtask, error,
            )  # fmt: skip
            reason = CheckpointFailureReason.CHECKPOINT_ASYNC_EXCEPTION
            self.decline(pending, subtask, reason, str(error))
            return
        copied = copy.future.result()
        handles = [state_handle(u) for u, _ in copied.plan]
        manifest = f"{pending.trigger.target_location}/sink-{copy.subtask}.json"
        handles.append(StateHandle(manifest, StateHandleKind.SINK_EPOCH, 0))
        persisted = copied.persisted
        pending.persisted += persisted
        self.acknowledge(
            pending, subtask, handles + copied.channel,
            state_size=sum(u.size for u, _ in copied.plan) + persisted,
            checkpointed=sum(u.size for u, s in copied.plan if s is not None) + persisted,
            sync_ms=copy.sync_ms,
            async_ms=int((time.monotonic() - copy.started) * 1000),
            persisted=persisted, unaligned=copy.unaligned,
        )  # fmt: skip

    def acknowledge(
        self, pending: PendingSnapshot, subtask: str, handles: list[StateHandle], *,
        state_size: int, checkpointed: int, sync_ms: int, async_ms: int,
        persisted: int = 0, unaligned: bool = False,
    ) -> None:  # fmt: skip
        """Publishes a subtask's acknowledgement; alignment is 0 for sources (they snapshot at
        the trigger, before any alignment). ``persisted``: bytes of in-flight records written
        as channel state (Flink's persistedData)."""
        ack = AcknowledgeCheckpoint(
            self.job_id, pending.checkpoint_id, subtask, self.attempt(), now_ms(), handles,
            state_size, pending.aligned_ms, sync_ms, async_ms, persisted, unaligned, checkpointed,
            pending.processed.get(subtask, 0), agent_id=self.agent_id,
        )  # fmt: skip
        self.publisher.publish_nowait(ACKS, self.job_id, ack)
        pending.acked.add(subtask)
        if len(pending.acked) == self.subtasks:
            self.publisher.flush(10)
            crash_point("after-ack")
        self.publisher.producer.poll(0)

    def decline(
        self, pending: PendingSnapshot, subtask: str, reason: CheckpointFailureReason, message: str
    ) -> None:
        decline = DeclineCheckpoint(
            self.job_id, pending.checkpoint_id, subtask, self.attempt(), reason, now_ms(),
            message, agent_id=self.agent_id,
        )  # fmt: skip
        self.declined.append(pending.checkpoint_id)
        self.publisher.publish_nowait(ACKS, self.job_id, decline)
        self.publisher.producer.poll(0)


def state_handle(upload: Upload) -> StateHandle:
    """A keyed state file's handle: the file, or with file merging the merged file, the
    segment's offset and the state file's name (the coordinator counts the merged file)."""
    span = split_segment(upload.path)
    path, offset, name = (upload.path, None, None) if span is None else (span[0], span[1], span[3])
    return StateHandle(
        path, StateHandleKind.KEYED_STATE, upload.size, upload.first, upload.last, upload.shared,
        offset, name,
    )  # fmt: skip
