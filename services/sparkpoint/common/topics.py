"""The sparkpoint topics of the contract, and their idempotent creation.

Every topic is keyed by job id, so one job's events stay in order on one partition. Names carry
the prefix ``SPARKPOINT_TOPIC_PREFIX`` (default ``sparkpoint.``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

DEFAULT_PREFIX = "sparkpoint."
DEFAULT_PARTITIONS = 6
"""Jobs are spread over coordinator instances by partition; six lets up to six instances share
the work and is cheap on a single broker. Raise it with --partitions for more instances."""

AUDIT_RETENTION_MS = 365 * 24 * 3600 * 1000
"""The audit topics (config changes, checkpoint lifecycle) keep a year: long enough to answer
"who changed what, when" for any incident review, bounded so the topics do not grow forever."""

ADMIN_TIMEOUT_S = 30.0


class Cleanup(Enum):
    COMPACT = "compact"
    DELETE = "delete"


@dataclass(frozen=True)
class TopicSpec:
    suffix: str
    cleanup: Cleanup
    carries: str
    retention_ms: int | None = None

    def name(self, prefix: str | None = None) -> str:
        return f"{topic_prefix() if prefix is None else prefix}{self.suffix}"

    def config(self) -> dict[str, str]:
        config = {"cleanup.policy": self.cleanup.value}
        if self.retention_ms is not None:
            config["retention.ms"] = str(self.retention_ms)
        return config


JOBS = TopicSpec("jobs", Cleanup.COMPACT, "job registration and status")
CONTROL = TopicSpec(
    "control",
    Cleanup.DELETE,
    "trigger checkpoint/savepoint, notify complete/aborted, failover request",
)
ACKS = TopicSpec("acks", Cleanup.DELETE, "acknowledge, decline")
CHECKPOINT_OVERRIDES = TopicSpec(
    "checkpoint-overrides", Cleanup.COMPACT, "effective runtime overrides per job"
)
CONFIG_CHANGES = TopicSpec(
    "config-changes", Cleanup.DELETE, "every accepted configuration change", AUDIT_RETENTION_MS
)
CHECKPOINT_EVENTS = TopicSpec(
    "checkpoint-events", Cleanup.DELETE, "checkpoint lifecycle events", AUDIT_RETENTION_MS
)
CHECKPOINT_STORE = TopicSpec(
    "checkpoint-store", Cleanup.COMPACT, "checkpoint id counter and retained checkpoints per job"
)

COORDINATORS = TopicSpec(
    "coordinators", Cleanup.COMPACT, "coordinator instances: REST address and owned partitions"
)
SINK_MARKERS = TopicSpec(
    "sink-markers", Cleanup.COMPACT, "exactly-once Kafka sinks: the newest epoch each published"
)

ALL_TOPICS: tuple[TopicSpec, ...] = (
    JOBS,
    CONTROL,
    ACKS,
    CHECKPOINT_OVERRIDES,
    CONFIG_CHANGES,
    CHECKPOINT_EVENTS,
    CHECKPOINT_STORE,
    COORDINATORS,
    SINK_MARKERS,
)


PREFIX_ENV = "SPARKPOINT_TOPIC_PREFIX"


def topic_prefix() -> str:
    return os.environ.get(PREFIX_ENV, DEFAULT_PREFIX)


class TopicMismatch(RuntimeError):
    """An existing topic has a cleanup policy other than the contract's."""


@dataclass(frozen=True)
class TopicState:
    name: str
    spec: TopicSpec
    created: bool
    partitions: int
    cleanup_policy: str


def create_topics(
    admin: AdminClient,
    partitions: int = DEFAULT_PARTITIONS,
    replication_factor: int = -1,
    prefix: str | None = None,
) -> list[TopicState]:
    """Creates every sparkpoint topic that does not exist yet; returns each topic's state.

    Idempotent: existing topics are left as they are, but one whose cleanup policy differs from
    the contract's raises `TopicMismatch` (a compacted store on a delete topic loses data).
    ``replication_factor=-1`` takes the broker's default.
    """
    if partitions < 1:
        raise ValueError(f"partitions must be >= 1, got {partitions}")
    specs = {spec.name(prefix): spec for spec in ALL_TOPICS}
    existing = admin.list_topics(timeout=ADMIN_TIMEOUT_S).topics
    # only the missing ones: Kafka checks the Create permission before existence, so asking for
    # existing topics would need Create on them too (docs/security.md)
    missing = [
        NewTopic(name, partitions, replication_factor, config=spec.config())
        for name, spec in specs.items()
        if name not in existing
    ]
    futures = (
        admin.create_topics(
            missing, operation_timeout=ADMIN_TIMEOUT_S, request_timeout=ADMIN_TIMEOUT_S
        )
        if missing
        else {}
    )
    created: set[str] = set()
    for name, future in futures.items():
        try:
            future.result()
            created.add(name)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise
    metadata = admin.list_topics(timeout=ADMIN_TIMEOUT_S)
    policies = describe_cleanup_policies(admin, list(specs))
    states = [
        TopicState(
            name,
            spec,
            name in created,
            len(metadata.topics[name].partitions),
            policies[name],
        )
        for name, spec in specs.items()
    ]
    wrong = [s for s in states if s.cleanup_policy != s.spec.cleanup.value]
    if wrong:
        raise TopicMismatch(
            "; ".join(
                f"{s.name} has cleanup.policy={s.cleanup_policy}, expected {s.spec.cleanup.value}"
                for s in wrong
            )
        )
    return states


def missing_topics(admin: AdminClient, prefix: str | None = None) -> list[str]:
    """The sparkpoint topics the broker does not have (under the current prefix)."""
    present = set(admin.list_topics(timeout=ADMIN_TIMEOUT_S).topics)
    return [spec.name(prefix) for spec in ALL_TOPICS if spec.name(prefix) not in present]


def describe_cleanup_policies(admin: AdminClient, names: list[str]) -> dict[str, str]:
    resources = [ConfigResource(ConfigResource.Type.TOPIC, name) for name in names]
    futures = admin.describe_configs(resources, request_timeout=ADMIN_TIMEOUT_S)
    policies = {}
    for resource, future in futures.items():
        entry = future.result().get("cleanup.policy")
        policies[resource.name] = entry.value if entry is not None else "delete"
    return policies


def print_topics(states: list[TopicState], say: Callable[[str], None]) -> None:
    say("topics:")
    width = max(len(s.name) for s in states)
    for s in states:
        verb = "created" if s.created else "exists"
        say(
            f"  {s.name:<{width}}  cleanup.policy={s.cleanup_policy:<7}  partitions={s.partitions}  {verb}"
        )
