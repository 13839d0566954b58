"""Security of a REST endpoint (the coordinator's, the history service's): TLS and mutual TLS
(`tls`), who may do what (`access`: the ``read`` and ``operate`` roles, bearer tokens kept by
their SHA-256, client certificates by name), the operator's access list file, read again when it
changes (`access_file`), the settings from flags and YAML keys (`settings`), what is done with
one request (`decision`: let in as a principal, or refused; no I/O, whichever server carries
it), and the ASGI middleware that applies it and names the audited principal (`guard`). The
history service applies the same decision in an aiohttp middleware
(`sparkpoint.history.security`).

An ASGI service wires it in two places (`install` and `RestSecurity.uvicorn_options`)::

    security.check()                        # at start: every file usable, or a clear error
    install(app, security)                  # the middleware, outermost but for path rewriting
    uvicorn.Config(app, ..., **security.uvicorn_options())

and reads the audited principal of a request with `audited_principal`. With nothing configured
neither does anything: the endpoint behaves as it did before.
"""

from __future__ import annotations

from collections.abc import Collection

from starlette.applications import Starlette

from sparkpoint.common.rest_security.access import AccessList, Role, token_digest
from sparkpoint.common.rest_security.access_file import access_source
from sparkpoint.common.rest_security.guard import (
    PUBLIC_PAGES,
    RestGuard,
    audited_principal,
)
from sparkpoint.common.rest_security.settings import (
    RestSecurity,
    SecuritySettingsError,
    proxy_network,
)

__all__ = [
    "PUBLIC_PAGES",
    "AccessList",
    "RestGuard",
    "RestSecurity",
    "Role",
    "SecuritySettingsError",
    "audited_principal",
    "install",
    "proxy_network",
    "token_digest",
]


def install(app: Starlette, security: RestSecurity, public: Collection[str] = PUBLIC_PAGES) -> None:
    """Adds `RestGuard` to ``app`` (as the outermost middleware so far: add it before any
    middleware that should run after it). Nothing when no security setting is given."""
    if not security.configured:
        return
    access = access_source(security.access_file)
    app.add_middleware(RestGuard, security=security, access=access, public=public)
