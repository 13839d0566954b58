"""`sparkpoint audit`: who changed what when, and what became of each checkpoint.

When the history service (`sparkpoint history`) answers, the story comes from it, at once: every
configuration change, and each job's kept checkpoints (the last 50 by default) with the counts of
all. Otherwise, or with ``--replay``, the audit topics (configuration changes and checkpoint
lifecycle) are replayed to the end offsets taken at start: every event, at the cost of reading
them all. ``--follow`` then goes on printing events as they are written, until interrupted.

A secured history service (docs/security.md) is read with `Credentials` as the REST commands
read the coordinator, from the history flags: a bearer token with the read role
(``--history-token-file``, else ``$SPARKPOINT_HISTORY_TOKEN``) and, over https, a CA to trust
(``--history-ca``, else the system's) and a client certificate (``--history-cert``,
``--history-key``). Redirects are not followed, so the token goes only to the address given. A
service that answers but cannot be read (it refuses the credentials, an HTTP error, a
certificate not trusted) is `HistoryUnreadable`: one line saying why and which flag helps."""

from __future__ import annotations

import dataclasses
import json
import logging
import ssl
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx
from confluent_kafka import TopicPartition

from sparkpoint.client import Credentials, RestError
from sparkpoint.common.avro import EventCodec
from sparkpoint.common.events import (
    CheckpointEventType,
    CheckpointLifecycleEvent,
    ConfigChange,
    Event,
)
from sparkpoint.common.kafka import (
    EventSubscriber,
    Malformed,
    end_offsets,
    make_consumer,
    replay_topic,
)
from sparkpoint.common.settings import REST_FIELDS, parse_duration
from sparkpoint.common.topics import CHECKPOINT_EVENTS, CONFIG_CHANGES

log = logging.getLogger(__name__)

HISTORY_TIMEOUT_S = 1.0
"""How long `audit` waits for the history service before replaying the topics instead."""
HISTORY_READ_TIMEOUT_S = 30.0
"""How long each read of a history service that answered may take (one job's document)."""
TOKEN_HINT = "--history-token-file or $SPARKPOINT_HISTORY_TOKEN: a token with the read role"
"""What a 401 of the history service asks for (`earlier.TOKEN_ENV` is the variable)."""
MUTUAL_TLS_HINT = (
    "a history service under mutual TLS needs a client certificate its CA signed: "
    "--history-cert and --history-key"
)

FINAL = {
    CheckpointEventType.COMPLETED,
    CheckpointEventType.FAILED,
    CheckpointEventType.EXPIRED,
    CheckpointEventType.SUBSUMED,
}


@dataclass(frozen=True)
class Entry:
    timestamp_ms: int
    job_id: str
    kind: str
    text: str
    record: dict[str, Any]


