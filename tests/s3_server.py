"""An S3-compatible server for tests and benchmarks: moto's, started as a process of its own on a
free port (`moto_server`, installed with the dev dependencies). Clients find it through the
standard AWS variables (``AWS_ENDPOINT_URL`` and test credentials), as s3fs, botocore and every
Spark executor started from the same environment do."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import httpx

from sparkpoint.common.broker import free_port

MOTO_SERVER = str(Path(sys.executable).parent / "moto_server")


@dataclass
class S3Server:
    process: subprocess.Popen[bytes]
    endpoint: str
    log: Path | None = None
    """The server's log: a line per request."""

    def gets(self, fragment: str, since: int = 0) -> int:
        """GET requests of keys containing ``fragment`` in the log from byte ``since`` on."""
        assert self.log is not None, "started without a log"
        with open(self.log, "rb") as source:
            source.seek(since)
            lines = source.read().decode(errors="replace").splitlines()
        return sum(1 for line in lines if "GET /" in line and fragment in line)

    def log_size(self) -> int:
        return self.log.stat().st_size if self.log is not None else 0

    def environment(self) -> dict[str, str]:
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": "sparkpoint-test",
            "AWS_SECRET_ACCESS_KEY": "sparkpoint-test",
            "AWS_DEFAULT_REGION": "us-east-1",
        }

    def bucket(self) -> str:
        """A new, empty bucket: its URL, ``s3://name``."""
        import s3fs

        name = f"sparkpoint-{uuid.uuid4().hex[:10]}"
        s3fs.S3FileSystem(skip_instance_cache=True).mkdir(name)
        return f"s3://{name}"

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(10)


def start_s3_server(log: Path | None = None) -> S3Server:
    port = free_port()
    out = open(log, "wb") if log else subprocess.DEVNULL  # noqa: SIM115
    process = subprocess.Popen(
        [MOTO_SERVER, "-H", "127.0.0.1", "-p", str(port)],
        stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            httpx.get(endpoint, timeout=1)
            return S3Server(process, endpoint, log)
        except httpx.HTTPError:
            if process.poll() is not None:
                break
            time.sleep(0.1)
    process.kill()
    raise RuntimeError(f"moto's S3 server did not start on {endpoint}")
