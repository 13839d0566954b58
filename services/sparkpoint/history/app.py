"""`sparkpoint history`: a faust-streaming app that folds the audit topics into one history
document per job (`sparkpoint.history.model`) and serves it over REST in Flink's shapes.

The documents live in a faust table whose changelog is a compacted topic; a restarted service
reads the changelog back instead of replaying the audit topics (faust's recovery), then goes on
from its committed offsets. Events are folded in batches and each job's document is written once
per batch, so the changelog grows with the batches, not with the events. The REST API takes the
coordinator's security: https, mutual TLS, bearer tokens (`sparkpoint.history.security`).

The embedded broker's defects, and what this module does about each (pinned by
tests/integration/test_history_service.py):

- aiokafka's producer cannot use idempotence or transactions against it: the app runs faust's
  default at-least-once guarantee; a document remembers the offsets it folded, so an event
  folded again after a restart changes nothing.
- the end offset it reports is right only when the last batch holds one record, and faust's
  recovery reads to that offset: every changelog record is its own produce request
  (`JobTable.put`).
- the group join is held for half of the session timeout: the service's session timeout is 3 s
  (`SESSION_TIMEOUT_S`), so a restart joins in 1.5 s.

And one defect of faust with aiokafka on any broker: records fetched before recovery ended are
lost where nothing was committed yet (`RewindingConsumer`).
"""

from __future__ import annotations

import copy
import logging
import os
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import faust
from faust.tables.manager import TableManager
from faust.transport.drivers import aiokafka as aiokafka_driver
from faust.types import TransportT
from faust.web import Request, Response, View

from sparkpoint.common.avro import EventCodec, UndecodableEvent
from sparkpoint.common.flink_ids import is_flink_id
from sparkpoint.common.kafka import make_admin, partition_of
from sparkpoint.common.kafka_config import client_properties
from sparkpoint.common.rest_security import RestSecurity
from sparkpoint.common.topics import CHECKPOINT_EVENTS, CONFIG_CHANGES, JOBS, topic_prefix
from sparkpoint.history import model
from sparkpoint.history.credentials import faust_credentials
from sparkpoint.history.security import web_options

log = logging.getLogger(__name__)

DEFAULT_PORT = 8082
BATCH_EVENTS = 1000
BATCH_WITHIN_S = 0.25
"""Events are folded in batches of up to 1,000, or what arrived within 250 ms: a document is
written once per batch, and the history lags the topics by at most that much plus a fetch."""

SOURCES = (JOBS, CHECKPOINT_EVENTS, CONFIG_CHANGES)

SESSION_TIMEOUT_S = 3.0
"""The history service is the only member of its group: a restarted process can serve only once
the group let go of its predecessor. After a SIGKILL that takes a session timeout, and the
embedded broker holds every join for half of it; 3 s (heartbeats every 0.75 s) keeps a restart
after a crash near 5 s and still rides out a stall of two seconds."""


@dataclass(frozen=True)
class HistorySettings:
    bootstrap: str
    rest_host: str = "127.0.0.1"
    rest_port: int = DEFAULT_PORT
    app_id: str | None = None
    checkpoint_history: int = model.CHECKPOINT_HISTORY
    data_dir: str = os.path.join(tempfile.gettempdir(), "sparkpoint-history")
    """faust's data directory (nothing is kept there with the in-memory store)."""
    session_timeout_s: float = SESSION_TIMEOUT_S
    security: RestSecurity = field(default_factory=RestSecurity)
    """The REST API's TLS and authentication (`sparkpoint.history.security`); none: plain HTTP,
    every request served."""

    @property
    def group(self) -> str:
        return self.app_id or f"{topic_prefix()}history"


def source_partitions(bootstrap: str) -> int:
    """The audit topics' partition count (they share it); the table is co-partitioned."""
    topics = make_admin(bootstrap).list_topics(timeout=10).topics
    counts = {len(topics[s.name()].partitions) for s in SOURCES if s.name() in topics}
    if len(counts) != 1:
        raise RuntimeError(
            "the sparkpoint topics are missing or disagree on partitions: run "
            "`sparkpoint topics create` first"
        )
    return counts.pop()


