"""The agent's link to the coordinator for its job: the control topic's partition of the job,
read from where the job's attempt starts (a restart in the same process reads on from where the
failed attempt stood, so nothing sent meanwhile is missed), the registration and lease
(`membership`), and the job's status announcements on ``sparkpoint.jobs``. Acknowledgements go
out through the same publisher (`checkpointing.acks`)."""

from __future__ import annotations

import contextlib
import logging
import traceback
from collections.abc import Callable

from confluent_kafka import TopicPartition

from sparkpoint.agent.control.membership import Membership
from sparkpoint.agent.control.reader import ControlReader
from sparkpoint.agent.rounds.user_code import UserFunctionError
from sparkpoint.common.avro import EventCodec
from sparkpoint.common.events import JobRegistered, JobStatus, JobStatusChanged
from sparkpoint.common.kafka import (
    ConsumerProfile,
    EventPublisher,
    EventSubscriber,
    end_offsets,
    make_consumer,
    partition_of,
)
from sparkpoint.common.limits import MAX_TEXT
from sparkpoint.common.topics import CONTROL, JOBS

log = logging.getLogger(__name__)

MAX_STACKTRACE = 64 * 1024
"""The end of a failure's traceback that travels with RESTARTING and FAILED (the cause is last)."""

CONTROL_BATCH = 100
"""Control events read at most per turn of the loop."""


class ControlLink:
    def __init__(
        self,
        bootstrap: str,
        codec: EventCodec,
        job_id: str,
        agent_id: str,
        publisher: EventPublisher,
        membership: Membership,
        clock_ms: Callable[[], int],
    ) -> None:
        self.bootstrap = bootstrap
        self.codec = codec
        self.job_id = job_id
        self.agent_id = agent_id
        self.publisher = publisher
        self.membership = membership
        self.clock_ms = clock_ms
        self.control: EventSubscriber | None = None
        self.reader: ControlReader | None = None
        """Reads the control partition on a thread of its own while the job runs (`listen`)."""
        self.partition = 0
        self._resume: int | None = None
        """Where the control topic was read up to when the job restarts in this process."""

    def connect(self) -> None:
        """Reads the job's control partition from its end, or, after a restart in this
        process, from where the failed attempt stood."""
        resume, self._resume = self._resume, None
        consumer = make_consumer(self.bootstrap, profile=ConsumerProfile.CONTROL)
        topic = CONTROL.name()
        partitions = len(consumer.list_topics(topic, timeout=10).topics[topic].partitions)
        self.partition = partition_of(self.job_id, partitions)
        _, high = end_offsets(consumer, topic)[self.partition]
        start = resume if resume is not None and 0 <= resume <= high else high
        self.control = EventSubscriber(consumer, self.codec)
        self.control.assign([TopicPartition(topic, self.partition, start)])

    def register(self, build: Callable[[int], JobRegistered], attempt: int) -> None:
        """Registers attempt ``attempt`` (or the one the coordinator asks for) and waits until
        it is accepted; raises `RegistrationRefused` or `Superseded` otherwise."""
        assert self.control is not None
        response = self.membership.register(build, self.control, attempt)
        log.info(
            "job %s: registration accepted (attempt %d, next checkpoint id %s)",
            self.job_id, self.membership.attempt, response.checkpoint_id_counter,
        )  # fmt: skip

    def listen(self, wake: Callable[[], None]) -> None:
        """From now until `disconnect`, the control partition is read on a thread of its own
        that calls ``wake`` when events arrived; `read` then takes them without waiting."""
        if self.control is not None and self.reader is None:
            self.reader = ControlReader(self.control, wake, CONTROL_BATCH)

    def read(self, timeout_s: float) -> list[object]:
        """The job's control events that arrived (within ``timeout_s`` when no reader runs:
        then this polls), addressed to this agent's attempt, with those held until the
        coordinator's record confirmed their epoch (`Membership.heard`: raises `Superseded`
        when taken over)."""
        if self.control is None:
            return []
        if self.reader is not None:
            records = self.reader.take(CONTROL_BATCH)
        else:
            records = self.control.poll(timeout_s, CONTROL_BATCH)
        return self.membership.heard(
            [r.event for r in records if r.key == self.job_id and r.event is not None]
        )

    def announce(
        self,
        status: JobStatus,
        message: str | None = None,
        end_of_input: bool = False,
        failure: BaseException | None = None,
        restart_delay_ms: int | None = None,
        processing_backlog: bool | None = None,
    ) -> None:
        """Publishes the job's status (with a failure's exception and trace, or whether its
        source processes backlog); a RESTARTING, an end of input or a backlog report
        re-publishes the registration, the job's latest record (compaction)."""
        exception_name = stacktrace = None
        if failure is not None:
            exception_name, stacktrace, message = described(failure, message)
        event = JobStatusChanged(
            self.job_id, self.agent_id, self.membership.attempt, status, self.clock_ms(),
            message=message, end_of_input=end_of_input, exception_name=exception_name,
            stacktrace=stacktrace, restart_delay_ms=restart_delay_ms,
            processing_backlog=processing_backlog,
        )  # fmt: skip
        try:
            self.publisher.publish_sync(JOBS, self.job_id, event)
            registration = self.membership.registration
            again = end_of_input or processing_backlog is not None
            if (again or status is JobStatus.RESTARTING) and registration is not None:
                self.publisher.publish_sync(JOBS, self.job_id, registration)
        except Exception as exc:
            log.error("job %s: could not publish status %s: %s", self.job_id, status.name, exc)

    def disconnect(self, keep_position: bool) -> None:
        """Lets go of the control topic; ``keep_position``: the next attempt reads on from here
        (a cancel sent meanwhile is not missed)."""
        control, self.control = self.control, None
        reader, self.reader = self.reader, None
        left = reader.stop() if reader is not None else []
        if control is None:
            return
        if keep_position:  # from the first event read and not handled, else from the position
            with contextlib.suppress(Exception):
                where = TopicPartition(CONTROL.name(), self.partition)
                self._resume = control.consumer.position([where])[0].offset
            if left:
                self._resume = left[0].offset
        try:
            control.close()
        except Exception as exc:  # closing after a failure: report, go on closing
            log.warning("job %s: closing the control topic: %s", self.job_id, exc)


def described(failure: BaseException, message: str | None) -> tuple[str, str, str]:
    """A failure as the job's status carries it: its exception's name, the end of its trace
    (with the trace from the Spark task for the job's own function), and a message."""
    exception_name = type(failure).__qualname__
    stacktrace = "".join(traceback.format_exception(failure))
    if isinstance(failure, UserFunctionError):  # the trace from the task, kept whole
        exception_name = failure.exception_name
        stacktrace = f"{stacktrace}\nraised in a Spark task:\n{failure.stacktrace}"
        message = message or str(failure)[:MAX_TEXT]  # already "Name: message"
    message = message or f"{exception_name}: {failure}"[:MAX_TEXT]
    return exception_name, stacktrace[-MAX_STACKTRACE:], message
