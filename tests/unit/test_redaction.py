"""What counts as a secret's key (common/redaction.py): Spark's pattern widened for Kafka's client
properties, the Schema Registry client's credentials and Flink's sensitive keys."""

from __future__ import annotations

import pytest

from sparkpoint.common.kafka_config import parse_properties
from sparkpoint.common.redaction import REDACTED, is_secret, redact_options, secrets_of

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "key",
    [
        "schema.registry.basic.auth.user.info", "basic.auth.user.info",
        "avro-confluent.basic-auth.user-info", "avro-confluent.http-headers",
        "sasl.oauthbearer.auth-params", "fs.azure.account.key.mine.blob.core.windows.net",
        "schema.registry.basic.auth.credentials.source",
    ],
)  # fmt: skip
def test_registry_and_flinks_sensitive_keys_are_secrets(key: str) -> None:
    assert is_secret(key)


def test_a_registry_user_info_is_redacted_and_registered() -> None:
    options = {"schema.registry.basic.auth.user.info": "svc:hunter2xyz", "sasl.username": "svc"}
    assert redact_options(options) == {
        "schema.registry.basic.auth.user.info": REDACTED,
        "sasl.username": "svc",
    }
    properties = parse_properties(
        "schema.registry.basic.auth.user.info=svc:hunter2xyz\nsasl.password=pw123456\n", "p"
    )
    assert sorted(secrets_of(properties)) == ["pw123456", "svc:hunter2xyz"]


def test_a_jobs_own_secrets_are_found_for_the_drivers_logs() -> None:
    """The agent registers them when it starts: a source's and a sink's client properties, a
    Schema Registry's user info, a secret-named setting."""
    from dataclasses import replace

    from sparkpoint.agent.example import example_job
    from sparkpoint.agent.formats import ConfluentAvroValues
    from sparkpoint.agent.job import KafkaSink, KafkaSource
    from sparkpoint.agent.options import job_secrets

    registry = ConfluentAvroValues(
        "http://registry:8081", registry_properties={"basic.auth.user.info": "svc:registry-pw"}
    )
    job = replace(
        example_job("secrets", "in", "out", True, 2, {"fs.s3a.secret.key": "s3-secret-1"}),
        source=KafkaSource(["in"], properties={"sasl.password": "source-pw-1"}),
        sink=KafkaSink("out", properties={"sasl.password": "sink-pw-1"}, value_format=registry),
    )
    assert sorted(job_secrets(job)) == sorted(
        ["s3-secret-1", "source-pw-1", "sink-pw-1", "svc:registry-pw"]
    )