def parse_since(text: str | None, now_ms: int) -> int | None:
    """``--since``: an ISO timestamp (UTC when no zone is given) or a duration ago (``10min``)."""
    if text is None:
        return None
    try:
        return now_ms - parse_duration(text)
    except ValueError:
        pass
    from datetime import UTC, datetime

    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(
            f"--since: {text!r} is neither a duration (10min) nor an ISO time"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def read_audit(bootstrap: str, codec: EventCodec, on_malformed: Any = None) -> list[Event]:
    events: list[Event] = []
    for topic in (CONFIG_CHANGES.name(), CHECKPOINT_EVENTS.name()):
        records = replay_topic(bootstrap, codec, topic, on_malformed=on_malformed)
        events.extend(r.event for r in records if r.event is not None)
    return events


def entries(
    events: Iterable[Event], job_id: str | None = None, since_ms: int | None = None
) -> list[Entry]:
    selected = []
    for event in events:
        if isinstance(event, ConfigChange):
            timestamp, text = event.changed_at, _describe_change(event)
            kind = "config"
        elif isinstance(event, CheckpointLifecycleEvent):
            timestamp, text = event.timestamp, _describe_lifecycle(event)
            kind = "checkpoint"
        else:
            continue
        if job_id is not None and event.job_id != job_id:
            continue
        if since_ms is not None and timestamp < since_ms:
            continue
        selected.append(Entry(timestamp, event.job_id, kind, text, _record(event)))
    return sorted(selected, key=lambda e: e.timestamp_ms)


def fates(events: Iterable[Event], job_id: str | None = None) -> dict[tuple[str, int], str]:
    """How each checkpoint ended, by (job, id): COMPLETED, EXPIRED, FAILED (reason), SUBSUMED,
    or IN_PROGRESS when nothing final was recorded; DISCARDED after completion is appended."""
    result: dict[tuple[str, int], str] = {}
    for event in sorted(
        (e for e in events if isinstance(e, CheckpointLifecycleEvent)), key=lambda e: e.timestamp
    ):
        if job_id is not None and event.job_id != job_id:
            continue
        key = (event.job_id, event.checkpoint_id)
        kind = event.event_type
        if kind is CheckpointEventType.TRIGGERED:
            result.setdefault(key, "IN_PROGRESS")
        elif kind in FINAL:
            reason = (
                f" ({event.failure_reason.name})"
                if kind is CheckpointEventType.FAILED and event.failure_reason
                else ""
            )
            result[key] = kind.name + reason
        elif kind is CheckpointEventType.DISCARDED:
            result[key] = result.get(key, "COMPLETED") + ", later discarded"
    return result


def _describe_change(change: ConfigChange) -> str:
    return change_text(
        change.principal, change.changed_fields, dataclasses.asdict(change.old),
        dataclasses.asdict(change.new), change.request_id, change.override_version,
    )  # fmt: skip


def change_text(
    principal: str,
    changed_fields: Iterable[str],
    old: dict[str, Any],
    new: dict[str, Any],
    request_id: str,
    override_version: int,
) -> str:
    """One configuration change in words, whether it came from the topic or the history
    service (whose documents keep the settings as dicts without the unset ones)."""
    parts = [
        f"{name} {old.get(REST_FIELDS[name])} -> {new.get(REST_FIELDS[name])}"
        for name in changed_fields
        if name in REST_FIELDS
    ]
    return f"{principal} changed {', '.join(parts)} (request {request_id}, override v{override_version})"


def _describe_lifecycle(event: CheckpointLifecycleEvent) -> str:
    kind = "savepoint" if event.snapshot_type.is_savepoint else "checkpoint"
    text = f"{kind} {event.checkpoint_id} {event.event_type.name}"
    if event.failure_reason is not None:
        text += f" ({event.failure_reason.name})"
    if event.duration_ms is not None and event.event_type is not CheckpointEventType.TRIGGERED:
        text += f" after {event.duration_ms} ms"
    if event.external_path and event.event_type is CheckpointEventType.COMPLETED:
        text += f" at {event.external_path}"
    if event.message and event.event_type is not CheckpointEventType.COMPLETED:
        text += f": {event.message}"
    return text


def _record(event: Event) -> dict[str, Any]:
    import enum

    def plain(value: Any) -> Any:
        if isinstance(value, enum.Enum):
            return value.name
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
        if isinstance(value, list):
            return [plain(v) for v in value]
        return value

    fields: dict[str, Any] = plain(event)
    return {"type": type(event).__name__} | fields


def format_time(ms: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms / 1000)) + f".{ms % 1000:03d}Z"


def render(
    selected: list[Entry], checkpoint_fates: dict[tuple[str, int], str], as_json: bool
) -> list[str]:
    if as_json:
        return [json.dumps(e.record, sort_keys=True) for e in selected]
    lines = [f"{format_time(e.timestamp_ms)}  {e.job_id}  {e.kind:<10}  {e.text}" for e in selected]
    if checkpoint_fates:
        lines.append("")
        lines.append("fate of each checkpoint:")
        for (job, checkpoint_id), fate in sorted(checkpoint_fates.items()):
            lines.append(f"  {job}  {checkpoint_id:>6}  {fate}")
    return lines


