"""The coordinator's REST API, in Flink's JSON shapes (FastAPI; ``GET /openapi.json``).

Errors are Flink's ``{"errors": ["message"]}`` with a 4xx status; a message about a request
field names the field. Requests for a job this instance does not own answer 404 (see the README
for how requests find the owning instance).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from pathlib import PurePosixPath
from typing import Annotated, Any

from fastapi import Body, FastAPI, Header, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, RedirectResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException

from services.common.events import CheckpointSettings
from services.common.settings import PREFIX, REST_FIELDS, CheckpointConfig, ConfigError
from services.common.storage import PathOutsideRoots
from services.coordinator.service import (
    CoordinatorService,
    NotOwner,
    OwnedJob,
    TriggerRequest,
    UnknownJob,
    UpdateInProgress,
)

OPTION_TO_REST = {
    PREFIX + "interval": "checkpointInterval",
    PREFIX + "timeout": "checkpointTimeout",
    PREFIX + "min-pause": "minPauseBetweenCheckpoints",
    PREFIX + "max-concurrent-checkpoints": "maxConcurrentCheckpoints",
    PREFIX + "tolerable-failed-checkpoints": "tolerableCheckpointFailureNumber",
    PREFIX + "aligned-checkpoint-timeout": "alignedCheckpointTimeout",
}


class ConfigurationUpdate(BaseModel):
    """``PATCH /jobs/{jobid}/checkpoints/configuration``: every field optional, durations in ms."""

    model_config = ConfigDict(extra="forbid", strict=True)

    checkpointInterval: int | None = Field(default=None, gt=0)
    checkpointTimeout: int | None = Field(default=None, gt=0)
    minPauseBetweenCheckpoints: int | None = Field(default=None, ge=0)
    maxConcurrentCheckpoints: int | None = Field(default=None, ge=1)
    tolerableCheckpointFailureNumber: int | None = Field(default=None, ge=0)
    alignedCheckpointTimeout: int | None = Field(default=None, ge=0)

    def settings(self) -> CheckpointSettings:
        return CheckpointSettings(
            **{field: getattr(self, rest) for rest, field in REST_FIELDS.items()}
        )


class SavepointRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    target_directory: str | None = Field(default=None, alias="target-directory")
    cancel_job: bool = Field(default=False, alias="cancel-job")
    formatType: str = "CANONICAL"


class StopRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    targetDirectory: str | None = None
    drain: bool = False


class CheckpointTriggerBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    checkpointType: str = "CONFIGURED"


class NotHere(Exception):
    """The job is not owned by this instance."""

    def __init__(self, job_id: str) -> None:
        super().__init__(job_id)
        self.job_id = job_id


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


def metrics_text(jobs: list[OwnedJob], malformed: int) -> str:
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
    ]
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
    app = FastAPI(
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

    def known(job_id: str) -> OwnedJob:
        """A running job, or one that ended here: its statistics stay readable, as Flink keeps
        a finished job's checkpoint history."""
        ended = service.ended.get(job_id)
        return ended if ended is not None and job_id not in service.jobs else owned(job_id)

    @app.get("/jobs")
    async def jobs() -> dict[str, Any]:
        listed = [
            {"id": job.job_id, "name": job.registration.job_name, "status": job.status.name, "parallelism": job.registration.parallelism}
            for job in [*service.jobs.values(), *service.ended.values()]
        ]  # fmt: skip
        return {"jobs": listed}

    @app.get("/jobs/{jobid}/checkpoints/config")
    async def checkpoint_config(jobid: str) -> dict[str, Any]:
        return config_json(known(jobid).core.config)

    @app.patch("/jobs/{jobid}/checkpoints/configuration")
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

    @app.get("/jobs/{jobid}/checkpoints/details/{checkpointid}")
    async def details(jobid: str, checkpointid: int) -> dict[str, Any]:
        found = known(jobid).core.stats.details(checkpointid)
        if found is None:
            raise HTTPException(
                404, f"Checkpoint {checkpointid} of job {jobid} not found in the history"
            )
        return found

    @app.get("/jobs/{jobid}/checkpoints")
    async def checkpoints(jobid: str) -> dict[str, Any]:
        return known(jobid).core.stats.to_json()

    @app.post("/jobs/{jobid}/checkpoints")
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

    @app.get("/jobs/{jobid}/checkpoints/{triggerid}")
    async def checkpoint_status(jobid: str, triggerid: str) -> dict[str, Any]:
        request = service.requests.get(triggerid)
        if request is None and jobid not in service.jobs:
            raise NotHere(jobid)
        if request is None or request.job_id != jobid or request.savepoint:
            raise HTTPException(404, f"No checkpoint request {triggerid} for job {jobid}")
        return trigger_status(request)

    @app.post("/jobs/{jobid}/savepoints")
    async def trigger_savepoint(
        jobid: str, body: Annotated[SavepointRequest | None, Body()] = None
    ) -> Any:
        owned(jobid)
        body = body or SavepointRequest()
        if body.formatType not in ("CANONICAL", "NATIVE"):
            return error(400, "formatType: must be CANONICAL or NATIVE")
        try:
            request = service.trigger(jobid, True, body.target_directory, terminate=body.cancel_job)
        except PathOutsideRoots as exc:
            return error(400, f"target-directory: {exc}")
        return {"request-id": request.request_id}

    @app.get("/jobs/{jobid}/savepoints/{triggerid}")
    async def savepoint_status(jobid: str, triggerid: str) -> dict[str, Any]:
        request = service.requests.get(triggerid)
        if request is None and jobid not in service.jobs:
            raise NotHere(jobid)
        if request is None or request.job_id != jobid or not request.savepoint:
            raise HTTPException(404, f"No savepoint request {triggerid} for job {jobid}")
        return trigger_status(request)

    @app.get("/jobs/{jobid}/savepoints")
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
            except (FileNotFoundError, ValueError):
                continue  # not complete: a directory without _metadata is not a savepoint
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

    @app.post("/jobs/{jobid}/stop")
    async def stop(jobid: str, body: Annotated[StopRequest | None, Body()] = None) -> Any:
        owned(jobid)
        try:
            request = service.trigger(
                jobid, True, (body or StopRequest()).targetDirectory, terminate=True
            )
        except PathOutsideRoots as exc:
            return error(400, f"targetDirectory: {exc}")
        return {"request-id": request.request_id}

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics() -> str:
        return metrics_text(list(service.jobs.values()), service.malformed)

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
