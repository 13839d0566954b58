"""Kafka's errors as sparkpoint sorts them.

Errors of an operation are sorted as quix-streams does: retriable ones are retried by librdkafka
or by us, abortable ones abort the current transaction, fatal ones (a fenced producer among
them) stop the component loudly. Errors of a connection that no retry cures (refused
credentials, an untrusted certificate) are kept per cluster by `ConnectionErrors`, logged once,
and raised by whoever waits for the cluster to answer.
"""

from __future__ import annotations

import enum
import logging
import re
import threading
from collections.abc import Callable

from confluent_kafka import KafkaError

log = logging.getLogger("sparkpoint.common.kafka")

LIBRDKAFKA_LOG = logging.getLogger("sparkpoint.librdkafka")
"""librdkafka's own log (connection failures, retries) goes here, not to stderr; the CLI shows it
with --verbose. Errors that matter surface as exceptions or delivery reports."""


class ErrorKind(enum.Enum):
    RETRIABLE = "retriable"
    ABORTABLE = "abortable"
    FATAL = "fatal"


def classify(error: KafkaError) -> ErrorKind:
    """Fatal: the client cannot go on (fenced, fatal idempotence errors). Abortable: the current
    transaction must be aborted and may be retried. Everything else librdkafka reports as
    retriable is retried; the rest is fatal for the operation."""
    if error.fatal() or error.code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED):
        return ErrorKind.FATAL
    if error.txn_requires_abort():
        return ErrorKind.ABORTABLE
    if error.retriable():
        return ErrorKind.RETRIABLE
    return ErrorKind.FATAL


class DeliveryFailed(RuntimeError):
    def __init__(self, topic: str, error: KafkaError) -> None:
        super().__init__(f"delivery to {topic} failed: {error.str()} ({classify(error).value})")
        self.error = error
        self.kind = classify(error)


class ConnectionErrors:
    """The last error each cluster's clients reported that no retry will cure: refused
    credentials, an untrusted or unverifiable certificate, a broker that speaks another
    protocol. Logged once per cause (librdkafka would retry them silently forever), and read by
    `sparkpoint.common.broker.wait_for_metadata` to fail in seconds with the cause."""

    FATAL_TO_CONNECTING = (KafkaError._AUTHENTICATION, KafkaError._SSL, KafkaError._INVALID_ARG)

    def __init__(self) -> None:
        self._last: dict[str, str] = {}
        self._logged: set[tuple[str, str]] = set()
        self._lock = threading.Lock()

    def callback(self, bootstrap: str, report: bool = True) -> Callable[[KafkaError], None]:
        def noted(error: KafkaError) -> None:
            self.note(bootstrap, error, report)

        return noted

    def note(self, bootstrap: str, error: KafkaError, report: bool = True) -> None:
        text = _WHEN.sub("", error.str()).strip()
        if error.code() in self.FATAL_TO_CONNECTING or _looks_like_security(text):
            with self._lock:
                self._last[bootstrap] = text
                first = report and (bootstrap, text) not in self._logged
                if first:
                    self._logged.add((bootstrap, text))
            if first:
                log.error("Kafka at %s: %s", bootstrap, text)
        else:
            LIBRDKAFKA_LOG.info("Kafka at %s: %s", bootstrap, text)

    def last(self, bootstrap: str) -> str | None:
        with self._lock:
            return self._last.get(bootstrap)

    def forget(self, bootstrap: str) -> None:
        with self._lock:
            self._last.pop(bootstrap, None)


CONNECTION_ERRORS = ConnectionErrors()


_WHEN = re.compile(r"\s*\(after \d+ms in state \w+(?:, \d+ identical error\(s\) suppressed)?\)")
"""librdkafka's timing of an error, which changes at every retry of the same cause."""


_BROKER = re.compile(r"^\w+://[^ ]+: ")
"""The broker a librdkafka error starts with (``sasl_ssl://host:9092/1: ``), whose protocol's
name says nothing of the cause."""

SECURITY_CAUSES = ("sasl authentication", "ssl handshake", "certificate", "authentication failed")


def _looks_like_security(text: str) -> bool:
    """librdkafka reports some of these as transport errors of the connection they ended."""
    cause = _BROKER.sub("", text).lower()
    return any(words in cause for words in SECURITY_CAUSES)
