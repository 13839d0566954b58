"""What the REST API asks of the service, on the loop: manual checkpoints and savepoints (and
stop-with-savepoint), cancellation, FLIP-571 configuration changes, savepoint disposal and the
list of a job's savepoints. Each operation with an outcome to ask for later is a
`TriggerRequest` under its trigger id (`TriggerRequests`), which the job's core answers
(RequestCompleted, RequestFailed). Errors are raised for the REST layer to answer
(`owned`: UnknownJob, TriggerIdInUse, UpdateInProgress, DisposalRefused, OwnedElsewhere;
PathOutsideRoots, ConfigError)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sparkpoint.common.clock import Clock
from sparkpoint.common.events import (
    CancelJob,
    CheckpointOverrides,
    CheckpointSettings,
    ConfigChange,
    SavepointFormat,
)
from sparkpoint.common.limits import MAX_TEXT
from sparkpoint.common.metadata import BadMetadata, SnapshotMetadata
from sparkpoint.common.settings import REST_FIELDS, CheckpointConfig
from sparkpoint.common.storage import PathOutsideRoots, Storage
from sparkpoint.coordinator.core.commands import (
    Command,
    DiscardState,
    RequestCompleted,
    RequestFailed,
)
from sparkpoint.coordinator.core.store import Discard
from sparkpoint.coordinator.service.owned import (
    DisposalRefused,
    OwnedElsewhere,
    OwnedJob,
    TriggerIdInUse,
    TriggerRequest,
    UnknownJob,
    UpdateInProgress,
)
from sparkpoint.coordinator.service.publisher import Publisher
from sparkpoint.coordinator.service.writer import OutcomeUnknown

log = logging.getLogger(__name__)


class TriggerRequests:
    """The operations asked for over REST, by trigger id (Flink's ``triggerId``)."""

    def __init__(self) -> None:
        self.by_id: dict[str, TriggerRequest] = {}

    def answer(self, command: RequestCompleted | RequestFailed) -> None:
        """The job's core says how a request ended."""
        request = self.by_id.get(command.request_id)
        if request is None:
            return
        if isinstance(command, RequestCompleted):
            request.status, request.checkpoint_id, request.location = (
                "COMPLETED",
                command.checkpoint_id,
                command.external_path,
            )
        else:
            request.status, request.failure = (
                "COMPLETED",
                f"{command.reason.name}: {command.message}",
            )


class Operations:
    def __init__(
        self,
        jobs: Mapping[str, OwnedJob],
        ended: Mapping[str, OwnedJob],
        requests: TriggerRequests,
        storage: Storage,
        clock: Clock,
        publisher: Publisher,
        execute: Callable[[OwnedJob, Sequence[Command]], None],
        owner_url: Callable[[str], str | None],
    ) -> None:
        """``jobs``, ``ended``: the registry's (read only); ``owner_url``: where another
        instance that owns a job answers (None when none does)."""
        self.jobs, self.ended, self.requests = jobs, ended, requests.by_id
        self.storage, self.clock, self.publisher = storage, clock, publisher
        self.execute, self.owner_url = execute, owner_url

    def job(self, job_id: str) -> OwnedJob:
        job = self.jobs.get(job_id)
        if job is None:
            raise UnknownJob(job_id)
        return job

    def trigger(
        self,
        job_id: str,
        savepoint: bool,
        target_directory: str | None = None,
        terminate: bool = False,
        full: bool = False,
        format_type: SavepointFormat = SavepointFormat.CANONICAL,
        trigger_id: str | None = None,
        drain: bool = False,
    ) -> TriggerRequest:
        """A manual checkpoint or savepoint. ``trigger_id``: the client's id for the operation
        (Flink's ``triggerId``); a request that names one already known for this job and kind
        is a retry and gets that operation back; for another job or kind, `TriggerIdInUse`."""
        job = self.job(job_id)
        if trigger_id is not None:
            trigger_id = trigger_id.lower()
            known = self.requests.get(trigger_id)
            if known is not None:
                if (known.job_id, known.savepoint, known.disposal) != (job_id, savepoint, False):
                    raise TriggerIdInUse(trigger_id)
                return known
        if target_directory is not None:
            self.storage.check(target_directory)
        request = TriggerRequest(trigger_id or uuid.uuid4().hex, job_id, savepoint)
        self.requests[request.request_id] = request
        now = self.clock.now_ms()
        if savepoint:
            commands = job.core.trigger_savepoint(
                now, request.request_id, target_directory, terminate, format_type, drain
            )
        else:
            commands = job.core.trigger_checkpoint(now, request.request_id, full=full)
        self.execute(job, commands)
        return request

    async def cancel(self, job_id: str, principal: str) -> None:
        """Flink's cancel: the job's agent ends it CANCELED at the end of its current round, as
        Ctrl-C does, without a savepoint. Returns once the request is durable on the control
        topic (the agent acts on it when it reads it); raises `UnknownJob` for a job not
        running here. A job that already ended is left as it is."""
        job = self.job(job_id)
        registration = job.registration
        event = CancelJob(
            job_id,
            job.core.owner_epoch,
            self.clock.now_ms(),
            principal[:MAX_TEXT],
            registration.agent_id,
            registration.attempt,
        )
        log.info("job %s: cancellation requested by %s", job_id, principal)
        await self.publisher.published(job, [event])

    async def update_configuration(
        self, job_id: str, changes: CheckpointSettings, principal: str, request_id: str
    ) -> CheckpointConfig:
        """FLIP-571: validate, persist (acknowledged), apply. The override and its change event
        are one transaction: durable together or not at all. A change answered with an error
        never takes effect later: when the outcome of the write is unknown, the previous
        overrides are written again above it before the error goes out."""
        job = self.job(job_id)
        if job.updating:
            raise UpdateInProgress(job_id)
        job.updating = True
        try:
            current = job.core.config
            new_config = current.with_overrides(changes)  # raises ConfigError: 400
            previous = job.overrides
            merged = _merge(previous.overrides if previous else CheckpointSettings(), changes)
            version = (previous.version if previous else 0) + 1
            now = self.clock.now_ms()
            record = CheckpointOverrides(job_id, version, merged, request_id, now)
            changed = [name for name, value in _rest_fields(changes).items() if value is not None]
            change = ConfigChange(
                job_id, request_id, principal, now, current.settings(), new_config.settings(),
                changed, version,
            )  # fmt: skip
            try:
                await self.publisher.published(job, [record, change])
            except OutcomeUnknown:
                await self._take_back(job, previous, version)
                raise
            live = self.jobs.get(job_id)
            if live is None:
                return new_config  # durable: the job's next owner applies it on takeover
            if live is not job:  # the job restarted meanwhile: apply to its new coordinator
                new_config = live.core.config.with_overrides(changes)
                job = live
            job.overrides = record
            self.execute(job, job.core.apply_config(new_config, self.clock.now_ms()))
            return new_config
        finally:
            job.updating = False

    async def _take_back(
        self, job: OwnedJob, previous: CheckpointOverrides | None, version: int
    ) -> None:
        """The write of override ``version`` may have gone through: the previous overrides are
        written as ``version + 1``, so whichever owner replays the topic applies those."""
        restored = CheckpointOverrides(
            job.job_id, version + 1, previous.overrides if previous else CheckpointSettings(),
            f"revert-{version}", self.clock.now_ms(),
        )  # fmt: skip
        try:
            await self.publisher.published(job, [restored])
        except Exception as exc:
            log.error(
                "job %s: override %d may be durable and could not be taken back (%s); "
                "check GET .../checkpoints/config after the next takeover",
                job.job_id, version, exc,
            )  # fmt: skip
            return
        job.overrides = restored

    async def dispose_savepoint(self, path: str) -> TriggerRequest:
        """``POST /savepoint-disposal``: checks that ``path`` is a completed savepoint inside the
        storage roots that no job restores from (`DisposalRefused` otherwise, nothing deleted),
        then deletes it. A savepoint of a job owned by another instance is that instance's to
        dispose (`OwnedElsewhere`), so the job's record of its savepoints stays right."""
        directory, metadata = await self._savepoint_at(path)
        if self.owner_url(metadata.job_id) is not None:
            raise OwnedElsewhere(metadata.job_id)
        job = self.jobs.get(metadata.job_id) or self.ended.get(metadata.job_id)
        for candidate in (*self.jobs.values(), *self.ended.values()):
            held = candidate.core.in_use(directory)
            if held is not None:
                raise DisposalRefused(
                    f"{directory} is retained checkpoint {held.checkpoint_id} of job "
                    f"{candidate.job_id} (it claimed the savepoint): that job may restore from it"
                )
        request = TriggerRequest(
            uuid.uuid4().hex, metadata.job_id, True, location=directory, disposal=True
        )
        self.requests[request.request_id] = request
        if job is not None:
            commands = job.core.dispose_savepoint(directory, "disposed on request")
            self.publisher.publish(job, [job.core.store_record(self.clock.now_ms())])
            discards = [c for c in commands if isinstance(c, DiscardState)]
        else:
            discards = [
                DiscardState(
                    metadata.job_id, Discard(metadata.checkpoint_id, (), directory, "disposed")
                )
            ]
        try:
            for discard in discards:
                await asyncio.to_thread(
                    self.storage.delete, discard.discard.files, discard.discard.directory
                )
            request.status = "COMPLETED"
        except Exception as exc:
            request.status, request.failure = "COMPLETED", f"deleting {directory} failed: {exc}"
        log.info("savepoint %s of job %s disposed", directory, metadata.job_id)
        return request

    async def _savepoint_at(self, path: str) -> tuple[str, SnapshotMetadata]:
        """The directory of the completed savepoint at ``path`` (or its ``_metadata``) and what
        its ``_metadata`` says; `PathOutsideRoots` or `DisposalRefused` when it is none."""
        self.storage.check(path)  # PathOutsideRoots: refused
        directory = path.removesuffix("/_metadata").rstrip("/")
        try:
            data = await asyncio.to_thread(self.storage.read, f"{directory}/_metadata")
            metadata = SnapshotMetadata.from_json(data, directory)
        except FileNotFoundError:
            raise DisposalRefused(
                f"{directory} has no _metadata: not a completed savepoint"
            ) from None
        except BadMetadata as exc:
            raise DisposalRefused(str(exc)) from None
        if not metadata.is_savepoint:
            raise DisposalRefused(
                f"{directory} is checkpoint {metadata.checkpoint_id} of job {metadata.job_id}, not a "
                "savepoint: retention deletes checkpoints"
            )
        return directory, metadata

    async def savepoints_of(self, job: OwnedJob) -> list[dict[str, Any]]:
        """Every savepoint the job wrote, wherever, as its record says, and whether it is still
        on storage."""
        listed = []
        for saved in job.core.savepoints:
            try:
                exists = await asyncio.to_thread(
                    self.storage.exists, f"{saved.external_path}/_metadata"
                )
            except PathOutsideRoots:
                exists = False
            listed.append(
                {
                    "id": saved.checkpoint_id,
                    "location": saved.external_path,
                    "trigger_timestamp": saved.trigger_timestamp,
                    "completed_timestamp": saved.completed_timestamp,
                    "status": "DISPOSED" if saved.disposed else "COMPLETED",
                    "state_size": saved.state_size_bytes,
                    "format_type": saved.format_type,
                    "kind": saved.kind,
                    "exists": exists,
                }
            )
        return listed


def _rest_fields(settings: CheckpointSettings) -> dict[str, Any]:
    return {rest: getattr(settings, field) for rest, field in REST_FIELDS.items()}


def _merge(base: CheckpointSettings, changes: CheckpointSettings) -> CheckpointSettings:
    return dataclasses.replace(
        base,
        **{
            f.name: getattr(changes, f.name)
            for f in dataclasses.fields(changes)
            if getattr(changes, f.name) is not None
        },
    )
