"""The history service as a process of its own (`sparkpoint history`), started, killed and
restarted as in production, on the current topic prefix."""

from __future__ import annotations

import os
import signal
import ssl
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from sparkpoint.common.broker import free_port

SPARKPOINT = str(Path(sys.executable).parent / "sparkpoint")


@dataclass
class HistoryProcess:
    bootstrap: str
    log_dir: Path
    group: str = field(default_factory=lambda: f"history-{uuid.uuid4().hex[:8]}")
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None
    starts: int = 0
    flags: tuple[str, ...] = ()
    """More of ``sparkpoint history``'s flags (``--rest-tls-cert`` makes `url` https)."""
    verify: ssl.SSLContext | bool = True
    """How this harness's own requests (`status`, `get`) check the service's certificate, and
    the client certificate they present under mutual TLS."""
    token: str | None = None
    """The bearer token this harness's `get` sends (a service with an access list)."""

    @property
    def url(self) -> str:
        scheme = "https" if "--rest-tls-cert" in self.flags else "http"
        return f"{scheme}://127.0.0.1:{self.port}"

    def start(self) -> HistoryProcess:
        self.starts += 1
        log = open(self.log_dir / f"history-{self.starts}.log", "wb")  # noqa: SIM115
        self.process = subprocess.Popen(
            [SPARKPOINT, "history", "--bootstrap", self.bootstrap, "--rest-port", str(self.port),
             "--group", self.group, *self.flags],
            env=dict(os.environ), stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        log.close()
        return self

    def status(self) -> dict[str, Any] | None:
        try:
            answer = httpx.get(f"{self.url}/history/status", timeout=2, verify=self.verify)
        except httpx.HTTPError:
            return None
        return answer.json() if answer.status_code == 200 else None

    def wait_ready(self, timeout_s: float = 60.0) -> float:
        """Seconds from now until the service answers ready."""
        began = time.monotonic()
        while time.monotonic() - began < timeout_s:
            if self.process is not None and self.process.poll() is not None:
                raise AssertionError(f"the history service exited: {self.log()}")
            status = self.status()
            if status is not None and status["ready"]:
                return time.monotonic() - began
            time.sleep(0.05)
        raise AssertionError(
            f"the history service was not ready within {timeout_s} s: {self.log()}"
        )

    def get(self, path: str, **params: object) -> httpx.Response:
        return httpx.get(
            f"{self.url}{path}",
            params=params,  # type: ignore[arg-type]
            timeout=10,
            verify=self.verify,
            headers={"Authorization": f"Bearer {self.token}"} if self.token else None,
        )

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()

    def log(self) -> str:
        return (self.log_dir / f"history-{self.starts}.log").read_text(errors="replace")[-3000:]