def run(
    bootstrap: str,
    job_id: str | None,
    since: str | None,
    as_json: bool,
    say: Any,
    history_url: str | None = None,
    credentials: Credentials | None = None,
) -> int:
    """Prints the story: from the history service at ``history_url`` when given (read with
    ``credentials``), else from a replay of the topics. Returns the number of entries printed;
    a history service that cannot be read is `HistoryUnreadable`, before anything is printed."""
    since_ms = parse_since(since, int(time.time() * 1000))
    if history_url is not None:
        selected = from_history(history_url, job_id, since_ms, credentials)
        log.info("from the history service at %s (--replay reads every event)", history_url)
        for line in render(selected, {}, as_json):
            say(line)
        return len(selected)
    codec = EventCodec()
    malformed: list[Malformed] = []
    events = read_audit(bootstrap, codec, malformed.append)
    selected = entries(events, job_id, since_ms)
    checkpoint_fates = {} if as_json else fates([e for e in events if _after(e, since_ms)], job_id)
    for line in render(selected, checkpoint_fates, as_json):
        say(line)
    for bad in malformed:
        log.warning(
            "skipped malformed record %s[%d]@%d: %s",
            bad.topic,
            bad.partition,
            bad.offset,
            bad.reason,
        )
    return len(selected)


# --- from the history service -----------------------------------------------------------------


class HistoryUnreadable(Exception):
    """The history service answered but cannot be read by this command: the message is one
    line saying why and which flag helps, never the token."""


def history_client(
    url: str,
    credentials: Credentials | None = None,
    timeout_s: float = HISTORY_READ_TIMEOUT_S,
    transport: httpx.BaseTransport | None = None,
) -> httpx.Client:
    """A client of the history service at ``url`` showing ``credentials``; a file among them
    that cannot be used is a `ValueError` naming its flag."""
    credentials = credentials or Credentials()
    headers = {"Authorization": f"Bearer {credentials.token}"} if credentials.token else {}
    verify: ssl.SSLContext | bool = True
    if url.startswith("https:") or credentials.ca or credentials.cert or credentials.key:
        try:
            verify = credentials.ssl_context("--history")
        except RestError as exc:
            raise ValueError(str(exc)) from None
    return httpx.Client(
        base_url=url.rstrip("/"), headers=headers, verify=verify, timeout=timeout_s,
        transport=transport,
    )  # fmt: skip


def history_answers(
    url: str, credentials: Credentials | None = None, transport: httpx.BaseTransport | None = None
) -> bool:
    """Whether the history service at ``url`` is there and ready (its status is open to all).
    Not there is False, and the topics are replayed; there but its certificate not trusted, or
    our client certificate refused, is `HistoryUnreadable`."""
    with history_client(url, credentials, HISTORY_TIMEOUT_S, transport) as client:
        try:
            answer = client.get("/history/status")
        except httpx.HTTPError as exc:
            refusal = _tls_refusal(exc, url)
            if refusal is not None:
                raise HistoryUnreadable(f"the history service at {url}: {refusal}") from None
            return False
    try:
        return answer.status_code == 200 and bool(answer.json().get("ready"))
    except (ValueError, AttributeError):
        return False  # something else listens there


def from_history(
    url: str,
    job_id: str | None,
    since_ms: int | None,
    credentials: Credentials | None = None,
    transport: httpx.BaseTransport | None = None,
) -> list[Entry]:
    """The entries the history service keeps, as a replay would list them."""
    with history_client(url, credentials, transport=transport) as client:
        if job_id is None:
            overview = _read(client, url, "/jobs/overview")
            try:
                jobs = [j["sparkpoint.job_id"] for j in overview.json()["jobs"]]
            except (ValueError, KeyError, TypeError):
                raise HistoryUnreadable(
                    f"the history service at {url} answered GET /jobs/overview with no job list"
                ) from None
        else:
            jobs = [job_id]
        selected: list[Entry] = []
        for job in jobs:
            answer = _read(client, url, f"/jobs/{quote(job, safe='')}/history")
            if answer.status_code == 404:
                continue
            selected.extend(_history_entries(answer.json()))
    return sorted(
        (e for e in selected if since_ms is None or e.timestamp_ms >= since_ms),
        key=lambda e: e.timestamp_ms,
    )


