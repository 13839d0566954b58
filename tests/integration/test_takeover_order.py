"""A coordinator that takes a job over publishes the job's store record before the abort notices
it owes the agent.

The notices carry the new owner's epoch, and an agent believes a newer epoch only once the job's
store record shows it. The embedded broker shows the records of open transactions to readers, so
an agent reads a transaction's records in the order they were produced: with the notices first,
it read one before the record, dropped it as unconfirmed and left its checkpoint pending for
good. The record and the notices go to different topics (the store and the control topic), so
no offset orders them: the test notes every record the new owner's transactional producers
produce, in order, while they go to the real broker as usual."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from sparkpoint.common.avro import EventCodec
from sparkpoint.common.events import CheckpointStoreRecord, Event, NotifyCheckpointAborted
from sparkpoint.common.kafka import make_producer
from tests.conftest import KafkaUnderTest
from tests.running_coordinator import coordinator_in_thread, wait
from tests.scripted_agent import Action, Answer, always

running_coordinator = contextmanager(coordinator_in_thread)


@dataclass(frozen=True)
class Produced:
    """One record as a coordinator's writer handed it to its producer."""

    topic: str
    key: str
    event: Event | None


class RecordingProducer:
    """A real transactional producer that first notes each record it is asked to produce."""

    def __init__(self, producer: Producer, codec: EventCodec, produced: list[Produced]) -> None:
        self._producer, self._codec, self._produced = producer, codec, produced

    def produce(self, topic: str, key: bytes, value: bytes | None, **kwargs: Any) -> None:
        event = None if value is None else self._codec.decode(value)
        self._produced.append(Produced(topic, key.decode(), event))
        self._producer.produce(topic, key=key, value=value, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._producer, name)


def recording(codec: EventCodec, produced: list[Produced]) -> Callable[..., RecordingProducer]:
    """A stand-in for the writers' `make_producer` that wraps what the real one makes."""

    def make(bootstrap: str, **kwargs: Any) -> RecordingProducer:
        return RecordingProducer(make_producer(bootstrap, **kwargs), codec, produced)

    return make


def test_a_new_owner_publishes_the_job_s_store_record_before_the_abort_notices_it_owes(
    kafka: KafkaUnderTest,
    codec: EventCodec,
    topic_prefix: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first coordinator triggers a checkpoint the agent never answers, then stops; the
    second takes the job over with its partition and declares that checkpoint aborted. Of what
    the second produced for the job, its store record with its new epoch comes before every
    abort notice for the pending checkpoint, and there is such a notice (it reaches the agent)."""
    hanging = {"execution.checkpointing.timeout": "10min"}  # no interval: no periodic trigger
    with running_coordinator(kafka, tmp_path) as first:
        agent = first.agent(codec, configuration=hanging, script=always(Answer(Action.HANG)))
        with first.client() as client:
            triggered = client.post(f"/jobs/{agent.job_id}/checkpoints")
        assert "request-id" in triggered.json(), triggered.text
        agent.wait_for(lambda: bool(agent.triggers), what="a trigger")
    (trigger,) = agent.triggers
    pending = trigger.checkpoint_id

    produced: list[Produced] = []
    monkeypatch.setattr(
        "sparkpoint.coordinator.service.writer.make_producer", recording(codec, produced)
    )
    try:
        with running_coordinator(kafka, tmp_path) as second:
            wait(lambda: agent.job_id in second.service.jobs, what="the job taken over")
            agent.wait_for(
                lambda: any(a.checkpoint_id == pending for a in agent.aborted),
                what=f"the abort notice for checkpoint {pending}",
            )
    finally:
        agent.stop()

    for_job = [p.event for p in produced if p.key == agent.job_id]
    order = [type(e).__name__ for e in for_job]
    notices = [
        (i, e)
        for i, e in enumerate(for_job)
        if isinstance(e, NotifyCheckpointAborted) and e.checkpoint_id == pending
    ]
    assert notices, f"no abort notice for checkpoint {pending} among {order}"
    epoch = notices[0][1].owner_epoch
    assert epoch > trigger.owner_epoch and all(e.owner_epoch == epoch for _, e in notices)
    records = [
        i
        for i, e in enumerate(for_job)
        if isinstance(e, CheckpointStoreRecord) and e.owner_epoch == epoch
    ]
    assert records, f"no store record with the new epoch {epoch} among {order}"
    assert records[0] < notices[0][0], (
        f"the abort notices for checkpoint {pending} were produced before the store record "
        f"with the new epoch: {order}"
    )
    assert agent.completed == []
