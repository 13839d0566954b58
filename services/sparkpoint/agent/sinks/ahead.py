"""The exactly-once Kafka sink writing ahead (Flink's KafkaWriter: records go into the open
transaction as they are produced, and a completed checkpoint only commits it).

Without it an epoch's records are produced when its checkpoint completes, by a Spark task that
first waits for a slot: on live input that put 0.3-0.6 s between a completion and the output
being visible (measured at 10,000 records/s on local[2]), longer than the checkpoint itself.

With it, a process of the agent's own (`AheadPublisher`, one per sink writer) holds the sink's
transactional producer and its open transaction:

- ``produce``: staged files of the oldest epoch not yet handed to the committer go into the open
  transaction as soon as stage 2 staged them (`EpochLedger` decides which, so a transaction
  never holds output of an epoch whose checkpoint has not completed with the epoch it commits);
- ``commit``: the epoch's remaining files, its `SinkEpochPublished` marker, the commit: a few
  milliseconds after the completion;
- ``reset``: the open transaction aborted and the producer dropped (a new attempt of the job
  restores; its staged output is published again from the checkpoint).

The process reads the staged files where stage 2 wrote them and produces them: records never
pass through the driver's process. It is used with a local master only, where the executors run
on the driver's machine anyway; on a cluster an epoch is still published by a Spark task.

Processes come from a fork server (`ForkServer`) that imported the sink's modules once per agent
process, so a new writer's process starts in milliseconds. The process ends when the agent's end
of its socket closes (the agent exited or was killed), and so does the fork server: an open
transaction is then aborted by the next producer of the transactional id, as a killed agent's
is.
"""

from __future__ import annotations

import logging
import os
import pickle
import signal
import socket
import struct
import subprocess
import sys
import threading
import uuid
from dataclasses import dataclass, field, replace
from multiprocessing.connection import Connection
from typing import Any

from confluent_kafka import Producer

from sparkpoint.agent.sinks import outputs_digest, read_outputs
from sparkpoint.agent.sinks.kafka import (
    Publish,
    commit_epoch,
    marker_codec,
    queue_frame,
    sink_producer,
)
from sparkpoint.common.sockets import receive_exactly

log = logging.getLogger(__name__)

START_TIMEOUT_S = 60.0
"""How long a new process may take to answer (the fork server's first start imports)."""

_HEADER = struct.Struct("!I")


# --- the fork server ------------------------------------------------------------------------------


class ForkServer:
    """``python -m sparkpoint.agent.sinks.ahead``: one per agent process, started on first use. It
    imports this module (pandas, pyarrow, confluent-kafka: 0.9 s here) once; each writer's
    process is then a fork of it (milliseconds). A request is a socket's end (passed as a file
    descriptor) and the pickled `Publish`; the fork serves that socket. Not multiprocessing's
    fork server: that one runs the parent's main script again in every child (a script without
    a main guard would start another job there)."""

    _lock = threading.Lock()
    _running: ForkServer | None = None

    def __init__(self) -> None:
        ours, theirs = socket.socketpair()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "sparkpoint.agent.sinks.ahead", str(theirs.fileno())],
            pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL,
        )
        theirs.close()
        self.control = ours

    @classmethod
    def fork(cls, task: Publish) -> tuple[Connection, int]:
        """A new process serving ``task``'s sink: the agent's end of its socket, and its pid."""
        with cls._lock:
            server = cls._running
            if server is None or server.process.poll() is not None:
                server = cls._running = ForkServer()
            ours, theirs = socket.socketpair()
            payload = pickle.dumps(task)
            try:
                socket.send_fds(server.control, [_HEADER.pack(len(payload))], [theirs.fileno()])
                server.control.sendall(payload)
                server.control.settimeout(START_TIMEOUT_S)
                (pid,) = _HEADER.unpack(_receive(server.control, _HEADER.size))
            finally:
                theirs.close()
            return Connection(ours.detach()), pid


def _receive(sock: socket.socket, size: int) -> bytes:
    data = receive_exactly(sock, size)
    if len(data) < size:
        raise EOFError("the sink's fork server ended")
    return data


def serve_forks(control: socket.socket) -> None:
    """The fork server's loop, until the agent's end of ``control`` closes."""
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # forks are reaped by the kernel
    marker_codec()  # compiled once here (0.09 s of CPU), not in every fork's first commit
    while True:
        try:
            header, fds, _, _ = socket.recv_fds(control, _HEADER.size, 1)
        except OSError:
            return
        if not header or not fds:
            return  # the agent is gone
        header += _receive(control, _HEADER.size - len(header))
        task = pickle.loads(_receive(control, _HEADER.unpack(header)[0]))
        pid = os.fork()
        if pid == 0:
            control.close()
            code = 0
            try:
                serve(Connection(fds[0]), task)
            except BaseException:
                code = 1
            finally:
                os._exit(code)
        os.close(fds[0])
        control.sendall(_HEADER.pack(pid))


# --- the process ----------------------------------------------------------------------------------