class RewindingConsumer(aiokafka_driver.Consumer):
    """faust's consumer, going back to the log start where its group has committed nothing (or 0).

    faust drops records it has fetched but not delivered when it stops the flow (the end of
    table recovery does, and source partitions are fetched during recovery), and counts on
    going back to the committed offsets. aiokafka's ``seek_to_committed`` leaves a partition
    where it is when its committed offset is missing or 0, so a service started (or killed and
    restarted) before its first commit lost those records for good: seen as a restarted
    service that never folded a job, or missed one of its events
    (``test_aiokafka_does_not_go_back_to_an_offset_of_0_or_none``).

    It also stops the flow before it seeks. The end of table recovery resumes the source
    partitions and seeks them while the flow still runs (recovery turned it on to read the
    changelog): a batch fetched from the old position goes on being delivered during and after
    the seek, moving faust's read offsets past the new position, and the agent's queue is then
    cleared (``flow_control.resume``): a record still queued was dropped and never read again,
    seen as a restarted service missing an event of a job that ran while it was down."""

    async def perform_seek(self) -> None:
        self.stop_flow()  # every caller resumes the flow once the seek is done
        await super().perform_seek()

    async def seek_to_committed(self) -> Mapping[Any, int]:
        committed = await super().seek_to_committed()
        sources = [
            t for t, offset in committed.items() if not offset and not self._is_changelog_tp(t)
        ]
        if sources:
            await self._thread.seek_to_beginning(*sources)
        return committed


class HistoryTransport(aiokafka_driver.Transport):
    Consumer = RewindingConsumer


class HistoryApp(faust.App):
    def _new_transport(self) -> TransportT:
        return HistoryTransport(self.conf.broker_consumer, self)


class PromptTableManager(TableManager):
    """faust's table manager waits a fixed second at start for tables declared late; every table
    here is declared before the app starts, and that second is a fifth of a restart."""

    async def on_start(self) -> None:
        if not self.should_stop:
            await self._update_channels()
            await self.recovery.start()


class JobTable(faust.Table[bytes, Any]):
    """Documents keyed by job id. They are written once per batch, outside faust's per-event
    context, so the changelog partition comes from the key: murmur2, as every sparkpoint
    producer partitions job ids, which is the partition the job's audit events are on."""

    def partition_for_key(self, key: bytes) -> int:
        return partition_of(key.decode(), self.partitions or 1)

    async def put(self, key: bytes, doc: model.Doc) -> None:
        """Stores ``doc`` and writes it to the changelog, waiting until the broker has it. One
        record per produce request, so one per batch: the embedded broker reports a partition's
        end as its last batch's base offset + 1, and faust's recovery stops there, losing the
        rest of a batch of several records. Waiting also means an event is acknowledged (and
        its offset committed) only once the document it changed is in the changelog, and a
        reader sees a document only once it is there: a restart serves what it served before
        (stored first, a SIGKILL between the two had it serve an older document afterwards)."""
        pending = await self.changelog_topic.send(
            key=key, value=doc, partition=self.partition_for_key(key)
        )
        await pending
        self.data[key] = doc


def faust_settings(settings: HistorySettings, partitions: int) -> dict[str, Any]:
    """The faust app's settings: the broker and its credentials, the table's store, the group's
    timeouts, the web server and its security."""
    return dict(
        broker=f"kafka://{settings.bootstrap}",
        store="memory://",
        datadir=settings.data_dir,
        topic_partitions=partitions,
        consumer_auto_offset_reset="earliest",
        broker_session_timeout=settings.session_timeout_s,
        broker_heartbeat_interval=settings.session_timeout_s / 4,
        web_enabled=True,
        web_bind=settings.rest_host,
        web_port=settings.rest_port,
        web_host=settings.rest_host,
        table_standby_replicas=0,
        producer_max_request_size=4 * 1024 * 1024,
        TableManager=PromptTableManager,
        broker_credentials=faust_credentials(client_properties()),
        **web_options(settings.security),
    )


