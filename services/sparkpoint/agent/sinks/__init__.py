"""Sinks: where stage 2's output goes. Stage 2 stages each round's output as an Arrow file; a
sink either publishes it right away (at-least-once) or when the checkpoint of its epoch completes
(exactly-once), idempotently, so a restore can publish a completed epoch again.

Staged files are named uniquely per agent run (a random token), and what a sink makes visible is
named after them, so two runs of one job id can never overwrite each other's output, even if an
epoch number were used twice. A restore publishes a completed epoch again only when the sink
cannot show it was published (`unpublished`)."""

from __future__ import annotations

import hashlib
import logging
import posixpath
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import pandas as pd

from sparkpoint.agent.rounds.frames import from_ipc
from sparkpoint.agent.state.backend import delete_files

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PublishedEpoch:
    """The newest epoch a sink made visible, and the digest of the staged files it published."""

    epoch: int
    digest: str | None


def outputs_digest(outputs: list[str]) -> str:
    """SHA-256 of an epoch's staged file names (unique per agent run), sorted."""
    names = sorted(posixpath.basename(o) for o in outputs)
    return hashlib.sha256("\n".join(names).encode()).hexdigest()


class SinkConflict(RuntimeError):
    """The sink's record of what it published contradicts the checkpoint being restored."""


def unpublished(epochs: dict[int, list[str]], published: PublishedEpoch | None) -> list[int]:
    """The restored epochs to publish, oldest first. Epochs are published in order, so every
    epoch below the sink's newest is visible; the newest itself must be this checkpoint's (same
    staged files), or the restore cannot prove what was published and refuses."""
    if published is None:
        return sorted(epochs)
    pending = []
    for epoch in sorted(epochs):
        if epoch > published.epoch:
            pending.append(epoch)
        elif (
            epoch == published.epoch
            and published.digest is not None
            and published.digest != outputs_digest(epochs[epoch])
        ):
            raise SinkConflict(
                f"the sink published epoch {epoch} from other staged output than this "
                "checkpoint's: another run used the same epoch; refusing to guess what is visible"
            )
    return pending


SinkRunner = Callable[[Callable[[Any], int], list[Any]], list[int]]
"""Runs a sink's work function over its tasks and returns their counts: the agent runs them as
one Spark job (a task each, in the pool ``sink``), so staged output is read and made visible on
executors and never passes through the driver."""


Emit = Callable[[pd.DataFrame], int]
"""Makes a frame of output visible and returns how many records: picklable, it travels to
stage-2 tasks."""


def inline(work: Callable[[Any], int], tasks: list[Any]) -> list[int]:
    """The runner outside an agent: the tasks one after another, in this process."""
    return [work(task) for task in tasks]


class SinkWriter(Protocol):
    exactly_once: bool
    writes_ahead: bool
    """Exactly-once output goes into an open transaction as soon as it is staged, and a
    completion only commits it (`write_ahead`); otherwise an epoch is written when it commits."""

    def publish_epoch(self, epoch: int, outputs: list[str]) -> int:
        """Makes epoch ``epoch``'s staged output visible (exactly-once: atomically, once)."""
        ...

    def prepare(self) -> None:
        """Starts what the sink needs before its first epoch, once Spark has started (the
        write-ahead process: its imports would compete with Spark's start)."""
        ...

    def write_ahead(self, outputs: list[str]) -> None:
        """Staged files into the open transaction, ahead of their epoch's `publish_epoch`."""
        ...

    def abort_ahead(self) -> None:
        """What was written ahead and not committed is dropped (a failed attempt's: its restore
        stages that output again)."""
        ...

    def direct(self) -> Emit | None:
        """At-least-once: what stage-2 tasks call with their round's output to make it visible
        at once, from the executor (no staged file, no Spark job of its own); None for an
        exactly-once sink, whose output is staged until its checkpoint completes."""
        ...

    def published(self) -> PublishedEpoch | None:
        """The newest epoch already visible; None when the sink has no such record and proves
        each file instead (publishing is idempotent by name)."""
        ...

    def close(self) -> None: ...


class WriteAhead(Protocol):
    """What holds an exactly-once sink's open transaction and writes staged output into it
    before its epoch commits (`sinks.ahead.AheadPublisher`)."""

    def start(self) -> None: ...

    def started(self) -> bool: ...

    def produce(self, paths: list[str]) -> None: ...

    def commit(self, epoch: int, outputs: list[str], crash: bool = False) -> int: ...

    def reset(self) -> None: ...

    def close(self) -> None: ...


def read_outputs(outputs: list[str]) -> pd.DataFrame:
    frames = [from_ipc(path) for path in outputs]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


class EpochCommitter:
    """Publishes completed epochs in order on a thread of its own, so stage 1 and stage 2 go on
    while a sink commits (Flink's committers are asynchronous to processing too). A failed
    commit is kept and raised by `check` or `drain` in the agent's loop: the job fails, and a
    restore publishes the epoch again."""

    def __init__(self, sink: SinkWriter, job_id: str) -> None:
        self.sink = sink
        self.job_id = job_id
        self._queue: queue.Queue[tuple[int | None, list[str], bool] | None] = queue.Queue()
        """Epochs to publish (epoch, files, delete) and files to write ahead (None, files, _),
        in the order the ledger gave them."""
        self._error: BaseException | None = None
        self.published_through = 0
        """The newest epoch this committer made visible (epochs are published in order)."""
        self._wake: Callable[[], None] = lambda: None
        self._thread = threading.Thread(target=self._run, name=f"commit-{job_id}", daemon=True)
        self._thread.start()

    @property
    def writes_ahead(self) -> bool:
        return self.sink.writes_ahead

    def listen(self, wake: Callable[[], None]) -> None:
        """``wake`` is called when a commit fails (the job's loop then raises it at once)."""
        self._wake = wake

    def write_ahead(self, outputs: list[str]) -> None:
        """Staged files into the sink's open transaction, after the epochs submitted before."""
        self._queue.put((None, outputs, False))

    def submit(self, epoch: int, outputs: list[str], delete: bool = True) -> None:
        """Publishes an epoch; ``delete``: its staged files are this agent's, removed once
        visible (restored epochs name files of a snapshot or of an earlier run: kept)."""
        self._queue.put((epoch, sorted(outputs), delete))

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            epoch, outputs, delete = item
            try:
                if self._error is not None:
                    pass
                elif epoch is None:
                    self.sink.write_ahead(outputs)
                else:
                    count = self.sink.publish_epoch(epoch, outputs)
                    log.info("job %s: epoch %d committed (%d records)", self.job_id, epoch, count)
                    self.published_through = max(self.published_through, epoch)
                    if delete:
                        delete_files(outputs)
            except BaseException as exc:  # kept for the loop: it fails the job loudly
                self._error = exc
                self._wake()
            finally:
                self._queue.task_done()

    def check(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"committing a sink epoch failed: {self._error}") from self._error

    def drain(self) -> None:
        """Waits until every submitted epoch is committed."""
        self._queue.join()
        self.check()

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(60)
