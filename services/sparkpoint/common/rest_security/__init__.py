"""Security of a REST endpoint (the coordinator's, the history service's): TLS and mutual TLS
(`tls`), who may do what (`access`: the ``read`` and ``operate`` roles, bearer tokens kept by
their SHA-256, client certificates by name), the operator's access list file, read again when it
changes (`access_file`), the settings from flags and YAML keys (`settings`), and the middleware
that authenticates, authorizes and names the audited principal (`guard`).

A service wires it in two places (`install` and `RestSecurity.uvicorn_options`)::

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
from sparkpoint.common.rest_security.access_file import AccessFile
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
    if security.access_file is not None:
        access = AccessFile(security.access_file).current
    else:
        certificates_only = AccessList()
        access = lambda: certificates_only  # noqa: E731
    app.add_middleware(RestGuard, security=security, access=access, public=public)
