"""What every command shares: exit codes, the one error, argument types and reaching Kafka."""

from __future__ import annotations

import argparse
from pathlib import Path

from confluent_kafka import KafkaException

from sparkpoint.common.broker import BrokerError, wait_for_metadata
from sparkpoint.common.kafka import bootstrap_servers, make_admin
from sparkpoint.common.kafka_errors import CONNECTION_ERRORS
from sparkpoint.common.options import parse_memory

DEFAULT_HISTORY_URL = "http://127.0.0.1:8082"

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


class OperationFailed(Exception):
    """A command could not do what it was asked; the message is printed as the one error line."""


def say(line: str) -> None:
    print(line, flush=True)


def whole_number(text: str, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
    return value


def positive_int(text: str) -> int:
    return whole_number(text, 1)


def memory_size(text: str) -> int:
    try:
        size = parse_memory(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if size < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 byte, got {text!r}")
    return size


def non_negative_int(text: str) -> int:
    return whole_number(text, 0)


def on_off(text: str) -> bool:
    choices = {"on": True, "true": True, "off": False, "false": False}
    if text.lower() not in choices:
        raise argparse.ArgumentTypeError(f"{text!r}: use on or off")
    return choices[text.lower()]


def port_number(text: str) -> int:
    value = positive_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a TCP port")
    return value


REACH_TIMEOUT_S = 10.0
"""How long a command waits for Kafka to answer before it says it cannot reach it."""


def with_topics(servers: str) -> str:
    """The servers, once the broker is known to have every sparkpoint topic."""

    from sparkpoint.common.topics import missing_topics

    try:
        missing = missing_topics(make_admin(servers))
    except KafkaException:  # slow to answer now: the command itself waits for the broker
        return servers
    if missing:
        raise OperationFailed(
            f"Kafka at {servers} lacks the sparkpoint topics {', '.join(missing)}: create them "
            f"first with `sparkpoint topics create --bootstrap {servers}` (on a cluster with "
            "ACLs, this principal may also lack Describe on them: docs/security.md)"
        )
    return servers


def reachable(bootstrap: str | None) -> str:
    """The bootstrap servers to use, once they answered a metadata request."""
    servers = bootstrap_servers(bootstrap)
    try:
        wait_for_metadata(servers, REACH_TIMEOUT_S)
    except BrokerError as exc:
        if CONNECTION_ERRORS.last(servers) is not None or "configuration" in str(exc):
            raise OperationFailed(str(exc)) from None
        raise OperationFailed(
            f"cannot reach Kafka at {servers} (is a broker running? `sparkpoint broker`, "
            "or set --bootstrap / KAFKA_BOOTSTRAP_SERVERS; a secured cluster needs "
            "--kafka-config / SPARKPOINT_KAFKA_CONFIG)"
        ) from None
    return servers


def duration_ms(text: str) -> int:
    from sparkpoint.common.settings import parse_duration

    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_bootstrap(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--bootstrap",
        help="Kafka bootstrap servers (default: $KAFKA_BOOTSTRAP_SERVERS, else the client "
        "configuration's bootstrap.servers, else 127.0.0.1:9092)",
    )
    parser.add_argument(
        "--kafka-config",
        type=Path,
        metavar="FILE",
        help="librdkafka client properties (security.protocol, sasl.*, ssl.*) for every Kafka "
        "client of this process and of the Spark tasks it starts (default: "
        "$SPARKPOINT_KAFKA_CONFIG)",
    )
