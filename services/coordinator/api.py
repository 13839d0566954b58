"""The coordinator's REST API, in Flink's JSON shapes (FastAPI; ``GET /openapi.json``).

Errors are Flink's ``{"errors": ["message"]}`` with a 4xx or 503 status; a message about a
request field names the field. A request for a job that another coordinator instance owns is
answered with a 307 redirect to the same request on the owner (method and body kept); one for a
job that no instance owns answers 404 (see the README for how requests find the owning instance).
Every operation declares in ``/openapi.json`` each status it can answer and the body of each.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Mapping
from pathlib import PurePosixPath
from typing import Annotated, Any, Literal

from fastapi import Body, FastAPI, Header, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, RedirectResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException

from services.common.events import CheckpointSettings
from services.common.limits import MAX_ID, MAX_TEXT
from services.common.settings import PREFIX, REST_FIELDS, CheckpointConfig, ConfigError
from services.common.storage import PathOutsideRoots
from services.coordinator.service import (
    CoordinatorService,
    OwnedJob,
    TriggerRequest,
    UnknownJob,
    UpdateInProgress,
)
from services.coordinator.writer import NotOwner

OPTION_TO_REST = {
    PREFIX + "interval": "checkpointInterval",
    PREFIX + "timeout": "checkpointTimeout",
    PREFIX + "min-pause": "minPauseBetweenCheckpoints",
    PREFIX + "max-concurrent-checkpoints": "maxConcurrentCheckpoints",
    PREFIX + "tolerable-failed-checkpoints": "tolerableCheckpointFailureNumber",
    PREFIX + "aligned-checkpoint-timeout": "alignedCheckpointTimeout",
}

MAX_COUNT = 2**31 - 1
"""Counts in the override record are Avro ints."""


class ConfigurationUpdate(BaseModel):
    """``PATCH /jobs/{jobid}/checkpoints/configuration``: every field optional, durations in ms."""

    model_config = ConfigDict(extra="forbid", strict=True)

    # Bounded by what the override record carries (Avro long durations below MAX_ID, int
    # counts): a larger value is a 400 naming the field, not a change that fails to persist.
    checkpointInterval: int | None = Field(default=None, gt=0, le=MAX_ID)
    checkpointTimeout: int | None = Field(default=None, gt=0, le=MAX_ID)
    minPauseBetweenCheckpoints: int | None = Field(default=None, ge=0, le=MAX_ID)
    maxConcurrentCheckpoints: int | None = Field(default=None, ge=1, le=MAX_COUNT)
    tolerableCheckpointFailureNumber: int | None = Field(default=None, ge=0, le=MAX_COUNT)
    alignedCheckpointTimeout: int | None = Field(default=None, ge=0, le=MAX_ID)

    def settings(self) -> CheckpointSettings:
        return CheckpointSettings(
            **{field: getattr(self, rest) for rest, field in REST_FIELDS.items()}
        )


class SavepointRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    target_directory: str | None = Field(default=None, alias="target-directory")
    cancel_job: bool = Field(default=False, alias="cancel-job")
    # documented as the enum it is; checked in the handler, whose message names the field
    formatType: str = Field(
        default="CANONICAL", json_schema_extra={"enum": ["CANONICAL", "NATIVE"]}
    )


class StopRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    targetDirectory: str | None = None
    drain: bool = False


class CheckpointTriggerBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    checkpointType: str = Field(
        default="CONFIGURED", json_schema_extra={"enum": ["CONFIGURED", "FULL", "INCREMENTAL"]}
    )


class NotHere(Exception):
    """The job is not owned by this instance."""

    def __init__(self, job_id: str) -> None:
        super().__init__(job_id)
        self.job_id = job_id


# --- what each operation answers, for /openapi.json ----------------------------------------------
# The handlers return plain dicts (their JSON is Flink's, unchanged); these models only document
# the bodies. A model allows more properties than it names, as Flink's clients ignore new ones.


class Errors(BaseModel):
    """Every error, in Flink's shape; a message about a request field names the field."""

    errors: list[str]


class JobOverview(BaseModel):
    model_config = ConfigDict(extra="allow")

    id: str
    name: str
    status: str
    parallelism: int


class JobList(BaseModel):
    """``GET /jobs``: the jobs this instance drives, then those that ended here."""

    model_config = ConfigDict(extra="allow")

    jobs: list[JobOverview]


class Externalization(BaseModel):
    model_config = ConfigDict(extra="allow")

    enabled: bool
    delete_on_cancellation: bool


