"""The agent's standing with the coordinator: it registers and waits until it is accepted, keeps
its lease on the job with heartbeats, and hears only the control events addressed to it (as a
Flink TaskExecutor registers at its JobMaster, heartbeats, and receives only messages for its own
execution attempt).

1. **Register.** The agent publishes its registration and waits for the coordinator's
   `RegistrationResponse`. Before that it changes nothing on storage or in sinks: a second agent
   started by mistake must not disturb the one that runs.
2. **Refusals.** ``ATTEMPT``: the job runs with a higher attempt than this registration's
   (an agent that died drove it); register again one above. ``LEASE_HELD``: another agent drives
   the job. If it was heard from within `CLEARLY_ALIVE_MS`, look again once that long has
   passed: heard from again, it is alive: give up. Silent (it died just before this agent
   started, as a crash point or a supervisor's instant restart does, or a new coordinator has
   not heard from it yet), or not heard from in the first place: it may have died: wait until
   its lease must have run out, and try once more.
   ``INVALID``: the registration itself is wrong; the reason says why.
3. **Heartbeats** go out every `HEARTBEAT_INTERVAL_MS` from a thread of their own, so a long
   Spark stage never costs the lease.
4. **Addressing.** Control events name the agent and attempt they are for; others are dropped,
   as are events from an older coordinator epoch. A newer epoch is believed only when the
   coordinator's durable record of the job confirms it (a new owner writes that record before it
   sends anything to the agent), so one forged event cannot make the agent deaf to the real
   coordinator. An event the record does not confirm yet is held, not dropped, and heard in
   order once it does (the record and the events share a transaction, but they lie in two
   partitions, and a broker that shows open transactions shows them as they come), or dropped
   after `HOLD_S`. Seeing another agent accepted for the job
   means this one was taken over (it was paused past its lease): it stops at once, without a word
   on the job's status, which is no longer its to give.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from sparkpoint.common.events import (
    AgentHeartbeat,
    CancelJob,
    CheckpointStoreRecord,
    FailoverRequest,
    JobRegistered,
    NotifyCheckpointAborted,
    NotifyCheckpointComplete,
    RegistrationResponse,
    TriggerCheckpoint,
)
from sparkpoint.common.kafka import EventPublisher, EventSubscriber
from sparkpoint.common.limits import HEARTBEAT_INTERVAL_MS, LEASE_TIMEOUT_MS
from sparkpoint.common.topics import ACKS, JOBS

log = logging.getLogger(__name__)

CLEARLY_ALIVE_MS = 3 * HEARTBEAT_INTERVAL_MS
"""A holder heard from this recently is running: a second agent gives up without waiting."""

TAKEOVER_CHECK_S = 5.0
"""How often an announcement that another agent took the job over is checked against the
coordinator's durable record (a flood of forged announcements costs one read per period)."""

EPOCH_CHECK_S = 0.5
"""How often a control event's claim of a newer coordinator epoch may be checked against the
coordinator's durable record: a flood of forged epochs costs two reads a second, and a real new
owner's event read before its record waits a period at most (held: `HOLD_S`)."""

HOLD_S = 10.0
"""How long a control event claiming a coordinator epoch the record does not confirm yet is held,
to be heard once it does: a real new owner's record is there by the next read (it was published
with the event), a forged epoch's never is. The record is read for held events 0.5, 1.5, 3.5 and
7.5 s after the first was held (each read replays the job's store partition)."""

HELD_MOST = 64
"""Held events kept at most (the newest): a flood of forged epochs costs no more memory."""

WAIT_REPORT_S = 10.0
"""How often a registration still waiting for an answer says so."""

ControlEvent = (
    TriggerCheckpoint
    | NotifyCheckpointComplete
    | NotifyCheckpointAborted
    | FailoverRequest
    | CancelJob
)


class RegistrationRefused(RuntimeError):
    """The coordinator will not let this agent drive the job; the message says why."""


class Superseded(RuntimeError):
    """Another agent was accepted for the job: this one must stop."""


