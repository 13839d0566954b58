"""Flink's savepoint handlers (flink-runtime ``rest/handler/job/savepoints``): a savepoint's
trigger and status, stop-with-savepoint, a job's savepoints, and savepoint disposal."""

from __future__ import annotations

import asyncio
from pathlib import PurePosixPath
from typing import Annotated, Any

from fastapi import APIRouter, Body
from starlette.exceptions import HTTPException

from sparkpoint.common.events import SavepointFormat
from sparkpoint.common.limits import MAX_TEXT
from sparkpoint.common.metadata import BadMetadata, SnapshotMetadata
from sparkpoint.common.storage import PathOutsideRoots
from sparkpoint.coordinator.rest.deps import (
    NotHere,
    RestContext,
    directory_problem,
    encodable,
    error,
    handles,
    owned,
    routes,
    status_of,
)
from sparkpoint.coordinator.rest.models import (
    BAD_REQUEST,
    ELSEWHERE,
    NO_JOB,
    NO_SAVEPOINTS,
    NOT_FOUND,
    DisposalRequest,
    SavepointList,
    SavepointRequest,
    StopRequest,
    TriggerId,
    TriggerStatus,
    answers,
)
from sparkpoint.coordinator.service.owned import DisposalRefused, OwnedElsewhere, TriggerRequest


def disposal_outcome(request: TriggerRequest) -> dict[str, Any]:
    body: dict[str, Any] = {"status": {"id": request.status}}
    if request.status == "COMPLETED":
        body["operation"] = (
            {"failure-cause": {"class": "IOException", "stack-trace": request.failure}}
            if request.failure
            else {}
        )
    return body


def router(ctx: RestContext) -> APIRouter:
    return routes(SavepointHandlers(ctx))


class SavepointHandlers:
    def __init__(self, ctx: RestContext) -> None:
        self.ctx = ctx

    @handles(
        "POST",
        "/jobs/{jobid}/savepoints",
        response_model=None,
        responses=answers(TriggerId, ELSEWHERE, BAD_REQUEST, NO_JOB),
    )
    async def trigger_savepoint(
        self, jobid: str, body: Annotated[SavepointRequest | None, Body()] = None
    ) -> Any:
        body = body or SavepointRequest()
        return self._savepoint(
            jobid, body.formatType, ("target-directory", body.target_directory),
            terminate=body.cancel_job, trigger_id=body.triggerId,
        )  # fmt: skip

    @handles(
        "GET",
        "/jobs/{jobid}/savepoints/{triggerid}",
        response_model=None,
        responses=answers(TriggerStatus, ELSEWHERE, NOT_FOUND),
    )
    async def savepoint_status(self, jobid: str, triggerid: str) -> dict[str, Any]:
        return status_of(
            self.ctx,
            jobid,
            triggerid,
            "savepoint request",
            lambda r: r.savepoint and not r.disposal,
        )

    @handles(
        "GET",
        "/jobs/{jobid}/savepoints",
        response_model=None,
        responses=answers(SavepointList, ELSEWHERE, NO_SAVEPOINTS),
    )
    async def savepoints(self, jobid: str) -> dict[str, Any]:
        job = self.ctx.jobs.get(jobid) or self.ctx.ended.get(jobid)
        if job is None and self.ctx.owner_url(jobid) is not None:
            raise NotHere(jobid)  # the owner has the job's record of its savepoints
        found = await self.ctx.savepoints_of(job) if job is not None else []
        listed = {s["location"] for s in found}
        # savepoints from before the job's record listed them: by name in the default directory
        root = self.ctx.settings.defaults.savepoint_dir
        for directory in await asyncio.to_thread(self.ctx.storage.list_dirs, root):
            name = PurePosixPath(directory).name
            if directory in listed or not name.startswith(f"savepoint-{jobid[:6]}-"):
                continue
            try:
                data = await asyncio.to_thread(self.ctx.storage.read, f"{directory}/_metadata")
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

    @handles(
        "POST",
        "/savepoint-disposal",
        response_model=None,
        responses=answers(TriggerId, ELSEWHERE, BAD_REQUEST),
    )
    async def dispose_savepoint(self, body: Annotated[DisposalRequest, Body()]) -> Any:
        """Flink's savepoint disposal: deletes a completed savepoint; refuses (400, nothing
        deleted) a path outside the storage roots, one that is not a completed savepoint, or a
        snapshot a job restores from."""
        path = body.savepoint_path
        if "\x00" in path or not encodable(path) or len(path) > MAX_TEXT or not path.strip():
            return error(400, "savepoint-path: not a usable path")
        try:
            request = await self.ctx.dispose_savepoint(path)
        except PathOutsideRoots as exc:
            return error(400, f"savepoint-path: {exc}")
        except DisposalRefused as exc:
            return error(400, f"savepoint-path: {exc}")
        except OwnedElsewhere as exc:
            raise NotHere(exc.job_id) from None
        # done already: the outcome comes with the trigger id (a client that polls gets it too)
        return {"request-id": request.request_id, **disposal_outcome(request)}

    @handles(
        "GET",
        "/savepoint-disposal/{triggerid}",
        response_model=None,
        responses=answers(TriggerStatus, NOT_FOUND),
    )
    async def disposal_status(self, triggerid: str) -> dict[str, Any]:
        request = self.ctx.requests.get(triggerid)
        if request is None or not request.disposal:
            raise HTTPException(404, f"No savepoint disposal {triggerid}")
        return disposal_outcome(request)

    @handles(
        "POST",
        "/jobs/{jobid}/stop",
        response_model=None,
        responses=answers(TriggerId, ELSEWHERE, BAD_REQUEST, NO_JOB),
    )
    async def stop(self, jobid: str, body: Annotated[StopRequest | None, Body()] = None) -> Any:
        body = body or StopRequest()
        return self._savepoint(
            jobid, body.formatType, ("targetDirectory", body.targetDirectory),
            terminate=True, trigger_id=body.triggerId, drain=body.drain,
        )  # fmt: skip

    def _savepoint(
        self, jobid: str, format_type: str, target: tuple[str, str | None], **trigger: Any
    ) -> Any:
        """A savepoint (also of a stop) of a job running here; ``target``: the body's field
        for the target directory (Flink names it differently in the two bodies) and its value."""
        owned(self.ctx, jobid)
        if format_type not in ("CANONICAL", "NATIVE"):
            return error(400, "formatType: must be CANONICAL or NATIVE")
        field, directory = target
        problem = directory_problem(self.ctx, field, directory)
        if problem is not None:
            return problem
        try:
            request = self.ctx.trigger(
                jobid, True, directory, format_type=SavepointFormat[format_type], **trigger
            )
        except PathOutsideRoots as exc:
            return error(400, f"{field}: {exc}")
        return {"request-id": request.request_id}
