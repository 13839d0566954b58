"""A coordinator service running in the test process, for integration tests of the coordinator
and of agents: the real service, REST and Kafka I/O, on the session's broker."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from sparkpoint.common.avro import EventCodec
from sparkpoint.common.broker import free_port
from sparkpoint.common.kafka import make_admin
from sparkpoint.common.settings import CheckpointConfig
from sparkpoint.common.topics import create_topics
from sparkpoint.coordinator.main import serve
from sparkpoint.coordinator.rest.flink_compat import WebUi
from sparkpoint.coordinator.service.instance import CoordinatorService, ServiceSettings
from tests.conftest import KafkaUnderTest
from tests.scripted_agent import ScriptedAgent


@dataclass
class Running:
    service: CoordinatorService
    url: str
    bootstrap: str
    root: Path

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=15)

    def agent(self, codec: EventCodec, **kwargs: object) -> ScriptedAgent:
        job_id = f"job-{uuid.uuid4().hex[:8]}"
        agent = ScriptedAgent(self.bootstrap, codec, job_id, state_dir=self.root, **kwargs)  # type: ignore[arg-type]
        agent.start()
        wait(lambda: job_id in self.service.jobs, what=f"{job_id} registered")
        return agent


def wait(condition: object, timeout_s: float = 30.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return
        time.sleep(0.02)
    raise AssertionError(f"{what} not met within {timeout_s} s")


def coordinator_in_thread(
    kafka: KafkaUnderTest,
    tmp_path: Path,
    web_ui: WebUi | None = None,
    history_url: str | None = None,
    storage: str | None = None,
) -> Iterator[Running]:
    """A coordinator service (REST on a free port) in a thread, on the current topic prefix;
    checkpoints and savepoints under ``storage`` (a URL) if given, else under ``tmp_path``."""
    create_topics(make_admin(kafka.bootstrap), partitions=2)
    base = storage or str(tmp_path)
    defaults = CheckpointConfig(
        checkpoint_dir=f"{base}/checkpoints", savepoint_dir=f"{base}/savepoints"
    )
    port = free_port()
    service = CoordinatorService(
        ServiceSettings(
            kafka.bootstrap,
            defaults,
            rest_url=f"http://127.0.0.1:{port}",
            history_url=history_url,
        )
    )
    thread = threading.Thread(
        target=lambda: asyncio.run(serve(service, "127.0.0.1", port, web_ui)), daemon=True
    )
    thread.start()
    try:
        wait(service.ready.is_set, what="partitions assigned")
        wait(lambda: _answers(f"http://127.0.0.1:{port}/jobs"), what="REST up")
        yield Running(service, f"http://127.0.0.1:{port}", kafka.bootstrap, tmp_path)
    finally:
        service.stop()
        thread.join(20)


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False