@dataclass
class OpenTransaction:
    """The publisher process's producer and its open transaction."""

    task: Publish
    producer: Producer | None = None
    token: str | None = None
    """The open transaction's token (`TRANSACTION_HEADER`); None: no transaction open."""
    produced: set[str] = field(default_factory=set)
    """Staged files whose records the open transaction holds."""
    count: int = 0
    failed: str | None = None
    """Why writing ahead failed: the next commit reports it and fails."""

    def produce(self, paths: list[str], halfway: bool = False) -> None:
        if self.failed is not None:
            return
        try:
            producer = self._open()
            task = replace(self.task, crash_halfway=halfway)
            self.count += queue_frame(producer, task, read_outputs(paths), self.token)
            self.produced.update(paths)
        except Exception as exc:
            self.failed = f"writing {len(paths)} staged files ahead failed: {exc!r}"

    def commit(self, epoch: int, outputs: list[str], crash: bool) -> int:
        """Epoch ``epoch`` (``outputs``: every file of it, some already produced) committed with
        its marker; returns its records. ``crash``: the crash point ``mid-publish``: records
        delivered, the transaction left open."""
        beyond = self.produced - set(outputs)
        if beyond and self.failed is None:
            self.failed = (
                f"the open transaction holds {len(beyond)} staged files that are not epoch "
                f"{epoch}'s (e.g. {sorted(beyond)[0]}): refusing to commit them with it"
            )
        self.produce([o for o in outputs if o not in self.produced], halfway=crash)
        if self.failed is not None:
            failed = self.failed
            self.reset()
            raise RuntimeError(failed)
        producer, token, count = self._open(), self.token, self.count
        assert token is not None
        if crash:
            producer.flush(30)
            return count
        try:
            commit_epoch(producer, self.task, epoch, count, outputs_digest(outputs), token)
        except Exception:
            self.reset()
            raise
        self.token, self.produced, self.count = None, set(), 0
        return count

    def _open(self) -> Producer:
        """The producer, with a transaction open: a new producer's init_transactions fences
        (aborts) what a predecessor of the transactional id left open."""
        if self.producer is None:
            task = self.task
            self.producer = sink_producer(
                task.sink, task.bootstrap, task.job_id, task.transactional_id, task.client
            )
        if self.token is None:
            self.producer.begin_transaction()
            self.token = uuid.uuid4().hex
        return self.producer

    def reset(self) -> None:
        """The open transaction aborted, the producer dropped (the next one fences anew)."""
        producer, self.producer = self.producer, None
        if producer is not None and self.token is not None:
            try:
                producer.abort_transaction(30)
            except Exception as exc:  # fenced or gone: its successor's init aborts it
                log.warning("aborting the sink's open transaction: %s", exc)
        self.token, self.produced, self.count, self.failed = None, set(), 0, None


def serve(conn: Connection, task: Publish) -> None:
    """The publisher process: requests in order until the agent's end of the pipe closes."""
    transaction = OpenTransaction(task)
    conn.send(("ready", 0))
    while True:
        try:
            request = conn.recv()
        except (EOFError, OSError):
            return  # the agent is gone: the open transaction stays for a successor to abort
        kind = request[0]
        if kind == "produce":
            transaction.produce(request[1])
            continue
        try:
            if kind == "commit":
                conn.send(("ok", transaction.commit(request[1], request[2], request[3])))
            elif kind == "reset":
                transaction.reset()
                conn.send(("ok", 0))
            elif kind == "close":
                transaction.reset()
                conn.send(("ok", 0))
                return
        except Exception as exc:
            conn.send(("error", f"{type(exc).__name__}: {exc}"))


# --- the agent's side ----------------------------------------------------------------------------


class AheadPublisher:
    """The agent's end of a publisher process: requests are sent in order; a commit waits for
    its answer. Thread-safe (the committer's thread commits, the agent's loop resets)."""

    def __init__(self, task: Publish) -> None:
        self.task = task
        self.job_id = task.job_id
        self._conn: Connection | None = None
        self.pid: int | None = None
        self._lock = threading.Lock()
        self._start_lock = threading.Lock()
        self._starting = threading.Thread(
            target=self._start, name=f"start-sink-{task.job_id}", daemon=True
        )

    def start(self) -> None:
        """Starts the process on a thread (the fork server's first start imports the sink's
        modules, about a second: the agent calls this once Spark has started, so the two do not
        compete); the first request waits for it, and starts it if nobody did."""
        with self._start_lock:
            if self._starting.ident is None:
                self._starting.start()

    def started(self) -> bool:
        """Whether the process runs and answered (waits for its start)."""
        self.start()
        self._starting.join()
        return self._conn is not None

    def produce(self, paths: list[str]) -> None:
        with self._lock:
            self._send(("produce", paths))

    def commit(self, epoch: int, outputs: list[str], crash: bool = False) -> int:
        return self._ask(("commit", epoch, outputs, crash))

    def reset(self) -> None:
        self._ask(("reset",))

    def close(self) -> None:
        if not self.started():
            return
        try:
            self._ask(("close",))
        except RuntimeError as exc:
            log.warning("job %s: closing the sink's publisher: %s", self.job_id, exc)
        assert self._conn is not None
        self._conn.close()

    def _start(self) -> None:
        try:
            conn, pid = ForkServer.fork(self.task)
            if conn.poll(START_TIMEOUT_S) and conn.recv()[0] == "ready":
                self._conn, self.pid = conn, pid
            else:
                conn.close()
                log.warning("job %s: the sink's publisher process did not answer", self.job_id)
        except Exception as exc:
            log.warning("job %s: the sink's publisher process did not start: %s", self.job_id, exc)

    def _ask(self, request: tuple[Any, ...]) -> int:
        with self._lock:
            conn = self._send(request)
            try:
                answer, value = conn.recv()
            except (EOFError, OSError) as exc:
                raise self._gone() from exc
        if answer != "ok":
            raise RuntimeError(f"the sink's publisher: {value}")
        return int(value)

    def _send(self, request: tuple[Any, ...]) -> Connection:
        if not self.started() or self._conn is None:
            raise RuntimeError("the sink's publisher process did not start (see the log)")
        try:
            self._conn.send(request)
        except (BrokenPipeError, OSError) as exc:
            raise self._gone() from exc
        return self._conn

    def _gone(self) -> RuntimeError:
        return RuntimeError(f"the sink's publisher process (pid {self.pid}) ended")


if __name__ == "__main__":
    serve_forks(socket.socket(fileno=int(sys.argv[1])))
