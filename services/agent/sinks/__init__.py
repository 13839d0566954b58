"""Sinks: where stage 2's output goes. Stage 2 stages each round's output as an Arrow file; a
sink either publishes it right away (at-least-once) or when the checkpoint of its epoch completes
(exactly-once), idempotently, so a restore can publish a completed epoch again."""

from __future__ import annotations

import logging
import queue
import threading
from typing import Protocol

import pandas as pd

from services.agent.stages import from_ipc
from services.agent.state import delete_files

log = logging.getLogger(__name__)


class SinkWriter(Protocol):
    exactly_once: bool

    def publish_epoch(self, epoch: int, outputs: list[str]) -> int:
        """Makes epoch ``epoch``'s staged output visible (exactly-once: atomically, once)."""
        ...

    def write_now(self, outputs: list[str]) -> int:
        """At-least-once: makes the output visible at once."""
        ...

    def published_epoch(self) -> int:
        """The newest epoch already visible (0: none); epochs are published in order."""
        ...

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
        self._queue: queue.Queue[tuple[int, list[str]] | None] = queue.Queue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"commit-{job_id}", daemon=True)
        self._thread.start()

    def submit(self, epoch: int, outputs: list[str]) -> None:
        self._queue.put((epoch, sorted(outputs)))

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            epoch, outputs = item
            try:
                if self._error is None:
                    count = self.sink.publish_epoch(epoch, outputs)
                    log.info("job %s: epoch %d committed (%d records)", self.job_id, epoch, count)
                    delete_files(outputs)
            except BaseException as exc:  # kept for the loop: it fails the job loudly
                self._error = exc
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
