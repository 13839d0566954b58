"""One Kafka client configuration for every sparkpoint process and task.

A librdkafka properties file (``key=value`` lines, as Kafka's ``--command-config`` and kcat's
``-F`` take) holds what a secured cluster needs: ``security.protocol``, the SASL mechanism and
credentials, the CA, a client certificate. ``--kafka-config FILE`` or ``SPARKPOINT_KAFKA_CONFIG``
names it; every producer, consumer and admin client sparkpoint makes starts from it, and the
agent hands the same properties (with a source's or sink's own on top) to the Spark tasks that
read and write Kafka, inside the task rather than in Spark's configuration, so they appear
neither on Spark's environment page nor in its event log.

A value may name an environment variable, ``${env:NAME}`` (Kafka's EnvVarConfigProvider), so
the file itself can be kept free of secrets. Every value whose key names a secret is registered
with `sparkpoint.common.redaction` as soon as it is loaded.

Java clients' ``sasl.jaas.config`` for the PLAIN and SCRAM login modules is read as librdkafka's
``sasl.username`` and ``sasl.password``; the Java-only keystore and truststore keys are refused
with the librdkafka key to use instead.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Mapping
from pathlib import Path

from sparkpoint.common.redaction import register_secrets, secrets_of

CONFIG_ENV = "SPARKPOINT_KAFKA_CONFIG"
"""Names the properties file when ``--kafka-config`` is not given; the `sparkpoint` command sets
it for the processes it starts (the demo's coordinator and agent), so they read the same file."""

JAVA_ONLY = {
    "ssl.truststore.location": "ssl.ca.location (a PEM file of the CA certificates)",
    "ssl.truststore.password": "ssl.ca.location (PEM needs no password)",
    "ssl.truststore.type": "ssl.ca.location (PEM)",
    "ssl.keystore.type": "ssl.keystore.location (PKCS#12) or ssl.certificate.location and "
    "ssl.key.location (PEM)",
    "sasl.login.callback.handler.class": "sasl.oauthbearer.method=oidc and its settings",
}
"""Keys of Java's client with no librdkafka equivalent of the same name, and what to use."""

_JAAS = re.compile(
    r"org\.apache\.kafka\.common\.security\.(?:plain\.PlainLoginModule|scram\.ScramLoginModule)"
    r"\s+required(?P<options>.*?);?\s*$",
    re.DOTALL,
)
_JAAS_OPTION = re.compile(r"""(\w+)\s*=\s*"((?:[^"\\]|\\.)*)"|(\w+)\s*=\s*(\S+)""")
_ENV = re.compile(r"\$\{env:(?P<name>[A-Za-z_][A-Za-z0-9_]*)\}")


class KafkaConfigError(ValueError):
    """The Kafka client configuration cannot be used; the message names the file and the key."""


def parse_properties(text: str, source: str) -> dict[str, str]:
    """Java properties as Kafka's tools read them: ``key=value`` or ``key: value`` lines, ``#``
    and ``!`` comments, a trailing backslash continues a line; ``${env:NAME}`` is replaced by the
    variable (a missing one is an error naming it)."""
    properties: dict[str, str] = {}
    pending = ""
    for number, raw in enumerate(text.splitlines(), start=1):
        line = pending + raw.strip()
        if line.endswith("\\") and not line.endswith("\\\\"):
            pending = line[:-1]
            continue
        pending = ""
        if not line or line[0] in "#!":
            continue
        key, sep, value = _split(line)
        if not sep or not key:
            raise KafkaConfigError(f"{source}:{number}: expected key=value, got {line!r}")
        properties[key] = _expand(value, f"{source}:{number}")
    return _translated(properties, source)


def _split(line: str) -> tuple[str, str, str]:
    positions = [i for i in (line.find("="), line.find(":")) if i > 0]
    if not positions:
        return line, "", ""
    at = min(positions)
    return line[:at].strip(), line[at], line[at + 1 :].strip()


def _expand(value: str, where: str) -> str:
    def variable(match: re.Match[str]) -> str:
        name = match["name"]
        if name not in os.environ:
            raise KafkaConfigError(f"{where}: the environment variable {name} is not set")
        return os.environ[name]

    return _ENV.sub(variable, value)


def _translated(properties: dict[str, str], source: str) -> dict[str, str]:
    for key, instead in JAVA_ONLY.items():
        if key in properties:
            raise KafkaConfigError(f"{source}: {key} is Java's; librdkafka takes {instead}")
    jaas = properties.pop("sasl.jaas.config", None)
    if jaas is not None:
        match = _JAAS.search(jaas)
        if match is None:
            raise KafkaConfigError(
                f"{source}: sasl.jaas.config: only the PLAIN and SCRAM login modules can be read; "
                "give sasl.username and sasl.password instead"
            )
        options = {
            (m[1] or m[3]): (m[2] if m[1] else m[4])
            for m in _JAAS_OPTION.finditer(match["options"])
        }
        for option, key in (("username", "sasl.username"), ("password", "sasl.password")):
            if option in options:
                properties.setdefault(key, options[option])
    return properties


def load_properties(path: Path | str) -> dict[str, str]:
    """The properties of ``path``; its secrets are registered for redaction."""
    where = Path(path)
    try:
        text = where.read_text()
    except OSError as exc:
        raise KafkaConfigError(
            f"cannot read the Kafka client configuration {where}: {exc}"
        ) from None
    properties = parse_properties(text, str(where))
    register_secrets(secrets_of(properties))
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
