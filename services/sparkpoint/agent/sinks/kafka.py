"""The Kafka sink. Records are values in the sink's format (JSON by default) keyed by the key
column.

Exactly-once (the two-phase commit of Flink's KafkaSink, with the commit moved to the moment
the checkpoint completes):

1. records of epoch n (everything stage 2 emitted before barrier n) are staged as files with
   checkpoint n;
2. when checkpoint n completes, one Kafka transaction holds all of epoch n's records and a
   `SinkEpochPublished` marker for n on ``sparkpoint.sink-markers``;
3. on restore from checkpoint k, every epoch <= k above the newest marker is published again;
   the marker carries a digest of the staged files it published, so a restore whose checkpoint
   names other files for the marker's epoch refuses instead of guessing (`unpublished`).

The transactional id is fixed per job and sink, so a restarted agent's ``init_transactions``
aborts whatever a killed predecessor left open (zombie fencing).

Records never pass through the driver. With a local master the sink writes ahead
(`sinks.ahead`): a process of the agent's holds the open transaction, produces each round's
staged files into it as they appear, and a completion only commits. On a cluster an epoch is
published by one Spark task (`publish`, run by the agent's `SinkRunner`), which reads the staged
files where stage 2 wrote them and produces them in the epoch's transaction; the driver sends
the files' names and gets the count back. One process holds the whole transaction either way,
so an epoch is atomic, and the fixed transactional id fences: each new producer's
``init_transactions`` aborts what an earlier one left open.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache

import pandas as pd
from confluent_kafka import KafkaError, KafkaException, Message, Producer

from sparkpoint.agent.faults import kill, passes
from sparkpoint.agent.formats import with_registry_settings
from sparkpoint.agent.job import SIDE_OUTPUT, DeliveryGuarantee, KafkaSink
from sparkpoint.agent.sinks import (
    Emit,
    PublishedEpoch,
    SinkRunner,
    WriteAhead,
    inline,
    outputs_digest,
    read_outputs,
)
from sparkpoint.common.avro import EventCodec
from sparkpoint.common.events import SinkEpochPublished
from sparkpoint.common.kafka import (
    partition_of,
    producer_config,
    replay_topic,
)
from sparkpoint.common.kafka_config import Frozen, client_properties, frozen
from sparkpoint.common.topics import SINK_MARKERS, topic_prefix

log = logging.getLogger(__name__)

TRANSACTION_HEADER = "sparkpoint.transaction"
"""Header of every record an exactly-once epoch publishes: the token of its transaction, also
in the epoch's marker. On a broker that shows aborted transactions to ``read_committed``
readers (the embedded one), a record is committed exactly when a marker carries its token."""

TRANSACTION_TIMEOUT_S = 120.0
"""How long one epoch's commit may take (a million records take a few seconds here)."""

QUEUE_MESSAGES = 1_000_000
"""Records a sink task's producer queues at most (librdkafka's default is 100,000; its byte cap,
1 GB by default, still applies). An epoch often holds more records than the default. Measured on
the embedded broker, 200,000 records with the transaction header: with the default the queue
filled 8 times and the process spent 4.8 µs of CPU a record; with this, 1.8."""


# --- executor side ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Publish:
    """Staged output to produce, for one Spark task: only the files' names travel."""

    sink: KafkaSink
    bootstrap: str
    job_id: str
    agent_id: str
    key_column: str
    transactional_id: str
    markers: str
    """Both named on the driver: a worker's environment is the Spark session's, not the
    agent's (a topic prefix set later would not reach it)."""
    outputs: tuple[str, ...]
    epoch: int | None = None
    """The exactly-once epoch these files are, published in one transaction with its marker;
    None: at-least-once, written at once."""
    crash_halfway: bool = False
    """Tests' crash point ``mid-publish``: half of the records delivered, the transaction left
    open, and the producer kept alive until the agent kills itself."""
    client: Frozen = ()
    """The agent's Kafka client properties: a task runs where its configuration file may not
    be."""


_LEFT_OPEN: list[Producer] = []
"""Producers of transactions left open on purpose (``crash_halfway``): alive until the agent's
process and its workers die, as a killed agent leaves its transaction."""


@cache
def marker_codec() -> EventCodec:
    """The marker's codec, built once per Python worker."""
    return EventCodec()


