"""What every group of REST handlers shares: `RestContext` (all the handlers may use of the
coordinator service), the lookups of a job (`owned`, `known`, `every_job`), request checks
(`directory_problem`, `principal`), Flink's error body (`error`) and `routes`, which turns a
class of handlers into an `APIRouter`.

Flink builds each REST handler with the collaborators it needs (its ``WebMonitorEndpoint`` hands
them in); here each group is a class built with a `RestContext`, its methods the handlers.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Any, Protocol, TypeVar

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from sparkpoint.common.clock import Clock
from sparkpoint.common.events import CheckpointSettings, SavepointFormat
from sparkpoint.common.limits import MAX_TEXT
from sparkpoint.common.rest_security import audited_principal
from sparkpoint.common.settings import CheckpointConfig
from sparkpoint.common.storage import PathOutsideRoots, Storage
from sparkpoint.coordinator.service.owned import OwnedJob, TriggerRequest, UnknownJob


class RestSettings(Protocol):
    """The settings of the instance the handlers read."""

    @property
    def history_url(self) -> str | None: ...
    @property
    def defaults(self) -> CheckpointConfig: ...


class RestContext(Protocol):
    """All the REST handlers use of the coordinator service (`CoordinatorService` is one)."""

    @property
    def jobs(self) -> Mapping[str, OwnedJob]: ...
    @property
    def ended(self) -> Mapping[str, OwnedJob]: ...
    @property
    def requests(self) -> Mapping[str, TriggerRequest]: ...
    @property
    def storage(self) -> Storage: ...
    @property
    def clock(self) -> Clock: ...
    @property
    def settings(self) -> RestSettings: ...
    @property
    def malformed(self) -> int: ...
    @property
    def rejected(self) -> Mapping[tuple[str, str], int]: ...

    def job(self, job_id: str) -> OwnedJob: ...
    def trigger(
        self,
        job_id: str,
        savepoint: bool,
        target_directory: str | None = ...,
        terminate: bool = ...,
        full: bool = ...,
        format_type: SavepointFormat = ...,
        trigger_id: str | None = ...,
        drain: bool = ...,
    ) -> TriggerRequest: ...
    async def cancel(self, job_id: str, principal: str) -> None: ...
    async def update_configuration(
        self, job_id: str, changes: CheckpointSettings, principal: str, request_id: str
    ) -> CheckpointConfig: ...
    async def dispose_savepoint(self, path: str) -> TriggerRequest: ...
    async def savepoints_of(self, job: OwnedJob) -> list[dict[str, Any]]: ...
    def route(self, job_id: str, tried: Collection[int] = ...) -> tuple[str, int] | None: ...
    def owner_url(self, job_id: str) -> str | None: ...
    def resolve(self, name: str) -> str: ...


class NotHere(Exception):
    """The job is not owned by this instance."""

    def __init__(self, job_id: str) -> None:
        super().__init__(job_id)
        self.job_id = job_id


def error(status: int, *messages: str) -> JSONResponse:
    return JSONResponse({"errors": list(messages)}, status_code=status)


def encodable(text: str) -> bool:
    """Whether ``text`` is valid Unicode (JSON may carry lone surrogates; events cannot)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def owned(ctx: RestContext, job_id: str) -> OwnedJob:
    """The job, running here; `NotHere` otherwise."""
    try:
        return ctx.job(job_id)
    except UnknownJob:
        raise NotHere(job_id) from None


def every_job(ctx: RestContext) -> list[OwnedJob]:
    """The jobs this instance runs, then those that ended here."""
    return [*ctx.jobs.values(), *ctx.ended.values()]


def known(ctx: RestContext, job_id: str) -> OwnedJob:
    """A running job, or one that ended here: its statistics stay readable, as Flink keeps
    a finished job's checkpoint history."""
    ended = ctx.ended.get(job_id)
    return ended if ended is not None and job_id not in ctx.jobs else owned(ctx, job_id)


def directory_problem(ctx: RestContext, field: str, path: str | None) -> JSONResponse | None:
    """A 400 naming ``field`` when a target directory cannot be used: outside the storage
    roots, longer than an event carries, or text no file system or event takes (a NUL, a
    lone surrogate, ``~user`` for no such user)."""
    if path is None:
        return None
    if len(path) > MAX_TEXT:
        return error(400, f"{field}: longer than {MAX_TEXT} characters")
    if "\x00" in path or not encodable(path):
        return error(400, f"{field}: must not contain NUL characters or lone surrogates")
    try:
        ctx.storage.check(path)
    except PathOutsideRoots as exc:
        return error(400, f"{field}: {exc}")
    except (ValueError, RuntimeError, OSError) as exc:
        return error(400, f"{field}: not a usable path ({exc})")
    return None


def principal(request: Request, header: str | None) -> str:
    """Who asks, for the audit: the principal the endpoint's security decided (the
    authenticated one; `sparkpoint.common.rest_security`); with no security configured, the
    ``X-Sparkpoint-Principal`` header, else the client's address."""
    decided = audited_principal(request.scope)
    if decided is not None:
        return decided
    return header or f"anonymous@{request.client.host if request.client else 'unknown'}"


def status_of(
    ctx: RestContext, jobid: str, triggerid: str, what: str, ours: Callable[[TriggerRequest], bool]
) -> dict[str, Any]:
    """`trigger_status` of the job's request ``triggerid`` of the kind ``ours`` accepts; the
    owner is asked when the job runs elsewhere (it knows its requests), else 404 naming
    ``what``."""
    request = ctx.requests.get(triggerid)
    if (request is None or request.job_id != jobid) and jobid not in ctx.jobs:
        raise NotHere(jobid)
    if request is None or request.job_id != jobid or not ours(request):
        raise HTTPException(404, f"No {what} {triggerid} for job {jobid}")
    return trigger_status(request)


def trigger_status(request: TriggerRequest) -> dict[str, Any]:
    """A checkpoint's or savepoint's trigger, as Flink answers for an asynchronous operation."""
    body: dict[str, Any] = {"status": {"id": request.status}}
    if request.status == "COMPLETED":
        if request.failure is not None:
            body["operation"] = {
                "failure-cause": {
                    "class": "CheckpointException",
                    "stack-trace": request.failure,
                    "serialized-throwable": None,
                }
            }
        elif request.savepoint:
            body["operation"] = {"location": request.location}
        else:
            body["operation"] = {"checkpointId": request.checkpoint_id}
    return body


Handler = TypeVar("Handler", bound=Callable[..., Any])
_ROUTE = "_sparkpoint_route"


def handles(method: str, path: str, **options: Any) -> Callable[[Handler], Handler]:
    """Marks a method of a handler class as the handler of ``method`` ``path``; ``options`` go
    to `APIRouter.add_api_route` (``response_model``, ``responses``, ``status_code``, ...)."""

    def mark(handler: Handler) -> Handler:
        setattr(handler, _ROUTE, (method, path, options))
        return handler

    return mark


def routes(handlers: object) -> APIRouter:
    """A router with the marked methods of ``handlers``, in the order the class defines them:
    Starlette takes the first route that matches, so a literal path (``/jobs/overview``) must
    come before the parameter that would take it (``/jobs/{jobid}``)."""
    router = APIRouter()
    for name, function in vars(type(handlers)).items():
        marked = getattr(function, _ROUTE, None)
        if marked is not None:
            method, path, options = marked
            router.add_api_route(path, getattr(handlers, name), methods=[method], **options)
    return router
