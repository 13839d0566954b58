"""What Flink's own tools need from the coordinator's REST API beyond Flink's JSON shapes.

- **Versioned paths**: Flink's REST client (the ``flink`` CLI, the Kubernetes operator) sends
  ``/v1/jobs/overview``; every path also answers under ``/v1/``, as Flink's own does.
- **JobIDs**: Flink's tools name jobs by a 32-hex JobID (`sparkpoint.common.flink_ids`); a
  ``/jobs/{jobid}/...`` path takes the JobID or the job id.
- **No redirects for Flink's clients**: Flink's REST client does not follow a 307, so a request
  that came through ``/v1/`` or the dashboard for a job another instance owns is forwarded to
  that instance and its answer returned (a plain request still gets the documented 307). The
  forwarded request keeps the caller's bearer token, so a request that came over https is never
  forwarded to an owner announced on plain http (503 naming it); between instances that all
  serve plain http it is, as the operator chose.
- **Flink's web dashboard** (``sparkpoint coordinator --flink-web-ui PATH``): the Angular app
  from a flink-dist jar's ``web/`` folder or an unpacked folder, served at ``/flink/``. It asks
  for REST paths relative to where it is served (``/flink/jobs/overview``): those are routed as
  the REST paths they name.
"""

from __future__ import annotations

import asyncio
import json
import logging
import mimetypes
import ssl
import weakref
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from sparkpoint.common.flink_ids import is_flink_id
from sparkpoint.common.rest_security import audited_principal

log = logging.getLogger(__name__)

FLINK_VERSION = "2.3.0"
"""The Flink release whose REST API and dashboard this one answers as."""

DASHBOARD_PREFIX = "/flink"
VERSION_PREFIX = "/v1"
FORWARD = "sparkpoint.forward"
"""Scope key: the request came from a Flink client (versioned or dashboard path) and is
forwarded, not redirected, to the owning instance; the value is the path to forward it to (the
versioned path, as sent, still percent-encoded)."""
FORWARDED_HEADER = "x-sparkpoint-forwarded"
"""Set on a forwarded request: the partitions it was already sent on for."""


class WebUiError(ValueError):
    """``--flink-web-ui`` names nothing that holds Flink's dashboard."""


@dataclass(frozen=True)
class WebUi:
    """The files of Flink's web dashboard: ``web/`` inside a flink-dist jar, or a folder."""

    files: dict[str, bytes]

    @classmethod
    def load(cls, path: Path) -> WebUi:
        if path.is_dir():
            root = path / "web" if (path / "web" / "index.html").is_file() else path
            if not (root / "index.html").is_file():
                raise WebUiError(f"{path}: no index.html (expected Flink's web/ folder)")
            files = {
                p.relative_to(root).as_posix(): p.read_bytes()
                for p in root.rglob("*")
                if p.is_file()
            }
            return cls(files)
        if not zipfile.is_zipfile(path):
            raise WebUiError(
                f"{path}: neither a folder nor a jar (e.g. pyflink/lib/flink-dist-*.jar)"
            )
        with zipfile.ZipFile(path) as jar:
            files = {
                name[len("web/") :]: jar.read(name)
                for name in jar.namelist()
                if name.startswith("web/") and not name.endswith("/")
            }
        if "index.html" not in files:
            raise WebUiError(f"{path}: the jar has no web/index.html (not a flink-dist jar?)")
        return cls(files)

    def response(self, name: str) -> Response | None:
        """The file ``name`` (``""``: index.html), or None when the bundle has no such file."""
        name = name or "index.html"
        body = self.files.get(name)
        if body is None:
            return None
        kind = mimetypes.guess_type(name)[0] or "application/octet-stream"
        return Response(body, media_type=kind, headers={"Cache-Control": "no-cache"})


class FlinkPaths:
    """ASGI middleware: strips ``/v1`` and ``/flink``, serves the dashboard's files, and puts
    the job id in place of a JobID the instance knows (``resolve``: the service's), before the
    API routes the request."""

    def __init__(self, app: ASGIApp, resolve: Callable[[str], str], web_ui: WebUi | None) -> None:
        self.app = app
        self.resolve = resolve
        self.web_ui = web_ui

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        sent = path = scope["path"]
        from_flink = False
        if path == VERSION_PREFIX or path.startswith(f"{VERSION_PREFIX}/"):
            path, from_flink = path[len(VERSION_PREFIX) :] or "/", True
        elif self.web_ui is not None and (
            path == DASHBOARD_PREFIX or path.startswith(f"{DASHBOARD_PREFIX}/")
        ):
            if path == DASHBOARD_PREFIX:  # relative URLs need the slash
                await Response(status_code=307, headers={"Location": f"{DASHBOARD_PREFIX}/"})(
                    scope, receive, send
                )
                return
            name = path[len(DASHBOARD_PREFIX) + 1 :]
            static = self.web_ui.response(name) if scope["method"] in ("GET", "HEAD") else None
            if static is not None:
                await static(scope, receive, send)
                return
            path, from_flink = f"/{name}", True
        parts = path.split("/", 3)
        if len(parts) >= 3 and parts[1] == "jobs" and is_flink_id(parts[2]):
            parts[2] = self.resolve(parts[2])
            path = "/".join(parts)
        if path != sent or from_flink:
            raw = scope.get("raw_path") or sent.encode()
            scope = dict(scope, path=path, raw_path=quote(path).encode())
            if from_flink:  # forwarded as sent (still encoded), as Flink's client sends it
                prefix = DASHBOARD_PREFIX if not sent.startswith(VERSION_PREFIX) else VERSION_PREFIX
                scope[FORWARD] = VERSION_PREFIX + raw.decode("latin-1")[len(prefix) :]
        await self.app(scope, receive, send)


