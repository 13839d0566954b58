"""What a secured REST endpoint does with one request, whichever server carries it (the
coordinator's ASGI middleware, `guard`; the history service's aiohttp middleware): let it in,
naming the principal the audit records, or refuse it (`access.Refusal`). No I/O: the access
list comes from a callable, asked only when a credential has to be checked.

The rules, in order:

1. Without authentication (no access file, no client CA) every request is let in; its principal
   is the ``X-Sparkpoint-Principal`` header when a trusted proxy sent it, else
   ``anonymous@<peer>``. This holds as soon as anything is configured, TLS alone or trusted
   proxies alone included: once the operator secured the endpoint, a header that any caller can
   write is no identity, so from anyone but a trusted proxy it is ignored. Only with nothing
   configured at all is there no guard (`sparkpoint.common.rest_security.install`), and the
   handlers believe the header from everyone, as before.
2. A read (GET, HEAD, OPTIONS) of a ``public`` path is let in with no principal: pages that hold
   no job's data.
3. Else the caller must prove who it is (`identify`: a bearer token, else the client
   certificate; under mutual TLS a request without a recorded certificate is refused, never let
   through) and its role must allow the method (`access.authorize`). A ``read_only`` endpoint
   (the history service, which changes nothing) needs no more than the read role for any method:
   what it does not serve gets the server's own answer (404, 405).
4. The audited principal is the authenticated one, or the trusted proxy's header.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from sparkpoint.common.rest_security.access import (
    READ_METHODS,
    AccessList,
    Identity,
    Refusal,
    authenticate,
    authorize,
)
from sparkpoint.common.rest_security.settings import RestSecurity, trusted

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Asked:
    """One request, as much of it as the decision reads."""

    method: str
    path: str
    peer: str | None
    """The client's address (the TCP peer's, never a forwarded header's)."""
    authorization: str | None = None
    principal_header: str | None = None
    """``X-Sparkpoint-Principal``, believed only from a trusted proxy."""
    tls: Mapping[str, Any] | None = None
    """The connection's ASGI TLS extension (`tls.tls_extension`); None: not TLS."""


@dataclass(frozen=True)
class Admitted:
    """A request let in: ``principal`` is what the audit records (None: a public page, read by
    no one in particular); ``identity`` who proved it (None without authentication);
    ``on_behalf`` the user a trusted proxy named."""

    principal: str | None
    identity: Identity | None = None
    on_behalf: str | None = None


def judge(
    security: RestSecurity,
    access: Callable[[], AccessList | None],
    asked: Asked,
    public: Collection[str],
    read_only: bool = False,
) -> Admitted | Refusal:
    """The rules above; ``access``: the access list as it is now (None while its file cannot be
    read: every request that needs it is then refused, 503)."""
    from_proxy = trusted(asked.peer, security.trusted_proxies)
    header = asked.principal_header if from_proxy else None
    if not security.authenticates:  # TLS or trusted proxies only: the header from a proxy alone
        return Admitted(header or f"anonymous@{asked.peer or 'unknown'}")
    if asked.method in READ_METHODS and asked.path in public:
        return Admitted(None)
    identity = identify(security, access, asked)
    if isinstance(identity, Refusal):
        return identity
    refusal = None if read_only else authorize(identity, asked.method, asked.path)
    if refusal is not None:
        return refusal
    return Admitted(header or identity.principal, identity, header)


def identify(
    security: RestSecurity, access: Callable[[], AccessList | None], asked: Asked
) -> Identity | Refusal:
    """Who sends the request: its bearer token, else its client certificate."""
    listed = access()
    tls = asked.tls or {}
    certificate = tls.get("client_cert_name")
    if security.client_ca is not None and not tls.get("client_cert"):
        # the handshake demands a certificate: none here means the server does not record it
        # (uvicorn without `RestSecurity.uvicorn_options`, aiohttp without the transport's)
        log.error("REST request without a recorded client certificate: refused")
        return Refusal(401, "no client certificate was presented", None)
    if tls.get("client_cert") and certificate is None:
        return Refusal(401, "the client certificate names no principal (no subject CN)")
    return authenticate(asked.authorization, certificate, listed)
