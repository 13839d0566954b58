"""The development CA's certificates pass strict X.509 verification (OpenSSL's -x509_strict,
which Python 3.13's default context turns on): a TLS handshake over a socket pair, each side
verifying the other with VERIFY_X509_STRICT, the server's certificate also as a client's (a
coordinator presents it under mutual TLS)."""

from __future__ import annotations

import socket
import ssl
import threading
from pathlib import Path

import pytest

from sparkpoint.common.dev_certs import make_dev_certs

pytestmark = pytest.mark.integration


def strict(context: ssl.SSLContext) -> ssl.SSLContext:
    context.verify_flags |= ssl.VERIFY_X509_STRICT
    return context


def handshake(server: ssl.SSLContext, client: ssl.SSLContext) -> str | None:
    """The server's view of the client certificate's CN, after a strict handshake both ways."""
    left, right = socket.socketpair()
    seen: list[str | None] = []

    def serve() -> None:
        with server.wrap_socket(left, server_side=True) as tls:
            peer = tls.getpeercert() or {}
            names = dict(x[0] for x in peer.get("subject", ()))
            seen.append(names.get("commonName"))

    thread = threading.Thread(target=serve)
    thread.start()
    with client.wrap_socket(right, server_hostname="localhost"):
        pass
    thread.join(10)
    return seen[0] if seen else None


@pytest.mark.parametrize("client_name", ["alice", None])
def test_dev_certificates_pass_strict_verification(tmp_path: Path, client_name: str | None) -> None:
    certs = make_dev_certs(tmp_path, ["localhost", "127.0.0.1"], ["alice"])
    server = strict(ssl.create_default_context(ssl.Purpose.CLIENT_AUTH))
    server.load_cert_chain(certs.server)
    server.verify_mode = ssl.CERT_REQUIRED
    server.load_verify_locations(certs.ca)
    client = strict(ssl.create_default_context(cafile=str(certs.ca)))
    if client_name is None:  # the server's own certificate, as a coordinator presents it
        client.load_cert_chain(certs.server)
    else:
        client.load_cert_chain(certs.client_cert(client_name), certs.client_key(client_name))
    assert handshake(server, client) == (client_name or "localhost")