def publish(task: Publish) -> int:
    """Produces the staged files' records (and, exactly-once, the epoch's marker in the same
    transaction); returns how many records. Runs inside a Spark task, or wherever the writer's
    runner puts it."""
    frame = read_outputs(list(task.outputs))
    if task.epoch is None:
        return publish_frame(task, frame)
    # a producer of its own: its init_transactions fences and aborts whatever an earlier one of
    # the sink's transactional id left open (a kept producer per worker would be fenced by the
    # other workers' in turn, and find out only once it had produced the epoch)
    producer = sink_producer(
        task.sink, task.bootstrap, task.job_id, task.transactional_id, task.client
    )
    digest = outputs_digest(list(task.outputs))
    if _retried():  # the lost attempt may have committed: then the epoch is visible already
        done = newest_marker(
            producer, task.bootstrap, marker_codec(), task.markers, task.job_id, task.sink.topic,
            task.client,
        )  # fmt: skip
        if done is not None and done.epoch == task.epoch and done.outputs_digest == digest:
            return done.records
    producer.begin_transaction()
    token = uuid.uuid4().hex
    try:
        count = queue_frame(producer, task, frame, token)
        if task.crash_halfway:
            _LEFT_OPEN.append(producer)
            return count
        commit_epoch(producer, task, task.epoch, count, digest, token)
    except Exception:
        producer.abort_transaction(30)
        raise
    return count


def commit_epoch(
    producer: Producer, task: Publish, epoch: int, count: int, digest: str, token: str
) -> None:
    """The epoch's `SinkEpochPublished` marker into the open transaction, then the commit."""
    marker = SinkEpochPublished(
        task.job_id, task.sink.topic, epoch, count, task.agent_id, int(time.time() * 1000),
        outputs_digest=digest, transaction=token,
    )  # fmt: skip
    send_records(producer, task.markers, [marker_codec().encode(marker)], [task.job_id.encode()])
    producer.commit_transaction(TRANSACTION_TIMEOUT_S)


@dataclass
class Undelivered:
    """A sink producer's delivery failures (librdkafka reports only those to it: no Python call
    per delivered record). A flush returns once every record is delivered *or failed*: a
    failure not looked at would be a record lost."""

    failed: int = 0
    examples: list[str] = field(default_factory=list)

    def __call__(self, error: KafkaError | None, message: Message) -> None:
        if error is None:
            return
        self.failed += 1
        if len(self.examples) < 3:
            self.examples.append(f"{message.topic()}[{message.partition()}]: {error.str()}")

    def check(self, topic: str) -> None:
        if self.failed:
            raise RuntimeError(
                f"{self.failed} records to {topic} not delivered: {'; '.join(self.examples)}"
            )


def publish_frame(task: Publish, frame: pd.DataFrame) -> int:
    """At-least-once: produces ``frame``'s records at once and waits for their delivery, with
    this worker's producer of the sink (`_KEPT`). A record that failed fails the task (the job
    then restarts from its latest checkpoint and reads it again)."""
    key = (
        task.bootstrap,
        task.job_id,
        repr((task.sink.topic, sorted(task.sink.properties.items()), task.client)),
    )
    kept = _KEPT.get(key)
    if kept is None:
        undelivered = Undelivered()
        producer = sink_producer(
            task.sink, task.bootstrap, task.job_id, None, task.client, undelivered
        )
        kept = _KEPT[key] = (producer, undelivered)
    producer, undelivered = kept
    try:
        count = queue_frame(producer, task, frame, None)
        remaining = producer.flush(60)
        if remaining:
            raise RuntimeError(f"{remaining} records to {task.sink.topic} not delivered")
        undelivered.check(task.sink.topic)
    except BaseException:
        _KEPT.pop(key, None)  # not reused after a failure
        raise
    return count


_KEPT: dict[tuple[str, str, str], tuple[Producer, Undelivered]] = {}
"""This worker's at-least-once sink producers, kept between the stage-2 tasks that publish their
round's output (a producer's first record waits for its connection and producer id)."""


def _retried() -> bool:
    """This is a later attempt of a Spark task (a cluster retries a failed task up to
    ``spark.task.maxFailures`` times): the earlier attempt may have committed its transaction
    before it was lost. Never true outside a Spark task."""
    from pyspark import TaskContext

    context = TaskContext.get()
    return context is not None and context.attemptNumber() > 0


def newest_marker(
    producer: Producer,
    bootstrap: str,
    codec: EventCodec,
    markers: str,
    job_id: str,
    topic: str,
    client: Frozen = (),
) -> SinkEpochPublished | None:
    """The newest committed marker of a job's sink. Markers are written one per transaction, so
    the end offsets are right on the embedded broker too. ``producer`` has initialised the
    sink's transactions, so none is left open (on Apache Kafka an open one would hold
    ``read_committed`` readers back). A read that fails raises: nobody guesses that nothing
    was published."""
    partitions = producer.list_topics(markers, timeout=10).topics[markers]
    partition = partition_of(job_id, len(partitions.partitions))
    found = [
        r.event
        for r in replay_topic(
            bootstrap, codec, markers, [partition], read_committed=True, properties=dict(client)
        )
        if r.key == job_id and isinstance(r.event, SinkEpochPublished) and r.event.sink == topic
    ]
    return max(found, key=lambda m: m.epoch, default=None)