def create_app(settings: HistorySettings, partitions: int) -> faust.App:
    app = HistoryApp(settings.group, **faust_settings(settings, partitions))
    codec = EventCodec()
    source = app.topic(
        *(s.name() for s in SOURCES),
        key_type=bytes,
        value_type=bytes,
        key_serializer="raw",
        value_serializer="raw",
        acks=True,
    )
    jobs = JobTable(
        app,
        name="jobs",
        default=None,
        partitions=partitions,
        key_type=bytes,  # raw job ids; values are JSON
    )
    app.tables.add(jobs)
    stats = {"malformed": 0, "folded": 0}

    @app.agent(source)
    async def fold(stream: Any) -> None:
        async for batch in stream.take_events(BATCH_EVENTS, within=BATCH_WITHIN_S):
            touched: dict[str, model.Doc] = {}
            changed: set[str] = set()
            for event in batch:
                message = event.message
                where = (message.topic, message.partition, message.offset)
                decoded = _decode(codec, event.value, where, stats)
                job_id = getattr(decoded, "job_id", None)
                if decoded is None or job_id is None:
                    continue
                doc = touched.get(job_id)
                if doc is None:  # a copy: readers see the stored one until the changelog has it
                    stored = jobs.get(job_id.encode())
                    doc = copy.deepcopy(stored) if stored is not None else model.new_job(job_id)
                    touched[job_id] = doc
                if model.apply(doc, decoded, *where, settings.checkpoint_history):
                    stats["folded"] += 1
                    changed.add(job_id)
            for job_id in changed:  # heartbeats and the like change nothing worth a write
                await jobs.put(job_id.encode(), touched[job_id])

    def documents() -> list[model.Doc]:
        return [doc for doc in jobs.values() if doc is not None]

    def find(job: str) -> model.Doc | None:
        doc = jobs.get(job.encode())
        if doc is not None:
            return doc  # type: ignore[no-any-return]
        if is_flink_id(job):
            return next((d for d in documents() if d["jid"] == job), None)
        return None

    def ready() -> bool:
        """Tables recovered and partitions assigned: until then a document may be missing or
        stale, and requests are answered 503."""
        recovery = app.tables.recovery  # type: ignore[attr-defined]
        return bool(recovery.completed.is_set() and not app.rebalancing and not app.in_recovery)

    _routes(app, documents, find, stats, ready)
    return app


def _decode(
    codec: EventCodec, value: bytes | None, where: tuple[str, int, int], stats: dict[str, int]
) -> Any:
    if value is None:
        return None  # a tombstone of the compacted jobs topic
    try:
        return codec.decode(value)
    except UndecodableEvent as exc:
        stats["malformed"] += 1
        log.warning("malformed event skipped: %s[%d]@%d: %s", *where, exc.reason)
        return None


def _routes(
    app: faust.App,
    documents: Callable[[], list[model.Doc]],
    find: Callable[[str], model.Doc | None],
    stats: dict[str, int],
    ready: Callable[[], bool],
) -> None:
    def recovering(view: View) -> Response:
        return view.json({"errors": ["the history service is recovering its tables"]}, status=503)

    def job_view(render: Callable[[model.Doc, Request], Any]) -> type[View]:
        class JobView(View):
            async def get(self, request: Request, job: str) -> Response:
                if not ready():
                    return recovering(self)
                doc = find(job)
                if doc is None:
                    return self.json({"errors": [f"no history of job {job!r}"]}, status=404)
                try:
                    return self.json(render(doc, request))
                except ValueError as exc:
                    return self.json({"errors": [str(exc)]}, status=400)

        return JobView

    @app.page("/jobs/overview")
    async def overview(self: View, request: Request) -> Response:
        if not ready():
            return recovering(self)
        jobs = sorted(documents(), key=lambda d: d["start_time"], reverse=True)
        return self.json({"jobs": [model.overview_json(d) for d in jobs]})

    @app.page("/history/status")
    async def status(self: View, request: Request) -> Response:
        return self.json({"ready": ready(), "jobs": len(documents()), **stats})

    def checkpoints(doc: model.Doc, request: Request) -> Any:
        before = request.query.get("before_epoch")
        if before is not None and not before.isdigit():
            raise ValueError(f"before_epoch: {before!r} is not a whole number")
        return model.checkpoints_json(doc, None if before is None else int(before))

    app.page("/jobs/{job}")(job_view(lambda doc, _: model.job_json(doc)))
    app.page("/jobs/{job}/checkpoints")(job_view(checkpoints))
    app.page("/jobs/{job}/config-changes")(
        job_view(
            lambda doc, _: {"changes": doc["config_changes"], "total": doc["config_change_count"]}
        )
    )
    app.page("/jobs/{job}/savepoints")(job_view(lambda doc, _: {"savepoints": doc["savepoints"]}))
    app.page("/jobs/{job}/history")(job_view(lambda doc, _: doc))

    page = resources.files("sparkpoint.history").joinpath("dashboard.html").read_text()

    @app.page("/")
    async def dashboard(self: View, request: Request) -> Response:
        return self.html(page)  # read once, at start: it is part of the package


def run(settings: HistorySettings, say: Callable[[str], None]) -> None:
    """Runs the history service in the foreground until interrupted."""
    security = settings.security
    partitions = source_partitions(settings.bootstrap)
    app = create_app(settings, partitions)
    say(f"history service on {security.scheme}://{settings.rest_host}:{settings.rest_port}/ "
        f"(group {settings.group}, {partitions} partitions)")  # fmt: skip
    if security.configured:
        say(f"REST security: {security.describe()}")
    worker = faust.Worker(app, loglevel="WARNING", quiet=True, override_logging=False)
    worker.execute_from_commandline()