class CheckpointConfigInfo(BaseModel):
    """The effective checkpointing configuration (Flink's CheckpointConfigInfo), durations in
    ms; ``interval`` is null when periodic checkpoints are off."""

    model_config = ConfigDict(extra="allow")

    mode: Literal["exactly_once", "at_least_once"]
    interval: int | None
    timeout: int
    min_pause: int
    max_concurrent: int
    tolerable_failed_checkpoints: int
    unaligned_checkpoints: bool
    aligned_checkpoint_timeout: int
    externalization: Externalization
    state_backend: str
    checkpoint_storage: str
    checkpoints_after_tasks_finish: bool
    num_retained: int
    interval_during_backlog: int | None


class CheckpointCounts(BaseModel):
    model_config = ConfigDict(extra="allow")

    restored: int
    total: int
    in_progress: int
    completed: int
    failed: int


class CheckpointStatistics(BaseModel):
    """One checkpoint or savepoint of the history (Flink's CheckpointStatistics)."""

    model_config = ConfigDict(extra="allow")

    className: str
    id: int
    status: Literal["IN_PROGRESS", "COMPLETED", "FAILED"]
    is_savepoint: bool
    trigger_timestamp: int
    latest_ack_timestamp: int
    state_size: int
    end_to_end_duration: int
    num_subtasks: int
    num_acknowledged_subtasks: int
    checkpoint_type: str


class LatestCheckpoints(BaseModel):
    model_config = ConfigDict(extra="allow")

    completed: CheckpointStatistics | None
    savepoint: CheckpointStatistics | None
    failed: CheckpointStatistics | None
    restored: dict[str, Any] | None


class CheckpointingStatistics(BaseModel):
    """``GET /jobs/{jobid}/checkpoints`` (Flink's CheckpointingStatistics)."""

    model_config = ConfigDict(extra="allow")

    counts: CheckpointCounts
    summary: dict[str, dict[str, float]]
    latest: LatestCheckpoints
    history: list[CheckpointStatistics]


class SubtaskCheckpointStatistics(BaseModel):
    model_config = ConfigDict(extra="allow")

    index: int
    subtask_id: str
    status: Literal["completed", "pending_or_failed"]


class CheckpointDetails(CheckpointStatistics):
    """One checkpoint of the history with a record per subtask."""

    subtasks: list[SubtaskCheckpointStatistics]


class TriggerId(BaseModel):
    """A triggered checkpoint, savepoint or stop: poll its status with the id."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    request_id: str = Field(alias="request-id")


class QueueStatus(BaseModel):
    id: Literal["IN_PROGRESS", "COMPLETED"]


class TriggerStatus(BaseModel):
    """An asynchronous operation's status (Flink's AsynchronousOperationResult): ``operation``
    is there once it COMPLETED, with the checkpoint id, the savepoint location or the failure."""

    model_config = ConfigDict(extra="allow")

    status: QueueStatus
    operation: dict[str, Any] | None = None


class SavepointEntry(BaseModel):
    model_config = ConfigDict(extra="allow")

    id: int
    location: str
    trigger_timestamp: int | None


class SavepointList(BaseModel):
    model_config = ConfigDict(extra="allow")

    savepoints: list[SavepointEntry]


Responses = dict[int | str, dict[str, Any]]


def answers(model: type[BaseModel], *errors: Responses) -> Responses:
    """The ``responses`` of an operation: 200 with ``model``, then the errors it can answer."""
    declared: Responses = {200: {"model": model, "description": model.__doc__ or "OK"}}
    for more in errors:
        declared.update(more)
    return declared


def _error(status: int, description: str) -> Responses:
    return {status: {"model": Errors, "description": description}}


BAD_REQUEST = _error(400, "The request is malformed: a body, parameter or value is invalid.")
NO_JOB = _error(404, "No coordinator instance owns the job.")
NOT_FOUND = _error(404, "The job, or what the request names in it, is not known.")
NO_SAVEPOINTS = _error(404, "The job has no savepoint and is not known to this instance.")
CONFLICT = _error(409, "Another configuration update of the job is in progress; retry.")
UNAVAILABLE = _error(503, "The change was not persisted (nothing changed) or the job moved.")
ELSEWHERE: Responses = {
    307: {
        "description": "Another coordinator instance owns the job: the same request (method and "
        "body kept) at the owner, named by Location.",
        "headers": {
            "Location": {
                "description": "The same request at the owning instance.",
                "schema": {"type": "string"},
            }
        },
    }
}


def without_422(schema: dict[str, Any]) -> dict[str, Any]:
    """Drops the 422 FastAPI documents for operations with parameters or a body: a request
    that fails validation is answered 400 in Flink's error shape (see ``invalid``)."""
    for operations in schema.get("paths", {}).values():
        for operation in operations.values():
            if isinstance(operation, dict):
                operation.get("responses", {}).pop("422", None)
    components = schema.get("components", {}).get("schemas", {})
    for unused in ("HTTPValidationError", "ValidationError"):
        components.pop(unused, None)
    return schema


