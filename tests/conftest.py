"""The test harness: markers by folder, and one Kafka-protocol broker for the whole session.

Broker, in order of preference:
1. ``KAFKA_BOOTSTRAP_SERVERS`` if set (any existing cluster);
2. Apache Kafka in KRaft mode through testcontainers, when a Docker engine answers;
3. the embedded broker (tansu), started on a free port.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from sparkpoint.common.avro import EventCodec
from sparkpoint.common.broker import EmbeddedBroker
from sparkpoint.common.kafka import make_admin

if TYPE_CHECKING:
    from tests.running_history import HistoryProcess

log = logging.getLogger(__name__)

collect_ignore = ["user_project"]
"""A user's project with tests of its own: tests/e2e/test_wheel.py runs them where only the
built wheel is installed."""

FOLDER_MARKERS = {"unit": "unit", "integration": "integration", "e2e": "e2e"}

EMBEDDED = "embedded"
EXTERNAL = "external"
TESTCONTAINERS = "testcontainers"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        folder = Path(str(item.fspath)).parent.name
        marker = FOLDER_MARKERS.get(folder)
        if marker is not None:
            item.add_marker(getattr(pytest.mark, marker))


@dataclass(frozen=True)
class KafkaUnderTest:
    bootstrap: str
    kind: str
    embedded: EmbeddedBroker | None = None

    @property
    def is_embedded(self) -> bool:
        return self.kind == EMBEDDED


def _docker_answers() -> bool:
    try:
        import docker

        client = docker.from_env(timeout=3)
        client.ping()
        return True
    except Exception:
        return False


@pytest.fixture(scope="session")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaUnderTest]:
    external = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if external:
        yield KafkaUnderTest(external, EXTERNAL)
        return
    if _docker_answers():
        from testcontainers.community.kafka import KafkaContainer

        with KafkaContainer().with_kraft() as container:
            yield KafkaUnderTest(container.get_bootstrap_server(), TESTCONTAINERS)
        return
    log_file = tmp_path_factory.mktemp("broker") / "tansu.log"
    with EmbeddedBroker(log_file=log_file) as broker:
        yield KafkaUnderTest(broker.bootstrap, EMBEDDED, broker)


@pytest.fixture
def embedded_only(kafka: KafkaUnderTest) -> KafkaUnderTest:
    """For tests that pin a defect of the embedded broker: a real Kafka does not have it."""
    if not kafka.is_embedded:
        pytest.skip(f"pins an embedded-broker defect; the broker under test is {kafka.kind}")
    return kafka


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    """One Spark session for the whole run: a session takes 12-18 s to its first result here."""
    from sparkpoint.agent.spark.session import spark_session

    session = spark_session("sparkpoint-tests", master="local[2]")
    yield session
    session.stop()  # type: ignore[attr-defined]


@pytest.fixture(scope="session")
def codec() -> EventCodec:
    return EventCodec()


@pytest.fixture
def topic_prefix(monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh topic prefix, so each test has its own sparkpoint topics on the shared broker."""
    prefix = f"t{uuid.uuid4().hex[:10]}."
    monkeypatch.setenv("SPARKPOINT_TOPIC_PREFIX", prefix)
    return prefix


@pytest.fixture
def new_topic(kafka: KafkaUnderTest) -> Iterator[Callable[..., str]]:
    """Creates uniquely named topics: ``new_topic(partitions=1, **config) -> name``."""
    from confluent_kafka.admin import NewTopic

    admin = make_admin(kafka.bootstrap)

    def create(partitions: int = 1, **config: str) -> str:
        name = f"test-{uuid.uuid4().hex[:12]}"
        future = admin.create_topics([NewTopic(name, partitions, 1, config=config)])[name]
        future.result(timeout=30)
        return name

    yield create


@pytest.fixture
def history(kafka: KafkaUnderTest, topic_prefix: str, tmp_path: Path) -> Iterator[HistoryProcess]:
    """The history service as a process (not started), on the test's topics; killed after."""
    from sparkpoint.common.topics import create_topics
    from tests.running_history import HistoryProcess

    create_topics(make_admin(kafka.bootstrap), partitions=2)
    process = HistoryProcess(kafka.bootstrap, tmp_path)
    try:
        yield process
    finally:
        process.kill()
