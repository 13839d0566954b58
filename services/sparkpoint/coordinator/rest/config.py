"""The checkpoint configuration of a running job, changed through REST (FLIP-571, sparkpoint's
own): ``PATCH /jobs/{jobid}/checkpoints/configuration``; and `config_json`, the effective values
as ``GET /jobs/{jobid}/checkpoints/config`` answers them (`checkpoints`)."""

from __future__ import annotations

import uuid
from typing import Annotated, Any

from fastapi import APIRouter, Body, Header, Request

from sparkpoint.common.settings import CheckpointConfig, ConfigError
from sparkpoint.coordinator.rest.deps import RestContext, error, handles, owned, principal, routes
from sparkpoint.coordinator.rest.models import (
    BAD_REQUEST,
    CONFLICT,
    ELSEWHERE,
    NO_JOB,
    OPTION_TO_REST,
    UNAVAILABLE,
    CheckpointConfigInfo,
    ConfigurationUpdate,
    answers,
)
from sparkpoint.coordinator.service.owned import UnknownJob, UpdateInProgress
from sparkpoint.coordinator.service.writer import NotOwner


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


def router(ctx: RestContext) -> APIRouter:
    return routes(ConfigurationHandlers(ctx))


class ConfigurationHandlers:
    def __init__(self, ctx: RestContext) -> None:
        self.ctx = ctx

    @handles(
        "PATCH",
        "/jobs/{jobid}/checkpoints/configuration",
        response_model=None,
        responses=answers(
            CheckpointConfigInfo, ELSEWHERE, BAD_REQUEST, NO_JOB, CONFLICT, UNAVAILABLE
        ),
    )
    async def update_configuration(
        self,
        jobid: str,
        request: Request,
        update: Annotated[ConfigurationUpdate, Body()],
        x_sparkpoint_principal: Annotated[str | None, Header()] = None,
        x_request_id: Annotated[str | None, Header()] = None,
    ) -> Any:
        owned(self.ctx, jobid)
        asking = principal(request, x_sparkpoint_principal)
        try:
            config = await self.ctx.update_configuration(
                jobid, update.settings(), asking, x_request_id or uuid.uuid4().hex
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