class CoordinatorApp(FastAPI):
    def openapi(self) -> dict[str, Any]:
        return without_422(super().openapi())


def _encodable(text: str) -> bool:
    """Whether ``text`` is valid Unicode (JSON may carry lone surrogates; events cannot)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def error(status: int, *messages: str) -> JSONResponse:
    return JSONResponse({"errors": list(messages)}, status_code=status)


def config_json(config: CheckpointConfig) -> dict[str, Any]:
    """``GET /jobs/{jobid}/checkpoints/config``: the effective values, durations in ms."""
    retention = config.externalized_retention
    return {
        "mode": "exactly_once" if config.mode.name == "EXACTLY_ONCE" else "at_least_once",
        "interval": config.interval_ms,
        "timeout": config.timeout_ms,
        "min_pause": config.min_pause_ms,
        "max_concurrent": config.max_concurrent,
        "tolerable_failed_checkpoints": config.tolerable_failed,
        "unaligned_checkpoints": config.unaligned,
        "aligned_checkpoint_timeout": config.aligned_checkpoint_timeout_ms,
        "externalization": {
            "enabled": retention.enabled,
            "delete_on_cancellation": retention.name == "DELETE_ON_CANCELLATION",
        },
        "state_backend": "sparkpoint-keygroup-files",
        "checkpoint_storage": config.checkpoint_dir,
        "checkpoints_after_tasks_finish": config.checkpoints_after_tasks_finish,
        "num_retained": config.num_retained,
        "interval_during_backlog": config.interval_during_backlog_ms,
    }


METRICS = (
    (
        "lastCheckpointDuration",
        "gauge",
        "End-to-end duration of the last completed checkpoint, ms.",
    ),
    ("lastCheckpointSize", "gauge", "State size of the last completed checkpoint, bytes."),
    ("numberOfCompletedCheckpoints", "counter", "Completed checkpoints."),
    ("numberOfFailedCheckpoints", "counter", "Failed checkpoints."),
    ("numberOfInProgressCheckpoints", "gauge", "Checkpoints in progress."),
    ("totalNumberOfCheckpoints", "counter", "Checkpoints triggered."),
)


def metrics_text(
    jobs: list[OwnedJob], malformed: int, rejected: Mapping[tuple[str, str], int] | None = None
) -> str:
    lines = []
    values: dict[str, list[tuple[OwnedJob, int]]] = {name: [] for name, _, _ in METRICS}
    for job in jobs:
        stats = job.core.stats
        latest = stats.latest_completed
        values["lastCheckpointDuration"].append(
            (job, latest.metric("end_to_end_duration") if latest else 0)
        )
        values["lastCheckpointSize"].append((job, latest.metric("state_size") if latest else 0))
        values["numberOfCompletedCheckpoints"].append((job, stats.completed))
        values["numberOfFailedCheckpoints"].append((job, stats.failed))
        values["numberOfInProgressCheckpoints"].append((job, stats.in_progress))
        values["totalNumberOfCheckpoints"].append(
            (job, stats.completed + stats.failed + stats.in_progress)
        )
    for name, kind, help_text in METRICS:
        metric = f"flink_jobmanager_job_{name}"
        lines += [f"# HELP {metric} {help_text}", f"# TYPE {metric} {kind}"]
        for job, value in values[name]:
            labels = f'job_id="{job.job_id}",job_name="{job.registration.job_name}"'
            lines.append(f"{metric}{{{labels}}} {value}")
    lines += [
        "# HELP sparkpoint_malformed_events_total Messages that could not be decoded and were skipped.",
        "# TYPE sparkpoint_malformed_events_total counter",
        f"sparkpoint_malformed_events_total {malformed}",
        "# HELP sparkpoint_rejected_events_total Well-formed events refused because they may not touch a running job (invalid registrations, answers from an agent or attempt that does not drive the job, ...).",
        "# TYPE sparkpoint_rejected_events_total counter",
    ]
    for (topic, kind), count in sorted((rejected or {}).items()):
        lines.append(f'sparkpoint_rejected_events_total{{topic="{topic}",kind="{kind}"}} {count}')
    if not rejected:
        lines.append("sparkpoint_rejected_events_total 0")
    return "\n".join(lines) + "\n"


def trigger_status(request: TriggerRequest) -> dict[str, Any]:
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


def create_app(service: CoordinatorService) -> FastAPI:
    app = CoordinatorApp(
        title="sparkpoint coordinator",
        version="1",
        description="Flink-compatible checkpoint REST API for Spark jobs.",
        docs_url=None,
        redoc_url=None,
    )

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        messages = []
        for problem in exc.errors():
            where = [str(part) for part in problem.get("loc", ()) if part != "body"]
            field = ".".join(where) or "body"
            kind = problem.get("type", "")
            if kind == "extra_forbidden":
                messages.append(f"{field}: unknown field")
            elif kind == "json_invalid":  # its loc is ("body", offset): name the body instead
                detail = (problem.get("ctx") or {}).get("error")
                messages.append(
                    f"body: invalid JSON ({detail})" if detail else "body: invalid JSON"
                )
            else:
                messages.append(f"{field}: {problem.get('msg', 'invalid')}")
        return error(400, *messages)

    @app.exception_handler(NotHere)
    async def elsewhere(request: Request, exc: NotHere) -> Any:
        """A job owned by another instance: 307 to the same request there (method and body
        kept); 404 when no instance owns it."""
        owner = service.owner_url(exc.job_id)
        if owner is None:
            return error(404, f"Job {exc.job_id} not found")
        query = f"?{request.url.query}" if request.url.query else ""
        return RedirectResponse(f"{owner}{request.url.path}{query}", status_code=307)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        return error(exc.status_code, str(exc.detail))

    def owned(job_id: str) -> OwnedJob:
        try:
            return service.job(job_id)
        except UnknownJob:
            raise NotHere(job_id) from None

    def directory_problem(field: str, path: str | None) -> JSONResponse | None:
        """A 400 naming ``field`` when a target directory cannot be used: outside the storage
        roots, longer than an event carries, or text no file system or event takes (a NUL, a
        lone surrogate, ``~user`` for no such user)."""
        if path is None:
            return None
        if len(path) > MAX_TEXT:
            return error(400, f"{field}: longer than {MAX_TEXT} characters")
        if "\x00" in path or not _encodable(path):
            return error(400, f"{field}: must not contain NUL characters or lone surrogates")
        try:
            service.storage.check(path)
        except PathOutsideRoots as exc:
            return error(400, f"{field}: {exc}")
        except (ValueError, RuntimeError, OSError) as exc:
            return error(400, f"{field}: not a usable path ({exc})")
        return None

    def known(job_id: str) -> OwnedJob:
        """A running job, or one that ended here: its statistics stay readable, as Flink keeps
        a finished job's checkpoint history."""
        ended = service.ended.get(job_id)
        return ended if ended is not None and job_id not in service.jobs else owned(job_id)

    @app.get("/jobs", response_model=None, responses=answers(JobList))
    async def jobs() -> dict[str, Any]:
        listed = [
            {"id": job.job_id, "name": job.registration.job_name, "status": job.status.name, "parallelism": job.registration.parallelism}
            for job in [*service.jobs.values(), *service.ended.values()]
        ]  # fmt: skip
        return {"jobs": listed}

    @app.get(
        "/jobs/{jobid}/checkpoints/config",
        response_model=None,
        responses=answers(CheckpointConfigInfo, ELSEWHERE, NO_JOB),
    )
    async def checkpoint_config(jobid: str) -> dict[str, Any]:
        return config_json(known(jobid).core.config)

    @app.patch(
        "/jobs/{jobid}/checkpoints/configuration",
        response_model=None,
        responses=answers(
            CheckpointConfigInfo, ELSEWHERE, BAD_REQUEST, NO_JOB, CONFLICT, UNAVAILABLE
        ),
    )
    async def update_configuration(
        jobid: str,
        request: Request,
        update: Annotated[ConfigurationUpdate, Body()],
        x_sparkpoint_principal: Annotated[str | None, Header()] = None,
        x_request_id: Annotated[str | None, Header()] = None,
    ) -> Any:
        owned(jobid)
        principal = (
            x_sparkpoint_principal
            or f"anonymous@{request.client.host if request.client else 'unknown'}"
        )
        try:
            config = await service.update_configuration(
                jobid, update.settings(), principal, x_request_id or uuid.uuid4().hex
            )
        except UpdateInProgress:
            return error(
                409, f"another checkpoint configuration update of job {jobid} is in progress"
            )
        except ConfigError as exc:
            field = OPTION_TO_REST.get(exc.field, exc.field)
            return error(400, f"{field}: {str(exc).split(': ', 1)[-1]}")
        except UnknownJob:
            return error(404, f"Job {jobid} not found")
        except NotOwner:
            return error(503, f"job {jobid} moved to another coordinator during the update; retry")
        except Exception as exc:
            return error(503, f"the change was not persisted, nothing changed: {exc}")
        return config_json(config)

    @app.get(
        "/jobs/{jobid}/checkpoints/details/{checkpointid}",
        response_model=None,
        responses=answers(CheckpointDetails, ELSEWHERE, BAD_REQUEST, NOT_FOUND),
    )
    async def details(jobid: str, checkpointid: int) -> dict[str, Any]:
        found = known(jobid).core.stats.details(checkpointid)
        if found is None:
            raise HTTPException(
                404, f"Checkpoint {checkpointid} of job {jobid} not found in the history"
            )
        return found

    @app.get(
        "/jobs/{jobid}/checkpoints",
        response_model=None,
        responses=answers(CheckpointingStatistics, ELSEWHERE, NO_JOB),
    )
    async def checkpoints(jobid: str) -> dict[str, Any]:
        return known(jobid).core.stats.to_json()

    @app.post(
        "/jobs/{jobid}/checkpoints",
        response_model=None,
        responses=answers(TriggerId, ELSEWHERE, BAD_REQUEST, NO_JOB),
    )
    async def trigger_checkpoint(
        jobid: str, body: Annotated[CheckpointTriggerBody | None, Body()] = None
    ) -> Any:
        owned(jobid)
        kind = (body or CheckpointTriggerBody()).checkpointType
        if kind not in ("CONFIGURED", "FULL", "INCREMENTAL"):
            return error(400, "checkpointType: must be CONFIGURED, FULL or INCREMENTAL")
        return {
            "request-id": service.trigger(jobid, savepoint=False, full=kind == "FULL").request_id
        }

    @app.get(
        "/jobs/{jobid}/checkpoints/{triggerid}",
        response_model=None,
        responses=answers(TriggerStatus, ELSEWHERE, NOT_FOUND),
    )
    async def checkpoint_status(jobid: str, triggerid: str) -> dict[str, Any]:
        request = service.requests.get(triggerid)
        if request is None and jobid not in service.jobs:
            raise NotHere(jobid)
        if request is None or request.job_id != jobid or request.savepoint:
            raise HTTPException(404, f"No checkpoint request {triggerid} for job {jobid}")
        return trigger_status(request)

    @app.post(
        "/jobs/{jobid}/savepoints",
        response_model=None,
        responses=answers(TriggerId, ELSEWHERE, BAD_REQUEST, NO_JOB),
    )
    async def trigger_savepoint(
        jobid: str, body: Annotated[SavepointRequest | None, Body()] = None
    ) -> Any:
        owned(jobid)
        body = body or SavepointRequest()
        if body.formatType not in ("CANONICAL", "NATIVE"):
            return error(400, "formatType: must be CANONICAL or NATIVE")
        problem = directory_problem("target-directory", body.target_directory)
        if problem is not None:
            return problem
        try:
            request = service.trigger(jobid, True, body.target_directory, terminate=body.cancel_job)
        except PathOutsideRoots as exc:
            return error(400, f"target-directory: {exc}")
        return {"request-id": request.request_id}

    @app.get(
        "/jobs/{jobid}/savepoints/{triggerid}",
        response_model=None,
        responses=answers(TriggerStatus, ELSEWHERE, NOT_FOUND),
    )
    async def savepoint_status(jobid: str, triggerid: str) -> dict[str, Any]:
        request = service.requests.get(triggerid)
        if request is None and jobid not in service.jobs:
            raise NotHere(jobid)
        if request is None or request.job_id != jobid or not request.savepoint:
            raise HTTPException(404, f"No savepoint request {triggerid} for job {jobid}")
        return trigger_status(request)

    @app.get(
        "/jobs/{jobid}/savepoints",
        response_model=None,
        responses=answers(SavepointList, NO_SAVEPOINTS),
    )
    async def savepoints(jobid: str) -> dict[str, Any]:
        root = service.settings.defaults.savepoint_dir
        found = []
        for directory in await asyncio.to_thread(service.storage.list_dirs, root):
            name = PurePosixPath(directory).name
            if not name.startswith(f"savepoint-{jobid[:6]}-"):
                continue
            try:
                metadata = json.loads(
                    await asyncio.to_thread(service.storage.read, f"{directory}/_metadata")
                )
            except (OSError, ValueError):
                continue  # not complete: a directory without _metadata is not a savepoint
            if not isinstance(metadata, dict) or not isinstance(metadata.get("checkpoint_id"), int):
                continue  # not one this coordinator wrote: no savepoint to list
            if metadata.get("job_id") == jobid:
                found.append(
                    {
                        "id": metadata["checkpoint_id"],
                        "location": directory,
                        "trigger_timestamp": metadata.get("trigger_timestamp"),
                    }
                )
        if not found and jobid not in service.jobs and jobid not in service.ended:
            raise HTTPException(404, f"Job {jobid} not found")
        return {"savepoints": sorted(found, key=lambda s: s["id"])}

    @app.post(
        "/jobs/{jobid}/stop",
        response_model=None,
        responses=answers(TriggerId, ELSEWHERE, BAD_REQUEST, NO_JOB),
    )
    async def stop(jobid: str, body: Annotated[StopRequest | None, Body()] = None) -> Any:
        owned(jobid)
        target = (body or StopRequest()).targetDirectory
        problem = directory_problem("targetDirectory", target)
        if problem is not None:
            return problem
        try:
            request = service.trigger(jobid, True, target, terminate=True)
        except PathOutsideRoots as exc:
            return error(400, f"targetDirectory: {exc}")
        return {"request-id": request.request_id}

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics() -> str:
        return metrics_text(list(service.jobs.values()), service.malformed, service.rejected)

    @app.get("/", response_class=HTMLResponse)
    async def dashboard() -> str:
        return DASHBOARD.replace("{{generated}}", time.strftime("%Y-%m-%d %H:%M:%S"))

    return app


