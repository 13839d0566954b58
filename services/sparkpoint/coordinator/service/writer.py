"""Publishing for the coordinator: one transactional producer per owned partition of
``sparkpoint.jobs``. Every batch of events one input produces for a job is one transaction on the
job's partition; batches queued meanwhile are committed together (group commit). The fixed
``transactional.id`` per partition fences a previous owner: once a new owner initialised it, the
old one's commits fail as fenced and it stops speaking for those jobs.

An instance's writers take turns (`TransactionTurns`): by default one transaction is open at a
time, and a writer waiting for its turn takes everything queued meanwhile into it. On the
embedded broker concurrent transactions slow each other down far more than they overlap: twelve
producers committing 20 transactions a second each took 24.8 ms p50 a transaction when all could
be open at once, 3.1 ms one at a time (and 5.2 ms two at a time). ``sparkpoint coordinator
--transactions-in-flight`` raises the limit for a broker that serves concurrent transactions
well.
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from sparkpoint.common.avro import EventCodec
from sparkpoint.common.events import (
    AgentHeartbeat,
    CancelJob,
    CheckpointLifecycleEvent,
    CheckpointOverrides,
    CheckpointStoreRecord,
    ConfigChange,
    Event,
    FailoverRequest,
    JobRegistered,
    JobStatusChanged,
    NotifyCheckpointAborted,
    NotifyCheckpointComplete,
    RegistrationResponse,
    TriggerCheckpoint,
)
from sparkpoint.common.kafka import make_producer
from sparkpoint.common.topics import (
    ACKS,
    CHECKPOINT_EVENTS,
    CHECKPOINT_OVERRIDES,
    CHECKPOINT_STORE,
    CONFIG_CHANGES,
    CONTROL,
    JOBS,
    TopicSpec,
    topic_prefix,
)

log = logging.getLogger(__name__)

TOPIC_OF: dict[type, Any] = {
    TriggerCheckpoint: CONTROL,
    NotifyCheckpointComplete: CONTROL,
    NotifyCheckpointAborted: CONTROL,
    FailoverRequest: CONTROL,
    CancelJob: CONTROL,
    JobRegistered: JOBS,
    JobStatusChanged: CHECKPOINT_EVENTS,
    RegistrationResponse: CONTROL,
    AgentHeartbeat: ACKS,
    CheckpointLifecycleEvent: CHECKPOINT_EVENTS,
    CheckpointStoreRecord: CHECKPOINT_STORE,
    ConfigChange: CONFIG_CHANGES,
    CheckpointOverrides: CHECKPOINT_OVERRIDES,
}

MAX_BATCH = 500
"""Batches a writer commits in one transaction at most (group commit under load)."""

TRANSACTION_TIMEOUT_S = 10.0
"""Beginning, producing and committing one batch; longer means the broker is in trouble."""


class TransactionTurns:
    """How many of an instance's partition writers may have a transaction open at once; the
    others wait in the order they asked, and each takes everything queued meanwhile into its
    transaction when its turn comes."""

    def __init__(self, slots: int) -> None:
        if slots < 1:
            raise ValueError("transactions in flight must be at least 1")
        self._lock = threading.Lock()
        self._free = slots
        self._waiting: collections.deque[threading.Event] = collections.deque()

    def __enter__(self) -> None:
        with self._lock:
            if self._free and not self._waiting:
                self._free -= 1
                return
            turn = threading.Event()
            self._waiting.append(turn)
        turn.wait()

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            if self._waiting:
                self._waiting.popleft().set()  # the slot passes straight to the next in line
            else:
                self._free += 1


@dataclass(frozen=True)
class Tombstone:
    """Delete the job's record on a compacted topic (published with the job's other events)."""

    topic: TopicSpec


Done = Callable[[Exception | None], None]
"""Told on the writer's thread how a submitted batch ended: None once committed, else why not."""


def ignore(_: Exception | None) -> None:
    return None


class OutcomeUnknown(RuntimeError):
    """A commit failed and so did the abort after it: the batch may or may not be durable."""


class NotOwner(RuntimeError):
    """This instance lost the partition while an operation was under way."""


