"""sparkpoint.testing's `SparkpointContainer`: the coordinator's image built from
deploy/Dockerfile, run on the session's broker, answering its REST API, killed and started again
on the same storage (what ``kill_coordinator`` does with it). Needs a Docker engine: skipped,
saying why, where none answers. The fallback (the coordinator as a process) runs everywhere: the
unit tests choose it without Docker, and tests/user_project runs on it."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkpoint.testing.cluster import docker_answers
from sparkpoint.testing.containers import SparkpointContainer
from tests.conftest import KafkaUnderTest

ROOT = Path(__file__).resolve().parents[2]


def test_the_coordinator_container_answers_and_survives_a_kill(
    kafka: KafkaUnderTest, tmp_path: Path
) -> None:
    if not docker_answers():
        pytest.skip(
            "no Docker engine answers here: SparkpointContainer builds deploy/Dockerfile and runs "
            "the coordinator in it; without Docker the fixtures use a coordinator process "
            "(tests/unit/test_testing_plugin.py, tests/user_project)"
        )
    container = SparkpointContainer(kafka.bootstrap, tmp_path, build_context=ROOT).start()
    try:
        assert "jobs" in container.get("/jobs/overview")
        container.kill()
        assert container.get("/jobs/overview") is None
        container.start()
        assert container.get("/jobs/overview") is not None
    finally:
        container.stop()
