"""The override store against a real broker: put is acknowledged before it returns, replay
reads to the end offsets taken at start."""

from __future__ import annotations

from sparkpoint.common.avro import EventCodec
from sparkpoint.common.events import CheckpointOverrides, CheckpointSettings
from sparkpoint.common.kafka import make_admin
from sparkpoint.common.topics import CHECKPOINT_OVERRIDES, create_topics
from sparkpoint.overrides.store import OverrideStore
from tests.conftest import KafkaUnderTest

T0 = 1_790_000_000_000


def overrides(job_id: str, version: int, interval_ms: int) -> CheckpointOverrides:
    return CheckpointOverrides(
        job_id,
        version,
        CheckpointSettings(checkpoint_interval_ms=interval_ms),
        f"req-{version}",
        T0,
    )


def test_a_fresh_store_replays_what_was_put(
    kafka: KafkaUnderTest, topic_prefix: str, codec: EventCodec
) -> None:
    create_topics(make_admin(kafka.bootstrap), partitions=3)
    writer = OverrideStore(kafka.bootstrap, codec)
    for job in range(10):
        for version in (1, 2, 3):
            writer.put(overrides(f"job-{job}", version, 1000 * version))
    writer.put(overrides("job-3", 2, 99))  # a stale duplicate arriving late
    writer.remove("job-7")
    writer.close()

    replayed = OverrideStore(kafka.bootstrap, codec).replay()

    assert sorted(replayed) == sorted(f"job-{j}" for j in range(10) if j != 7)
    assert {o.version for o in replayed.values()} == {3}
    assert replayed["job-3"].overrides.checkpoint_interval_ms == 3000


def test_replay_of_some_partitions_returns_only_their_jobs(
    kafka: KafkaUnderTest, topic_prefix: str, codec: EventCodec
) -> None:
    create_topics(make_admin(kafka.bootstrap), partitions=3)
    store = OverrideStore(kafka.bootstrap, codec)
    where = {f"job-{j}": store.put(overrides(f"job-{j}", 1, 1000)).partition for j in range(12)}

    partial = store.replay(partitions=[0])

    assert set(partial) == {job for job, partition in where.items() if partition == 0}
    assert CHECKPOINT_OVERRIDES.name().startswith(topic_prefix)


def test_replay_of_an_empty_topic_is_empty(
    kafka: KafkaUnderTest, topic_prefix: str, codec: EventCodec
) -> None:
    create_topics(make_admin(kafka.bootstrap), partitions=2)
    assert OverrideStore(kafka.bootstrap, codec).replay() == {}
