"""`RestGuard`: the ASGI middleware that authenticates and authorizes every request of a REST
endpoint (`access`), and decides the principal that the audit records (`audited_principal`).

The audited principal is the authenticated one. The ``X-Sparkpoint-Principal`` header is
believed only from a trusted proxy's address (a proxy that authenticated the user itself; the
request must still carry the proxy's own credential, whose role is what it may do); without any
security setting it is believed from everyone, as before.

Refusals are Flink's error body, ``{"errors": [...]}``: 401 (no valid credential, with
``WWW-Authenticate: Bearer``), 403 (the role does not allow the method), 503 (the access list
cannot be read). Tokens are never logged: what is logged names the principal.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Collection

from starlette.types import ASGIApp, Receive, Scope, Send

from sparkpoint.common.rest_security.access import (
    READ_METHODS,
    AccessList,
    Identity,
    Refusal,
    authenticate,
    authorize,
)
from sparkpoint.common.rest_security.settings import RestSecurity, trusted
from sparkpoint.common.rest_security.tls import TLS_EXTENSION

log = logging.getLogger(__name__)

PRINCIPAL = "sparkpoint.principal"
"""Scope key: the principal the audit records for this request."""

PRINCIPAL_HEADER = b"x-sparkpoint-principal"

PUBLIC_PAGES = frozenset({"/", "/openapi.json"})
"""Read without a credential: pages that hold no job's data (the dashboard's page, whose own
requests carry a token, and the API's description)."""


def audited_principal(scope: Scope) -> str | None:
    """The principal `RestGuard` decided for the request (None: no guard, the caller decides)."""
    principal = scope.get(PRINCIPAL)
    return principal if isinstance(principal, str) else None


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            text: str = value.decode("latin-1")
            return text
    return None


class RestGuard:
    """Authenticates and authorizes each HTTP request (`RestSecurity`); ``access``: the access
    list as it is now (None while its file cannot be read). Requests to ``public`` paths with a
    read method need no credential."""

    def __init__(
        self,
        app: ASGIApp,
        security: RestSecurity,
        access: Callable[[], AccessList | None],
        public: Collection[str] = PUBLIC_PAGES,
    ) -> None:
        self.app = app
        self.security = security
        self.access = access
        self.public = frozenset(public)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        method, path = scope["method"], scope["path"]
        peer = (scope.get("client") or (None,))[0]
        from_proxy = trusted(peer, self.security.trusted_proxies)
        header = _header(scope, PRINCIPAL_HEADER) if from_proxy else None
        if not self.security.authenticates:
            scope[PRINCIPAL] = header or f"anonymous@{peer or 'unknown'}"
            await self.app(scope, receive, send)
            return
        if method in READ_METHODS and path in self.public:
            await self.app(scope, receive, send)
            return
        judged = self.identify(scope)
        refusal = judged if isinstance(judged, Refusal) else authorize(judged, method, path)
        if refusal is not None:
            log.info("REST %s %s from %s refused: %s", method, path, peer, refusal.message)
            await _refuse(refusal, send)
            return
        assert isinstance(judged, Identity)
        scope[PRINCIPAL] = header or judged.principal
        if method not in READ_METHODS:
            log.info(
                "REST %s %s by %s (%s, %s)%s", method, path, judged.principal, judged.role.value,
                judged.credential, f" for {header}" if header else "",
            )  # fmt: skip
        await self.app(scope, receive, send)

    def identify(self, scope: Scope) -> Identity | Refusal:
        """Who sends the request: its bearer token, else its client certificate."""
        access = self.access()
        tls = scope.get("extensions", {}).get(TLS_EXTENSION) or {}
        certificate = tls.get("client_cert_name")
        if self.security.client_ca is not None and not tls.get("client_cert"):
            # the handshake demands a certificate: none here means the protocol that records it
            # is not wired in (`RestSecurity.uvicorn_options`)
            log.error("REST request without a recorded client certificate: refused")
            return Refusal(401, "no client certificate was presented", None)
        if tls.get("client_cert") and certificate is None:
            return Refusal(401, "the client certificate names no principal (no subject CN)")
        return authenticate(_header(scope, b"authorization"), certificate, access)


async def _refuse(refusal: Refusal, send: Send) -> None:
    body = json.dumps({"errors": [refusal.message]}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if refusal.challenge is not None:
        headers.append((b"www-authenticate", refusal.challenge.encode()))
    await send({"type": "http.response.start", "status": refusal.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