def sink_producer(
    sink: KafkaSink,
    bootstrap: str,
    job_id: str,
    transactional_id: str | None,
    client: Frozen,
    undelivered: Undelivered | None = None,
) -> Producer:
    """A producer for the sink. Given the sink's transactional id, its transactions are
    initialised, which aborts whatever an earlier producer of that id left open (fencing);
    a transaction holding a failed record does not commit. Without: ``undelivered`` is told of
    each record that failed."""
    config = producer_config(
        bootstrap,
        client_id=f"sparkpoint-sink-{job_id}",
        transactional_id=transactional_id,
        properties=dict(client),
    )
    config["linger.ms"] = 5
    config["queue.buffering.max.messages"] = QUEUE_MESSAGES
    config |= {k: v for k, v in sink.properties.items() if k != "transactional.id"}
    if undelivered is not None:
        config |= {"on_delivery": undelivered, "delivery.report.only.error": True}
    if transactional_id is None:
        return Producer(config)
    config["transaction.timeout.ms"] = int(TRANSACTION_TIMEOUT_S * 1000)
    producer = Producer(config)
    producer.init_transactions(30)
    return producer


def queue_frame(
    producer: Producer, task: Publish, frame: pd.DataFrame, transaction: str | None
) -> int:
    """Queues ``frame``'s records: each to the sink's topic, or to the topic of the side output
    its `SIDE_OUTPUT` column names (in the same transaction)."""
    return sum(
        _produce_to(producer, task, topic, part, transaction)
        for topic, part in side_outputs(task.sink, frame)
    )


