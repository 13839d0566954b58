"""`create_topics`: every topic of the contract with its cleanup policy, idempotently."""

from __future__ import annotations

import pytest
from confluent_kafka.admin import NewTopic

from sparkpoint.common.kafka import make_admin
from sparkpoint.common.topics import ALL_TOPICS, TopicMismatch, create_topics
from tests.conftest import KafkaUnderTest

CONTRACT = {
    "jobs": "compact",
    "control": "delete",
    "acks": "delete",
    "checkpoint-overrides": "compact",
    "config-changes": "delete",
    "checkpoint-events": "delete",
    "checkpoint-store": "compact",
    # additions to the contract's table: coordinator announcements, exactly-once sink markers
    "coordinators": "compact",
    "sink-markers": "compact",
}


def test_the_catalogue_is_the_contract() -> None:
    assert {t.suffix: t.cleanup.value for t in ALL_TOPICS} == CONTRACT


def test_creates_every_topic_with_its_policy_and_partitions(
    kafka: KafkaUnderTest, topic_prefix: str
) -> None:
    states = create_topics(make_admin(kafka.bootstrap), partitions=3)

    assert {s.name: s.cleanup_policy for s in states} == {
        f"{topic_prefix}{suffix}": policy for suffix, policy in CONTRACT.items()
    }
    assert all(s.created and s.partitions == 3 for s in states)


def test_creating_twice_changes_nothing(kafka: KafkaUnderTest, topic_prefix: str) -> None:
    admin = make_admin(kafka.bootstrap)
    create_topics(admin, partitions=2)
    again = create_topics(admin, partitions=5)

    assert not any(s.created for s in again)
    assert {s.partitions for s in again} == {2}


def test_an_existing_topic_with_the_wrong_policy_is_an_error(
    kafka: KafkaUnderTest, topic_prefix: str
) -> None:
    admin = make_admin(kafka.bootstrap)
    name = f"{topic_prefix}checkpoint-store"
    admin.create_topics([NewTopic(name, 1, 1, config={"cleanup.policy": "delete"})])[name].result(
        30
    )

    with pytest.raises(
        TopicMismatch, match=r"checkpoint-store has cleanup.policy=delete, expected compact"
    ):
        create_topics(admin)


def test_partitions_must_be_positive(kafka: KafkaUnderTest, topic_prefix: str) -> None:
    with pytest.raises(ValueError, match="partitions"):
        create_topics(make_admin(kafka.bootstrap), partitions=0)
