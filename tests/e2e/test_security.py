"""The demo, run as a user runs it, against a secured Kafka: the embedded broker behind its front
with TLS, a client certificate required and SCRAM-SHA-512 (tests/secure_kafka.py). `sparkpoint
demo --kafka-config FILE` hands the file to every process it starts (history service, coordinator,
generator, agent and the agent's Spark tasks); the job's output is committed; and the password
appears in no log of the run and in no record of any topic."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from sparkpoint.common.broker import free_port
from sparkpoint.common.kafka import consumer_config
from sparkpoint.common.kafka_config import CONFIG_ENV
from tests.secure_kafka import secure_kafka

SPARKPOINT = str(Path(sys.executable).parent / "sparkpoint")


def every_record(bootstrap: str, properties: dict[str, str]) -> list[bytes]:
    """Keys, values and headers of every record of every topic on the broker."""
    consumer = Consumer(consumer_config(bootstrap, properties=properties))
    try:
        topics = consumer.list_topics(timeout=10).topics
        partitions = [
            TopicPartition(t, p, 0) for t, meta in topics.items() for p in meta.partitions
        ]
        ends = {
            (tp.topic, tp.partition): consumer.get_watermark_offsets(tp, 10, cached=False)[1]
            for tp in partitions
        }
        consumer.assign([tp for tp in partitions if ends[(tp.topic, tp.partition)] > 0])
        found: list[bytes] = []
        deadline = time.monotonic() + 60
        quiet = 0
        while time.monotonic() < deadline and quiet < 3:
            batch = consumer.consume(10_000, 1.0)
            quiet = 0 if batch else quiet + 1
            for message in batch:
                if message.error() is None:
                    found += [message.key() or b"", message.value() or b""]
                    found += [v or b"" for _, v in message.headers() or []]
        return found
    finally:
        consumer.close()


@pytest.mark.spark
def test_the_demo_runs_end_to_end_on_a_secured_kafka_and_leaks_no_secret(tmp_path: Path) -> None:
    with secure_kafka(tmp_path) as kafka:
        port = free_port()
        env = {
            k: v for k, v in os.environ.items() if k not in (CONFIG_ENV, "KAFKA_BOOTSTRAP_SERVERS")
        }
        result = subprocess.run(
            [
                SPARKPOINT, "demo", "--once", "--rest-port", str(port),
                "--bootstrap", kafka.bootstrap, "--kafka-config", str(kafka.config),
            ],
            capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env, check=False,
        )  # fmt: skip

        assert result.returncode == 0, result.stdout + result.stderr
        committed = re.search(r"^output committed: (\d+) records", result.stdout, re.M)
        assert committed and int(committed.group(1)) > 0, result.stdout
        logs = {
            path.name: path.read_text(errors="replace")
            for path in (tmp_path / ".sparkpoint" / "demo").glob("*.log")
        }
        assert set(logs) >= {"coordinator.log", "agent.log", "generator.log", "history.log"}
        records = every_record(kafka.bootstrap, kafka.properties)

    secret = kafka.password
    assert secret not in result.stdout + result.stderr
    leaked = [name for name, text in logs.items() if secret in text]
    assert leaked == []
    assert len(records) > 1000  # the input, the output, and every sparkpoint topic's events
    assert not any(secret.encode() in record for record in records)


def broker_process(port: int, *flags: str) -> subprocess.Popen[str]:
    broker = subprocess.Popen(
        [SPARKPOINT, "broker", "--port", str(port), *flags],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    assert broker.stdout is not None
    for line in broker.stdout:  # the listening line comes once the front accepts connections
        if "embedded broker" in line:
            return broker
    raise AssertionError(f"sparkpoint broker {' '.join(flags)} exited {broker.wait()}")


def topics_create(bootstrap: str, config: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in (CONFIG_ENV, "KAFKA_BOOTSTRAP_SERVERS")}
    return subprocess.run(
        [SPARKPOINT, "topics", "create", "--bootstrap", bootstrap, "--kafka-config", str(config)],
        capture_output=True, text=True, timeout=60, env=env, check=False,
    )  # fmt: skip


def test_sparkpoint_broker_dev_tls_keeps_its_ca_and_user_across_restarts(tmp_path: Path) -> None:
    """`sparkpoint broker --dev-tls DIR` makes a CA, a SCRAM user and DIR/client.properties once:
    clients configured for the first broker reach a restarted one; a wrong password does not."""
    folder, port = tmp_path / "secure", free_port()
    broker = broker_process(port, "--dev-tls", str(folder))
    try:
        config = folder / "client.properties"
        assert oct(config.stat().st_mode & 0o777) == "0o600"
        first = config.read_text()
        assert "security.protocol=SASL_SSL" in first and "sasl.mechanism=SCRAM-SHA-512" in first
        assert topics_create(f"127.0.0.1:{port}", config).returncode == 0
    finally:
        broker.terminate()
        broker.wait(20)
    broker = broker_process(port, "--dev-tls", str(folder))
    try:
        assert config.read_text() == first  # the same CA, user and password
        again = topics_create(f"127.0.0.1:{port}", config)
        assert again.returncode == 0, again.stderr
        wrong = tmp_path / "wrong.properties"
        wrong.write_text(re.sub(r"sasl\.password=.*", "sasl.password=not-it", first))
        refused = topics_create(f"127.0.0.1:{port}", wrong)
        assert refused.returncode == 1 and "invalid credentials" in refused.stderr
    finally:
        broker.terminate()
        broker.wait(20)


def test_the_broker_and_the_demo_refuse_security_flags_that_cannot_work(tmp_path: Path) -> None:
    missing = subprocess.run(
        [SPARKPOINT, "broker", "--tls-cert", str(tmp_path / "none.pem")],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert missing.returncode == 2 and "none.pem: no such file" in missing.stderr
    (tmp_path / "junk.pem").write_text("not a certificate")
    junk = subprocess.run(
        [SPARKPOINT, "broker", "--tls-cert", str(tmp_path / "junk.pem")],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert junk.returncode == 2 and "junk.pem" in junk.stderr and "not a PEM" in junk.stderr
    (tmp_path / "users").write_text("alice=alice-password\nbob\n")
    no_password = subprocess.run(
        [SPARKPOINT, "broker", "--sasl-users", str(tmp_path / "users")],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert no_password.returncode == 2 and "user bob has no password" in no_password.stderr
    assert "alice-password" not in no_password.stderr
    both = subprocess.run(
        [SPARKPOINT, "demo", "--secure", "--bootstrap", "127.0.0.1:1"],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert both.returncode == 2 and "--kafka-config" in both.stderr


def test_a_secured_broker_starts_in_a_process_already_configured_for_its_front(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`sparkpoint demo --secure` sets the client file before it starts the broker: the broker's
    own check of tansu behind the front must not use it (it did, and the demo never started)."""
    from sparkpoint.common.broker import EmbeddedBroker
    from sparkpoint.common.kafka import make_admin
    from sparkpoint.common.kafka_config import use_properties_file
    from sparkpoint.common.secure_broker import dev_security

    dev = dev_security(tmp_path)
    monkeypatch.setenv(CONFIG_ENV, "")  # put back as it was after the test
    use_properties_file(dev.client_config)
    with EmbeddedBroker(security=dev.security) as broker:
        assert make_admin(broker.bootstrap).list_topics(timeout=10).brokers
