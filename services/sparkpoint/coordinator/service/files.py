"""The coordinator's file work, off the event loop: writing each completed checkpoint's
``_metadata`` and discarding what retention let go.

A few threads take work from two queues. ``_metadata`` writes come first, because a checkpoint
completes only once its file is in place; discards run when no write is waiting. Each thread
takes every write queued at that moment and hands the outcomes back to the loop in one call, so
under load a thousand completions a second cost the loop a few dozen wake-ups, not a thousand
tasks and thread hand-offs.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass

from sparkpoint.common.storage import Storage

log = logging.getLogger(__name__)

THREADS = 4
"""Threads doing file work where a root is not on local disk: object stores answer in tens of
milliseconds, and four keep several requests in flight."""

LOCAL_THREADS = 1
"""Threads doing file work where every root is on local disk: a local write takes tens of
microseconds and one thread keeps up. More only contend for the interpreter lock and wake each
other: at 1,000 checkpoints a second four threads cost the coordinator 0.66-0.75 CPU s per 1,000
checkpoints where one costs 0.58-0.66 (runs taken turn about), and p99 rose with them. The
price: a write that arrives while the thread deletes a discarded checkpoint waits for that one
delete (writes still go first whenever the thread picks its next work)."""


def threads_for(storage: Storage) -> int:
    return LOCAL_THREADS if storage.local_only else THREADS


BATCH = 256
"""Writes one thread takes at once at most."""


@dataclass(frozen=True)
class Write:
    """Write ``data()`` to ``path`` atomically, then tell ``done`` on the loop (with the error,
    if it failed). ``data`` runs on the file thread: building the file is part of the work."""

    path: str
    data: Callable[[], bytes]
    done: Callable[[Exception | None], None]


@dataclass(frozen=True)
class Delete:
    files: tuple[str, ...]
    directory: str | None
    failed: Callable[[Exception], None]
    """Called on the file thread when the delete failed (it leaves garbage, nothing else)."""


class FileWork:
    def __init__(
        self,
        storage: Storage,
        post: Callable[[Callable[[], None]], None],
        start: bool = True,
    ) -> None:
        """``start``: the threads start at once; else with `start` (work queued meanwhile
        waits for them)."""
        self.storage = storage
        self._post = post
        self._writes: queue.SimpleQueue[Write] = queue.SimpleQueue()
        self._deletes: queue.SimpleQueue[Delete | None] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, name=f"sparkpoint-files-{i}", daemon=True)
            for i in range(threads_for(storage))
        ]
        if start:
            self.start()

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def write(self, work: Write) -> None:
        self._writes.put(work)
        self._deletes.put(None)  # wakes a thread waiting for deletes

    def delete(self, work: Delete) -> None:
        self._deletes.put(work)

    def close(self, timeout_s: float = 10.0) -> None:
        """Finishes what is queued, then stops the threads."""
        self._stop.set()
        for _ in self._threads:
            self._deletes.put(None)
        for thread in self._threads:
            thread.join(timeout_s)

    def _run(self) -> None:
        while True:
            writes = self._take_writes()
            if writes:
                self._do_writes(writes)
                continue
            work = self._deletes.get()
            if work is not None:
                self._do_delete(work)
            elif self._stop.is_set():  # close() queued one None per thread after all work
                self._do_writes(self._take_writes())
                return

    def _take_writes(self) -> list[Write]:
        taken: list[Write] = []
        while len(taken) < BATCH:
            try:
                taken.append(self._writes.get_nowait())
            except queue.Empty:
                break
        return taken

    def _do_writes(self, writes: list[Write]) -> None:
        if not writes:
            return
        outcomes: list[tuple[Write, Exception | None]] = []
        for work in writes:
            try:
                self.storage.write_atomic(work.path, work.data())
                outcomes.append((work, None))
            except Exception as exc:
                outcomes.append((work, exc))

        def report() -> None:
            for work, error in outcomes:
                try:
                    work.done(error)
                except Exception:
                    log.exception("handling the write of %s failed", work.path)

        self._post(report)

    def _do_delete(self, work: Delete) -> None:
        try:
            self.storage.delete(work.files, work.directory)
        except Exception as exc:
            work.failed(exc)
