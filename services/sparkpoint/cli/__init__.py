"""The `sparkpoint` command: thin, it parses arguments and calls into the services.

Exit status: 0 on success, 1 on a failed operation, 2 on bad usage; errors go to stderr as one
readable line.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

from confluent_kafka import KafkaException

from sparkpoint.cli.arguments import EXIT_FAILED, OperationFailed
from sparkpoint.cli.parser import build_parser
from sparkpoint.client import RestError
from sparkpoint.common.broker import BrokerError
from sparkpoint.common.kafka_config import KafkaConfigError, use_properties_file
from sparkpoint.common.redaction import install_log_redaction
from sparkpoint.common.settings import ConfigError
from sparkpoint.common.topics import TopicMismatch

__all__ = ["build_parser", "main"]


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    install_log_redaction()
    if not args.verbose:
        logging.getLogger("sparkpoint.librdkafka").setLevel(logging.CRITICAL)
    try:
        if getattr(args, "kafka_config", None) is not None:
            use_properties_file(args.kafka_config)
        code: int = args.run(args)
        return code
    except (OperationFailed, BrokerError, TopicMismatch, ConfigError, KafkaConfigError) as exc:
        print(f"sparkpoint: {exc}", file=sys.stderr)
    except RestError as exc:
        print(f"sparkpoint: {exc}", file=sys.stderr)
    except KafkaException as exc:
        print(f"sparkpoint: Kafka: {exc.args[0].str()}", file=sys.stderr)
    except KeyboardInterrupt:
        return EXIT_FAILED
    return EXIT_FAILED
