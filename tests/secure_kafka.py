"""A secured embedded broker for tests: TLS with a throwaway CA (common/dev_certs.py), a client
certificate required, and SCRAM-SHA-512 users, behind the broker's front (common/broker_front.py);
and the librdkafka properties files a client needs to reach it, or to fail to."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from sparkpoint.common.broker import BrokerSecurity, EmbeddedBroker
from sparkpoint.common.dev_certs import make_dev_certs

USER = "sparkpoint"


@dataclass(frozen=True)
class SecureKafka:
    bootstrap: str
    files: Path
    password: str
    """The SCRAM password: it must appear in no log, event or page."""
    broker: EmbeddedBroker

    @property
    def properties(self) -> dict[str, str]:
        return {
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": USER,
            "sasl.password": self.password,
            "ssl.ca.location": str(self.files / "ca.pem"),
            "ssl.certificate.location": str(self.files / "client.pem"),
            "ssl.key.location": str(self.files / "client.key"),
        }

    @property
    def config(self) -> Path:
        """The properties file that reaches the broker."""
        return self.write("client.properties")

    def write(self, name: str, **changes: str | None) -> Path:
        """A properties file: this broker's, with ``changes`` (None removes a key)."""
        properties = self.properties | changes
        path = self.files / name
        path.write_text("".join(f"{k}={v}\n" for k, v in properties.items() if v is not None))
        return path


@contextmanager
def secure_kafka(files: Path) -> Iterator[SecureKafka]:
    certs = make_dev_certs(files, ["127.0.0.1", "localhost"], ["client"])
    make_dev_certs(files / "other", ["127.0.0.1"], [])
    (files / "other-ca.pem").write_bytes((files / "other" / "ca.pem").read_bytes())
    password = f"scram-{uuid.uuid4().hex}"
    server = str(certs.server)
    security = BrokerSecurity(server, server, str(certs.ca), {USER: password})
    with EmbeddedBroker(security=security, log_file=files / "broker.log") as broker:
        yield SecureKafka(broker.bootstrap, files, password, broker)