def _read(client: httpx.Client, url: str, path: str) -> httpx.Response:
    """GET ``path``: its answer when 200 or 404, else `HistoryUnreadable` in one line, naming
    the flag that helps when the service refused us."""
    try:
        answer = client.get(path)
    except httpx.HTTPError as exc:
        why = (
            _tls_refusal(exc, url) or f"no answer to GET {path} ({str(exc) or type(exc).__name__})"
        )
        raise HistoryUnreadable(f"the history service at {url}: {why}") from None
    if answer.status_code in (200, 404):
        return answer
    try:
        said = "; ".join(answer.json()["errors"])
    except (ValueError, KeyError, TypeError):
        said = answer.reason_phrase
    hint = {
        401: f" ({TOKEN_HINT})",
        403: " (a token or client certificate the history service admits with the read role: "
        "--history-token-file, --history-cert)",
    }.get(answer.status_code, "")
    raise HistoryUnreadable(
        f"the history service at {url} answered GET {path} with HTTP {answer.status_code}: "
        f"{said}{hint}"
    )


def _tls_refusal(exc: httpx.HTTPError, url: str) -> str | None:
    """Why TLS kept us out, with the flag that helps; None when TLS was not the cause."""
    cause: BaseException | None = exc
    while cause is not None and not isinstance(cause, ssl.SSLError):
        cause = cause.__cause__ or cause.__context__
    if isinstance(cause, ssl.SSLCertVerificationError):
        return f"its certificate is not trusted ({cause.verify_message}): --history-ca names the CA"
    if isinstance(cause, ssl.SSLError):
        return f"TLS refused ({cause.reason or cause}): {MUTUAL_TLS_HINT}"
    if isinstance(exc, httpx.RemoteProtocolError) and url.startswith("https:"):
        # aiohttp under mutual TLS closes a connection whose client certificate it does not
        # trust (or that has none) without a TLS alert: a disconnection is all we see
        return f"it closed the connection without an answer ({MUTUAL_TLS_HINT})"
    return None


def _history_entries(doc: dict[str, Any]) -> list[Entry]:
    job = doc["job_id"]
    out = []
    for change in doc["config_changes"]:
        text = change_text(
            change["principal"], change["changed_fields"], change["old"], change["new"],
            change["request_id"], change["override_version"],
        )  # fmt: skip
        record = {"type": "ConfigChange", "job_id": job} | change
        out.append(Entry(change["changed_at"], job, "config", text, record))
    for entry in doc["history"]:
        kind = "savepoint" if entry["is_savepoint"] else "checkpoint"
        status = entry["status"]
        text = f"{kind} {entry['id']} {status}"
        at = entry["trigger_timestamp"]
        if status == "COMPLETED":
            at = entry["latest_ack_timestamp"]
            text += f" after {entry['end_to_end_duration']} ms at {entry['external_path']}"
            if entry.get("discarded"):
                text += ", later discarded"
        elif status == "FAILED":
            at = entry.get("failure_timestamp", at)
            text += f" after {entry['end_to_end_duration']} ms: {entry.get('failure_message')}"
        record = {"type": "CheckpointStatistics", "job_id": job} | entry
        out.append(Entry(at, job, "checkpoint", text, record))
    return out


# --- following ---------------------------------------------------------------------------------


def follow(
    bootstrap: str, job_id: str | None, as_json: bool, say: Any, stop: Any = lambda: False
) -> None:
    """Prints audit events as they are written, from now on, until ``stop()`` or Ctrl-C."""
    codec = EventCodec()
    consumer = make_consumer(bootstrap)
    subscriber = EventSubscriber(consumer, codec)
    started_ms = int(time.time() * 1000)
    assignment = []
    for topic in (CONFIG_CHANGES.name(), CHECKPOINT_EVENTS.name()):
        for partition, (_, high) in end_offsets(consumer, topic).items():
            assignment.append(TopicPartition(topic, partition, high))
    subscriber.assign(assignment)
    try:
        while not stop():
            events = [r.event for r in subscriber.poll(0.5) if r.event is not None]
            # the embedded broker's end offset may point into the last batch: what was
            # written before we started is not news
            fresh = [e for e in events if _after(e, started_ms)]
            for line in render(entries(fresh, job_id), {}, as_json):
                say(line)
    finally:
        subscriber.close()


def _after(event: Event, since_ms: int | None) -> bool:
    return since_ms is None or getattr(event, "timestamp", 0) >= since_ms