def side_outputs(sink: KafkaSink, frame: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """``frame`` split by topic: rows whose `SIDE_OUTPUT` is empty go to the sink's topic, the
    others to the topic ``sink.side_outputs`` names for their side output (Flink's
    ``OutputTag``); the column itself is not written. A side output the sink does not name is
    the job's error, named with those it does."""
    if SIDE_OUTPUT not in frame.columns:
        return [(sink.topic, frame)]
    tags = frame[SIDE_OUTPUT]
    routed = tags.notna() & (tags.astype(str) != "")
    rest = frame.drop(columns=[SIDE_OUTPUT])
    parts = [(sink.topic, rest[~routed.to_numpy()])]
    for tag in pd.unique(tags[routed]):
        topic = sink.side_outputs.get(str(tag))
        if topic is None:
            raise ValueError(
                f"output rows name side output {tag!r}, which the sink to {sink.topic} does "
                f"not route (side_outputs: {sorted(sink.side_outputs) or 'none'})"
            )
        parts.append((topic, rest[(tags == tag).to_numpy()]))
    return parts


def _produce_to(
    producer: Producer, task: Publish, topic: str, frame: pd.DataFrame, transaction: str | None
) -> int:
    if not len(frame):
        return 0
    values = task.sink.value_format.encode(frame)
    keys: list[bytes | None] = (
        [k.encode() for k in frame[task.key_column].astype(str).tolist()]
        if task.key_column in frame
        else [None] * len(values)
    )
    # a list of (name, bytes): librdkafka takes it with less conversion than a dict
    headers: list[tuple[str, str | bytes | None]] | None = (
        [(TRANSACTION_HEADER, transaction.encode())] if transaction else None
    )
    if task.crash_halfway:
        middle = len(values) // 2 + 1
        send_records(producer, topic, values[:middle], keys[:middle], headers)
        producer.flush(30)  # half of the records delivered, the transaction open
        return middle
    send_records(producer, topic, values, keys, headers)
    return len(values)


def send_records(
    producer: Producer,
    topic: str,
    values: list[bytes],
    keys: list[bytes | None],
    headers: list[tuple[str, str | bytes | None]] | None = None,
) -> None:
    """Queues records in the producer, waiting for room whenever its queue is full: an epoch may
    hold more records than the queue. A record the producer refuses at once (it already knows
    the topic does not exist, say) fails the call as a delivery failure does, naming the topic
    and how many records were not queued."""
    produce = producer.produce
    for queued, (value, key) in enumerate(zip(values, keys, strict=True)):
        while True:
            try:  # value and key by position: 0.15 us a record less than by keyword
                produce(topic, value, key, headers=headers)
                break
            except BufferError:
                producer.poll(0.05)
            except KafkaException as refused:
                raise RuntimeError(
                    f"{len(values) - queued} records to {topic} not delivered: refused by the "
                    f"producer: {refused.args[0].str()}"
                ) from refused


@dataclass(frozen=True)
class DirectPublish:
    """At-least-once: a stage-2 task produces its round's output at once (`publish_frame`)."""

    task: Publish

    def __call__(self, frame: pd.DataFrame) -> int:
        return publish_frame(self.task, frame)


# --- driver side ------------------------------------------------------------------------------------


class KafkaSinkWriter:
    def __init__(
        self,
        sink: KafkaSink,
        bootstrap: str,
        codec: EventCodec,
        job_id: str,
        agent_id: str,
        key: str,
        run: SinkRunner = inline,
        write_ahead: Callable[[Publish], WriteAhead] | None = None,
    ) -> None:
        self.sink = dataclasses.replace(
            sink, value_format=with_registry_settings(sink.value_format)
        )
        self.client = frozen(client_properties())
        self.bootstrap = bootstrap
        self.codec = codec
        self.job_id = job_id
        self.agent_id = agent_id
        self.key_column = sink.key_column or key
        self.exactly_once = sink.delivery_guarantee is DeliveryGuarantee.EXACTLY_ONCE
        self.markers = SINK_MARKERS.name()
        self.transactional_id = f"{topic_prefix()}sink-{job_id}-{sink.topic}"
        """Fixed per job and sink: a successor's ``init_transactions`` fences the predecessor."""
        self.run = run
        self.ahead: WriteAhead | None = None
        """Exactly-once with ``write_ahead`` (`sinks.ahead.AheadPublisher`, made from the
        sink's settings): the process that holds the open transaction; None: each epoch is
        published by a task when it completes."""
        if write_ahead is not None and self.exactly_once:
            self.ahead = write_ahead(self._task([]))
        self.writes_ahead = self.ahead is not None

    def _task(self, outputs: list[str], epoch: int | None = None, crash: bool = False) -> Publish:
        return Publish(
            self.sink, self.bootstrap, self.job_id, self.agent_id, self.key_column,
            self.transactional_id, self.markers, tuple(outputs), epoch, crash, self.client,
        )  # fmt: skip

    def publish_epoch(self, epoch: int, outputs: list[str]) -> int:
        crash = passes("mid-publish")
        ahead = self._ahead()
        if ahead is not None:
            count = ahead.commit(epoch, outputs, crash)
        else:
            (count,) = self.run(publish, [self._task(outputs, epoch, crash)])
        if crash:
            kill("mid-publish")
        log.info(
            "job %s: epoch %d published to %s (%d records)",
            self.job_id,
            epoch,
            self.sink.topic,
            count,
        )
        return count

    def prepare(self) -> None:
        if self.ahead is not None:
            self.ahead.start()

    def write_ahead(self, outputs: list[str]) -> None:
        """Staged files into the open transaction now, ahead of their epoch's commit."""
        ahead = self._ahead()
        if ahead is not None:
            ahead.produce(outputs)

    def abort_ahead(self) -> None:
        ahead = self._ahead()
        if ahead is not None:
            ahead.reset()

    def _ahead(self) -> WriteAhead | None:
        """The write-ahead process; if it could not start, the sink publishes each epoch with
        a task instead (every file of the epoch: nothing was written ahead)."""
        if self.ahead is not None and not self.ahead.started():
            log.warning(
                "job %s: the sink's write-ahead process did not start (the reason is logged "
                "above); epochs are published by a task when they complete instead",
                self.job_id,
            )
            self.ahead.close()
            self.ahead, self.writes_ahead = None, False
        return self.ahead

    def direct(self) -> Emit | None:
        return None if self.exactly_once else DirectPublish(self._task([]))

    def published(self) -> PublishedEpoch | None:
        """The newest epoch this job's sink made visible (`newest_marker`)."""
        newest = newest_marker(
            self._fence(), self.bootstrap, self.codec, self.markers, self.job_id, self.sink.topic,
            self.client,
        )  # fmt: skip
        return None if newest is None else PublishedEpoch(newest.epoch, newest.outputs_digest)

    def _fence(self) -> Producer:
        """A producer of the sink's transactional id, initialised: a predecessor's transaction
        left open is aborted before the markers are read. At-least-once: a plain producer."""
        transactional = self.transactional_id if self.exactly_once else None
        return sink_producer(self.sink, self.bootstrap, self.job_id, transactional, self.client)

    def close(self) -> None:
        """The write-ahead process ends (its open transaction aborted); without it nothing is
        held: each publishing task has its own producer."""
        if self.ahead is not None:
            self.ahead.close()
