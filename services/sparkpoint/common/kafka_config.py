"""One Kafka client configuration for every sparkpoint process and task.

A librdkafka properties file (``key=value`` lines, as Kafka's ``--command-config`` and kcat's
``-F`` take) holds what a secured cluster needs: ``security.protocol``, the SASL mechanism and
credentials, the CA, a client certificate. ``--kafka-config FILE`` or ``SPARKPOINT_KAFKA_CONFIG``
names it; every producer, consumer and admin client sparkpoint makes starts from it, and the
agent hands the same properties (with a source's or sink's own on top) to the Spark tasks that
read and write Kafka, inside the task rather than in Spark's configuration, so they appear
neither on Spark's environment page nor in its event log.

The file is read exactly as Java's ``Properties.load`` reads it (`java_properties`), so a file
written for Kafka's own tools means the same here. A value may name an environment variable,
``${env:NAME}`` (Kafka's EnvVarConfigProvider), so the file itself can be kept free of secrets.
Every value whose key names a secret is registered with `sparkpoint.common.redaction` as soon as
it is loaded, and no error this module raises ever quotes a value or a line: it names the file,
the line and the key.

Java clients' ``sasl.jaas.config`` for the PLAIN and SCRAM login modules is read as librdkafka's
``sasl.username`` and ``sasl.password``; the Java-only truststore keys and a Java (JKS) keystore
are refused with what to give instead; the keys sparkpoint sets itself are refused with why.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path

from sparkpoint.common.java_formats import (
    KafkaConfigError as KafkaConfigError,  # raised by this module too: its callers catch it here
)
from sparkpoint.common.java_formats import (
    Property,
    jaas_credentials,
    java_properties,
)
from sparkpoint.common.redaction import is_secret, register_secrets, secrets_of

log = logging.getLogger(__name__)

CONFIG_ENV = "SPARKPOINT_KAFKA_CONFIG"
"""Names the properties file when ``--kafka-config`` is not given; the `sparkpoint` command sets
it for the processes it starts (the demo's coordinator and agent), so they read the same file."""

JAVA_ONLY = {
    "ssl.truststore.location": "ssl.ca.location (a PEM file of the CA certificates)",
    "ssl.truststore.password": "ssl.ca.location (PEM needs no password)",
    "ssl.truststore.type": "ssl.ca.location (PEM)",
    "ssl.truststore.certificates": "ssl.ca.pem (or ssl.ca.location, a file)",
    "ssl.keystore.certificate.chain": "ssl.certificate.pem (or ssl.certificate.location, a file)",
    "ssl.keystore.key": "ssl.key.pem (or ssl.key.location, a file)",
    "sasl.login.callback.handler.class": "sasl.oauthbearer.method=oidc and its settings",
}
"""Keys of Java's client with no librdkafka equivalent of the same name, and what to use. The
keystore is not here: librdkafka's ``ssl.keystore.location`` takes a PKCS#12 file, so only a Java
(JKS) keystore is refused (`KEYSTORE_CONVERSION`)."""

KEYSTORE_CONVERSION = (
    "convert it to PKCS#12 (keytool -importkeystore -srckeystore client.jks -destkeystore "
    "client.p12 -deststoretype PKCS12) and give that file as ssl.keystore.location with "
    "ssl.keystore.password, or to PEM files given as ssl.certificate.location and "
    "ssl.key.location"
)
"""What to do with a Java keystore: librdkafka's keystore is PKCS#12 ("Path to client's keystore
(PKCS#12)", CONFIGURATION.md), and its certificate and key may also be PEM files."""

SPARKPOINT_OWNS = {
    "transactional.id": "sparkpoint gives each transactional writer its own fixed id (one from "
    "the file would make every producer transactional, all with the same id)",
    "enable.idempotence": "sparkpoint's producers are always idempotent (acks=all)",
    "group.id": "sparkpoint names its consumer groups itself, under the topic prefix "
    "(docs/security.md lists them for the ACLs)",
    "enable.auto.commit": "sparkpoint never auto-commits: it keeps positions where it needs them",
    "isolation.level": "sparkpoint reads read_committed where its guarantees need it",
}
"""Keys sparkpoint sets on its clients itself (`sparkpoint.common.kafka`): refused in the file
rather than silently overridden, or worse, as ``transactional.id`` would be, applied.
``bootstrap.servers`` is not here: the file's is the last fallback of
`sparkpoint.common.kafka.bootstrap_servers` (after ``--bootstrap`` and
``KAFKA_BOOTSTRAP_SERVERS``), as ``--bootstrap``'s help says."""

_ENV = re.compile(r"\$\{env:(?P<name>[A-Za-z_][A-Za-z0-9_]*)\}")


def plain_properties(
    text: str, source: str, environ: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Java properties (`java_properties`) with ``${env:NAME}`` in values replaced by the
    variable of ``environ`` (the process's by default; a missing one is an error naming it and
    the line), and no Kafka rule: a ``--sasl-users`` file's ``name=password`` lines."""
    return {key: found.value for key, found in _expanded(text, source, environ).items()}


def parse_properties(
    text: str, source: str, environ: Mapping[str, str] | None = None
) -> dict[str, str]:
    """A Kafka client configuration: `plain_properties`, then Java's ``sasl.jaas.config`` read
    as ``sasl.username`` and ``sasl.password``, ``ssl.keystore.type=PKCS12`` dropped, and Java's
    truststore, a Java keystore and the keys sparkpoint owns refused, each error naming the file,
    the line and the key. A secret's value ending in white space the file did not escape is kept,
    as Java's Properties.load keeps it, with a warning naming the key."""
    expanded = _expanded(text, source, environ)
    for key, found in expanded.items():
        if found.alone and "." not in key:
            # a word alone on a line (a password pasted on a line of its own?): librdkafka would
            # quote it back as an unknown property, so it is refused without being named
            raise KafkaConfigError(
                f"{source}:{found.line}: a word with no value and no dot, which no Kafka client "
                "property is (a value pasted on a line of its own?)"
            )
        if found.blank_end and is_secret(key):
            log.warning(
                "%s:%d: the value of %s ends in white space, which is kept as part of it "
                "(Properties.load keeps it; Kafka's Java clients trim it afterwards): remove it "
                "unless the secret ends so",
                source,
                found.line,
                key,
            )
    properties = {key: found.value for key, found in expanded.items()}
    return _translated(properties, source, {key: found.line for key, found in expanded.items()})


def _expanded(text: str, source: str, environ: Mapping[str, str] | None) -> dict[str, Property]:
    """Each key's property (a later line wins), ``${env:NAME}`` replaced in its value."""
    variables = os.environ if environ is None else environ
    return {
        found.key: replace(found, value=_expand(found, variables, source))
        for found in java_properties(text, source)
    }


def _expand(found: Property, variables: Mapping[str, str], source: str) -> str:
    def variable(match: re.Match[str]) -> str:
        name = match["name"]
        if name not in variables:
            raise KafkaConfigError(
                f"{source}:{found.line}: the environment variable {name} (for {found.key}) is "
                "not set"
            )
        return variables[name]

    return _ENV.sub(variable, found.value)


def _translated(
    properties: dict[str, str], source: str, lines: Mapping[str, int]
) -> dict[str, str]:
    def at(key: str) -> str:
        return f"{source}:{lines[key]}: {key}"

    for key, why in SPARKPOINT_OWNS.items():
        if key in properties:
            raise KafkaConfigError(f"{at(key)} is sparkpoint's to set, not the file's: {why}")
    for key, instead in JAVA_ONLY.items():
        if key in properties:
            raise KafkaConfigError(f"{at(key)} is Java's; librdkafka takes {instead}")
    _check_keystore(properties, at)
    jaas = properties.pop("sasl.jaas.config", None)
    if jaas is not None:
        try:
            credentials = jaas_credentials(jaas)
        except ValueError as exc:
            raise KafkaConfigError(f"{at('sasl.jaas.config')}: {exc}") from None
        for option, key in (("username", "sasl.username"), ("password", "sasl.password")):
            if option not in credentials:
                continue
            if properties.setdefault(key, credentials[option]) != credentials[option]:
                raise KafkaConfigError(
                    f"{at('sasl.jaas.config')}: its {option} is not the {key} of line "
                    f"{lines[key]}; give one of them"
                )
    return properties


def _check_keystore(properties: dict[str, str], at: Callable[[str], str]) -> None:
    """librdkafka's keystore is PKCS#12: ``ssl.keystore.type=PKCS12`` says nothing more and is
    dropped (librdkafka has no such key); a Java keystore, by its type or a ``.jks`` name, is
    refused. Kafka trims and Java's KeyStore ignores case, so both are done here too."""
    kind = properties.pop("ssl.keystore.type", None)
    if kind is not None:
        kind = kind.strip().upper()
        if kind in ("JKS", "JCEKS"):
            raise KafkaConfigError(
                f"{at('ssl.keystore.type')} names a Java keystore, which librdkafka cannot "
                f"read: {KEYSTORE_CONVERSION}"
            )
        if kind == "PEM":
            raise KafkaConfigError(
                f"{at('ssl.keystore.type')}: librdkafka takes a PEM certificate and key as "
                "ssl.certificate.location and ssl.key.location (or ssl.certificate.pem and "
                "ssl.key.pem), not as a keystore"
            )
        if kind != "PKCS12":
            raise KafkaConfigError(
                f"{at('ssl.keystore.type')}: librdkafka's keystore (ssl.keystore.location) "
                "is PKCS#12 only; give PKCS12 or leave the key out"
            )
    location = properties.get("ssl.keystore.location")
    if location is not None and location.strip().lower().endswith(".jks"):
        raise KafkaConfigError(
            f"{at('ssl.keystore.location')} names a Java keystore (.jks), which librdkafka "
            f"cannot read: {KEYSTORE_CONVERSION} (a file already PKCS#12: name it .p12)"
        )


# --- the process's configuration -----------------------------------------------------------------


def load_properties(path: Path | str) -> dict[str, str]:
    """The properties of ``path`` (UTF-8, a byte order mark ignored); its secrets are registered
    for redaction."""
    where = Path(path)
    try:
        data = where.read_bytes()
    except OSError as exc:
        raise KafkaConfigError(
            f"cannot read the Kafka client configuration {where}: {exc}"
        ) from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise KafkaConfigError(
            f"{where}:{line}: not UTF-8 text; write other characters as \\uXXXX"
        ) from None
    properties = parse_properties(text, str(where))
    secrets = secrets_of(properties)
    # a secret with stray white space is registered bare too: a message may quote it trimmed
    register_secrets([*secrets, *(s.strip() for s in secrets)])
    return properties


SCHEMA_REGISTRY_PREFIX = "schema.registry."
"""Keys under this prefix are the Schema Registry client's (Confluent's serializers read them
from the same file): ``schema.registry.basic.auth.user.info``, ``schema.registry.ssl.ca.location``,
``schema.registry.bearer.auth.token``... librdkafka never sees them."""

Frozen = tuple[tuple[str, str], ...]
"""Properties as a Spark task carries them: hashable, in a stable order."""


def frozen(*layers: Mapping[str, object]) -> Frozen:
    """``layers`` merged, later over earlier, as strings."""
    merged: dict[str, str] = {}
    for layer in layers:
        merged |= {str(k): str(v) for k, v in layer.items()}
    return tuple(sorted(merged.items()))


_loaded: dict[str, dict[str, str]] = {}
_lock = threading.Lock()


def _process_properties() -> dict[str, str]:
    path = os.environ.get(CONFIG_ENV)
    if not path:
        return {}
    with _lock:
        if path not in _loaded:
            _loaded[path] = load_properties(path)
        return _loaded[path]


def client_properties() -> dict[str, str]:
    """This process's librdkafka properties: the file ``SPARKPOINT_KAFKA_CONFIG`` names (read
    once), without the Schema Registry's; none without a file."""
    return {
        k: v for k, v in _process_properties().items() if not k.startswith(SCHEMA_REGISTRY_PREFIX)
    }


def schema_registry_properties() -> dict[str, str]:
    """This process's Schema Registry client settings (the file's ``schema.registry.*`` keys,
    prefix removed; ``url`` is the value format's own)."""
    return {
        k[len(SCHEMA_REGISTRY_PREFIX) :]: v
        for k, v in _process_properties().items()
        if k.startswith(SCHEMA_REGISTRY_PREFIX) and k != f"{SCHEMA_REGISTRY_PREFIX}url"
    }


def use_properties_file(path: Path) -> dict[str, str]:
    """Makes ``path`` this process's Kafka client configuration and that of the processes it
    starts (through ``SPARKPOINT_KAFKA_CONFIG``); reads it at once so a bad file fails here."""
    absolute = str(path.resolve())
    properties = load_properties(absolute)
    with _lock:
        _loaded[absolute] = properties
    os.environ[CONFIG_ENV] = absolute
    return dict(properties)
