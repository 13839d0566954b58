"""The `sparkpoint` command: thin, it parses arguments and calls into the services.

Exit status: 0 on success, 1 on a failed operation, 2 on bad usage; errors go to stderr as one
readable line.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from confluent_kafka import KafkaException

from services.common.broker import BrokerError, wait_for_metadata
from services.common.kafka import bootstrap_servers, make_admin
from services.common.settings import ConfigError
from services.common.topics import DEFAULT_PARTITIONS, TopicMismatch

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


class OperationFailed(Exception):
    """A command could not do what it was asked; the message is printed as the one error line."""


def say(line: str) -> None:
    print(line, flush=True)


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def port_number(text: str) -> int:
    value = positive_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a TCP port")
    return value


REACH_TIMEOUT_S = 10.0
"""How long a command waits for Kafka to answer before it says it cannot reach it."""


def reachable(bootstrap: str | None) -> str:
    """The bootstrap servers to use, once they answered a metadata request."""
    servers = bootstrap_servers(bootstrap)
    try:
        wait_for_metadata(servers, REACH_TIMEOUT_S)
    except BrokerError:
        raise OperationFailed(
            f"cannot reach Kafka at {servers} (is a broker running? `sparkpoint broker`, "
            "or set --bootstrap / KAFKA_BOOTSTRAP_SERVERS)"
        ) from None
    return servers


def add_bootstrap(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--bootstrap",
        help="Kafka bootstrap servers (default: $KAFKA_BOOTSTRAP_SERVERS, else 127.0.0.1:9092)",
    )


def cmd_broker(args: argparse.Namespace) -> int:
    from services.common.broker import run_foreground

    say(f"embedded broker (tansu, memory only) on 127.0.0.1:{args.port}")
    run_foreground(args.port)
    return EXIT_OK  # not reached: the process became the broker


def cmd_topics_create(args: argparse.Namespace) -> int:
    from services.common.topics import create_topics
    from services.demo import print_topics

    bootstrap = reachable(args.bootstrap)
    states = create_topics(
        make_admin(bootstrap),
        partitions=args.partitions,
        replication_factor=args.replication_factor,
    )
    print_topics(states, say)
    return EXIT_OK


def cmd_coordinator(args: argparse.Namespace) -> int:
    from services.coordinator.main import run

    run(reachable(args.bootstrap), args.rest_host, args.rest_port, args.config)
    return EXIT_OK


def cmd_demo(args: argparse.Namespace) -> int:
    from services import demo

    demo.run(reachable(args.bootstrap) if args.bootstrap else None, args.partitions, args.once, say)
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sparkpoint",
        description="Flink-grade checkpointing for Spark pipelines, coordinated over Kafka.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    broker = commands.add_parser(
        "broker", help="run the embedded Kafka-protocol broker in the foreground"
    )
    broker.add_argument("--port", type=port_number, default=9092)
    broker.set_defaults(run=cmd_broker)

    topics = commands.add_parser("topics", help="manage sparkpoint topics")
    topic_commands = topics.add_subparsers(dest="topics_command", required=True, metavar="ACTION")
    create = topic_commands.add_parser("create", help="create every sparkpoint topic; idempotent")
    add_bootstrap(create)
    create.add_argument("--partitions", type=positive_int, default=DEFAULT_PARTITIONS)
    create.add_argument(
        "--replication-factor", type=int, default=-1, help="default: the broker's default"
    )
    create.set_defaults(run=cmd_topics_create)

    coordinator = commands.add_parser("coordinator", help="run a coordinator instance")
    add_bootstrap(coordinator)
    coordinator.add_argument("--rest-host", default="127.0.0.1")
    coordinator.add_argument("--rest-port", type=port_number, default=8081)
    coordinator.add_argument(
        "--config", type=Path, help="YAML with cluster-wide execution.checkpointing.* defaults"
    )
    coordinator.set_defaults(run=cmd_coordinator)

    demo = commands.add_parser("demo", help="what `make run` runs: everything embedded")
    add_bootstrap(demo)
    demo.add_argument("--partitions", type=positive_int, default=DEFAULT_PARTITIONS)
    demo.add_argument("--once", action="store_true", help="exit after the scripted exchange")
    demo.set_defaults(run=cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not args.verbose:
        logging.getLogger("sparkpoint.librdkafka").setLevel(logging.CRITICAL)
    try:
        code: int = args.run(args)
        return code
    except (OperationFailed, BrokerError, TopicMismatch, ConfigError) as exc:
        print(f"sparkpoint: {exc}", file=sys.stderr)
    except KafkaException as exc:
        print(f"sparkpoint: Kafka: {exc.args[0].str()}", file=sys.stderr)
    except KeyboardInterrupt:
        return EXIT_FAILED
    return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
