"""Runtime checkpoint-configuration overrides, one record per job on the compacted topic
``sparkpoint.checkpoint-overrides`` (keyed by job id, versioned value, tombstone on removal).

Writes return only after the broker acknowledged them (acks=all), so a change the client was
told about survives a coordinator failover. Replay reads every wanted partition up to the end
offsets taken when the replay starts (Kafka Connect's config-topic pattern), and folds what it
reads: the highest version per job wins, duplicates and versions that arrive out of order are
ignored, a tombstone removes the job, and gaps in the versions are fine. Compaction may or may
not have run (on the embedded broker it never does): the fold gives the same answer either way.

The embedded broker reports a correct end offset only when every batch holds one record, so the
writer publishes one record per batch (see services/sparkpoint/common/broker.py).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable

from sparkpoint.common.avro import EventCodec
from sparkpoint.common.events import CheckpointOverrides
from sparkpoint.common.kafka import (
    Delivered,
    EventPublisher,
    Received,
    make_producer,
    replay_topic,
)
from sparkpoint.common.limits import MAX_ID
from sparkpoint.common.topics import CHECKPOINT_OVERRIDES, TopicSpec

log = logging.getLogger(__name__)

PUT_TIMEOUT_S = 10.0
"""A PATCH waits this long for the broker's acknowledgement before the client gets an error:
long enough for a leader election on a real cluster, short enough for an HTTP client."""


def fold(records: Iterable[Received]) -> dict[str, CheckpointOverrides]:
    """The effective overrides per job from records in partition order."""
    latest: dict[str, CheckpointOverrides] = {}
    for record in records:
        if record.key is None:
            log.warning(
                "override record without a key at %s[%d]@%d skipped",
                record.topic,
                record.partition,
                record.offset,
            )
            continue
        event = record.event
        if event is None:
            latest.pop(record.key, None)
            continue
        if not isinstance(event, CheckpointOverrides) or event.job_id != record.key:
            log.warning(
                "unexpected record at %s[%d]@%d (key %s) skipped",
                record.topic,
                record.partition,
                record.offset,
                record.key,
            )
            continue
        problem = _implausible(event)
        if problem is not None:
            log.warning(
                "override record at %s[%d]@%d skipped: %s",
                record.topic, record.partition, record.offset, problem,
            )  # fmt: skip
            continue
        current = latest.get(record.key)
        if current is None or event.version > current.version:
            latest[record.key] = event
    return latest


def _implausible(event: CheckpointOverrides) -> str | None:
    """Overrides the coordinator could not have written: a version or a value out of range."""
    if not 0 < event.version <= MAX_ID:
        return f"version {event.version} out of range"
    values = [v for v in dataclasses.astuple(event.overrides) if v is not None]
    if any(not 0 <= v <= MAX_ID for v in values):
        return "a setting out of range"
    return None


class OverrideStore:
    def __init__(
        self,
        bootstrap: str,
        codec: EventCodec,
        publisher: EventPublisher | None = None,
        topic: TopicSpec | str = CHECKPOINT_OVERRIDES,
    ) -> None:
        self.bootstrap = bootstrap
        self.codec = codec
        self.topic = topic if isinstance(topic, str) else topic.name()
        self._publisher = publisher

    @property
    def publisher(self) -> EventPublisher:
        """Opened on the first write: a store that only replays never connects a producer."""
        if self._publisher is None:
            producer = make_producer(self.bootstrap, one_record_per_batch=True)
            self._publisher = EventPublisher(producer, self.codec)
        return self._publisher

    def put(self, overrides: CheckpointOverrides, timeout_s: float = PUT_TIMEOUT_S) -> Delivered:
        """Persists a job's overrides; returns once the broker acknowledged, raises otherwise."""
        return self.publisher.publish_sync(self.topic, overrides.job_id, overrides, timeout_s)

    def remove(self, job_id: str, timeout_s: float = PUT_TIMEOUT_S) -> Delivered:
        """Tombstone: the job is gone, and so are its overrides."""
        return self.publisher.publish_sync(self.topic, job_id, None, timeout_s)

    def replay(
        self, partitions: Iterable[int] | None = None, timeout_s: float = 60.0
    ) -> dict[str, CheckpointOverrides]:
        """Every job's effective overrides in the given partitions (all by default)."""
        records = replay_topic(
            self.bootstrap, self.codec, self.topic, partitions, timeout_s=timeout_s
        )
        overrides = fold(records)
        log.info(
            "replayed %d override records of %d jobs from %s",
            len(records),
            len(overrides),
            self.topic,
        )
        return overrides

    def close(self) -> None:
        if self._publisher is not None:
            self._publisher.close()
