"""Flink's checkpoint handlers (flink-runtime ``rest/handler/job/checkpoints``): a job's
checkpoint statistics (with those from before this instance owned it, from the history service),
one checkpoint's details, the checkpoint configuration, and a manual checkpoint's trigger and
status."""

from __future__ import annotations

import ssl
from typing import Annotated, Any

from fastapi import APIRouter, Body
from starlette.exceptions import HTTPException

from sparkpoint.coordinator.rest.config import config_json
from sparkpoint.coordinator.rest.deps import (
    RestContext,
    error,
    handles,
    known,
    owned,
    routes,
    status_of,
)
from sparkpoint.coordinator.rest.flink_compat import http_client
from sparkpoint.coordinator.rest.models import (
    BAD_REQUEST,
    ELSEWHERE,
    NO_JOB,
    NOT_FOUND,
    CheckpointConfigInfo,
    CheckpointDetails,
    CheckpointingStatistics,
    CheckpointTriggerBody,
    TriggerId,
    TriggerStatus,
    answers,
)
from sparkpoint.coordinator.service.earlier import earlier_statistics, merge


def router(ctx: RestContext, peer_tls: ssl.SSLContext | None = None) -> APIRouter:
    return routes(CheckpointHandlers(ctx, peer_tls))


class CheckpointHandlers:
    """In route order: ``/checkpoints/config`` before ``/checkpoints/{triggerid}``, which would
    take it. ``peer_tls``: how this instance calls the history service over TLS, as it calls
    another instance (`sparkpoint.common.rest_security.tls.TlsFiles.peer_context`; None: the
    default trust)."""

    def __init__(self, ctx: RestContext, peer_tls: ssl.SSLContext | None = None) -> None:
        self.ctx = ctx
        self.peer_tls = peer_tls

    @handles(
        "GET",
        "/jobs/{jobid}/checkpoints/config",
        response_model=None,
        responses=answers(CheckpointConfigInfo, ELSEWHERE, NO_JOB),
    )
    async def checkpoint_config(self, jobid: str) -> dict[str, Any]:
        return config_json(known(self.ctx, jobid).core.config)

    @handles(
        "GET",
        "/jobs/{jobid}/checkpoints/details/{checkpointid}",
        response_model=None,
        responses=answers(CheckpointDetails, ELSEWHERE, BAD_REQUEST, NOT_FOUND),
    )
    async def details(self, jobid: str, checkpointid: int) -> dict[str, Any]:
        found = known(self.ctx, jobid).core.stats.details(checkpointid)
        if found is None:
            raise HTTPException(
                404, f"Checkpoint {checkpointid} of job {jobid} not found in the history"
            )
        return found

    @handles(
        "GET",
        "/jobs/{jobid}/checkpoints",
        response_model=None,
        responses=answers(CheckpointingStatistics, ELSEWHERE, NO_JOB),
    )
    async def checkpoints(self, jobid: str) -> dict[str, Any]:
        core = known(self.ctx, jobid).core
        own = core.stats.to_json()
        history_url = self.ctx.settings.history_url
        if history_url is None:
            return own
        client = http_client(self.peer_tls)
        earlier = await earlier_statistics(client, history_url, jobid, core.owner_epoch)
        return own if earlier is None else merge(own, earlier, core.stats.history_size)

    @handles(
        "POST",
        "/jobs/{jobid}/checkpoints",
        response_model=None,
        responses=answers(TriggerId, ELSEWHERE, BAD_REQUEST, NO_JOB),
    )
    async def trigger_checkpoint(
        self, jobid: str, body: Annotated[CheckpointTriggerBody | None, Body()] = None
    ) -> Any:
        owned(self.ctx, jobid)
        kind = (body or CheckpointTriggerBody()).checkpointType
        if kind not in ("CONFIGURED", "FULL", "INCREMENTAL"):
            return error(400, "checkpointType: must be CONFIGURED, FULL or INCREMENTAL")
        trigger_id = (body or CheckpointTriggerBody()).triggerId
        request = self.ctx.trigger(
            jobid, savepoint=False, full=kind == "FULL", trigger_id=trigger_id
        )
        return {"request-id": request.request_id}

    @handles(
        "GET",
        "/jobs/{jobid}/checkpoints/{triggerid}",
        response_model=None,
        responses=answers(TriggerStatus, ELSEWHERE, NOT_FOUND),
    )
    async def checkpoint_status(self, jobid: str, triggerid: str) -> dict[str, Any]:
        return status_of(
            self.ctx, jobid, triggerid, "checkpoint request", lambda r: not r.savepoint
        )
