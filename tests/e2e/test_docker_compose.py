"""docker-compose.yml: Apache Kafka in KRaft mode with one-node settings, topic creation as a
one-shot service, one service per component; docker-compose.secure.yml, its override with Kafka on
SASL_SSL and the coordinators' REST on https.

There is no Docker engine on the development machine or CI's: nothing here starts a container.
The files are validated by `docker-compose config` where the command exists (Debian's
docker-compose package; the tests that need it skip without it), the secured variant's properties
are read from the merged configuration that command prints, and the files it mounts are read
with sparkpoint's own parsers."""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509

from sparkpoint.agent.rounds.fetch import FetchTask
from sparkpoint.agent.sinks.kafka import Publish
from sparkpoint.common.dev_certs import make_dev_certs
from sparkpoint.common.kafka_config import KafkaConfigError, parse_properties
from sparkpoint.common.rest_security import RestSecurity
from sparkpoint.common.rest_security.access import Role, token_digest
from sparkpoint.common.rest_security.access_file import read_access_list

ROOT = Path(__file__).resolve().parents[2]
SECURE = ROOT / "docker-compose.secure.yml"
CLIENT_PROPERTIES = ROOT / "deploy" / "kafka-client.properties"
ACCESS_FILE = ROOT / "deploy" / "rest-access.yaml"

PASSWORD_VARIABLE = "SPARKPOINT_KAFKA_PASSWORD"
DEV_PASSWORD = "dev-only-change-me"
DEV_DEFAULT = "${SPARKPOINT_KAFKA_PASSWORD:-dev-only-change-me}"
"""The one way the compose files may spell the Kafka password: the variable, with the marked
dev-only default."""

DEV_TOKENS = {
    "dev-only-operator-token-change-me": Role.OPERATE,
    "dev-only-viewer-token-change-me": Role.READ,
}
"""The dev-only REST tokens deploy/README.md gives, and their roles."""


def docker_compose() -> str:
    command = shutil.which("docker-compose")
    if command is None:
        pytest.skip("docker-compose is not installed (apt-get install docker-compose)")
    return command


