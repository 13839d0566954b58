"""Resident tasks: on a local master, the agent's work runs in long-running Spark tasks, one per
task slot, instead of a Spark job per round.

A Spark job costs the driver's JVM about 31 ms of CPU, each of its tasks about 12 ms of a Python
worker's (its command unpickled, PySpark's setup of a task), and 40-60 ms of wall time pass from
its submission to its tasks running (docs/jobs.md, "Where the time goes"). A live job runs
rounds back to back, several a second, each a Spark job: that was a third of a core and a
fifth of every round's time, whatever the round carried. Spark's continuous processing
(``Trigger.Continuous``) keeps long-running tasks for the same reason. Here:

- `ResidentWorkers.start` submits one Spark job with a task per slot, in the scheduler pool
  `RESIDENT_POOL`. Each task (`serve`) imports what tasks need (`preload`: it is the warm-up),
  connects to the agent's Unix socket (in a directory only this user can enter, with a token
  the agent made) and from then on runs what the agent sends it, one task at a time, until the
  socket closes.
- `ResidentWorkers.run` queues a call's tasks and waits for their results, as a Spark job's
  ``collect`` does. A free worker takes the next task of the pool running the fewest tasks
  (ties: the pool whose name sorts first), FIFO within a pool: what spark_pools.xml has Spark's
  FAIR scheduler do between the rounds, the sink, recovery and savepoint folds (`next_pool`).
- A task's exception fails its call with the task's traceback (`ResidentTaskError`), as a failed
  Spark job raises the Python traceback; the call returns once none of its tasks runs any more.
  A worker that dies (killed, crashed) ends the Spark job, which fails every call in flight or
  queued (`broken`); `cancel` (a failed attempt's work still running) cancels the job, and
  Spark kills the workers' processes as for any cancelled job. The next call then starts a new
  job (`SparkJobs`), on the workers PySpark's daemon keeps or on new ones.

Local masters only: the socket is a local one, so what a task carries (Kafka client properties,
secrets among them) never leaves the machine. On a cluster every round is a Spark job.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import pickle
import re
import secrets
import shutil
import socket
import struct
import tempfile
import threading
import time
import traceback
import uuid
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from sparkpoint.common.sockets import receive_exactly

log = logging.getLogger(__name__)

RESIDENT_POOL = "resident"
"""The resident job's scheduler pool (spark_pools.xml)."""

SETTING = "spark.sparkpoint.residentTasks"
"""``--conf spark.sparkpoint.residentTasks=false``: a Spark job per round on a local master too."""

START_TIMEOUT_S = 120.0
"""How long the resident tasks may take to connect (a first start imports pandas, pyarrow and
confluent-kafka in every worker; Spark may also be finishing a cancelled job's tasks)."""

WORKS_KEPT = 16
"""Work functions a worker keeps unpickled (the rounds', the sink's, ...): each is sent to a
worker once, not with every task. The agent mirrors each worker's choice of which to keep."""

_LENGTH = struct.Struct("!Q")


class ResidentTaskError(RuntimeError):
    """A task failed in a resident worker; the message ends with its traceback."""


