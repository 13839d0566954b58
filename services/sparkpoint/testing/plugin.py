"""sparkpoint's pytest plugin, registered through the ``pytest11`` entry point: installing
sparkpoint is enough. Fixtures:

- ``sparkpoint_kafka`` (session): a broker (`Kafka`): ``KAFKA_BOOTSTRAP_SERVERS`` if set, else
  Apache Kafka through testcontainers when a Docker engine answers, else the embedded broker;
- ``sparkpoint_coordinator`` (session): a coordinator process on it (`CoordinatorProcess`),
  checkpoints and savepoints under the session's temporary directory;
- ``run_job``: runs a job end to end and returns its committed output (`JobRunner.run`), with
  faults injected by name (`kill_agent`, `kill_coordinator`);
- ``keyed_harness``: a factory of `KeyedFunctionHarness` closed after the test.

Nothing here starts before a test asks for it; importing the plugin imports no Spark.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from sparkpoint.testing.cluster import CoordinatorProcess, JobRun, Kafka
    from sparkpoint.testing.harness import KeyedFunctionHarness


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "sparkpoint: a test that runs a sparkpoint job (broker, coordinator, Spark)"
    )


@pytest.fixture(scope="session")
def sparkpoint_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kafka]:
    """The session's broker."""
    from sparkpoint.testing.cluster import kafka_for_tests

    with kafka_for_tests(tmp_path_factory.mktemp("sparkpoint-broker")) as kafka:
        yield kafka


@pytest.fixture(scope="session")
def sparkpoint_coordinator(
    sparkpoint_kafka: Kafka, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[CoordinatorProcess]:
    """The session's coordinator, storage under a temporary directory: a process, or a
    `SparkpointContainer` with ``SPARKPOINT_TEST_CONTAINERS=1`` where Docker answers."""
    from sparkpoint.testing.containers import coordinator_for_tests

    coordinator = coordinator_for_tests(
        sparkpoint_kafka.bootstrap, tmp_path_factory.mktemp("sparkpoint-coordinator")
    ).start()
    try:
        yield coordinator
    finally:
        coordinator.stop()


@pytest.fixture
def run_job(
    sparkpoint_kafka: Kafka, sparkpoint_coordinator: CoordinatorProcess, tmp_path: Path
) -> Callable[..., JobRun]:
    """``run_job(job, input, faults=[...], parallelism=None, rate=None, until=None)``: see
    `sparkpoint.testing.cluster.JobRunner.run`."""
    from sparkpoint.testing.cluster import JobRunner

    return JobRunner(sparkpoint_kafka, sparkpoint_coordinator, tmp_path).run


@pytest.fixture
def keyed_harness() -> Iterator[Harnesses]:
    """``keyed_harness(function, key, parallelism=1, ...)``, ``keyed_harness.of_job(job)`` and
    ``keyed_harness.restore(snapshot, function, key, parallelism=...)``: `KeyedFunctionHarness`
    instances, closed after the test."""
    harnesses = Harnesses()
    yield harnesses
    harnesses.close()


class Harnesses:
    """Makes `KeyedFunctionHarness` instances and closes them all at the end of the test."""

    def __init__(self) -> None:
        self.made: list[KeyedFunctionHarness] = []

    def _keep(self, harness: KeyedFunctionHarness) -> KeyedFunctionHarness:
        self.made.append(harness)
        return harness

    def __call__(self, *args: Any, **kwargs: Any) -> KeyedFunctionHarness:
        from sparkpoint.testing.harness import KeyedFunctionHarness

        return self._keep(KeyedFunctionHarness(*args, **kwargs))

    def of_job(self, *args: Any, **kwargs: Any) -> KeyedFunctionHarness:
        from sparkpoint.testing.harness import KeyedFunctionHarness

        return self._keep(KeyedFunctionHarness.of_job(*args, **kwargs))

    def restore(self, *args: Any, **kwargs: Any) -> KeyedFunctionHarness:
        from sparkpoint.testing.harness import KeyedFunctionHarness

        return self._keep(KeyedFunctionHarness.restore(*args, **kwargs))

    def close(self) -> None:
        for harness in self.made:
            harness.close()
