"""The Kafka client configuration file (services/sparkpoint/common/kafka_config.py): Java
properties exactly as java.util.Properties.load reads them, environment variables, Java's JAAS
line as Kafka's JaasConfig reads it, the keys only Java knows, a Java keystore, the keys
sparkpoint owns, errors that never quote a value; and redaction (common/redaction.py)."""

from __future__ import annotations

import logging
import sys

import pytest

from sparkpoint.common import redaction
from sparkpoint.common.java_formats import jaas_credentials, java_properties
from sparkpoint.common.kafka import producer_config
from sparkpoint.common.kafka_config import (
    SPARKPOINT_OWNS,
    KafkaConfigError,
    frozen,
    parse_properties,
    plain_properties,
)
from sparkpoint.common.redaction import (
    REDACTED,
    RedactingFilter,
    is_secret,
    redact_options,
    redact_text,
    register_secrets,
    secrets_of,
)

SECRET = "Sup3rS3cret"
"""A value no error message may quote."""


def read(text: str) -> dict[str, str]:
    """``text`` as java.util.Properties.load reads it, later keys winning."""
    return {p.key: p.value for p in java_properties(text, "f")}


def refusal(text: str, environ: dict[str, str] | None = None) -> str:
    """The message of the error reading ``text`` as a client configuration."""
    with pytest.raises(KafkaConfigError) as refused:
        parse_properties(text, "client.properties", environ or {})
    return str(refused.value)


def jaas(options: str, module: str = "scram.ScramLoginModule") -> str:
    return f"org.apache.kafka.common.security.{module} required {options}"


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


# --- Java's Properties.load ----------------------------------------------------------------------


def test_white_space_separates_a_key_from_its_value() -> None:
    assert read(f"sasl.password    {SECRET}\nkey\tvalue\nform\fvalue\n") == {
        "sasl.password": SECRET,
        "key": "value",
        "form": "value",
    }


def test_white_space_around_one_equals_or_colon_is_one_separator() -> None:
    assert read("a = = b\nc :: d\ne = x : y\ng h\n") == {
        "a": "= b",
        "c": ": d",
        "e": "x : y",
        "g": "h",
    }


def test_a_key_alone_has_the_empty_value() -> None:
    assert read("lonely\n  spaced   \n") == {"lonely": "", "spaced": ""}


def test_leading_white_space_of_a_line_is_ignored() -> None:
    assert read(" \t\f a=1\n   # a comment after blanks\n") == {"a": "1"}


def test_escaped_separators_belong_to_the_key_and_the_value() -> None:
    assert read("a\\=b\\:c\\ d = x\\=y\\:z\\ w\n") == {"a=b:c d": "x=y:z w"}


def test_escapes_in_keys_and_values() -> None:
    text = 'k\\u0041\\#=\\t\\n\\r\\f|\\u00e9\\u20AC|\\\\|\\#\\!\\x\\"\n'
    assert read(text) == {"kA#": '\t\n\r\f|\u00e9\u20ac|\\|#!x"'}


def test_a_surrogate_pair_of_escapes_is_one_character() -> None:
    assert read("smile=\\ud83d\\ude00\n") == {"smile": "\U0001f600"}


def test_comments_start_with_hash_or_bang_and_never_continue() -> None:
    text = "# a comment ending in a backslash \\\nb=1\n! another \\\nc=2\nd=#not a comment\n"
    assert read(text) == {"b": "1", "c": "2", "d": "#not a comment"}


def test_an_odd_number_of_trailing_backslashes_continues_the_line() -> None:
    assert read("odd=x\\\\\\\ny\n") == {"odd": "x\\y"}


def test_an_even_number_of_trailing_backslashes_is_escaped_backslashes() -> None:
    assert read("even=x\\\\\ny=2\n") == {"even": "x\\", "y": "2"}


def test_a_continuation_drops_the_next_lines_leading_white_space_only() -> None:
    text = "fruits = apple, \\\n     banana, \\\n\t\t#cherry\n"
    assert read(text) == {"fruits": "apple, banana, #cherry"}


def test_a_line_continued_at_the_end_of_the_file_is_still_taken() -> None:
    assert read("a=1\nb=two\\") == {"a": "1", "b": "two"}
    assert read("b=two\\\n") == {"b": "two"}


def test_a_blank_line_ends_a_continuation() -> None:
    assert read("a=one\\\n\nb=2\n") == {"a": "one", "b": "2"}


def test_only_cr_lf_and_crlf_end_a_line() -> None:
    assert read("a=1\r\nb=2\rc=3\nd=x\x0by\u2028z\n") == {
        "a": "1",
        "b": "2",
        "c": "3",
        "d": "x\x0by\u2028z",
    }


