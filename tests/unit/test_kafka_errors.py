"""Connection errors no retry cures (services/sparkpoint/common/kafka_errors.py): kept per
cluster for whoever waits on it, logged once per cause whatever librdkafka's timing says, and
told apart from the transport errors of a broker that is merely down."""

from __future__ import annotations

import logging

import pytest
from confluent_kafka import KafkaError

from sparkpoint.common.kafka_errors import ConnectionErrors

REFUSED = (
    "sasl_ssl://127.0.0.1:9093/bootstrap: SASL authentication error: Authentication failed "
    "during authentication due to invalid credentials with SASL mechanism SCRAM-SHA-512"
)


def test_a_refused_login_is_kept_and_logged_once_whatever_its_timing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    errors = ConnectionErrors()
    with caplog.at_level(logging.ERROR, logger="sparkpoint.common.kafka"):
        for ms in (12, 27, 5):
            text = f"{REFUSED} (after {ms}ms in state AUTH_REQ)"
            errors.note("127.0.0.1:9093", KafkaError(KafkaError._AUTHENTICATION, text))
    assert errors.last("127.0.0.1:9093") == REFUSED
    assert [r.getMessage() for r in caplog.records] == [f"Kafka at 127.0.0.1:9093: {REFUSED}"]
    errors.forget("127.0.0.1:9093")
    assert errors.last("127.0.0.1:9093") is None


def test_an_untrusted_certificate_reported_as_a_transport_error_is_kept() -> None:
    errors = ConnectionErrors()
    text = "ssl://127.0.0.1:9093/bootstrap: SSL handshake failed: certificate verify failed"
    errors.note("b", KafkaError(KafkaError._TRANSPORT, text))
    assert errors.last("b") == text


def test_a_broker_that_is_down_is_no_security_error_even_on_a_sasl_listener() -> None:
    errors = ConnectionErrors()
    text = "sasl_ssl://127.0.0.1:9093/1: Connect to ipv4#127.0.0.1:9093 failed: Connection refused"
    errors.note("b", KafkaError(KafkaError._TRANSPORT, text))
    assert errors.last("b") is None


def test_a_caller_that_raises_the_error_itself_gets_it_unlogged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    errors = ConnectionErrors()
    with caplog.at_level(logging.ERROR, logger="sparkpoint.common.kafka"):
        errors.callback("b", report=False)(KafkaError(KafkaError._AUTHENTICATION, REFUSED))
    assert errors.last("b") == REFUSED and caplog.records == []
