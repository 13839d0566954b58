"""Secrets stay out of logs, events and pages: Spark's ``spark.redaction.regex`` idea.

An option whose key names a secret (a password, a token, a key's passphrase, a JAAS line...) is
shown with its value replaced by ``REDACTED``, wherever sparkpoint lists options: the job's
configuration in its registration event and in ``GET /jobs/{id}/config``, the coordinator's
``/jobmanager/config``, the dashboards that render them. The values of the secrets sparkpoint
itself loads (the Kafka client properties, REST tokens) are also registered here, and every log
record is scrubbed of them (and of ``key=value`` pairs whose key names a secret) before any
handler writes it, so an exception that quotes a configuration still leaks nothing.

Pure: no I/O. The registry of known values is per process.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterable, Mapping
from typing import Any

REDACTED = "*********(redacted)"
"""What a secret is shown as (Spark's own marker, so operators of both recognise it)."""

SECRET_KEY = re.compile(
    r"(?i)secret|password|passwd|token|credential|jaas|access[._-]?key|private[._-]?key"
    r"|api[._-]?key|ssl\.key\.pem|keystore\.key|user[._-]?info|basic[._-]?auth"
    r"|auth[._-]?params|http[._-]?headers|account\.key"
)
"""Spark's default ``(?i)secret|password|token|access[.]?key``, widened for Kafka's client
properties (``sasl.password``, ``ssl.key.password``, ``sasl.jaas.config``,
``sasl.oauthbearer.client.secret``, ``ssl.key.pem``, ``ssl.keystore.password``), the Schema
Registry client's (``basic.auth.user.info``: ``user:password``) and what Flink's
``SENSITIVE_KEYS`` add (``basic-auth``, ``http-headers``, ``auth-params``,
``fs.azure.account.key``)."""

_PAIR = re.compile(
    r"""(?P<key>[A-Za-z0-9_.\-]+)(?P<sep>\s*[=:]\s*)(?P<quote>["']?)(?P<value>[^\s"',;}]+)"""
)
"""``key=value`` or ``key: value`` inside free text (a log line, an exception message)."""

MIN_SECRET_LENGTH = 4
"""Shorter registered values are not scrubbed from free text: replacing every "on" or "1" would
mangle logs and hide nothing worth hiding."""

_known: set[str] = set()
_lock = threading.Lock()


def is_secret(key: str) -> bool:
    return SECRET_KEY.search(key) is not None


def redact_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """The options with every secret's value replaced by ``REDACTED``."""
    return {k: (REDACTED if is_secret(str(k)) else v) for k, v in options.items()}


def register_secrets(values: Iterable[str]) -> None:
    """Values this process holds that must never be written: scrubbed from every log record."""
    with _lock:
        _known.update(v for v in values if len(v) >= MIN_SECRET_LENGTH)


def secrets_of(options: Mapping[str, Any]) -> list[str]:
    """The values of the options whose key names a secret."""
    return [str(v) for k, v in options.items() if is_secret(str(k)) and v not in (None, "")]


def redact_text(text: str) -> str:
    """``text`` without any registered secret, and with the value of every ``key=value`` pair
    whose key names a secret replaced."""
    with _lock:
        known = sorted(_known, key=len, reverse=True)
    for value in known:
        if value in text:
            text = text.replace(value, REDACTED)
    return _PAIR.sub(_redact_pair, text)


def _redact_pair(match: re.Match[str]) -> str:
    if not is_secret(match["key"]) or match["value"] == REDACTED:
        return match[0]
    return f"{match['key']}{match['sep']}{match['quote']}{REDACTED}"


class RedactingFilter(logging.Filter):
    """Scrubs a record's message (and its exception's text) before a handler formats it."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        scrubbed = redact_text(message)
        if scrubbed != message:
            record.msg, record.args = scrubbed, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact_text(record.exc_text)
        return True


def install_log_redaction(logger: logging.Logger | None = None) -> None:
    """Adds the filter to every handler of ``logger`` (the root logger by default): a handler's
    filter sees the records of every logger below it, a logger's would not."""
    for handler in (logger or logging.getLogger()).handlers:
        if not any(isinstance(f, RedactingFilter) for f in handler.filters):
            handler.addFilter(RedactingFilter())
