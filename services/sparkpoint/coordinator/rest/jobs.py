"""Flink's job handlers (flink-runtime ``rest/handler/job``): the job list and overview, a job's
details, plan, exceptions and configuration, its cancellation, and its vertices' metrics and
sparkpoint's progress (Flink keeps its vertex handlers under ``job/`` too)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Header, Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from sparkpoint.common.flink_ids import flink_job_id
from sparkpoint.coordinator.rest import job_views, progress_views
from sparkpoint.coordinator.rest.deps import (
    RestContext,
    error,
    every_job,
    handles,
    known,
    owned,
    principal,
    routes,
)
from sparkpoint.coordinator.rest.models import (
    BAD_REQUEST,
    ELSEWHERE,
    ENDED,
    NO_JOB,
    NOT_FOUND,
    UNAVAILABLE,
    Accepted,
    JobConfig,
    JobDetails,
    JobExceptions,
    JobList,
    JobPlan,
    JobProgress,
    JobsOverview,
    VertexMetrics,
    answers,
)
from sparkpoint.coordinator.service.owned import UnknownJob


def router(ctx: RestContext) -> APIRouter:
    return routes(JobHandlers(ctx))


class JobHandlers:
    """In route order: ``/jobs/overview`` before ``/jobs/{jobid}``, which would take it."""

    def __init__(self, ctx: RestContext) -> None:
        self.ctx = ctx

    @handles("GET", "/jobs", response_model=None, responses=answers(JobList))
    async def jobs(self) -> dict[str, Any]:
        listed = [
            {"id": job.job_id, "jid": flink_job_id(job.job_id),
             "name": job.registration.job_name, "status": job.status.name,
             "parallelism": job.registration.parallelism, "restarts": job.history.restarts}
            for job in every_job(self.ctx)
        ]  # fmt: skip
        return {"jobs": listed}

    @handles("GET", "/jobs/overview", response_model=None, responses=answers(JobsOverview))
    async def jobs_overview(self) -> dict[str, Any]:
        now = self.ctx.clock.now_ms()
        return {"jobs": [job_views.overview(job, now) for job in every_job(self.ctx)]}

    @handles(
        "GET",
        "/jobs/{jobid}/vertices/{vertexid}/{what:path}",
        response_model=None,
        responses=answers(VertexMetrics, ELSEWHERE, NOT_FOUND),
    )
    async def vertex_metrics(
        self, jobid: str, vertexid: str, what: str, get: str | None = None
    ) -> Any:
        """A stage's metrics, metrics over its subtasks and back-pressure, as Flink's dashboard
        asks for them, from the agent's heartbeats (`progress_views`), and its watermarks (an
        empty list while it has none, as Flink answers)."""
        job = known(self.ctx, jobid)
        if what not in ("watermarks", "metrics", "subtasks/metrics", "backpressure"):
            raise HTTPException(404, f"No {what} of vertex {vertexid}")
        vertex = job_views.vertex_index(job, vertexid)
        if vertex is None:
            raise HTTPException(404, f"Vertex {vertexid} of job {jobid} not found")
        now = self.ctx.clock.now_ms()
        names = [n for n in get.split(",") if n] if get is not None else None
        if what == "metrics":
            return progress_views.vertex_metrics(job, vertex, now, names)
        if what == "subtasks/metrics":
            return progress_views.aggregated_metrics(job, vertex, now, names)
        if what == "backpressure":
            return progress_views.backpressure(job, vertex, now)
        return progress_views.watermarks(job, vertex)

    @handles(
        "GET",
        "/jobs/{jobid}/progress",
        response_model=None,
        responses=answers(JobProgress, ELSEWHERE, NO_JOB),
    )
    async def job_progress(self, jobid: str) -> dict[str, Any]:
        """Records in and out and where each source partition stands (sparkpoint's own)."""
        return progress_views.progress(known(self.ctx, jobid), self.ctx.clock.now_ms())

    @handles(
        "GET",
        "/jobs/{jobid}/plan",
        response_model=None,
        responses=answers(JobPlan, ELSEWHERE, NO_JOB),
    )
    async def job_plan(self, jobid: str) -> dict[str, Any]:
        return {"plan": job_views.plan(known(self.ctx, jobid))}

    @handles(
        "PATCH",
        "/jobs/{jobid}",
        status_code=202,
        response_model=None,
        responses={
            202: {"model": Accepted, "description": Accepted.__doc__},
            **ELSEWHERE, **BAD_REQUEST, **NO_JOB, **ENDED, **UNAVAILABLE,
        },
    )  # fmt: skip
    async def cancel(
        self,
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
        ended = self.ctx.ended.get(jobid)
        if ended is not None and jobid not in self.ctx.jobs:
            return error(
                409,
                f"Job cancellation failed because the job has already reached another terminal "
                f"state ({ended.status.name}).",
            )
        owned(self.ctx, jobid)
        asking = principal(request, x_sparkpoint_principal)
        try:
            await self.ctx.cancel(jobid, asking)
        except UnknownJob:
            return error(404, f"Job {jobid} not found")
        except Exception as exc:
            return error(503, f"the cancellation was not persisted, nothing changed: {exc}")
        return JSONResponse({}, status_code=202)

    @handles(
        "GET",
        "/jobs/{jobid}",
        response_model=None,
        responses=answers(JobDetails, ELSEWHERE, NO_JOB),
    )
    async def job_details(self, jobid: str) -> dict[str, Any]:
        return job_views.details(known(self.ctx, jobid), self.ctx.clock.now_ms())

    @handles(
        "GET",
        "/jobs/{jobid}/exceptions",
        response_model=None,
        responses=answers(JobExceptions, ELSEWHERE, NO_JOB),
    )
    async def job_exceptions(self, jobid: str) -> dict[str, Any]:
        return job_views.exceptions(known(self.ctx, jobid))

    @handles(
        "GET",
        "/jobs/{jobid}/config",
        response_model=None,
        responses=answers(JobConfig, ELSEWHERE, NO_JOB),
    )
    async def job_config(self, jobid: str) -> dict[str, Any]:
        return job_views.config(known(self.ctx, jobid))
