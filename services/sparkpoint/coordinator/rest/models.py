"""The request and response bodies of the coordinator's REST API, and what each operation
declares in ``/openapi.json``: handlers return plain dicts in Flink's JSON shapes; these models
validate requests and document responses (a response model allows more properties than it
names, as Flink's clients ignore new ones)."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict, Field, RootModel

from sparkpoint.common.events import CheckpointSettings
from sparkpoint.common.limits import MAX_ID
from sparkpoint.common.settings import PREFIX, REST_FIELDS

OPTION_TO_REST = {
    PREFIX + "interval": "checkpointInterval",
    PREFIX + "timeout": "checkpointTimeout",
    PREFIX + "min-pause": "minPauseBetweenCheckpoints",
    PREFIX + "max-concurrent-checkpoints": "maxConcurrentCheckpoints",
    PREFIX + "tolerable-failed-checkpoints": "tolerableCheckpointFailureNumber",
    PREFIX + "aligned-checkpoint-timeout": "alignedCheckpointTimeout",
    PREFIX + "unaligned.enabled": "unalignedCheckpoints",
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
    unalignedCheckpoints: bool | None = None
    """Unaligned checkpoints on or off from the next checkpoint (needs EXACTLY_ONCE and max
    concurrent checkpoints 1)."""

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
    # Flink's client-chosen trigger id (32 hex digits): the request is answered with it, and
    # sent again (a retry) it names the same operation instead of starting another
    triggerId: str | None = Field(default=None, pattern="^[0-9a-fA-F]{32}$")


class DisposalRequest(BaseModel):
    """``POST /savepoint-disposal`` (Flink's SavepointDisposalRequest)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    savepoint_path: str = Field(alias="savepoint-path")


class StopRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    targetDirectory: str | None = None
    drain: bool = False
    formatType: str = Field(
        default="CANONICAL", json_schema_extra={"enum": ["CANONICAL", "NATIVE"]}
    )
    # Flink's client-chosen trigger id (32 hex digits): the request is answered with it, and
    # sent again (a retry) it names the same operation instead of starting another
    triggerId: str | None = Field(default=None, pattern="^[0-9a-fA-F]{32}$")


class CheckpointTriggerBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    checkpointType: str = Field(
        default="CONFIGURED", json_schema_extra={"enum": ["CONFIGURED", "FULL", "INCREMENTAL"]}
    )
    # Flink's client-chosen trigger id (32 hex digits): the request is answered with it, and
    # sent again (a retry) it names the same operation instead of starting another
    triggerId: str | None = Field(default=None, pattern="^[0-9a-fA-F]{32}$")


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


class Accepted(BaseModel):
    """Accepted: the request is durable and the job acts on it (Flink answers ``{}``)."""

    model_config = ConfigDict(extra="forbid")


class DashboardConfig(BaseModel):
    """``GET /config`` (Flink's DashboardConfiguration): what Flink's web dashboard reads first."""

    model_config = ConfigDict(extra="allow")

    refresh_interval: int = Field(alias="refresh-interval")
    flink_version: str = Field(alias="flink-version")
    features: dict[str, bool]


class ClusterOverview(BaseModel):
    """``GET /overview`` (Flink's ClusterOverviewWithVersion): jobs by state; no task managers
    (Spark's executors run the tasks)."""

    model_config = ConfigDict(extra="allow")

    taskmanagers: int
    jobs_running: int = Field(alias="jobs-running")
    jobs_finished: int = Field(alias="jobs-finished")
    jobs_cancelled: int = Field(alias="jobs-cancelled")
    jobs_failed: int = Field(alias="jobs-failed")
    flink_version: str = Field(alias="flink-version")


class Applications(BaseModel):
    """``GET /applications/overview`` (Flink 2.3): each job is an application of its own."""

    model_config = ConfigDict(extra="allow")

    applications: list[dict[str, Any]]


class VertexMetrics(RootModel[list[dict[str, Any]] | dict[str, Any]]):
    """A stage's metrics (ids, or values with ``get``), its metrics over its subtasks, its
    back-pressure, or its watermarks (an empty list while it has none), in Flink's shapes."""


class JobProgress(BaseModel):
    """``GET /jobs/{id}/progress``: records in and out, rates, and each source partition's
    position, end, lag and time since it last advanced, from the agent's newest heartbeat;
    ``stalled`` when a partition has a lag and has not advanced for 10 s."""

    model_config = ConfigDict(extra="allow")
    reported: bool
    stalled: bool
    partitions: list[dict[str, Any]]


class TaskManagers(BaseModel):
    """``GET /taskmanagers``: none (Spark's executors run the tasks)."""

    model_config = ConfigDict(extra="allow")

    taskmanagers: list[dict[str, Any]]


class ConfigEntry(BaseModel):
    key: str
    value: str


class ConfigEntries(RootModel[list[ConfigEntry]]):
    """``GET /jobmanager/config``: the instance's cluster-wide defaults, as key and value."""


class JobPlan(BaseModel):
    """``GET /jobs/{jobid}/plan``: the job graph, one node per stage."""

    model_config = ConfigDict(extra="allow")

    plan: dict[str, Any]


class JobsOverview(BaseModel):
    """``GET /jobs/overview`` (Flink's MultipleJobsDetails)."""

    model_config = ConfigDict(extra="allow")

    jobs: list[dict[str, Any]]


class JobDetails(BaseModel):
    """``GET /jobs/{jobid}`` (Flink's JobDetailsInfo): one vertex per stage."""

    model_config = ConfigDict(extra="allow")

    jid: str
    name: str
    state: str
    vertices: list[dict[str, Any]]


class ExceptionHistory(BaseModel):
    model_config = ConfigDict(extra="allow")

    entries: list[dict[str, Any]]
    truncated: bool


class JobExceptions(BaseModel):
    """``GET /jobs/{jobid}/exceptions`` (Flink's JobExceptionsInfoWithHistory), newest first."""

    model_config = ConfigDict(extra="allow")

    exceptionHistory: ExceptionHistory


class JobConfig(BaseModel):
    """``GET /jobs/{jobid}/config`` (Flink's JobConfigInfo), with the options in effect and
    those without effect here."""

    model_config = ConfigDict(extra="allow")

    jid: str
    name: str


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
ENDED = _error(409, "The job already reached a terminal state.")
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
