"""What the agent believes of its control events (services/sparkpoint/agent/control/membership.py), on a fake clock:
an event's claim of a newer coordinator epoch stands only when the coordinator's durable record
confirms it, so a forged epoch cannot make the agent deaf to the coordinator that drives it; an
event the record does not confirm yet is held until it does, in order, or for `HOLD_S`."""

from __future__ import annotations

import threading

import pytest

from sparkpoint.agent.control import membership as membership_module
from sparkpoint.agent.control.membership import EPOCH_CHECK_S, HELD_MOST, HOLD_S, Membership
from sparkpoint.common.events import (
    CancelJob,
    CheckpointFailureReason,
    CheckpointStoreRecord,
    NotifyCheckpointAborted,
    NotifyCheckpointComplete,
    SnapshotType,
    TriggerCheckpoint,
)

pytestmark = pytest.mark.unit

JOB = "payments"
AGENT = "agent-1"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Record:
    """The coordinator's durable record of the job, as the agent reads it; counts the reads."""

    def __init__(self, owner_epoch: int) -> None:
        self.owner_epoch = owner_epoch
        self.reads = 0

    def __call__(self) -> CheckpointStoreRecord:
        self.reads += 1
        return CheckpointStoreRecord(JOB, self.owner_epoch, 5, [], 0, agent_id=AGENT, attempt=0)


def membership(record: Record, clock: Clock, epoch: int = 1) -> Membership:
    member = Membership(JOB, AGENT, None, threading.Event(), lookup=record, clock=clock)  # type: ignore[arg-type]
    member.owner_epoch = member.confirmed_epoch = epoch  # as its accepted registration said
    return member


def trigger(epoch: int, checkpoint_id: int = 3) -> TriggerCheckpoint:
    return TriggerCheckpoint(
        JOB, epoch, checkpoint_id, 0, SnapshotType.CHECKPOINT, True, False, "/tmp/x",
        agent_id=AGENT, attempt=0,
    )  # fmt: skip


def test_a_forged_epoch_is_dropped_and_the_real_coordinator_is_still_heard() -> None:
    record, clock = Record(owner_epoch=1), Clock()
    member = membership(record, clock)
    forged = NotifyCheckpointComplete(
        JOB, 2**63 - 7, 3, False, "/etc", 0, agent_id=AGENT, attempt=0
    )
    assert not member.hears(forged)
    assert member.owner_epoch == 1
    assert member.hears(trigger(1))  # the coordinator that drives the job
    assert record.reads == 1


def test_a_new_owner_confirmed_by_the_record_is_believed() -> None:
    record, clock = Record(owner_epoch=2), Clock()  # a failover: the new owner wrote its record
    member = membership(record, clock)
    assert member.hears(trigger(2))
    assert member.owner_epoch == 2
    assert not member.hears(trigger(1))  # the old owner, fenced
    assert member.hears(trigger(2, checkpoint_id=4))
    assert record.reads == 1  # confirmed once


def aborted(epoch: int, checkpoint_id: int = 3) -> NotifyCheckpointAborted:
    reason = CheckpointFailureReason.CHECKPOINT_COORDINATOR_SUSPEND  # what a takeover sends
    return NotifyCheckpointAborted(JOB, epoch, checkpoint_id, reason, 0, agent_id=AGENT, attempt=0)


def holding_an_abort_notice_of_epoch_2() -> tuple[Record, Clock, Membership]:
    """A member driven at epoch 1 that read epoch 2's abort notice before the record shows
    epoch 2: the notice is held."""
    record, clock = Record(owner_epoch=1), Clock()
    member = membership(record, clock)
    assert member.heard([aborted(2)]) == []
    return record, clock, member


def test_a_new_owner_s_events_read_before_its_record_are_heard_once_the_record_shows_it() -> None:
    """A new owner publishes its record and its first events in one transaction; a broker
    that shows open transactions (the embedded one) or puts the record's partition behind the
    control partition shows the events first. Held, not dropped: a dropped abort notice left
    its checkpoint pending for good."""
    record, clock = Record(owner_epoch=1), Clock()
    member = membership(record, clock)
    assert member.heard([aborted(2, checkpoint_id=3), trigger(2, checkpoint_id=4)]) == []
    assert member.owner_epoch == 1 and len(member.held) == 2 and record.reads == 1
    record.owner_epoch = 2  # the record arrives
    assert member.heard([]) == [], "the record is read again only once the period has passed"
    clock.now += EPOCH_CHECK_S
    later = trigger(2, checkpoint_id=5)
    assert member.heard([later]) == [aborted(2, checkpoint_id=3), trigger(2, 4), later]
    assert member.owner_epoch == 2 and member.held == [] and record.reads == 2


def test_events_held_behind_ones_of_their_epoch_keep_their_order() -> None:
    """Once held events wait, a later event of the same epoch waits behind them, even if the
    record confirms that epoch when it comes."""
    record, clock, member = holding_an_abort_notice_of_epoch_2()
    record.owner_epoch = 2
    clock.now += EPOCH_CHECK_S
    assert not member.hears(trigger(2, checkpoint_id=4)), "held behind the abort notice"
    assert record.reads == 1, "and the record not read for it"
    assert member.heard([]) == [aborted(2), trigger(2, 4)]