def local_slots(master: str, task_cpus: int = 1) -> int | None:
    """The task slots of a local master (``local``, ``local[N]``, ``local[*]``, ``local[N,F]``,
    ``local-cluster[W,C,M]``); None for any other master."""
    cores = os.cpu_count() or 1
    if master == "local":
        slots = 1
    elif match := re.fullmatch(r"local\[(\*|\d+)(?:,\s*\d+)?\]", master):
        slots = cores if match.group(1) == "*" else int(match.group(1))
    elif match := re.fullmatch(r"local-cluster\[\s*(\d+)\s*,\s*(\d+)\s*,\s*\d+\s*\]", master):
        slots = int(match.group(1)) * int(match.group(2))
    else:
        return None
    return max(1, slots // max(1, task_cpus))


def next_pool(queued: Mapping[str, int], running: Mapping[str, int]) -> str | None:
    """The pool whose task a free worker takes: among those with tasks queued, the one running
    the fewest, ties to the name that sorts first (Spark's FAIR comparison below every pool's
    minimum share, as spark_pools.xml sets them)."""
    waiting = [pool for pool, count in queued.items() if count]
    return min(waiting, key=lambda pool: (running.get(pool, 0), pool), default=None)


# --- frames ------------------------------------------------------------------------------------


def send(sock: socket.socket, payload: bytes) -> None:
    sock.sendall(_LENGTH.pack(len(payload)) + payload)


def receive(sock: socket.socket) -> bytes | None:
    """The next frame, or None when the other end closed between frames."""
    header = receive_exactly(sock, _LENGTH.size)
    if not header:
        return None
    if len(header) < _LENGTH.size:
        raise EOFError("the other end closed in the middle of a frame")
    (size,) = _LENGTH.unpack(header)
    body = receive_exactly(sock, size)
    if len(body) < size:
        raise EOFError("the other end closed in the middle of a frame")
    return body


class KeptWorks:
    """The work functions one worker keeps, by digest, least recently used first out: the
    worker keeps them, the agent keeps the same digests to know which to send (both see the
    same digests in the same order)."""

    def __init__(self) -> None:
        self.kept: OrderedDict[bytes, Any] = OrderedDict()

    def has(self, digest: bytes) -> bool:
        return digest in self.kept

    def keep(self, digest: bytes, work: Any = None) -> None:
        if digest in self.kept:
            self.kept.move_to_end(digest)
            return
        self.kept[digest] = work
        if len(self.kept) > WORKS_KEPT:
            self.kept.popitem(last=False)


# --- the worker side ---------------------------------------------------------------------------


def serve(address: str, token: bytes, slot: int) -> int:
    """A resident task's body: the warm-up's imports, then the agent's tasks as they come, until
    the agent closes the socket; returns how many tasks it ran."""
    from pyspark import cloudpickle

    from sparkpoint.agent.spark.preload import preload
    from sparkpoint.agent.spark.worker_gc import in_task

    preload()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(address)
    send(sock, pickle.dumps((token, slot, os.getpid())))
    works = KeptWorks()
    ran = 0
    with sock:
        while (frame := receive(sock)) is not None:
            digest, work, task = pickle.loads(frame)
            if work is not None:
                try:
                    works.keep(digest, cloudpickle.loads(work))
                except Exception:
                    works.keep(digest, partial(_unloadable, traceback.format_exc()))
            works.keep(digest)
            try:
                result = in_task(works.kept[digest], pickle.loads(task))
                reply = (True, cloudpickle.dumps(result))  # type: ignore[no-untyped-call]
            except Exception:
                reply = (False, traceback.format_exc())
            send(sock, pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL))
            ran += 1
    return ran


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _unloadable(why: str, _: object) -> None:
    raise RuntimeError(f"the task's function could not be unpickled in the worker:\n{why}")


# --- the agent side ----------------------------------------------------------------------------


@dataclass(eq=False)
class _Call:
    pool: str
    results: list[Any]
    left: int
    """Tasks not yet finished (run, failed or dropped)."""
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None
    sent: int = 0
    received: int = 0


@dataclass(eq=False)
class _Item:
    call: _Call
    index: int
    digest: bytes
    work: bytes
    task: bytes
    finished: bool = False


@dataclass(eq=False)
class _Worker:
    slot: int
    pid: int
    sock: socket.socket
    works: KeptWorks = field(default_factory=KeptWorks)
    item: _Item | None = None


Traffic = Callable[[int, int], None]
"""Told of each call's bytes to the tasks and back (`DriverTraffic.add_call`)."""


