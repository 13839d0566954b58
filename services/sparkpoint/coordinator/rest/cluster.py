"""Flink's cluster handlers (flink-runtime ``rest/handler/cluster``): the cluster overview, the
dashboard's and the instance's configuration, task managers (none) and applications; and the
instance's own pages: Prometheus metrics (`metrics_text`) and the dashboard
(``dashboard.html``)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from importlib.resources import files
from typing import Any

from fastapi import APIRouter
from fastapi.responses import HTMLResponse, PlainTextResponse

from sparkpoint.common.redaction import redact_options
from sparkpoint.coordinator.rest import job_views, progress_views
from sparkpoint.coordinator.rest.deps import RestContext, every_job, handles, routes
from sparkpoint.coordinator.rest.flink_compat import cluster_overview, dashboard_config
from sparkpoint.coordinator.rest.models import (
    Applications,
    ClusterOverview,
    ConfigEntries,
    DashboardConfig,
    TaskManagers,
    answers,
)
from sparkpoint.coordinator.service.owned import OwnedJob

DASHBOARD = files(__package__).joinpath("dashboard.html").read_text(encoding="utf-8")
"""``GET /``: a page of the jobs, their progress and checkpoints; ``{{generated}}``: when."""

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


def router(ctx: RestContext) -> APIRouter:
    return routes(ClusterHandlers(ctx))


class ClusterHandlers:
    def __init__(self, ctx: RestContext) -> None:
        self.ctx = ctx

    @handles("GET", "/config", response_model=None, responses=answers(DashboardConfig))
    async def flink_config(self) -> dict[str, Any]:
        return dashboard_config()

    @handles("GET", "/overview", response_model=None, responses=answers(ClusterOverview))
    async def cluster(self) -> dict[str, Any]:
        return cluster_overview([job.status.name for job in every_job(self.ctx)])

    @handles("GET", "/applications/overview", response_model=None, responses=answers(Applications))
    async def applications(self) -> dict[str, Any]:
        now = self.ctx.clock.now_ms()
        return {"applications": [job_views.application(job, now) for job in every_job(self.ctx)]}

    @handles("GET", "/taskmanagers", response_model=None, responses=answers(TaskManagers))
    async def task_managers(self) -> dict[str, Any]:
        """None: Spark's executors run the tasks (Spark's UI shows them)."""
        return {"taskmanagers": []}

    @handles("GET", "/jobmanager/config", response_model=None, responses=answers(ConfigEntries))
    async def coordinator_config(self) -> list[dict[str, str]]:
        """The instance's cluster-wide defaults, as Flink lists its configuration (a secret's
        value redacted)."""
        defaults = redact_options(self.ctx.settings.defaults.to_options())
        return [{"key": k, "value": str(v)} for k, v in sorted(defaults.items())]

    @handles("GET", "/metrics", response_class=PlainTextResponse)
    async def metrics(self) -> str:
        return metrics_text(
            list(self.ctx.jobs.values()), self.ctx.malformed, self.ctx.rejected,
            self.ctx.clock.now_ms(),
        )  # fmt: skip

    @handles("GET", "/", response_class=HTMLResponse)
    async def dashboard(self) -> str:
        return DASHBOARD.replace("{{generated}}", time.strftime("%Y-%m-%d %H:%M:%S"))
