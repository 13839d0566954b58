"""The coordinator's REST API, in Flink's JSON shapes (FastAPI; ``GET /openapi.json``).

Errors are Flink's ``{"errors": ["message"]}`` with a 4xx or 503 status; a message about a
request field names the field. A request for a job that another coordinator instance owns is
answered with a 307 redirect to the same request on the owner (method and body kept); one for a
job that no instance owns answers 404 (see the README for how requests find the owning instance).
Every operation declares in ``/openapi.json`` each status it can answer and the body of each.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Mapping
from pathlib import PurePosixPath
from typing import Annotated, Any
from urllib.parse import quote

from fastapi import Body, FastAPI, Header, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, RedirectResponse
from starlette.exceptions import HTTPException

from sparkpoint.common.events import SavepointFormat
from sparkpoint.common.flink_ids import flink_job_id, is_flink_id
from sparkpoint.common.limits import MAX_TEXT
from sparkpoint.common.metadata import BadMetadata, SnapshotMetadata
from sparkpoint.common.settings import CheckpointConfig, ConfigError
from sparkpoint.common.storage import PathOutsideRoots
from sparkpoint.coordinator.rest import job_views, progress_views
from sparkpoint.coordinator.rest.flink_compat import (
    FORWARD,
    FORWARDED_HEADER,
    FlinkPaths,
    WebUi,
    cluster_overview,
    dashboard_config,
    forward,
    http_client,
)
from sparkpoint.coordinator.rest.models import (
    BAD_REQUEST,
    CONFLICT,
    ELSEWHERE,
    ENDED,
    NO_JOB,
    NO_SAVEPOINTS,
    NOT_FOUND,
    OPTION_TO_REST,
    UNAVAILABLE,
    Accepted,
    Applications,
    CheckpointConfigInfo,
    CheckpointDetails,
    CheckpointingStatistics,
    CheckpointTriggerBody,
    ClusterOverview,
    ConfigEntries,
    ConfigurationUpdate,
    CoordinatorApp,
    DashboardConfig,
    DisposalRequest,
    JobConfig,
    JobDetails,
    JobExceptions,
    JobList,
    JobPlan,
    JobProgress,
    JobsOverview,
    SavepointList,
    SavepointRequest,
    StopRequest,
    TaskManagers,
    TriggerId,
    TriggerStatus,
    VertexMetrics,
    answers,
)
from sparkpoint.coordinator.service.earlier import earlier_statistics, merge
from sparkpoint.coordinator.service.instance import CoordinatorService
from sparkpoint.coordinator.service.owned import (
    DisposalRefused,
    OwnedElsewhere,
    OwnedJob,
    TriggerIdInUse,
    TriggerRequest,
    UnknownJob,
    UpdateInProgress,
)
from sparkpoint.coordinator.service.writer import NotOwner

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


class NotHere(Exception):
    """The job is not owned by this instance."""

    def __init__(self, job_id: str) -> None:
        super().__init__(job_id)
        self.job_id = job_id


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
        # Flink's state changelog (FLIP-158) has no counterpart here: answered as Flink does
        # when it is off
        "state_changelog_enabled": False,
        "changelog_storage": "memory",
        "changelog_periodic_materialization_interval": 600_000,
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
    ("numRestarts", "counter", "Restarts of the job by its restart strategy."),
)


def metrics_text(
    jobs: list[OwnedJob],
    malformed: int,
    rejected: Mapping[tuple[str, str], int] | None = None,
    now_ms: int = 0,
) -> str:
    """Prometheus text: each job's checkpoint metrics, its progress (`progress_views`), and the
    events this instance skipped or refused."""
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
        values["numRestarts"].append((job, job.history.restarts))
    for name, kind, help_text in METRICS:
        metric = f"flink_jobmanager_job_{name}"
        lines += [f"# HELP {metric} {help_text}", f"# TYPE {metric} {kind}"]
        for job, value in values[name]:
            labels = f'job_id="{job.job_id}",job_name="{job.registration.job_name}"'
            lines.append(f"{metric}{{{labels}}} {value}")
    lines += progress_views.prometheus_lines(jobs, now_ms)
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


def disposal_outcome(request: TriggerRequest) -> dict[str, Any]:
    body: dict[str, Any] = {"status": {"id": request.status}}
    if request.status == "COMPLETED":
        body["operation"] = (
            {"failure-cause": {"class": "IOException", "stack-trace": request.failure}}
            if request.failure
            else {}
        )
    return body


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


def create_app(service: CoordinatorService, web_ui: WebUi | None = None) -> FastAPI:
    """The API; ``web_ui``: Flink's dashboard, served at ``/flink/`` (`flink_compat`)."""
    app = CoordinatorApp(
        title="sparkpoint coordinator",
        version="1",
        description="Flink-compatible checkpoint REST API for Spark jobs. Every path also "
        "answers under /v1/, and /jobs/{jobid} takes the job id or its Flink JobID.",
        docs_url=None,
        redoc_url=None,
    )
    app.add_middleware(FlinkPaths, service=service, web_ui=web_ui)

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
        kept), or for Flink's clients, which follow no redirect, that instance's answer; 404
        when no instance owns it. A JobID this instance does not know names up to two
        partitions: each hop says which were tried, so none is asked twice and none loops."""
        tried = hops(request.query_params.get(HOP)) | hops(request.headers.get(FORWARDED_HEADER))
        routed = service.route(exc.job_id, tried)
        if routed is None:
            return error(404, f"Job {exc.job_id} not found")
        owner, partition = routed
        tried.add(partition)
        query = "&".join(
            f"{quote(k)}={quote(v)}" for k, v in request.query_params.multi_items() if k != HOP
        )
        if FORWARD in request.scope:
            return await forward(owner, request.scope, await request.body(), query, tried)
        if is_flink_id(exc.job_id):
            hop = f"{HOP}={','.join(map(str, sorted(tried)))}"
            query = f"{query}&{hop}" if query else hop
        query = f"?{query}" if query else ""
        return RedirectResponse(f"{owner}{request.url.path}{query}", status_code=307)

    @app.exception_handler(TriggerIdInUse)
    async def trigger_id_in_use(request: Request, exc: TriggerIdInUse) -> JSONResponse:
        return error(400, f"triggerId: {exc.trigger_id} names another operation")

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

    def every_job() -> list[OwnedJob]:
        """The jobs this instance runs, then those that ended here."""
        return [*service.jobs.values(), *service.ended.values()]

    def known(job_id: str) -> OwnedJob:
        """A running job, or one that ended here: its statistics stay readable, as Flink keeps
        a finished job's checkpoint history."""
        ended = service.ended.get(job_id)
        return ended if ended is not None and job_id not in service.jobs else owned(job_id)

    @app.get("/jobs", response_model=None, responses=answers(JobList))
    async def jobs() -> dict[str, Any]:
        listed = [
            {"id": job.job_id, "jid": flink_job_id(job.job_id),
             "name": job.registration.job_name, "status": job.status.name,
             "parallelism": job.registration.parallelism, "restarts": job.history.restarts}
            for job in every_job()
        ]  # fmt: skip
        return {"jobs": listed}

    @app.get("/jobs/overview", response_model=None, responses=answers(JobsOverview))
    async def jobs_overview() -> dict[str, Any]:
        now = service.clock.now_ms()
        return {"jobs": [job_views.overview(job, now) for job in every_job()]}

    @app.get("/config", response_model=None, responses=answers(DashboardConfig))
    async def flink_config() -> dict[str, Any]:
        return dashboard_config()

    @app.get("/overview", response_model=None, responses=answers(ClusterOverview))
    async def cluster() -> dict[str, Any]:
        return cluster_overview([job.status.name for job in every_job()])

    @app.get("/applications/overview", response_model=None, responses=answers(Applications))
    async def applications() -> dict[str, Any]:
        now = service.clock.now_ms()
        return {"applications": [job_views.application(job, now) for job in every_job()]}

    @app.get(
        "/jobs/{jobid}/vertices/{vertexid}/{what:path}",
        response_model=None,
        responses=answers(VertexMetrics, ELSEWHERE, NOT_FOUND),
    )
    async def vertex_metrics(jobid: str, vertexid: str, what: str, get: str | None = None) -> Any:
        """A stage's metrics, metrics over its subtasks and back-pressure, as Flink's dashboard
        asks for them, from the agent's heartbeats (`progress_views`); its watermarks: none
        (an empty list, as Flink answers before it has any)."""
        job = known(jobid)
        if what not in ("watermarks", "metrics", "subtasks/metrics", "backpressure"):
            raise HTTPException(404, f"No {what} of vertex {vertexid}")
        vertex = job_views.vertex_index(job, vertexid)
        if vertex is None:
            raise HTTPException(404, f"Vertex {vertexid} of job {jobid} not found")
        now = service.clock.now_ms()
        names = [n for n in get.split(",") if n] if get is not None else None
        if what == "metrics":
            return progress_views.vertex_metrics(job, vertex, now, names)
        if what == "subtasks/metrics":
            return progress_views.aggregated_metrics(job, vertex, now, names)
        if what == "backpressure":
            return progress_views.backpressure(job, vertex, now)
        return []

    @app.get(
        "/jobs/{jobid}/progress",
        response_model=None,
        responses=answers(JobProgress, ELSEWHERE, NO_JOB),
    )
    async def job_progress(jobid: str) -> dict[str, Any]:
        """Records in and out and where each source partition stands (sparkpoint's own)."""
        return progress_views.progress(known(jobid), service.clock.now_ms())

    @app.get("/taskmanagers", response_model=None, responses=answers(TaskManagers))
    async def task_managers() -> dict[str, Any]:
        """None: Spark's executors run the tasks (Spark's UI shows them)."""
        return {"taskmanagers": []}

    @app.get("/jobmanager/config", response_model=None, responses=answers(ConfigEntries))
    async def coordinator_config() -> list[dict[str, str]]:
        """The instance's cluster-wide defaults, as Flink lists its configuration."""
        defaults = service.settings.defaults.to_options()
        return [{"key": k, "value": str(v)} for k, v in sorted(defaults.items())]

    @app.get(
        "/jobs/{jobid}/plan",
        response_model=None,
        responses=answers(JobPlan, ELSEWHERE, NO_JOB),
    )
    async def job_plan(jobid: str) -> dict[str, Any]:
        return {"plan": job_views.details(known(jobid), service.clock.now_ms())["plan"]}

    @app.patch(
        "/jobs/{jobid}",
        status_code=202,
        response_model=None,
        responses={
            202: {"model": Accepted, "description": Accepted.__doc__},
            **ELSEWHERE, **BAD_REQUEST, **NO_JOB, **ENDED, **UNAVAILABLE,
        },
    )  # fmt: skip
    async def cancel(
        jobid: str,
        request: Request,
        mode: str = "cancel",
        x_sparkpoint_principal: Annotated[str | None, Header()] = None,
    ) -> Any:
        """Flink's ``flink cancel``: the job's agent ends it CANCELED (no savepoint; for one,
        ``POST /jobs/{jobid}/stop``)."""
        if mode != "cancel":
            return error(
                400, "mode: must be cancel (stop with a savepoint: POST /jobs/{jobid}/stop)"
            )
        ended = service.ended.get(jobid)
        if ended is not None and jobid not in service.jobs:
            return error(
                409,
                f"Job cancellation failed because the job has already reached another terminal "
                f"state ({ended.status.name}).",
            )
        owned(jobid)
        principal = x_sparkpoint_principal or (
            f"anonymous@{request.client.host if request.client else 'unknown'}"
        )
        try:
            await service.cancel(jobid, principal)
        except UnknownJob:
            return error(404, f"Job {jobid} not found")
        except Exception as exc:
            return error(503, f"the cancellation was not persisted, nothing changed: {exc}")
        return JSONResponse({}, status_code=202)

    @app.get(
        "/jobs/{jobid}",
        response_model=None,
        responses=answers(JobDetails, ELSEWHERE, NO_JOB),
    )
    async def job_details(jobid: str) -> dict[str, Any]:
        return job_views.details(known(jobid), service.clock.now_ms())

    @app.get(
        "/jobs/{jobid}/exceptions",
        response_model=None,
        responses=answers(JobExceptions, ELSEWHERE, NO_JOB),
    )
    async def job_exceptions(jobid: str) -> dict[str, Any]:
        return job_views.exceptions(known(jobid))

    @app.get(
        "/jobs/{jobid}/config",
        response_model=None,
        responses=answers(JobConfig, ELSEWHERE, NO_JOB),
    )
    async def job_config(jobid: str) -> dict[str, Any]:
        return job_views.config(known(jobid))

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
        core = known(jobid).core
        own = core.stats.to_json()
        history_url = service.settings.history_url
        if history_url is None:
            return own
        earlier = await earlier_statistics(http_client(), history_url, jobid, core.owner_epoch)
        return own if earlier is None else merge(own, earlier, core.stats.history_size)

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
        trigger_id = (body or CheckpointTriggerBody()).triggerId
        request = service.trigger(
            jobid, savepoint=False, full=kind == "FULL", trigger_id=trigger_id
        )
        return {"request-id": request.request_id}

    @app.get(
        "/jobs/{jobid}/checkpoints/{triggerid}",
        response_model=None,
        responses=answers(TriggerStatus, ELSEWHERE, NOT_FOUND),
    )
    async def checkpoint_status(jobid: str, triggerid: str) -> dict[str, Any]:
        request = service.requests.get(triggerid)
        if (request is None or request.job_id != jobid) and jobid not in service.jobs:
            raise NotHere(jobid)  # the job's owner knows its requests
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
            request = service.trigger(
                jobid,
                True,
                body.target_directory,
                terminate=body.cancel_job,
                format_type=SavepointFormat[body.formatType],
                trigger_id=body.triggerId,
            )
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
        if (request is None or request.job_id != jobid) and jobid not in service.jobs:
            raise NotHere(jobid)  # the job's owner knows its requests
        if request is None or request.job_id != jobid or not request.savepoint or request.disposal:
            raise HTTPException(404, f"No savepoint request {triggerid} for job {jobid}")
        return trigger_status(request)

    @app.get(
        "/jobs/{jobid}/savepoints",
        response_model=None,
        responses=answers(SavepointList, ELSEWHERE, NO_SAVEPOINTS),
    )
    async def savepoints(jobid: str) -> dict[str, Any]:
        job = service.jobs.get(jobid) or service.ended.get(jobid)
        if job is None and service.owner_url(jobid) is not None:
            raise NotHere(jobid)  # the owner has the job's record of its savepoints
        found = await service.savepoints_of(job) if job is not None else []
        listed = {s["location"] for s in found}
        # savepoints from before the job's record listed them: by name in the default directory
        root = service.settings.defaults.savepoint_dir
        for directory in await asyncio.to_thread(service.storage.list_dirs, root):
            name = PurePosixPath(directory).name
            if directory in listed or not name.startswith(f"savepoint-{jobid[:6]}-"):
                continue
            try:
                data = await asyncio.to_thread(service.storage.read, f"{directory}/_metadata")
                metadata = SnapshotMetadata.from_json(data, directory)
            except (OSError, BadMetadata):
                continue  # not complete, or not one a coordinator wrote
            if metadata.job_id == jobid:
                found.append(
                    {
                        "id": metadata.checkpoint_id, "location": directory,
                        "trigger_timestamp": metadata.trigger_ms, "status": "COMPLETED",
                        "state_size": metadata.state_size, "format_type": metadata.format_type.name,
                        "exists": True,
                    }
                )  # fmt: skip
        if not found and job is None:
            raise HTTPException(404, f"Job {jobid} not found")
        return {"savepoints": sorted(found, key=lambda s: s["id"])}

    @app.post(
        "/savepoint-disposal",
        response_model=None,
        responses=answers(TriggerId, ELSEWHERE, BAD_REQUEST),
    )
    async def dispose_savepoint(body: Annotated[DisposalRequest, Body()]) -> Any:
        """Flink's savepoint disposal: deletes a completed savepoint; refuses (400, nothing
        deleted) a path outside the storage roots, one that is not a completed savepoint, or a
        snapshot a job restores from."""
        path = body.savepoint_path
        if "\x00" in path or not _encodable(path) or len(path) > MAX_TEXT or not path.strip():
            return error(400, "savepoint-path: not a usable path")
        try:
            request = await service.dispose_savepoint(path)
        except PathOutsideRoots as exc:
            return error(400, f"savepoint-path: {exc}")
        except DisposalRefused as exc:
            return error(400, f"savepoint-path: {exc}")
        except OwnedElsewhere as exc:
            raise NotHere(exc.job_id) from None
        # done already: the outcome comes with the trigger id (a client that polls gets it too)
        return {"request-id": request.request_id, **disposal_outcome(request)}

    @app.get(
        "/savepoint-disposal/{triggerid}",
        response_model=None,
        responses=answers(TriggerStatus, NOT_FOUND),
    )
    async def disposal_status(triggerid: str) -> dict[str, Any]:
        request = service.requests.get(triggerid)
        if request is None or not request.disposal:
            raise HTTPException(404, f"No savepoint disposal {triggerid}")
        return disposal_outcome(request)

    @app.post(
        "/jobs/{jobid}/stop",
        response_model=None,
        responses=answers(TriggerId, ELSEWHERE, BAD_REQUEST, NO_JOB),
    )
    async def stop(jobid: str, body: Annotated[StopRequest | None, Body()] = None) -> Any:
        owned(jobid)
        body = body or StopRequest()
        if body.formatType not in ("CANONICAL", "NATIVE"):
            return error(400, "formatType: must be CANONICAL or NATIVE")
        problem = directory_problem("targetDirectory", body.targetDirectory)
        if problem is not None:
            return problem
        try:
            request = service.trigger(
                jobid,
                True,
                body.targetDirectory,
                terminate=True,
                format_type=SavepointFormat[body.formatType],
                trigger_id=body.triggerId,
                drain=body.drain,
            )
        except PathOutsideRoots as exc:
            return error(400, f"targetDirectory: {exc}")
        return {"request-id": request.request_id}

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics() -> str:
        return metrics_text(
            list(service.jobs.values()), service.malformed, service.rejected,
            service.clock.now_ms(),
        )  # fmt: skip

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
    const g=await fetch(`/jobs/${j.id}/progress`);
    if(g.ok){const p=await g.json(); if(p.reported){
      html+=(p.stalled?'<p class="FAILED"><b>STALLED</b>: records wait in a source partition whose position has not moved for 10 s</p>':'')+
        `<p>records in ${p.records_in_per_second}/s · out ${p.records_out_per_second}/s · lag ${p.lag} · back-pressured ${p.backpressured_ms_per_second} ms/s</p>`+
        '<table><tr><th>source</th><th>subtask</th><th>position</th><th>end</th><th>lag</th><th>records/s</th><th>advanced</th></tr>'+
        p.partitions.map(q=>`<tr class="${q.stalled?'FAILED':''}"><td>${q.topic}[${q.partition}]</td><td>${q.subtask}</td><td>${q.position}</td><td>${q.end}</td><td>${q.lag}</td><td>${q.records_in_per_second}</td><td>${(q.ms_since_advanced/1000).toFixed(1)} s ago${q.stalled?' STALLED':''}</td></tr>`).join('')+'</table>';
    }}
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