class PartitionWriter:
    """Publishes batches for the jobs of one partition, in order, each batch one transaction.
    A fenced producer marks the writer dead: the partition is no longer ours."""

    def __init__(
        self,
        bootstrap: str,
        partition: int,
        codec: EventCodec,
        on_fenced: Callable[[PartitionWriter], None],
        turns: TransactionTurns,
    ) -> None:
        self.partition = partition
        self.turns = turns
        self.codec = codec
        self.on_fenced = on_fenced
        self.transactional_id = f"{topic_prefix()}coordinator-p{partition}"
        self._topic_of = {kind: spec.name() for kind, spec in TOPIC_OF.items()}  # resolved once
        # Batches of many records (a transaction's records for one topic travel together; the
        # store and audit topics are replayed by `read_to_end`, which takes the last batch
        # whole), sent at once: a trigger waits for no linger.
        self.producer: Producer = make_producer(
            bootstrap,
            transactional_id=self.transactional_id,
            client_id=f"sparkpoint-coordinator-p{partition}",
            linger_ms=0,
        )
        self.producer.init_transactions(TRANSACTION_TIMEOUT_S)  # fences the previous owner
        self.alive = True
        self.accepting = True
        self._lock = threading.Lock()
        self._queue: queue.Queue[tuple[str, list[Event | Tombstone], Done] | None] = queue.Queue()
        self._thread = threading.Thread(
            target=self._run, name=f"sparkpoint-writer-p{partition}", daemon=True
        )
        self._thread.start()

    def submit(self, key: str, events: Sequence[Event | Tombstone], done: Done = ignore) -> None:
        """Queues one batch (one input's events for one job); ``done`` hears how it ended (on
        the writer's thread, or at once when the writer no longer accepts work). A callback, not
        a Future: two batches per checkpoint, and a Future costs a lock and a condition each."""
        with self._lock:
            if self.accepting and self.alive:
                self._queue.put((key, list(events), done))
                return
        done(NotOwner(f"partition {self.partition} is not ours any more"))

    def close(self) -> None:
        """Commits everything already queued, then stops; later submits fail at once."""
        with self._lock:
            if self.accepting:
                self.accepting = False
                self._queue.put(None)
        self._thread.join(TRANSACTION_TIMEOUT_S * 2)

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            with self.turns:
                closing = self._drain_and_commit(first)
            if closing:
                return

    def _drain_and_commit(self, first: tuple[str, list[Event | Tombstone], Done]) -> bool:
        """Commits ``first`` and what queued behind it (true when close() came among them)."""
        batch = [first]
        closing = False
        # Group commit: everything queued meanwhile goes into the same transaction, in order.
        while len(batch) < MAX_BATCH:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is None:
                closing = True
                break
            batch.append(item)
        self._commit_batch(batch)
        return closing

    def _commit_batch(self, batch: list[tuple[str, list[Event | Tombstone], Done]]) -> None:
        if not self.alive:
            for _, _, done in batch:
                _tell(done, NotOwner(f"partition {self.partition} is not ours any more"))
            return
        try:
            self._commit(batch)
        except KafkaException as exc:
            error: KafkaError = exc.args[0]
            if error.fatal() or error.code() == KafkaError._FENCED:
                self.alive = False
                log.error(
                    "partition %d: producer fenced, ownership lost: %s", self.partition, error.str()
                )
                self.on_fenced(self)
                failure: Exception = NotOwner(f"fenced on partition {self.partition}")
            else:
                failure = exc if self._abort() else OutcomeUnknown(str(exc))
            for _, _, done in batch:
                _tell(done, failure)
            return
        except Exception as exc:
            failure = exc if self._abort() else OutcomeUnknown(str(exc))
            for _, _, done in batch:
                _tell(done, failure)
            return
        for _, _, done in batch:
            _tell(done, None)

    def _commit(self, batch: list[tuple[str, list[Event | Tombstone], Done]]) -> None:
        producer = self.producer
        producer.begin_transaction()
        for key, events, _ in batch:
            for event in events:
                if isinstance(event, Tombstone):
                    producer.produce(
                        event.topic.name(), key=key.encode(), value=None, partition=self.partition
                    )
                    continue
                producer.produce(
                    self._topic_of[type(event)],
                    key=key.encode(),
                    value=self.codec.encode(event),
                    partition=self.partition,
                )
        producer.commit_transaction(TRANSACTION_TIMEOUT_S)

    def _abort(self) -> bool:
        """Aborts the transaction; false when that failed too (it may have committed)."""
        try:
            self.producer.abort_transaction(TRANSACTION_TIMEOUT_S)
        except KafkaException as exc:
            log.warning("partition %d: abort failed: %s", self.partition, exc)
            return False
        return True


def _tell(done: Done, outcome: Exception | None) -> None:
    try:
        done(outcome)
    except Exception:
        log.exception("a publisher's callback failed")