def merged_config(env_file: Path, environment: dict[str, str]) -> dict[str, Any]:
    """What `docker-compose -f docker-compose.yml -f docker-compose.secure.yml config` prints,
    with only ``environment`` (and no `.env` of the developer's) for the variables."""
    clean = {k: v for k, v in os.environ.items() if k != PASSWORD_VARIABLE} | environment
    result = subprocess.run(
        [docker_compose(), "--env-file", str(env_file), "-f", "docker-compose.yml",
         "-f", SECURE.name, "config"],
        cwd=ROOT, env=clean, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    loaded = yaml.safe_load(result.stdout)
    assert isinstance(loaded, dict)
    return loaded


@pytest.fixture(scope="module")
def no_env_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("compose") / "empty.env"
    path.write_text("")
    return path


@pytest.fixture(scope="module")
def secure(no_env_file: Path) -> dict[str, Any]:
    """The merged configuration with no password set: the dev-only default everywhere."""
    return merged_config(no_env_file, {})


def kafka_clients(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The services that run a `sparkpoint` command: each opens Kafka clients."""
    return {
        name: service
        for name, service in config["services"].items()
        if service.get("command", [None])[0] == "sparkpoint"
    }


def listeners(value: str) -> dict[str, str]:
    """``NAME://host:port,...`` as {NAME: host:port}."""
    return dict(entry.split("://", 1) for entry in value.split(","))


def mounts(service: dict[str, Any]) -> dict[str, str]:
    """A service's volumes as {target: source} (docker-compose 1 prints ``source:target:mode``,
    Compose 2 a mapping)."""
    found = {}
    for volume in service.get("volumes", []):
        if isinstance(volume, dict):
            found[volume["target"]] = volume["source"]
        else:
            source, target = volume.split(":")[:2]
            found[target] = source
    return found


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


# The secured variant: docker-compose.secure.yml over docker-compose.yml.


def test_docker_compose_validates_the_secure_override(no_env_file: Path) -> None:
    result = subprocess.run(
        [docker_compose(), "--env-file", str(no_env_file), "-f", "docker-compose.yml",
         "-f", SECURE.name, "config", "--quiet"],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr


def test_every_sparkpoint_process_reads_the_client_properties_and_the_ca(
    secure: dict[str, Any],
) -> None:
    clients = kafka_clients(secure)
    assert {"topics", "coordinator", "coordinator-2", "history", "agent", "generator"} <= set(
        clients
    )
    for name, service in clients.items():
        environment = service["environment"]
        where = mounts(service)
        config = environment["SPARKPOINT_KAFKA_CONFIG"]
        assert where[config] == str(CLIENT_PROPERTIES), name
        assert where["/certs"] == "certs", name
        assert environment[PASSWORD_VARIABLE] == DEV_PASSWORD, name
        assert service["depends_on"]["certs"]["condition"] == "service_completed_successfully"


def test_the_spark_worker_gets_the_ca_but_no_password_as_tasks_carry_their_properties(
    secure: dict[str, Any],
) -> None:
    # what a Spark task reads and writes Kafka with travels in the task itself
    assert "properties" in {f.name for f in dataclasses.fields(FetchTask)}
    assert "client" in {f.name for f in dataclasses.fields(Publish)}
    worker = secure["services"]["spark-worker"]
    assert mounts(worker)["/certs"] == "certs"
    assert "SPARKPOINT_KAFKA_CONFIG" not in worker["environment"]
    assert PASSWORD_VARIABLE not in worker["environment"]
    assert PASSWORD_VARIABLE not in secure["services"]["spark-master"]["environment"]


def test_kafka_serves_clients_on_sasl_ssl_and_plaintext_only_on_its_loopback(
    secure: dict[str, Any],
) -> None:
    env = secure["services"]["kafka"]["environment"]
    protocols = dict(p.split(":") for p in env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(","))
    bound = listeners(env["KAFKA_LISTENERS"])
    advertised = listeners(env["KAFKA_ADVERTISED_LISTENERS"])
    assert protocols["CLIENT"] == "SASL_SSL"
    assert protocols["EXTERNAL"] == "SASL_SSL"
    for name, protocol in protocols.items():
        if protocol == "PLAINTEXT":
            assert bound[name].startswith("127.0.0.1:"), name
    assert protocols[env["KAFKA_INTER_BROKER_LISTENER_NAME"]] == "PLAINTEXT"
    assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"] == f"1@{bound['CONTROLLER']}"
    # what the sparkpoint services are given is the SASL_SSL listener
    for name, service in kafka_clients(secure).items():
        command = service["command"]
        assert command[command.index("--bootstrap") + 1] == advertised["CLIENT"], name
        assert service["environment"]["KAFKA_BOOTSTRAP_SERVERS"] == advertised["CLIENT"], name
    # the image's start script wants JKS credential files for a listener spelt SSL://
    assert "SSL://" not in env["KAFKA_ADVERTISED_LISTENERS"]
    assert env["KAFKA_SASL_ENABLED_MECHANISMS"] == "PLAIN"
    for name, protocol in protocols.items():
        if protocol == "SASL_SSL":
            jaas = env[f"KAFKA_LISTENER_NAME_{name}_PLAIN_SASL_JAAS_CONFIG"]
            assert "PlainLoginModule required" in jaas
            assert f'user_sparkpoint="{DEV_PASSWORD}"' in jaas
    healthcheck = secure["services"]["kafka"]["healthcheck"]["test"][1]
    assert f"--bootstrap-server {advertised['BROKER']}" in healthcheck


def test_kafka_reads_pem_files_that_the_certs_service_writes(secure: dict[str, Any]) -> None:
    services = secure["services"]
    kafka = services["kafka"]
    env = kafka["environment"]
    assert env["KAFKA_SSL_KEYSTORE_TYPE"] == "PEM"
    assert env["KAFKA_SSL_KEYSTORE_LOCATION"] == "/certs/server.pem"
    assert env["KAFKA_SSL_TRUSTSTORE_TYPE"] == "PEM"
    assert env["KAFKA_SSL_TRUSTSTORE_LOCATION"] == "/certs/ca.pem"
    # an unencrypted key: a key password would make Kafka read it as encrypted
    assert "KAFKA_SSL_KEY_PASSWORD" not in env
    assert "KAFKA_SSL_KEYSTORE_PASSWORD" not in env
    assert mounts(kafka)["/certs"] == "certs"
    assert kafka["depends_on"]["certs"]["condition"] == "service_completed_successfully"
    certs = services["certs"]
    script = certs["command"][-1]
    assert "python -m sparkpoint.common.dev_certs /certs" in script
    # Kafka runs as appuser (uid 1000) in the apache/kafka image
    assert "chown 1000:1000 /certs/server.pem" in script
    assert certs["restart"] == "no"


def test_the_dev_certificate_names_every_host_reached_over_tls(
    secure: dict[str, Any], tmp_path: Path
) -> None:
    script = shlex.split(secure["services"]["certs"]["command"][-1])
    hosts = [script[i + 1] for i, word in enumerate(script) if word == "--host"]
    made = make_dev_certs(tmp_path, hosts, [])
    certificate = x509.load_pem_x509_certificates(made.server.read_bytes())[0]
    names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    dns = set(names.get_values_for_type(x509.DNSName))
    kafka = secure["services"]["kafka"]["environment"]
    protocols = dict(p.split(":") for p in kafka["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(","))
    for name, address in listeners(kafka["KAFKA_ADVERTISED_LISTENERS"]).items():
        if protocols[name] == "SASL_SSL":
            assert address.rsplit(":", 1)[0] in dns, name
    for name in ("coordinator", "coordinator-2"):
        command = secure["services"][name]["command"]
        url = command[command.index("--advertised-rest-url") + 1]
        assert url.split("://")[1].rsplit(":", 1)[0] in dns, name
    # the coordinators take server.pem as both their certificate and their key
    RestSecurity(certificate=made.server, private_key=made.server, access_file=ACCESS_FILE).check()


def test_the_client_properties_give_sasl_ssl_with_the_password_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(PASSWORD_VARIABLE, "from-the-environment")
    properties = parse_properties(CLIENT_PROPERTIES.read_text(), str(CLIENT_PROPERTIES))
    assert properties["security.protocol"] == "SASL_SSL"
    assert properties["sasl.mechanism"] == "PLAIN"
    assert properties["sasl.username"] == "sparkpoint"
    assert properties["sasl.password"] == "from-the-environment"
    assert properties["ssl.ca.location"] == "/certs/ca.pem"
    assert "sasl.password=${env:SPARKPOINT_KAFKA_PASSWORD}" in CLIENT_PROPERTIES.read_text()


def test_the_client_properties_cannot_be_read_without_the_password_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(PASSWORD_VARIABLE, raising=False)
    with pytest.raises(KafkaConfigError, match=PASSWORD_VARIABLE):
        parse_properties(CLIENT_PROPERTIES.read_text(), str(CLIENT_PROPERTIES))


def test_the_schema_registry_keeps_its_schemas_on_kafka_over_sasl_ssl(
    secure: dict[str, Any],
) -> None:
    registry = secure["services"]["schema-registry"]
    env = registry["environment"]
    advertised = listeners(secure["services"]["kafka"]["environment"]["KAFKA_ADVERTISED_LISTENERS"])
    assert (
        env["SCHEMA_REGISTRY_KAFKASTORE_BOOTSTRAP_SERVERS"] == f"SASL_SSL://{advertised['CLIENT']}"
    )
    assert env["SCHEMA_REGISTRY_KAFKASTORE_SECURITY_PROTOCOL"] == "SASL_SSL"
    assert env["SCHEMA_REGISTRY_KAFKASTORE_SASL_MECHANISM"] == "PLAIN"
    assert f'password="{DEV_PASSWORD}"' in env["SCHEMA_REGISTRY_KAFKASTORE_SASL_JAAS_CONFIG"]
    assert env["SCHEMA_REGISTRY_KAFKASTORE_SSL_TRUSTSTORE_TYPE"] == "PEM"
    assert env["SCHEMA_REGISTRY_KAFKASTORE_SSL_TRUSTSTORE_LOCATION"] == "/certs/ca.pem"
    assert mounts(registry)["/certs"] == "certs"


def test_the_kafka_password_comes_from_the_environment_everywhere(no_env_file: Path) -> None:
    password = "set-by-the-operator-4b1f"
    config = merged_config(no_env_file, {PASSWORD_VARIABLE: password})
    assert DEV_PASSWORD not in yaml.safe_dump(config)
    kafka = config["services"]["kafka"]["environment"]
    for listener in ("CLIENT", "EXTERNAL"):
        jaas = kafka[f"KAFKA_LISTENER_NAME_{listener}_PLAIN_SASL_JAAS_CONFIG"]
        assert f'user_sparkpoint="{password}"' in jaas
    registry = config["services"]["schema-registry"]["environment"]
    assert f'password="{password}"' in registry["SCHEMA_REGISTRY_KAFKASTORE_SASL_JAAS_CONFIG"]
    for name, service in kafka_clients(config).items():
        assert service["environment"][PASSWORD_VARIABLE] == password, name


def test_no_password_is_written_in_the_files_but_the_marked_dev_default() -> None:
    text = SECURE.read_text()
    code = "\n".join(
        line.split(" #")[0] for line in text.splitlines() if not line.lstrip().startswith("#")
    )
    spelled = re.findall(r'(?:password|user_\w+)="([^"]*)"', code)
    spelled += re.findall(rf"{PASSWORD_VARIABLE}: (\S+)", code)
    assert len(spelled) >= 4
    assert set(spelled) == {DEV_DEFAULT}
    assert code.count(DEV_PASSWORD) == code.count(DEV_DEFAULT)
    base = (ROOT / "docker-compose.yml").read_text()
    assert "sasl" not in base.lower() and PASSWORD_VARIABLE not in base
    properties = CLIENT_PROPERTIES.read_text()
    assert re.findall(r"^sasl\.password=(.*)$", properties, re.M) == [
        "${env:SPARKPOINT_KAFKA_PASSWORD}"
    ]


def test_the_coordinators_serve_https_and_want_a_token_from_the_access_list(
    secure: dict[str, Any],
) -> None:
    for name in ("coordinator", "coordinator-2"):
        service = secure["services"][name]
        command = service["command"]
        value = {
            flag: command[command.index(flag) + 1] for flag in command if flag.startswith("--")
        }
        assert value["--advertised-rest-url"] == f"https://{service['hostname']}:8081"
        assert value["--rest-tls-cert"] == value["--rest-tls-key"] == "/certs/server.pem"
        assert mounts(service)[value["--rest-access-file"]] == str(ACCESS_FILE)
        # forwarding to the job's owner verifies the other coordinator with the dev CA
        assert service["environment"]["SSL_CERT_FILE"] == "/certs/ca.pem"


def test_the_access_list_keeps_only_digests_of_the_documented_dev_tokens() -> None:
    access = read_access_list(ACCESS_FILE)
    assert access.clear_tokens == ()
    listed = {digest: identity.role for digest, identity in access.tokens.items()}
    assert listed == {token_digest(token): role for token, role in DEV_TOKENS.items()}
