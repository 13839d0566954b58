"""The agent's control link read on a thread of its own while the job runs
(`sparkpoint.agent.control.reader`), against a real broker: events wake the loop and come in
order, and none is lost when the link lets go before the loop took them."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator

import pytest

from sparkpoint.agent.control.link import ControlLink
from sparkpoint.agent.control.membership import Membership
from sparkpoint.agent.wakeup import Wakeup
from sparkpoint.common.avro import EventCodec
from sparkpoint.common.events import TriggerCheckpoint
from sparkpoint.common.kafka import EventPublisher, make_admin, make_producer
from sparkpoint.common.topics import CONTROL, create_topics
from tests import factories
from tests.conftest import KafkaUnderTest

JOB = "job-reader"
AGENT = "agent-reader"


def trigger(checkpoint_id: int) -> TriggerCheckpoint:
    return dataclasses.replace(
        factories.periodic_checkpoint_trigger(checkpoint_id, JOB),
        owner_epoch=0, agent_id=AGENT, attempt=0,
    )  # fmt: skip


@pytest.fixture
def link(
    kafka: KafkaUnderTest, topic_prefix: str, codec: EventCodec
) -> Iterator[tuple[ControlLink, EventPublisher]]:
    create_topics(make_admin(kafka.bootstrap), partitions=1)
    publisher = EventPublisher(make_producer(kafka.bootstrap), codec)
    membership = Membership(JOB, AGENT, publisher, threading.Event())
    control = ControlLink(kafka.bootstrap, codec, JOB, AGENT, publisher, membership, lambda: 0)
    control.connect()
    yield control, publisher
    control.disconnect(keep_position=False)
    publisher.close(10)


def test_events_wake_the_loop_and_come_in_the_order_they_were_sent(
    link: tuple[ControlLink, EventPublisher],
) -> None:
    control, publisher = link
    wakeup = Wakeup()
    control.listen(wakeup.set)
    assert not wakeup.wait(0.5)  # nothing sent: nothing wakes it
    sent = [trigger(n) for n in (11, 12, 13)]
    for event in sent:
        publisher.publish_sync(CONTROL.name(), JOB, event)
    received: list[object] = []
    deadline = time.monotonic() + 30
    while len(received) < len(sent) and time.monotonic() < deadline:
        assert wakeup.wait(30), "events arrived but nothing woke the loop"
        received += control.read(0)
    assert received == sent


def test_events_read_and_not_taken_are_read_again_by_the_next_attempt(
    link: tuple[ControlLink, EventPublisher],
) -> None:
    control, publisher = link
    control.listen(lambda: None)
    sent = [trigger(n) for n in (21, 22)]
    for event in sent:
        publisher.publish_sync(CONTROL.name(), JOB, event)
    deadline = time.monotonic() + 30
    while control.reader is not None and len(control.reader.arrived) < len(sent):
        assert time.monotonic() < deadline, "the reader did not read what was sent"
        time.sleep(0.01)
    control.disconnect(keep_position=True)  # a failure: the loop took none of them
    control.connect()  # the next attempt in this process, polling until it listens
    received: list[object] = []
    while len(received) < len(sent) and time.monotonic() < deadline:
        received += control.read(0.2)
    assert received == sent
