"""docker-compose.yml: Apache Kafka in KRaft mode with one-node settings, topic creation as a
one-shot service, one service per component. Validated by `docker-compose config` where the
command exists (Debian's docker-compose package), and read as YAML everywhere."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    loaded = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert isinstance(loaded, dict)
    return loaded


def test_docker_compose_validates_the_file() -> None:
    command = shutil.which("docker-compose")
    if command is None:
        pytest.skip("docker-compose is not installed (apt-get install docker-compose)")
    result = subprocess.run(
        [command, "config", "--quiet"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def test_kafka_runs_kraft_with_one_node_replication(compose: dict[str, Any]) -> None:
    env = compose["services"]["kafka"]["environment"]
    assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"
    assert env["KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR"] == 1
    assert env["KAFKA_TRANSACTION_STATE_LOG_MIN_ISR"] == 1
    assert env["KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR"] == 1


def test_topics_are_created_once_kafka_is_healthy(compose: dict[str, Any]) -> None:
    topics = compose["services"]["topics"]
    assert topics["command"][:3] == ["sparkpoint", "topics", "create"]
    assert topics["depends_on"]["kafka"]["condition"] == "service_healthy"
    assert topics["restart"] == "no"


def test_every_component_has_a_service(compose: dict[str, Any]) -> None:
    assert {"kafka", "topics", "coordinator", "history", "agent", "generator"} <= set(
        compose["services"]
    )


def test_the_coordinators_add_earlier_checkpoints_from_the_history_service(
    compose: dict[str, Any],
) -> None:
    history = compose["services"]["history"]
    assert history["command"][:2] == ["sparkpoint", "history"]
    port = history["command"][history["command"].index("--rest-port") + 1]
    coordinator = compose["services"]["coordinator"]["command"]
    assert coordinator[coordinator.index("--history-url") + 1] == f"http://history:{port}"


def test_a_schema_registry_serves_avro_schemas_from_kafka(compose: dict[str, Any]) -> None:
    registry = compose["services"]["schema-registry"]
    env = registry["environment"]
    assert env["SCHEMA_REGISTRY_KAFKASTORE_BOOTSTRAP_SERVERS"] == "PLAINTEXT://kafka:19092"
    assert env["SCHEMA_REGISTRY_KAFKASTORE_TOPIC_REPLICATION_FACTOR"] == 1
    assert registry["depends_on"]["kafka"]["condition"] == "service_healthy"


def test_storage_is_minio_for_every_component_and_the_coordinators_defaults(
    compose: dict[str, Any],
) -> None:
    services = compose["services"]
    minio = services["minio"]
    assert minio["command"][:2] == ["server", "/data"]
    assert "mc mb --ignore-existing local/sparkpoint" in services["bucket"]["command"][0]
    sparkpoint = [s for s in services.values() if s.get("image") == "sparkpoint:dev"]
    assert len(sparkpoint) >= 6
    for service in sparkpoint:
        environment = service["environment"]
        assert environment["AWS_ENDPOINT_URL"] == "http://minio:9000"
        assert environment["AWS_ACCESS_KEY_ID"] == minio["environment"]["MINIO_ROOT_USER"]
        assert environment["AWS_SECRET_ACCESS_KEY"] == minio["environment"]["MINIO_ROOT_PASSWORD"]
    defaults = yaml.safe_load((ROOT / "deploy" / "coordinator.yaml").read_text())
    assert defaults["execution.checkpointing.dir"].startswith("s3://sparkpoint/")
    assert defaults["execution.checkpointing.savepoint-dir"].startswith("s3://sparkpoint/")


def test_the_agent_runs_its_executors_on_the_spark_cluster_with_state_on_minio(
    compose: dict[str, Any],
) -> None:
    services = compose["services"]
    master = services["spark-master"]["command"]
    assert master[:2] == ["spark-class", "org.apache.spark.deploy.master.Master"]
    url = f"spark://{master[master.index('--host') + 1]}:{master[master.index('--port') + 1]}"
    worker = services["spark-worker"]["command"]
    assert worker[:2] == ["spark-class", "org.apache.spark.deploy.worker.Worker"]
    assert worker[-1] == url
    agent = services["agent"]["command"]
    assert agent[agent.index("--master") + 1] == url
    assert agent[agent.index("--checkpoint-dir") + 1] == "s3://sparkpoint/checkpoints"
    assert f"spark.driver.host={services['agent']['hostname']}" in agent


def test_two_coordinators_each_advertise_their_own_address(compose: dict[str, Any]) -> None:
    commands = [compose["services"][name]["command"] for name in ("coordinator", "coordinator-2")]
    advertised = [c[c.index("--advertised-rest-url") + 1] for c in commands]
    assert advertised == ["http://coordinator:8081", "http://coordinator-2:8081"]