def test_a_forged_epoch_s_events_are_dropped_once_held_long_enough() -> None:
    record, clock = Record(owner_epoch=1), Clock()
    member = membership(record, clock)
    assert member.heard([trigger(2**62)]) == []
    clock.now += HOLD_S - 0.1
    assert member.heard([trigger(1)]) == [trigger(1)]  # the real coordinator meanwhile
    assert len(member.held) == 1
    clock.now += 0.1
    assert member.heard([]) == [] and member.held == []
    assert member.owner_epoch == 1


def test_a_held_forged_epoch_costs_a_few_reads_of_the_record_not_one_per_period() -> None:
    """Each read replays the job's store partition on the loop's thread: while events are held
    the record is read again later and later (0.5, 1.5, 3.5, 7.5 s after the first was held)."""
    record, clock = Record(owner_epoch=1), Clock()
    member = membership(record, clock)
    assert member.heard([trigger(2**62)]) == []  # the first read, for the event itself
    reads_at = []
    while member.held:
        clock.now += 0.25
        reads = record.reads
        assert member.heard([]) == []
        if record.reads > reads:
            reads_at.append(clock.now - 100.0)
    assert reads_at == [0.5, 1.5, 3.5, 7.5] and record.reads == 5
    assert clock.now == 100.0 + HOLD_S  # dropped once held that long


def test_an_event_held_past_its_time_is_still_heard_if_the_record_shows_it_when_looked_at() -> None:
    """The loop may not read for longer than `HOLD_S` (a restart's back-off): the record is
    looked at before anything held is dropped."""
    record, clock, member = holding_an_abort_notice_of_epoch_2()
    record.owner_epoch = 2
    clock.now += HOLD_S + 5
    assert member.heard([]) == [aborted(2)]


def test_held_events_of_an_earlier_attempt_are_dropped() -> None:
    record, clock, member = holding_an_abort_notice_of_epoch_2()
    member.attempt = 1  # the job restarted meanwhile
    record.owner_epoch = 2
    clock.now += EPOCH_CHECK_S
    assert member.heard([]) == [] and member.held == []


def test_a_flood_of_forged_epochs_reads_the_record_once_per_period() -> None:
    record, clock = Record(owner_epoch=1), Clock()
    member = membership(record, clock)
    for i in range(1000):
        assert member.heard([trigger(2**62 + i)]) == []
    assert record.reads == 1
    assert len(member.held) == HELD_MOST  # the newest kept, at most
    clock.now += EPOCH_CHECK_S
    record.owner_epoch = 2  # meanwhile a real failover
    assert member.hears(trigger(2))
    assert record.reads == 2


def test_without_a_record_to_ask_the_epoch_is_taken_as_sent() -> None:
    member = Membership(JOB, AGENT, None, threading.Event())  # type: ignore[arg-type]
    assert member.hears(trigger(3))
    assert member.owner_epoch == 3


def test_events_for_another_agent_are_not_heard_and_cost_no_read() -> None:
    record, clock = Record(owner_epoch=1), Clock()
    member = membership(record, clock)
    other = TriggerCheckpoint(
        JOB, 1, 3, 0, SnapshotType.CHECKPOINT, True, False, "/tmp/x", agent_id="agent-2", attempt=0
    )
    assert not member.hears(other)
    assert record.reads == 0


def test_a_record_that_cannot_be_read_now_leaves_the_epoch_unconfirmed() -> None:
    clock = Clock()

    def unreachable() -> CheckpointStoreRecord:
        raise TimeoutError("the broker did not answer")

    member = Membership(JOB, AGENT, None, threading.Event(), lookup=unreachable, clock=clock)  # type: ignore[arg-type]
    member.owner_epoch = member.confirmed_epoch = 1
    assert not member.hears(trigger(2))  # dropped, not raised into the agent's loop
    assert member.hears(trigger(1))


def test_a_cancellation_is_heard_only_from_the_driving_coordinator_for_this_attempt() -> None:
    """A stale or forged CancelJob (an older epoch, another agent or attempt) never ends the
    job; the real one does."""
    record, clock = Record(owner_epoch=2), Clock()
    member = membership(record, clock, epoch=2)
    assert not member.hears(CancelJob(JOB, 1, 0, "old owner", agent_id=AGENT, attempt=0))
    assert not member.hears(CancelJob(JOB, 2, 0, "x", agent_id="agent-2", attempt=0))
    assert not member.hears(CancelJob(JOB, 2, 0, "x", agent_id=AGENT, attempt=1))
    assert member.hears(CancelJob(JOB, 2, 0, "alice", agent_id=AGENT, attempt=0))


class Beats:
    """A publisher that keeps the heartbeats it was given."""

    def __init__(self) -> None:
        self.sent: list[object] = []
        self.first = threading.Event()
        self.producer = self

    def publish_nowait(self, topic: object, key: str, event: object) -> None:
        self.sent.append(event)
        self.first.set()

    def poll(self, timeout: float) -> int:
        return 0


def test_stopping_the_heartbeats_ends_their_thread_without_waiting_for_the_next_beat(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A job's end stops the heartbeats and joins their thread: with beats an hour apart the
    thread must still end at once (it slept through the interval, and every job's end waited
    for its next beat, up to a second)."""
    monkeypatch.setattr(membership_module, "HEARTBEAT_INTERVAL_MS", 3_600_000)
    beats = Beats()
    member = Membership(JOB, AGENT, beats, threading.Event())  # type: ignore[arg-type]
    member.start_heartbeats()
    assert beats.first.wait(30), "the first beat goes out at once"
    heart = member._heart
    assert heart is not None

    member.stop_heartbeats()

    assert not heart.is_alive() and member._heart is None and len(beats.sent) == 1