DASHBOARD = """<!doctype html>
<html><head><meta charset="utf-8"><title>sparkpoint</title>
<style>body{font:14px system-ui,sans-serif;margin:2em}table{border-collapse:collapse}
td,th{border-bottom:1px solid #ddd;padding:4px 10px;text-align:right}th{background:#f4f4f4}
.FAILED{color:#b00}.COMPLETED{color:#070}.IN_PROGRESS{color:#a60}svg{background:#fafafa}</style></head>
<body><h1>sparkpoint</h1><div id="jobs">loading...</div>
<script>
async function load(){
  const jobs=(await (await fetch('/jobs')).json()).jobs; let html='';
  for(const j of jobs){
    html+=`<h2>${j.name} <small>${j.id} · ${j.status} · parallelism ${j.parallelism}</small></h2>`;
    const r=await fetch(`/jobs/${j.id}/checkpoints`); if(!r.ok){continue}
    const s=await r.json(); const h=s.history.slice().reverse();
    const max=Math.max(1,...h.map(c=>c.end_to_end_duration));
    html+=`<p>completed ${s.counts.completed} · failed ${s.counts.failed} · in progress ${s.counts.in_progress}</p>`;
    const bar=c=>Math.max(4,100*c.end_to_end_duration/max);  // failed ones too, in red
    html+=`<svg width="${h.length*24+10}" height="110">`+h.map((c,i)=>`<rect x="${5+i*24}" y="${105-bar(c)}" width="18" height="${bar(c)}" class="${c.status}" fill="currentColor"><title>#${c.id} ${c.status} ${c.end_to_end_duration} ms</title></rect>`).join('')+`</svg>`;
    html+='<table><tr><th>id</th><th>status</th><th>type</th><th>duration ms</th><th>state bytes</th><th>acks</th><th>path</th></tr>'+
      s.history.map(c=>`<tr><td>${c.id}</td><td class="${c.status}">${c.status}</td><td>${c.checkpoint_type}</td><td>${c.end_to_end_duration}</td><td>${c.state_size}</td><td>${c.num_acknowledged_subtasks}/${c.num_subtasks}</td><td>${c.external_path||c.failure_message||''}</td></tr>`).join('')+'</table>';
  }
  document.getElementById('jobs').innerHTML=html||'no jobs';
}
load(); setInterval(load,2000);
</script><p><small>generated {{generated}}</small></p></body></html>
"""
