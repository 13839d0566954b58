"""The history service's REST security: the coordinator's (`sparkpoint.common.rest_security`),
on faust's aiohttp web server.

- TLS: faust's ``web_ssl_context`` setting, which faust hands to aiohttp's ``TCPSite``: the
  server's certificate and key and, with a client CA, mutual TLS (the handshake fails without a
  certificate that CA signed). The principal of a certificate is its subject CN.
- Authentication: `guard`, an aiohttp middleware (faust's ``web_application_options``) that asks
  `decision.judge` of every request, as the coordinator's ASGI guard does; the client
  certificate is read from the request's own connection.
- The history service only reads, so the read role suffices for everything: a request it does
  not serve (any method but GET) gets aiohttp's own answer (404, 405) once authenticated.
- Open without a credential: `PUBLIC_PAGES`, the dashboard's page (whose requests carry the
  token kept for its tab) and the health endpoint, which holds no job's data.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler

from sparkpoint.common.rest_security import RestSecurity
from sparkpoint.common.rest_security.access import Refusal
from sparkpoint.common.rest_security.access_file import access_source
from sparkpoint.common.rest_security.decision import Asked, judge
from sparkpoint.common.rest_security.tls import tls_extension

log = logging.getLogger(__name__)

PUBLIC_PAGES = frozenset({"/", "/history/status"})
"""Read without a credential: the dashboard's page and the health endpoint (ready or not, and
how many jobs and events: no job's data)."""


def web_options(security: RestSecurity) -> dict[str, Any]:
    """faust's settings serving the history's REST API with ``security`` (checked already:
    `RestSecurity.check`); nothing configured, none (plain HTTP, every request served)."""
    options: dict[str, Any] = {}
    tls = security.tls
    if tls is not None:
        options["web_ssl_context"] = tls.server_context()
    if security.authenticates:
        options["web_application_options"] = {"middlewares": [guard(security)]}
    return options


def guard(security: RestSecurity) -> Callable[[web.Request, Handler], Any]:
    """The middleware judging every request by ``security`` before its handler runs."""
    access = access_source(security.access_file)

    @web.middleware
    async def judged(request: web.Request, handler: Handler) -> web.StreamResponse:
        transport = request.transport
        asked = Asked(
            request.method,
            request.path,
            request.remote,
            request.headers.get("Authorization"),
            tls=tls_extension(transport) if transport is not None else None,
        )
        verdict = judge(security, access, asked, PUBLIC_PAGES, read_only=True)
        if isinstance(verdict, Refusal):
            log.info(
                "REST %s %s from %s refused: %s", asked.method, asked.path, asked.peer,
                verdict.message,
            )  # fmt: skip
            return refused(verdict)
        return await handler(request)

    return judged


def refused(refusal: Refusal) -> web.Response:
    """The refusal in Flink's error body, a 401 with its ``WWW-Authenticate`` challenge."""
    headers = {"WWW-Authenticate": refusal.challenge} if refusal.challenge is not None else None
    return web.Response(
        body=refusal.body(), status=refusal.status, content_type="application/json",
        headers=headers,
    )  # fmt: skip
