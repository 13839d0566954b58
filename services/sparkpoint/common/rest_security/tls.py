"""TLS on a REST endpoint served by uvicorn: the server's certificate and key (PEM), and with a
client CA, mutual TLS (every client presents a certificate the CA signed, or the handshake
fails); the client certificate of each request; and the context an instance uses to call
another one.

uvicorn does not put the peer's certificate in the ASGI scope. `protocol_class` is uvicorn's own
HTTP protocol (the one ``uvicorn.protocols.http.auto`` picks) with one change: once a
connection's handshake is done, the app it runs is wrapped so that every request of that
connection carries the ASGI TLS extension (``scope["extensions"]["tls"]``, with
``client_cert_name``, the certificate as ``getpeercert()`` gives it, and ``tls_version``). The
certificate thus travels with the connection itself: no table keyed by client address, which a
proxy header could rewrite or a reused port could confuse.
"""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.protocols.http.auto import AutoHTTPProtocol

from sparkpoint.common.rest_security.access import certificate_name

TLS_EXTENSION = "tls"


class TlsError(ValueError):
    """A certificate, key or CA file cannot be used; the message names the file."""


@dataclass(frozen=True)
class TlsFiles:
    certificate: Path
    """PEM: the server's certificate, followed by any intermediate CA certificates."""
    private_key: Path
    """PEM, not encrypted (keep it readable only by the service's user)."""
    client_ca: Path | None = None
    """PEM CA certificates: clients must present a certificate one of them signed."""

    def server_context(self) -> ssl.SSLContext:
        """The server's context (TLS 1.2 at least), each file checked with an error naming it."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        _load_chain(context, self.certificate, self.private_key)
        if self.client_ca is not None:
            _load_ca(context, self.client_ca, "client CA")
            context.verify_mode = ssl.CERT_REQUIRED
        return context

    def uvicorn_options(self) -> dict[str, Any]:
        """``uvicorn.Config`` keywords serving these files, the peer certificate in each
        request's scope (`protocol_class`)."""
        self.server_context()  # a bad file fails here, naming itself, not inside uvicorn
        return {
            "ssl_certfile": str(self.certificate),
            "ssl_keyfile": str(self.private_key),
            "ssl_ca_certs": str(self.client_ca) if self.client_ca else None,
            "ssl_cert_reqs": ssl.CERT_REQUIRED if self.client_ca else ssl.CERT_NONE,
            "http": protocol_class(),
        }

    def peer_context(self) -> ssl.SSLContext:
        """How this instance calls another one (forwarding a request, as Flink's REST client
        does with the same ``security.ssl.rest.*`` files): the system's CAs and the client CA
        verify the other's certificate; with mutual TLS, this instance's own certificate and key
        are its client certificate."""
        context = ssl.create_default_context()
        if self.client_ca is not None:
            _load_ca(context, self.client_ca, "client CA")
            _load_chain(context, self.certificate, self.private_key)
        return context


def _load_chain(context: ssl.SSLContext, certificate: Path, key: Path) -> None:
    for path, what in ((certificate, "certificate"), (key, "private key")):
        if not path.is_file():
            raise TlsError(f"{path}: no such file (the REST {what})")
    try:
        context.load_cert_chain(certificate, key)
    except ssl.SSLError as exc:
        raise TlsError(
            f"{certificate} and {key}: not a PEM certificate and its unencrypted private key "
            f"({exc.reason or exc})"
        ) from None


def _load_ca(context: ssl.SSLContext, ca: Path, what: str) -> None:
    if not ca.is_file():
        raise TlsError(f"{ca}: no such file (the REST {what})")
    try:
        context.load_verify_locations(cafile=ca)
    except ssl.SSLError as exc:
        raise TlsError(f"{ca}: not PEM CA certificates ({exc.reason or exc})") from None


class WithPeerCertificate:
    """One TLS connection's app: every request's scope gets the ASGI TLS extension."""

    def __init__(self, app: ASGIApp, tls: dict[str, Any]) -> None:
        self.app = app
        self.tls = tls

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        scope.setdefault("extensions", {})[TLS_EXTENSION] = self.tls
        await self.app(scope, receive, send)


def tls_extension(transport: asyncio.BaseTransport) -> dict[str, Any] | None:
    """The ASGI TLS extension of a connection (None when it is not TLS)."""
    ssl_object = transport.get_extra_info("ssl_object")
    if ssl_object is None:
        return None
    certificate = ssl_object.getpeercert() or {}
    return {
        "client_cert_name": certificate_name(certificate) if certificate else None,
        "client_cert": certificate,
        "tls_version": ssl_object.version(),
        "cipher_suite": (ssl_object.cipher() or (None,))[0],
    }


def protocol_class() -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol, each TLS connection's app given its peer certificate."""

    class RecordingPeerCertificate(AutoHTTPProtocol):  # type: ignore[misc,valid-type]
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(transport)
            tls = tls_extension(transport)
            if tls is not None:  # the app each request of this connection runs
                self.app = WithPeerCertificate(getattr(self, "app"), tls)  # noqa: B009

    return RecordingPeerCertificate
