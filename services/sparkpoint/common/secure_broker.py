"""The embedded broker with TLS and SASL, as ``sparkpoint broker`` and ``sparkpoint demo --secure``
start it: the operator's own certificate, key, client CA and users (``--tls-cert``, ``--tls-key``,
``--tls-client-ca``, ``--sasl-users``), or a development setup kept in one folder
(``--dev-tls DIR``): a throwaway CA and server certificate (`dev_certs`), one SCRAM-SHA-512 user
``sparkpoint`` with a random password, and ``client.properties``, the file every sparkpoint
command then takes as ``--kafka-config``. The folder is made once and kept: a restarted broker
accepts the clients configured for the one before."""

from __future__ import annotations

import secrets
import signal
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sparkpoint.common.broker import BrokerSecurity, EmbeddedBroker
from sparkpoint.common.dev_certs import DevCerts, make_dev_certs
from sparkpoint.common.kafka_config import KafkaConfigError, load_properties, plain_properties
from sparkpoint.common.redaction import register_secrets

DEV_USER = "sparkpoint"
DEV_MECHANISM = "SCRAM-SHA-512"
DEV_HOSTS = ["127.0.0.1", "localhost"]


@dataclass(frozen=True)
class DevSecurity:
    """A development setup's broker security and the client configuration that reaches it."""

    security: BrokerSecurity
    client_config: Path


def dev_security(directory: Path) -> DevSecurity:
    """The setup kept in ``directory``, made there first if absent (certificates, the user's
    password, ``client.properties``, the secret files readable by their owner only)."""
    certs = DevCerts(directory)
    if not (certs.ca.is_file() and certs.server.is_file()):
        make_dev_certs(directory, DEV_HOSTS, [])
    config = directory / "client.properties"
    password = load_properties(config).get("sasl.password") if config.is_file() else None
    if not password:
        password = secrets.token_urlsafe(24)
        config.touch(mode=0o600)
        config.write_text(
            "# written by sparkpoint for the embedded broker's development TLS: never production\n"
            f"security.protocol=SASL_SSL\nsasl.mechanism={DEV_MECHANISM}\n"
            f"sasl.username={DEV_USER}\nsasl.password={password}\n"
            f"ssl.ca.location={certs.ca.resolve()}\n"
        )
    register_secrets([password])
    server = str(certs.server.resolve())
    return DevSecurity(BrokerSecurity(server, server, None, {DEV_USER: password}), config)


def sasl_users(path: Path) -> dict[str, str]:
    """The users of a ``--sasl-users`` file: ``name=password`` lines (``${env:NAME}`` values
    allowed, ``#`` comments), each password registered for redaction."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise KafkaConfigError(f"cannot read the SASL users file {path}: {exc}") from None
    users = plain_properties(text, str(path))
    if not users:
        raise KafkaConfigError(f"{path}: no user (expected name=password lines)")
    empty = sorted(name for name, password in users.items() if not password)
    if empty:
        raise KafkaConfigError(f"{path}: user {empty[0]} has no password")
    register_secrets(list(users.values()))
    return users


def check_files(security: BrokerSecurity) -> None:
    """Each file of ``security`` usable as TLS needs it, or `KafkaConfigError` naming it (the
    front runs as a process of its own: a file it cannot use would only show as its exit)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    if security.certfile is not None:
        try:
            context.load_cert_chain(security.certfile, security.keyfile)
        except (OSError, ssl.SSLError) as exc:
            raise KafkaConfigError(
                f"--tls-cert {security.certfile} / --tls-key {security.keyfile}: not a PEM "
                f"certificate and its unencrypted key ({exc.strerror or exc})"
            ) from None
    if security.client_ca is not None:
        try:
            context.load_verify_locations(security.client_ca)
        except (OSError, ssl.SSLError) as exc:
            raise KafkaConfigError(
                f"--tls-client-ca {security.client_ca}: not PEM CA certificates "
                f"({exc.strerror or exc})"
            ) from None


def serve(port: int, host: str, security: BrokerSecurity, say: Callable[[str], None]) -> None:
    """Runs the secured broker until SIGINT or SIGTERM."""
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    with EmbeddedBroker(port=port, host=host, security=security) as broker:
        tls = "TLS" if security.certfile else "plaintext"
        client_certificate = ", client certificate required" if security.client_ca else ""
        users = f", SASL users: {', '.join(sorted(security.users))}" if security.users else ""
        say(f"embedded broker (tansu behind its {tls} front{client_certificate}{users}) "
            f"on {broker.bootstrap}")  # fmt: skip
        stop.wait()
