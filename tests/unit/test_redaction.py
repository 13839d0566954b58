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
