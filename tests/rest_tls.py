"""A secured coordinator for tests: a throwaway CA (trustme), the server's certificate for
127.0.0.1, client certificates by CN, an access list file, and a real coordinator serving https
in a thread on the session's broker."""

from __future__ import annotations

import asyncio
import json
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import trustme

from sparkpoint.common.broker import free_port
from sparkpoint.common.kafka import make_admin
from sparkpoint.common.rest_security import RestSecurity, token_digest
from sparkpoint.common.settings import CheckpointConfig
from sparkpoint.common.topics import create_topics
from sparkpoint.coordinator.main import serve
from sparkpoint.coordinator.rest.flink_compat import WebUi
from sparkpoint.coordinator.service.instance import CoordinatorService, ServiceSettings
from tests.conftest import KafkaUnderTest
from tests.running_coordinator import Running, wait

OPERATE_TOKEN = "operate-token-5f1c0e7a9b3d4c21"
READ_TOKEN = "read-token-8e2a6b4f0c1d3e57"


@dataclass
class Pki:
    """A CA and the files made from it, under ``root``."""

    root: Path
    ca: trustme.CA = field(default_factory=trustme.CA)

    def __post_init__(self) -> None:
        server = self.ca.issue_cert("127.0.0.1", "localhost")
        server.private_key_pem.write_to_path(self.server_key)
        server.cert_chain_pems[0].write_to_path(self.server_cert)
        for pem in server.cert_chain_pems[1:]:
            pem.write_to_path(self.server_cert, append=True)
        self.ca.cert_pem.write_to_path(self.ca_file)

    @property
    def ca_file(self) -> Path:
        return self.root / "ca.pem"

    @property
    def server_cert(self) -> Path:
        return self.root / "rest.pem"

    @property
    def server_key(self) -> Path:
        return self.root / "rest.key"

    def client(self, common_name: str) -> tuple[Path, Path]:
        """A client certificate for ``common_name`` and its key."""
        issued = self.ca.issue_cert(f"{common_name}.clients.example", common_name=common_name)
        cert, key = self.root / f"{common_name}.pem", self.root / f"{common_name}.key"
        issued.cert_chain_pems[0].write_to_path(cert)
        issued.private_key_pem.write_to_path(key)
        return cert, key

    def context(self, client: str | None = None) -> ssl.SSLContext:
        """A client's context: trusts the CA, presents ``client``'s certificate if given."""
        context = ssl.create_default_context(cafile=str(self.ca_file))
        if client is not None:
            context.load_cert_chain(*self.client(client))
        return context


def write_access_list(path: Path, **extra: Any) -> Path:
    """An access list: ``alice`` operates (kept as a SHA-256), ``grafana`` reads (in clear)."""
    listed = {
        "tokens": [
            {"principal": "alice", "role": "operate", "sha256": token_digest(OPERATE_TOKEN)},
            {"principal": "grafana", "role": "read", "token": READ_TOKEN},
        ],
        **extra,
    }
    path.write_text(json.dumps(listed))
    return path


@dataclass
class Secured(Running):
    pki: Pki | None = None

    def https(self, client: str | None = None, token: str | None = None) -> httpx.Client:
        assert self.pki is not None
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(
            base_url=self.url, timeout=15, verify=self.pki.context(client), headers=headers
        )


def secured_coordinator(
    kafka: KafkaUnderTest,
    tmp_path: Path,
    pki: Pki,
    security: RestSecurity,
    web_ui: WebUi | None = None,
    history_url: str | None = None,
) -> Iterator[Secured]:
    """A coordinator serving https with ``security``, in a thread, on the current topic prefix;
    ``history_url``: the history service it adds earlier statistics from."""
    security.check()
    create_topics(make_admin(kafka.bootstrap), partitions=2)
    defaults = CheckpointConfig(
        checkpoint_dir=f"{tmp_path}/checkpoints", savepoint_dir=f"{tmp_path}/savepoints"
    )
    port = free_port()
    url = f"https://127.0.0.1:{port}"
    service = CoordinatorService(
        ServiceSettings(kafka.bootstrap, defaults, rest_url=url, history_url=history_url)
    )
    thread = threading.Thread(
        target=lambda: asyncio.run(serve(service, "127.0.0.1", port, web_ui, security)),
        daemon=True,
    )
    thread.start()
    operator = pki.context("test-harness") if security.client_ca else pki.context()
    try:
        wait(service.ready.is_set, what="partitions assigned")
        wait(lambda: _answers(f"{url}/", operator), what="REST up")
        yield Secured(service, url, kafka.bootstrap, tmp_path, pki)
    finally:
        service.stop()
        thread.join(20)


def _answers(url: str, context: ssl.SSLContext) -> bool:
    try:
        return httpx.get(url, timeout=1, verify=context).status_code == 200
    except httpx.HTTPError:
        return False
