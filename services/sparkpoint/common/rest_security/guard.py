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

import logging
from collections.abc import Callable, Collection

from starlette.types import ASGIApp, Receive, Scope, Send

from sparkpoint.common.rest_security.access import READ_METHODS, AccessList, Identity, Refusal
from sparkpoint.common.rest_security.decision import Asked, judge
from sparkpoint.common.rest_security.settings import RestSecurity
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
    """Authenticates and authorizes each HTTP request (`RestSecurity`, by `decision.judge`);
    ``access``: the access list as it is now (None while its file cannot be read). Requests to
    ``public`` paths with a read method need no credential."""

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
        asked = Asked(
            scope["method"],
            scope["path"],
            (scope.get("client") or (None,))[0],
            _header(scope, b"authorization"),
            _header(scope, PRINCIPAL_HEADER),
            scope.get("extensions", {}).get(TLS_EXTENSION),
        )
        judged = judge(self.security, self.access, asked, self.public)
        if isinstance(judged, Refusal):
            log.info(
                "REST %s %s from %s refused: %s", asked.method, asked.path, asked.peer,
                judged.message,
            )  # fmt: skip
            await _refuse(judged, send)
            return
        if judged.principal is not None:
            scope[PRINCIPAL] = judged.principal
        if judged.identity is not None and asked.method not in READ_METHODS:
            _log_operation(asked, judged.identity, judged.on_behalf)
        await self.app(scope, receive, send)


def _log_operation(asked: Asked, identity: Identity, on_behalf: str | None) -> None:
    """What an operation's log line says: the principal, its role and credential, never the
    token."""
    log.info(
        "REST %s %s by %s (%s, %s)%s", asked.method, asked.path, identity.principal,
        identity.role.value, identity.credential, f" for {on_behalf}" if on_behalf else "",
    )  # fmt: skip


async def _refuse(refusal: Refusal, send: Send) -> None:
    body = refusal.body()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if refusal.challenge is not None:
        headers.append((b"www-authenticate", refusal.challenge.encode()))
    await send({"type": "http.response.start", "status": refusal.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