def test_trailing_white_space_of_a_value_is_kept() -> None:
    assert read("a=b  \nc=d\\ \n") == {"a": "b  ", "c": "d "}


def test_a_later_key_wins() -> None:
    assert read("a=1\na=2\n") == {"a": "2"}


def test_each_property_knows_the_line_its_logical_line_starts_on() -> None:
    found = java_properties("# c\n\na=x\\\n  y\nb=1\n", "f")
    assert [(p.line, p.key) for p in found] == [(3, "a"), (5, "b")]


# --- errors never quote a value ------------------------------------------------------------------


def test_a_line_with_no_key_names_the_file_and_line_but_not_the_value() -> None:
    message = refusal(f"a=1\n={SECRET}\n")
    assert message == "client.properties:2: a line with no key"
    assert SECRET not in message


def test_a_malformed_unicode_escape_names_the_key_but_not_the_value() -> None:
    message = refusal(f"a=1\nsasl.password={SECRET}\\u12G4\n")
    assert message.startswith("client.properties:2: sasl.password: the value has a malformed")
    assert SECRET not in message


@pytest.mark.parametrize(
    "text",
    [
        f"={SECRET}",
        f":{SECRET}",
        f"sasl.password={SECRET}\\u00",
        f"sasl.password={SECRET}\\ud800",
        f"sasl.password={SECRET}${{env:NOT_SET_HERE}}",
        f"transactional.id={SECRET}",
        f"ssl.truststore.password={SECRET}",
        f"ssl.keystore.location=/etc/{SECRET}.jks",
        f"ssl.keystore.type={SECRET}",
        "sasl.jaas.config=" + jaas(f'username="alice" password=0{SECRET};'),
        "sasl.jaas.config=" + jaas(f'username="alice" password="{SECRET}"'),
        "sasl.jaas.config=" + jaas(f"username={SECRET} 9;"),
        "sasl.jaas.config=" + jaas(f'password="{SECRET}";', module="plain.NoSuchModule"),
        "sasl.password=other\nsasl.jaas.config=" + jaas(f'password="{SECRET}";'),
    ],
)
def test_no_error_quotes_a_value(text: str) -> None:
    assert SECRET not in refusal(text + "\n")


# --- environment variables -----------------------------------------------------------------------


def test_env_values_are_expanded_after_escapes() -> None:
    environ = {"PASSWORD": SECRET}
    got = parse_properties("sasl.password=\\${env:PASSWORD}!\n", "f", environ)
    assert got == {"sasl.password": f"{SECRET}!"}


def test_a_missing_variable_names_it_the_line_and_the_key() -> None:
    message = refusal("a=1\nsasl.password=${env:KAFKA_PASSWORD}\n")
    assert message == (
        "client.properties:2: the environment variable KAFKA_PASSWORD (for sasl.password) is not "
        "set"
    )


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


def test_javas_truststore_refusal_names_the_line() -> None:
    message = refusal("a=1\nssl.truststore.password=changeit\n")
    assert message.startswith("client.properties:2: ssl.truststore.password is Java's")


# --- Java's JAAS line ----------------------------------------------------------------------------


def test_a_quoted_jaas_value_is_unescaped_as_kafkas_stream_tokenizer_does() -> None:
    options = jaas_credentials(jaas('username="al\\"ice" password="back\\\\slash\\n\\101";'))
    assert options == {"username": 'al"ice', "password": "back\\slash\nA"}


def test_jaas_values_may_be_single_quoted_or_plain_words_around_comments() -> None:
    options = jaas("username=alice_1 /* the user */ password='it\"s' // a comment\n;")
    assert jaas_credentials(options) == {"username": "alice_1", "password": 'it"s'}


def test_the_jaas_password_reaches_sasl_password_through_the_file_escapes() -> None:
    # the file's own escapes first (\\ is \), then the JAAS line's (\" is ")
    line = "sasl.jaas.config=" + jaas('username="alice" password="a\\\\"b";') + "\n"
    properties = parse_properties(line, "f", {})
    assert properties == {"sasl.username": "alice", "sasl.password": 'a"b'}
    assert secrets_of(properties) == ['a"b']


