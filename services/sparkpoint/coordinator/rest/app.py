"""The coordinator's REST API, in Flink's JSON shapes (FastAPI; ``GET /openapi.json``).

Errors are Flink's ``{"errors": ["message"]}`` with a 4xx or 503 status; a message about a
request field names the field. A request for a job that another coordinator instance owns is
answered with a 307 redirect to the same request on the owner (method and body kept); one for a
job that no instance owns answers 404 (see the README for how requests find the owning instance).
Every operation declares in ``/openapi.json`` each status it can answer and the body of each.

The handlers are grouped as Flink groups its own (flink-runtime ``rest/handler/``): `jobs`
(``job/``), `checkpoints` (``job/checkpoints/``), `savepoints` (``job/savepoints/``), `cluster`
(``cluster/``), and `config` (FLIP-571's configuration update); each is built with the
`RestContext` (`deps`) it may use. This module builds the app: Flink's paths (`FlinkPaths`),
the security of the endpoint (`sparkpoint.common.rest_security`: authentication, roles, the
audited principal; inside `FlinkPaths`, so it judges the path a request names after ``/v1`` and
``/flink`` are stripped), the error handlers and the routers.
"""

from __future__ import annotations

import ssl
from typing import Any
from urllib.parse import quote

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, RedirectResponse
from starlette.exceptions import HTTPException

from sparkpoint.common.flink_ids import is_flink_id
from sparkpoint.common.rest_security import RestSecurity, install
from sparkpoint.coordinator.rest import checkpoints, cluster, config, jobs, savepoints
from sparkpoint.coordinator.rest.deps import NotHere, RestContext, error
from sparkpoint.coordinator.rest.flink_compat import (
    FORWARD,
    FORWARDED_HEADER,
    FlinkPaths,
    WebUi,
    forward,
)
from sparkpoint.coordinator.rest.models import CoordinatorApp
from sparkpoint.coordinator.service.owned import TriggerIdInUse

HOP = "sparkpoint-hop"
"""Query parameter of a redirect for a JobID this instance does not know: the partitions tried
so far, which the instance it goes to does not send it on for again."""


def hops(value: str | None) -> set[int]:
    """The partitions a request was already sent on for (``1,3``); anything else: none."""
    tried = set()
    for part in (value or "").split(","):
        if part.strip().isdigit() and len(part.strip()) < 10:
            tried.add(int(part))
    return tried


def create_app(
    ctx: RestContext, web_ui: WebUi | None = None, security: RestSecurity | None = None
) -> FastAPI:
    """The API; ``web_ui``: Flink's dashboard, served at ``/flink/`` (`flink_compat`);
    ``security``: TLS, authentication and roles (none: every request is served, as before)."""
    security = security or RestSecurity()
    app = CoordinatorApp(
        title="sparkpoint coordinator",
        version="1",
        description="Flink-compatible checkpoint REST API for Spark jobs. Every path also "
        "answers under /v1/, and /jobs/{jobid} takes the job id or its Flink JobID.",
        docs_url=None,
        redoc_url=None,
    )
    install(app, security)
    app.add_middleware(FlinkPaths, resolve=ctx.resolve, web_ui=web_ui)
    app.exception_handler(RequestValidationError)(invalid)
    tls = security.tls
    peer_tls = tls.peer_context() if tls else None  # for other instances and the history service
    app.exception_handler(NotHere)(Elsewhere(ctx, peer_tls).answer)
    app.exception_handler(TriggerIdInUse)(trigger_id_in_use)
    app.exception_handler(HTTPException)(http_error)
    # jobs first: its /jobs/overview before /jobs/{jobid}; no path of one group matches
    # another's, so the order of the groups changes only the order of /openapi.json's paths
    for router in (
        jobs.router(ctx),
        cluster.router(ctx),
        checkpoints.router(ctx, peer_tls),
        config.router(ctx),
        savepoints.router(ctx),
    ):
        app.include_router(router)
    return app


async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
    """A request that does not validate: 400, a message per problem, each naming its field."""
    messages = []
    for problem in exc.errors():
        where = [str(part) for part in problem.get("loc", ()) if part != "body"]
        field = ".".join(where) or "body"
        kind = problem.get("type", "")
        if kind == "extra_forbidden":
            messages.append(f"{field}: unknown field")
        elif kind == "json_invalid":  # its loc is ("body", offset): name the body instead
            detail = (problem.get("ctx") or {}).get("error")
            messages.append(f"body: invalid JSON ({detail})" if detail else "body: invalid JSON")
        else:
            messages.append(f"{field}: {problem.get('msg', 'invalid')}")
    return error(400, *messages)


class Elsewhere:
    """Answers `NotHere`: a job owned by another instance. ``peer_tls``: how to call another
    instance over TLS when forwarding (None: the default trust)."""

    def __init__(self, ctx: RestContext, peer_tls: ssl.SSLContext | None = None) -> None:
        self.ctx = ctx
        self.peer_tls = peer_tls

    async def answer(self, request: Request, exc: NotHere) -> Any:
        """307 to the same request there (method and body kept), or for Flink's clients, which
        follow no redirect, that instance's answer; 404 when no instance owns it. A JobID this
        instance does not know names up to two partitions: each hop says which were tried, so
        none is asked twice and none loops."""
        tried = hops(request.query_params.get(HOP)) | hops(request.headers.get(FORWARDED_HEADER))
        routed = self.ctx.route(exc.job_id, tried)
        if routed is None:
            return error(404, f"Job {exc.job_id} not found")
        owner, partition = routed
        tried.add(partition)
        query = "&".join(
            f"{quote(k)}={quote(v)}" for k, v in request.query_params.multi_items() if k != HOP
        )
        if FORWARD in request.scope:
            body = await request.body()
            return await forward(owner, request.scope, body, query, tried, self.peer_tls)
        if is_flink_id(exc.job_id):
            hop = f"{HOP}={','.join(map(str, sorted(tried)))}"
            query = f"{query}&{hop}" if query else hop
        query = f"?{query}" if query else ""
        return RedirectResponse(f"{owner}{request.url.path}{query}", status_code=307)


async def trigger_id_in_use(request: Request, exc: TriggerIdInUse) -> JSONResponse:
    return error(400, f"triggerId: {exc.trigger_id} names another operation")


async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
    return error(exc.status_code, str(exc.detail))