class Membership:
    def __init__(
        self,
        job_id: str,
        agent_id: str,
        publisher: EventPublisher,
        stopping: threading.Event,
        say: Callable[[str], None] = log.warning,
        lookup: Callable[[], CheckpointStoreRecord | None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        progress: Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        self.job_id = job_id
        self.progress = progress
        """The job's progress, sent with every heartbeat (`sparkpoint.agent.control.progress`)."""
        self.agent_id = agent_id
        self.publisher = publisher
        self.stopping = stopping
        self.say = say
        self.attempt = 0
        self.owner_epoch = 0
        self.accepted = False
        self.cancelled: CancelJob | None = None
        """A cancellation read while registering (the job was restarting when it was asked
        for): the runtime ends the job once registered."""
        self.registration: JobRegistered | None = None
        """The registration the coordinator accepted last."""
        self.superseded = False
        self.lookup = lookup
        """Reads the coordinator's durable record of the job (who drives it)."""
        self.clock = clock
        self._read_at: dict[str, float] = {}
        """When the durable record was last read, per purpose (`_read_record`)."""
        self.confirmed_epoch = 0
        """The newest coordinator epoch the durable record has confirmed."""
        self.held: list[tuple[float, ControlEvent]] = []
        """Events claiming an epoch the record did not confirm yet, as they came (`heard`), with
        when they were held."""
        self._held_wait = EPOCH_CHECK_S
        """How long after the last read the record is read again for the held events."""
        self._beating = threading.Event()
        self._heart_stopped = threading.Event()
        """Set by `stop_heartbeats`: the beat thread's wait between beats ends at once (a job's
        end waited for the next beat, up to a second)."""
        self._heart: threading.Thread | None = None

    # --- registration ------------------------------------------------------------------------

    def register(
        self, build: Callable[[int], JobRegistered], control: EventSubscriber, attempt: int
    ) -> RegistrationResponse:
        """Registers ``build(attempt)`` until accepted, raising the attempt when the job already
        ran with a higher one; raises `RegistrationRefused` when the job is not this agent's to
        drive. Heartbeats keep the attempt accepted before until the new one is."""
        waited = probed = False
        while True:
            registration = build(attempt)
            self.publisher.publish_sync(JOBS, self.job_id, registration)
            response = self._answer(registration, control)
            if response.accepted:
                self.attempt = attempt
                self.registration = registration
                self.owner_epoch = max(self.owner_epoch, response.owner_epoch)
                self.confirmed_epoch = max(self.confirmed_epoch, self.owner_epoch)
                self.accepted = True
                if self.cancelled is not None and not self.hears(self.cancelled):
                    self.cancelled = None  # not for this agent, or from a stale coordinator
                return response
            reason = response.reason or "no reason given"
            if response.refusal == "ATTEMPT" and response.holder_attempt is not None:
                attempt = response.holder_attempt + 1
                log.info(
                    "job %s: registering again with attempt %d (%s)", self.job_id, attempt, reason
                )
                continue
            if response.refusal == "LEASE_HELD":
                seen = response.holder_seen_ms_ago or 0
                if seen < CLEARLY_ALIVE_MS and not probed:
                    probed = True  # alive, or died a moment ago: its heartbeats tell
                    if self.stopping.wait((CLEARLY_ALIVE_MS - seen) / 1000 + 0.2):
                        raise RegistrationRefused(f"job {self.job_id}: stopped while waiting")
                    continue
                if seen >= CLEARLY_ALIVE_MS and not waited:
                    wait_s = (LEASE_TIMEOUT_MS - seen) / 1000 + 0.5
                    self.say(
                        f"job {self.job_id}: {reason}; it may have died: waiting {wait_s:.1f} s for its lease to run out"
                    )
                    waited = True
                    if self.stopping.wait(max(0.0, wait_s)):
                        raise RegistrationRefused(f"job {self.job_id}: stopped while waiting")
                    continue
                raise RegistrationRefused(
                    f"job {self.job_id} is already running: {reason}. Stop that agent first "
                    "(or let it finish); two agents never drive one job"
                )
            raise RegistrationRefused(f"the coordinator refused job {self.job_id}: {reason}")

    def _answer(
        self, registration: JobRegistered, control: EventSubscriber
    ) -> RegistrationResponse:
        started = reported = time.monotonic()
        while not self.stopping.is_set():
            records = control.poll(0.05, 100)
            for i, record in enumerate(records):
                event = record.event
                if record.key == self.job_id and isinstance(event, CancelJob):
                    self.cancelled = event  # judged once the registration is accepted
                if (
                    record.key == self.job_id
                    and isinstance(event, RegistrationResponse)
                    and (event.agent_id, event.attempt) == (self.agent_id, registration.attempt)
                ):
                    # what came with the answer is the accepted attempt's: its first trigger
                    # may follow the answer within one fetch, and is the job loop's to handle
                    control.unread(records[i + 1 :])
                    return event
            if time.monotonic() - reported >= WAIT_REPORT_S:
                reported = time.monotonic()
                self.say(
                    f"job {self.job_id}: waiting {reported - started:.0f} s for a coordinator to "
                    "accept the registration (is `sparkpoint coordinator` running on this Kafka?)"
                )
        raise RegistrationRefused(f"job {self.job_id}: stopped before a coordinator answered")

    # --- heartbeats --------------------------------------------------------------------------

    def start_heartbeats(self) -> None:
        if self._heart is not None:
            return
        self._beating.set()
        self._heart_stopped.clear()
        self._heart = threading.Thread(
            target=self._beat, name=f"heartbeat-{self.job_id}", daemon=True
        )
        self._heart.start()

    def _beat(self) -> None:
        interval = HEARTBEAT_INTERVAL_MS / 1000
        while self._beating.is_set():
            try:
                beat = AgentHeartbeat(
                    self.job_id, self.agent_id, self.attempt, int(time.time() * 1000),
                    **(self.progress() if self.progress is not None else {}),
                )  # fmt: skip
                self.publisher.publish_nowait(ACKS, self.job_id, beat)
                self.publisher.producer.poll(0)
            except Exception as exc:  # a full queue or a closed producer: the next beat retries
                log.warning("job %s: heartbeat not sent: %s", self.job_id, exc)
            if self._heart_stopped.wait(interval):
                return

    def _taken_over(self) -> bool:
        """Another agent's acceptance was announced: confirmed by the coordinator's durable
        record of the job (written in the same transaction as that acceptance), so that a
        stray or forged announcement cannot stop a running job. Checked at most every
        `TAKEOVER_CHECK_S`."""
        record = self._read_record("takeover", TAKEOVER_CHECK_S)
        if record is None or record.agent_id is None:
            return False
        taken = record.agent_id != self.agent_id and record.owner_epoch >= self.owner_epoch
        if not taken:
            log.warning(
                "job %s: an announcement that another agent was accepted is not what the "
                "coordinator's record says (agent %s drives it); ignored",
                self.job_id, record.agent_id,
            )  # fmt: skip
        return taken

    def _read_record(self, purpose: str, period_s: float) -> CheckpointStoreRecord | None:
        """The coordinator's durable record of the job, read at most every ``period_s`` for
        one ``purpose`` (a flood of forged events costs one read per period); None when no
        read is due, there is no record, or it cannot be read now (the broker is slow)."""
        now = self.clock()
        if self.lookup is None or now - self._read_at.get(purpose, -period_s) < period_s:
            return None
        self._read_at[purpose] = now
        try:
            return self.lookup()
        except Exception as exc:
            log.warning("job %s: reading the coordinator's record failed: %s", self.job_id, exc)
            return None

    def stop_heartbeats(self) -> None:
        self._beating.clear()
        self._heart_stopped.set()
        if self._heart is not None:
            self._heart.join(5)
            self._heart = None

    # --- hearing control events --------------------------------------------------------------

    def heard(self, events: list[object]) -> list[object]:
        """The control events of this job, read in this order, that are for this agent's
        current attempt: those held before whose epoch the record now confirms first (in the
        order they came), then these (`hears`); raises `Superseded` when another agent was
        accepted for the job."""
        released = self._released()
        return [*released, *(event for event in events if self.hears(event))]

    def _released(self) -> list[object]:
        """Held events whose epoch the record now confirms (read `EPOCH_CHECK_S` after the
        first was held, then twice as long after each read that did not); then those held
        `HOLD_S` are dropped."""
        if not self.held:
            return []
        newest = max(event.owner_epoch for _, event in self.held)
        if newest > self.confirmed_epoch:
            record = self._read_record("held", self._held_wait)
            if record is not None:
                self.confirmed_epoch = max(self.confirmed_epoch, record.owner_epoch)
                if newest > self.confirmed_epoch:
                    self._held_wait = min(2 * self._held_wait, HOLD_S)
        now = self.clock()
        ready = [event for _, event in self.held if event.owner_epoch <= self.confirmed_epoch]
        waiting = [h for h in self.held if h[1].owner_epoch > self.confirmed_epoch]
        for since, event in [h for h in waiting if now - h[0] >= HOLD_S]:
            self._drop(event, f"held {now - since:.1f} s")
        self.held = [h for h in waiting if now - h[0] < HOLD_S]
        return [event for event in ready if self.hears(event)]

    def _drop(self, event: ControlEvent, why: str) -> None:
        log.warning(
            "job %s: control event claims coordinator epoch %d, which the coordinator's record "
            "does not confirm (confirmed: %d, %s); dropped",
            self.job_id, event.owner_epoch, self.confirmed_epoch, why,
        )  # fmt: skip

    def hears(self, event: object) -> bool:
        """Whether a control event of this job is for this agent's current attempt (one
        claiming an epoch the record does not confirm yet is held: `heard`); raises
        `Superseded` when another agent was accepted for the job."""
        if isinstance(event, RegistrationResponse):
            if event.accepted and event.agent_id != self.agent_id and self._taken_over():
                self.superseded = True
                raise Superseded(
                    f"agent {self.agent_id} no longer drives job {self.job_id}: the coordinator "
                    f"accepted agent {event.agent_id} (attempt {event.attempt})"
                )
            return False
        if not isinstance(
            event,
            TriggerCheckpoint
            | NotifyCheckpointComplete
            | NotifyCheckpointAborted
            | FailoverRequest
            | CancelJob,
        ):
            return False
        if isinstance(event, CancelJob):
            # a cancellation of an earlier attempt of this agent still stands: the job was
            # restarting when it was asked for, and the next attempt ends it
            addressed = event.agent_id == self.agent_id and (event.attempt or 0) <= self.attempt
        else:
            addressed = (event.agent_id, event.attempt) == (self.agent_id, self.attempt)
        if not addressed:
            return False
        if event.owner_epoch < self.owner_epoch:
            log.info("job %s: control event from an older coordinator epoch dropped", self.job_id)
            return False
        if event.owner_epoch > self.owner_epoch and (
            any(e.owner_epoch <= event.owner_epoch for _, e in self.held)  # behind them
            or not self._epoch_confirmed(event.owner_epoch)
        ):
            self._hold(event)
            return False
        self.owner_epoch = event.owner_epoch
        return True

    def _hold(self, event: ControlEvent) -> None:
        now = self.clock()
        if not self.held:  # the record was read for it just now (or is read for it next)
            self._read_at["held"], self._held_wait = now, EPOCH_CHECK_S
        if len(self.held) >= HELD_MOST:
            self._drop(self.held.pop(0)[1], f"more than {HELD_MOST} held")
        self.held.append((now, event))

    def _epoch_confirmed(self, epoch: int) -> bool:
        """Whether the durable record of the job (written by a new owner before its first
        event to the agent) has reached ``epoch``; read at most every `EPOCH_CHECK_S` for
        claims beyond what it confirmed last."""
        if self.lookup is None:
            return True
        if epoch <= self.confirmed_epoch:
            return True
        record = self._read_record("epoch", EPOCH_CHECK_S)
        if record is not None:
            self.confirmed_epoch = max(self.confirmed_epoch, record.owner_epoch)
        return epoch <= self.confirmed_epoch
