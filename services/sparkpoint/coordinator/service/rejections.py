"""Events refused because they may not touch a running job (a registration that is not
well-formed or loses its admission, a status change or an answer from an agent that does not
drive the job, a tombstone for a running job): each is logged where it came from and counted by
topic and kind (``sparkpoint_rejected_events_total`` in the metrics). Heartbeats come every
second: a superseded agent's are counted, and logged once. An event of a type its topic does
not carry is only logged (`skip_unexpected`)."""

from __future__ import annotations

import logging
from collections import Counter

from sparkpoint.common.kafka import Received
from sparkpoint.common.topics import topic_prefix

log = logging.getLogger(__name__)


class Rejections:
    def __init__(self) -> None:
        self.counts: Counter[tuple[str, str]] = Counter()
        """(topic, kind) -> events refused because they may not touch a running job."""
        self._noted_agents: set[str] = set()

    def reject(self, record: Received, kind: str, reason: str) -> None:
        """An event that may not touch a running job: logged where it came from, counted."""
        self.counts[(record.topic.removeprefix(topic_prefix()), kind)] += 1
        log.warning(
            "%s at %s[%d]@%d rejected: %s",
            kind,
            record.topic,
            record.partition,
            record.offset,
            reason,
        )

    def heartbeat(self, record: Received, agent_id: str, problem: str) -> None:
        """A heartbeat of an agent that does not drive the job."""
        key = (record.topic.removeprefix(topic_prefix()), "heartbeat")
        if agent_id not in self._noted_agents:
            self._noted_agents.add(agent_id)
            self.reject(record, "heartbeat", problem)
        else:
            self.counts[key] += 1


def skip_unexpected(record: Received) -> None:
    """An event of a type the topic does not carry: logged and skipped."""
    log.warning(
        "unexpected %s on %s[%d]@%d skipped",
        type(record.event).__name__,
        record.topic,
        record.partition,
        record.offset,
    )
