"""`sparkpoint audit`: replays the audit topics (configuration changes and checkpoint lifecycle)
to the end offsets taken at start, and tells who changed what when, and what became of each
checkpoint."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from services.common.avro import EventCodec
from services.common.events import (
    CheckpointEventType,
    CheckpointLifecycleEvent,
    ConfigChange,
    Event,
)
from services.common.kafka import (
    Malformed,
    replay_topic,
)
from services.common.settings import REST_FIELDS, parse_duration
from services.common.topics import CHECKPOINT_EVENTS, CONFIG_CHANGES

log = logging.getLogger(__name__)

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
    parts = [
        f"{name} {getattr(change.old, REST_FIELDS[name])} -> {getattr(change.new, REST_FIELDS[name])}"
        for name in change.changed_fields
        if name in REST_FIELDS
    ]
    return f"{change.principal} changed {', '.join(parts)} (request {change.request_id}, override v{change.override_version})"


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
    import dataclasses
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


def run(bootstrap: str, job_id: str | None, since: str | None, as_json: bool, say: Any) -> int:
    codec = EventCodec()
    malformed: list[Malformed] = []
    since_ms = parse_since(since, int(time.time() * 1000))
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


def _after(event: Event, since_ms: int | None) -> bool:
    return since_ms is None or getattr(event, "timestamp", 0) >= since_ms