_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[int, httpx.AsyncClient]] = (
    weakref.WeakKeyDictionary()
)

FORWARDED_HEADERS = (
    b"content-type", b"accept", b"x-sparkpoint-principal", b"x-request-id", b"authorization",
)  # fmt: skip
"""What a forwarded request keeps of the client's headers: its bearer token too, so the owning
instance authenticates the client itself."""


def http_client(tls: ssl.SSLContext | None = None) -> httpx.AsyncClient:
    """One client per event loop (and TLS context: ``tls``, None for the default trust), kept:
    a new one loads the CA bundle (about 30 ms a request, measured by bench/flink_rest.py) and
    opens a new connection."""
    clients = _clients.setdefault(asyncio.get_running_loop(), {})
    client = clients.get(id(tls))
    if client is None:
        verify: ssl.SSLContext | bool = tls if tls is not None else True
        client = clients[id(tls)] = httpx.AsyncClient(timeout=30, verify=verify)
    return client


async def forward(
    owner: str,
    scope: Scope,
    body: bytes,
    query: str,
    tried: set[int],
    tls: ssl.SSLContext | None = None,
) -> Response:
    """The owning instance's answer to the same request, for a Flink client that cannot follow
    a redirect; 503 in Flink's error shape when the owner cannot be reached. ``tried``: the
    partitions the request was sent on for, this hop's included (the next instance tries no
    other partition than those left). ``tls``: how to call the owner over https (with mutual
    TLS, this instance's certificate). The principal header is the one this instance audited,
    when it authenticated the request: the owner believes it if this instance's address is one
    of its trusted proxies. A request that came over https goes to an https owner only (503
    otherwise): its bearer token, and the owner's answer, never travel in clear."""
    url = httpx.URL(f"{owner}{scope[FORWARD]}" + (f"?{query}" if query else ""))
    headers = {
        k.decode("latin-1"): v.decode("latin-1")
        for k, v in scope.get("headers", [])
        if k.lower() in FORWARDED_HEADERS
    }
    if scope.get("scheme") == "https" and url.scheme != "https":
        log.warning(
            "%s %s not forwarded to %s: it serves plain http and this instance https",
            scope["method"], scope[FORWARD], owner,
        )  # fmt: skip
        return _unavailable(
            f"the instance that owns the job ({owner}) serves plain http: refusing to forward "
            "credentials over plain http (give every instance TLS and an https "
            "--advertised-rest-url)"
        )
    audited = audited_principal(scope)
    if audited is not None:
        headers = {k: v for k, v in headers.items() if k.lower() != "x-sparkpoint-principal"}
        headers["x-sparkpoint-principal"] = audited
    headers[FORWARDED_HEADER] = ",".join(map(str, sorted(tried)))
    try:
        client = http_client(tls)
        answer = await client.request(scope["method"], url, content=body, headers=headers)
    except httpx.HTTPError as exc:
        log.warning(
            "forwarding %s %s to %s failed: %s", scope["method"], scope[FORWARD], owner, exc
        )
        return _unavailable(
            f"the instance that owns the job ({owner}) did not answer: {type(exc).__name__}"
        )
    kind = answer.headers.get("content-type", "application/json")
    kept = {"Location": answer.headers["location"]} if "location" in answer.headers else None
    return Response(answer.content, status_code=answer.status_code, media_type=kind, headers=kept)


def _unavailable(message: str) -> Response:
    """503 in Flink's error shape."""
    return Response(
        json.dumps({"errors": [message]}), status_code=503, media_type="application/json"
    )


def dashboard_config() -> dict[str, Any]:
    """``GET /config``: what Flink's dashboard reads first (Flink's DashboardConfiguration)."""
    return {
        "refresh-interval": 3000,
        "timezone-name": "Coordinated Universal Time",
        "timezone-offset": 0,
        "flink-version": FLINK_VERSION,
        "flink-revision": f"sparkpoint (Flink {FLINK_VERSION} REST API)",
        "features": {
            "web-submit": False,
            "web-cancel": True,
            "web-rescale": False,
            "web-history": False,
        },
    }


def cluster_overview(states: list[str]) -> dict[str, Any]:
    """``GET /overview`` (Flink's ClusterOverviewWithVersion): job counts by state; sparkpoint
    has no task managers or slots (Spark executors run the tasks)."""
    return {
        "taskmanagers": 0,
        "slots-total": 0,
        "slots-available": 0,
        "jobs-running": sum(s in ("RUNNING", "RESTARTING", "CREATED") for s in states),
        "jobs-finished": states.count("FINISHED"),
        "jobs-cancelled": states.count("CANCELED"),
        "jobs-failed": states.count("FAILED"),
        "flink-version": FLINK_VERSION,
        "flink-commit": "sparkpoint",
    }
