"""The Kafka client configuration file (services/sparkpoint/common/kafka_config.py): Java
properties as Kafka's tools read them, environment variables, Java's JAAS line, the keys only
Java knows, the Schema Registry's keys kept apart; and redaction (common/redaction.py)."""

from __future__ import annotations

import logging
import sys

import pytest

from sparkpoint.common import redaction
from sparkpoint.common.kafka_config import (
    KafkaConfigError,
    frozen,
    parse_properties,
)
from sparkpoint.common.redaction import (
    REDACTED,
    RedactingFilter,
    is_secret,
    redact_options,
    redact_text,
    register_secrets,
)


def test_key_value_lines_comments_and_continuations() -> None:
    text = """
# a comment
! another
security.protocol = SASL_SSL
sasl.mechanism: SCRAM-SHA-512
ssl.ca.location=/etc/ca.pem
sasl.username=a\\
lice
empty=
"""
    assert parse_properties(text, "f") == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "ssl.ca.location": "/etc/ca.pem",
        "sasl.username": "alice",
        "empty": "",
    }


def test_a_line_without_a_separator_names_the_file_and_line() -> None:
    with pytest.raises(KafkaConfigError, match=r"^client\.properties:2: expected key=value"):
        parse_properties("a=1\njust words\n", "client.properties")


def test_env_values_are_expanded_and_a_missing_variable_is_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("KAFKA_PASSWORD", "from-the-environment")
    got = parse_properties("sasl.password=${env:KAFKA_PASSWORD}\n", "f")
    assert got == {"sasl.password": "from-the-environment"}
    monkeypatch.delenv("KAFKA_PASSWORD")
    with pytest.raises(KafkaConfigError, match=r"f:1: the environment variable KAFKA_PASSWORD"):
        parse_properties("sasl.password=${env:KAFKA_PASSWORD}\n", "f")


def test_javas_jaas_line_gives_the_username_and_password() -> None:
    text = (
        "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required "
        'username="alice" password="p=ss;word";\n'
    )
    assert parse_properties(text, "f") == {"sasl.username": "alice", "sasl.password": "p=ss;word"}


def test_a_jaas_line_of_another_login_module_is_refused() -> None:
    text = "sasl.jaas.config=com.sun.security.auth.module.Krb5LoginModule required;\n"
    with pytest.raises(KafkaConfigError, match=r"only the PLAIN and SCRAM login modules"):
        parse_properties(text, "f")


def test_javas_truststore_is_refused_naming_librdkafkas_key() -> None:
    with pytest.raises(
        KafkaConfigError, match=r"ssl\.truststore\.location is Java's.*ssl\.ca\.location"
    ):
        parse_properties("ssl.truststore.location=/etc/truststore.jks\n", "f")


def test_frozen_properties_merge_later_over_earlier_as_sorted_strings() -> None:
    assert frozen({"b": 1, "a": "x"}, {"b": 2}) == (("a", "x"), ("b", "2"))


@pytest.mark.parametrize(
    "key",
    [
        "sasl.password", "ssl.key.password", "ssl.keystore.password", "sasl.jaas.config",
        "sasl.oauthbearer.client.secret", "basic.auth.user.info.token", "s3.secret-key",
        "fs.s3a.access.key", "ssl.key.pem", "bearer.auth.token",
    ],
)  # fmt: skip
def test_keys_that_name_a_secret(key: str) -> None:
    assert is_secret(key)


@pytest.mark.parametrize(
    "key", ["sasl.username", "security.protocol", "execution.checkpointing.interval"]
)
def test_keys_that_do_not(key: str) -> None:
    assert not is_secret(key)


def test_options_keep_their_keys_and_lose_secret_values() -> None:
    options = {"sasl.username": "alice", "sasl.password": "hunter22"}
    assert redact_options(options) == {"sasl.username": "alice", "sasl.password": REDACTED}


@pytest.fixture
def fresh_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(redaction, "_known", set())


@pytest.mark.usefixtures("fresh_registry")
def test_text_loses_registered_values_and_secret_pairs_but_not_short_values() -> None:
    register_secrets(["correct-horse-battery", "on"])
    text = "login correct-horse-battery failed; sasl.password=other-one, mode on"
    assert redact_text(text) == f"login {REDACTED} failed; sasl.password={REDACTED}, mode on"


@pytest.mark.usefixtures("fresh_registry")
def test_the_log_filter_scrubs_messages_arguments_and_exceptions() -> None:
    register_secrets(["correct-horse-battery"])
    record = logging.LogRecord(
        "x", logging.ERROR, __file__, 1, "cannot log in with %s", ("correct-horse-battery",), None
    )
    try:
        raise ValueError("the password correct-horse-battery was refused")
    except ValueError:
        record.exc_info = sys.exc_info()
    assert RedactingFilter().filter(record)
    formatted = logging.Formatter().format(record)
    assert "correct-horse-battery" not in formatted
    assert f"cannot log in with {REDACTED}" in formatted
    assert f"ValueError: the password {REDACTED} was refused" in formatted