@pytest.mark.parametrize(
    ("options", "why"),
    [
        ('username="alice" password=0x;', "option 2 has no value Kafka can read"),
        ('username="alice" password "x";', "option 2 is not name=value"),
        ('username="alice" password="x"', "does not end with ';'"),
        ('password="x"; ' + jaas('password="y";'), "one login module, not 2"),
    ],
)
def test_a_jaas_line_kafka_would_refuse_is_refused(options: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        jaas_credentials(jaas(options))


def test_a_jaas_line_and_sasl_password_that_disagree_are_refused() -> None:
    text = "sasl.password=one\nsasl.jaas.config=" + jaas('password="two";') + "\n"
    assert refusal(text) == (
        "client.properties:2: sasl.jaas.config: its password is not the sasl.password of line 1; "
        "give one of them"
    )


def test_a_jaas_line_and_sasl_password_that_agree_are_one_password() -> None:
    text = "sasl.password=same\nsasl.jaas.config=" + jaas('password="same";') + "\n"
    assert parse_properties(text, "f", {}) == {"sasl.password": "same"}


# --- the keystore --------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["PKCS12", "pkcs12", " PKCS12 "])
def test_a_pkcs12_keystore_type_is_accepted_and_dropped(kind: str) -> None:
    text = f"ssl.keystore.type={kind}\nssl.keystore.location=/etc/client.p12\n"
    assert parse_properties(text, "f", {}) == {"ssl.keystore.location": "/etc/client.p12"}


@pytest.mark.parametrize(
    "text",
    [
        "ssl.keystore.type=JKS\nssl.keystore.location=/etc/client.keystore\n",
        "ssl.keystore.location=/etc/client.keystore.JKS\n",
        "ssl.keystore.type=PKCS12\nssl.keystore.location=/etc/client.jks\n",
    ],
)
def test_a_java_keystore_is_refused_saying_how_to_convert_it(text: str) -> None:
    message = refusal(text)
    assert "names a Java keystore" in message
    assert "keytool -importkeystore" in message
    assert "-deststoretype PKCS12" in message
    assert "ssl.certificate.location and ssl.key.location" in message


def test_a_pem_keystore_type_points_at_librdkafkas_pem_keys() -> None:
    assert "ssl.certificate.location and ssl.key.location" in refusal("ssl.keystore.type=PEM\n")


# --- the keys sparkpoint owns --------------------------------------------------------------------


@pytest.mark.parametrize("key", sorted(SPARKPOINT_OWNS))
def test_a_key_sparkpoint_owns_is_refused_naming_it_and_why(key: str) -> None:
    message = refusal(f"security.protocol=SSL\n{key}=x\n")
    assert message.startswith(f"client.properties:2: {key} is sparkpoint's to set")
    assert SPARKPOINT_OWNS[key] in message


def test_the_files_bootstrap_servers_is_kept_as_the_last_fallback() -> None:
    assert parse_properties("bootstrap.servers=b1:9093\n", "f", {}) == {
        "bootstrap.servers": "b1:9093"
    }


def test_a_sasl_users_file_is_read_without_the_kafka_rules() -> None:
    text = "alice=${env:ALICE}\ngroup.id=pw\\ \n"
    assert plain_properties(text, "users", {"ALICE": SECRET}) == {
        "alice": SECRET,
        "group.id": "pw ",
    }


# --- trailing white space ------------------------------------------------------------------------


def test_a_secrets_trailing_white_space_is_kept_with_a_warning_that_quotes_no_value(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="sparkpoint.common.kafka_config"):
        got = parse_properties(f"a=1\nsasl.password={SECRET} \n", "client.properties", {})
    assert got == {"a": "1", "sasl.password": f"{SECRET} "}
    assert len(caplog.records) == 1
    message = caplog.records[0].getMessage()
    assert message.startswith("client.properties:2: the value of sasl.password ends in white space")
    assert SECRET not in message


def test_escaped_or_other_trailing_white_space_is_not_warned_about(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="sparkpoint.common.kafka_config"):
        parse_properties("sasl.password=meant\\ \nsasl.username=alice \n", "f", {})
    assert caplog.records == []


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


def test_a_word_alone_on_a_line_is_refused_without_being_named() -> None:
    """A password pasted on a line of its own is a key with no value by Java's rules: librdkafka
    would quote it back as an unknown property, so it is refused here, unnamed."""
    with pytest.raises(KafkaConfigError) as refused:
        parse_properties("sasl.username=alice\nHunter2Secret\n", "client.properties")
    assert "client.properties:2" in str(refused.value)
    assert "Hunter2Secret" not in str(refused.value)
    # an empty value of a real (dotted) property stays: Kafka's way to turn a check off
    found = parse_properties("ssl.endpoint.identification.algorithm=\n", "p")
    assert found == {"ssl.endpoint.identification.algorithm": ""}


def test_a_transactional_producer_connects_to_its_brokers_at_once() -> None:
    """Sparse connections put a retry timer (54 ms, often 504 ms) into every
    ``init_transactions``, and a sink's transactional producer lives for one epoch."""
    assert producer_config("b:9092", transactional_id="t")["enable.sparse.connections"] is False
    assert "enable.sparse.connections" not in producer_config("b:9092")