class ResidentWorkers:
    """The resident job of one SparkContext and the workers its tasks connected."""

    def __init__(self, sc: Any, slots: int, traffic: Traffic | None = None) -> None:
        self.sc = sc
        self.slots = slots
        self.traffic = traffic
        self.group = f"sparkpoint-resident-{uuid.uuid4().hex[:12]}"
        self._cond = threading.Condition()
        self._queues: dict[str, deque[_Item]] = {}
        self._running: Counter[str] = Counter()
        self._workers: list[_Worker] = []
        self._broken: str | None = None
        """Why the workers are gone (the job ended, a worker died, a cancel, a close)."""
        self._ended = threading.Event()
        """The resident Spark job returned or failed."""
        self._dir = tempfile.mkdtemp(prefix="sparkpoint-resident-")  # only this user enters
        self.address = os.path.join(self._dir, "socket")
        self._token = secrets.token_bytes(16)
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(self.address)
        self._server.listen(slots)

    @property
    def broken(self) -> str | None:
        return self._broken

    @property
    def busy(self) -> bool:
        """A task runs or waits."""
        with self._cond:
            return any(self._queues.values()) or any(w.item is not None for w in self._workers)

    def start(self) -> None:
        """Submits the resident job and returns once every task connected (the warm-up)."""
        threading.Thread(target=self._job, name="resident-job", daemon=True).start()
        try:
            self._accept()
        except BaseException:
            self.cancel("the resident tasks did not start")
            raise
        finally:  # the connections stay; the socket's name is no longer needed
            self._server.close()
            shutil.rmtree(self._dir, ignore_errors=True)

    def run(
        self, pool: str, tasks: list[Any], work: Callable[[Any], Any],
        queued: Callable[[], None] | None = None,
    ) -> list[Any]:  # fmt: skip
        """``work`` over ``tasks``, each a task of a resident worker; the results in order.
        ``queued``: called once the tasks wait for workers (what comes after them is behind)."""
        from pyspark import cloudpickle

        if not tasks:
            return []
        work_bytes = cloudpickle.dumps(work)  # type: ignore[no-untyped-call]
        digest = hashlib.blake2b(work_bytes, digest_size=16).digest()
        payloads = [cloudpickle.dumps(task) for task in tasks]  # type: ignore[no-untyped-call]
        call = _Call(pool, [None] * len(tasks), len(tasks))
        with self._cond:
            if self._broken is not None:
                raise RuntimeError(f"resident tasks unavailable: {self._broken}")
            queue = self._queues.setdefault(pool, deque())
            queue.extend(_Item(call, i, digest, work_bytes, p) for i, p in enumerate(payloads))
            self._cond.notify_all()
        if queued is not None:
            queued()
        call.done.wait()
        if self.traffic is not None:
            self.traffic(call.sent, call.received)
        if call.error is not None:
            raise call.error
        return call.results

    def cancel(self, why: str = "cancelled") -> None:
        """Ends the resident job now: what runs and waits fails, and Spark kills the workers'
        processes (a failed attempt's tasks, which must not go on writing)."""
        self._break(why)
        with contextlib.suppress(Exception):
            self.sc.cancelJobGroup(self.group)

    def close(self, wait_s: float = 5.0) -> None:
        """Lets the workers go (their tasks end, the job completes and the slots are free);
        cancels the job if it has not ended within ``wait_s``."""
        self._break("closed")
        if not self._ended.wait(wait_s):
            with contextlib.suppress(Exception):
                self.sc.cancelJobGroup(self.group)

    # --- inside ----------------------------------------------------------------------------

    def _job(self) -> None:
        sc = self.sc
        why = "the resident tasks ended"
        try:
            sc.setLocalProperty("spark.scheduler.pool", RESIDENT_POOL)
            sc.setJobGroup(self.group, "resident tasks", interruptOnCancel=True)
            serving = partial(serve, self.address, self._token)
            sc.parallelize(range(self.slots), self.slots).map(serving).collect()
        except BaseException as exc:
            why = f"the resident tasks failed: {first_line(exc)}"
        finally:
            self._break(why)
            self._ended.set()

    def _accept(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        self._server.settimeout(0.1)
        while len(self._workers) < self.slots:
            if self._broken is not None:
                raise RuntimeError(f"resident tasks did not start: {self._broken}")
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{len(self._workers)} of {self.slots} resident tasks connected within "
                    f"{START_TIMEOUT_S:.0f} s"
                )
            try:
                conn, _ = self._server.accept()
            except TimeoutError:
                continue
            try:
                conn.settimeout(START_TIMEOUT_S)
                hello = receive(conn)
                token, slot, pid = pickle.loads(hello) if hello else (None, -1, 0)
            except (OSError, EOFError, pickle.UnpicklingError, ValueError):
                token, slot, pid = None, -1, 0
            if token != self._token:
                log.warning("a connection to the resident tasks' socket without the token")
                conn.close()
                continue
            conn.settimeout(None)
            worker = _Worker(slot, pid, conn)
            with self._cond:
                self._workers.append(worker)
            threading.Thread(
                target=self._drive, args=(worker,), name=f"resident-{slot}", daemon=True
            ).start()

    def _drive(self, worker: _Worker) -> None:
        """One worker's thread: takes the next task, sends it, waits for its result."""
        while (item := self._take(worker)) is not None:
            first = not worker.works.has(item.digest)
            worker.works.keep(item.digest)
            frame = pickle.dumps(
                (item.digest, item.work if first else None, item.task),
                protocol=pickle.HIGHEST_PROTOCOL,
            )
            try:
                send(worker.sock, frame)
                reply = receive(worker.sock)
                if reply is None:
                    raise EOFError("the worker closed its socket")
            except (OSError, EOFError) as exc:
                self._break(f"resident worker {worker.slot} (pid {worker.pid}) is gone: {exc}")
                break
            self._finish(worker, item, pickle.loads(reply), len(frame), len(reply))
        worker.sock.close()

    def _take(self, worker: _Worker) -> _Item | None:
        with self._cond:
            while self._broken is None:
                queued = {pool: len(queue) for pool, queue in self._queues.items()}
                pool = next_pool(queued, self._running)
                if pool is not None:
                    item = self._queues[pool].popleft()
                    self._running[pool] += 1
                    worker.item = item
                    return item
                self._cond.wait()
            return None

    def _finish(
        self, worker: _Worker, item: _Item, reply: tuple[bool, Any], sent: int, received: int
    ) -> None:
        from pyspark import cloudpickle

        ok, payload = reply
        result = cloudpickle.loads(payload) if ok else None
        with self._cond:
            if item.finished:  # failed meanwhile with the workers (`_break`)
                return
            worker.item = None
            self._running[item.call.pool] -= 1
            item.call.sent += sent
            item.call.received += received
            if ok:
                item.call.results[item.index] = result
                self._settle(item, None)
            else:
                self._settle(
                    item, ResidentTaskError(f"a task in a resident worker failed:\n{payload}")
                )
                for other in [
                    i for i in self._queues.get(item.call.pool, ()) if i.call is item.call
                ]:
                    self._queues[item.call.pool].remove(other)
                    self._settle(other, None)  # a failed call's other tasks do not run
            self._cond.notify_all()

    def _settle(self, item: _Item, error: BaseException | None) -> None:
        """``item`` finished (with ``error``, the first of its call's); under the lock."""
        if item.finished:
            return
        item.finished = True
        call = item.call
        if error is not None and call.error is None:
            call.error = error
        call.left -= 1
        if not call.left:
            call.done.set()

    def _break(self, why: str) -> None:
        """The workers are gone or let go: every task queued or running fails with ``why``."""
        with self._cond:
            if self._broken is None:
                self._broken = why
                if why not in ("closed",):
                    log.info("resident tasks: %s", why)
            error = RuntimeError(f"resident tasks unavailable: {self._broken}")
            for queue in self._queues.values():
                for item in queue:
                    self._settle(item, error)
                queue.clear()
            for worker in self._workers:
                if worker.item is not None:
                    self._running[worker.item.call.pool] -= 1
                    self._settle(worker.item, error)
                    worker.item = None
            workers = list(self._workers)
            self._cond.notify_all()
        for worker in workers:  # wakes the threads waiting for a reply, and ends the tasks
            with contextlib.suppress(OSError):
                worker.sock.shutdown(socket.SHUT_RDWR)
