"""A job's progress as the coordinator shows it: from the newest heartbeat of its agent (records
in and out, their rates, each source partition's position and end), in sparkpoint's own shape
(``GET /jobs/{id}/progress``, the dashboard, ``sparkpoint demo``), in Flink's vertex metrics and
back-pressure shapes (``/jobs/{id}/vertices/{v}/metrics``, ``.../subtasks/metrics``,
``.../backpressure``, read by Flink's web dashboard) and as Prometheus lines with Flink's metric
names. Pure: the time comes in as an argument.

A source partition is **stalled** when records wait in it (its lag is above 0) and its position
has not moved for `STALL_AFTER_MS`: the job's lag grows while it reads nothing. A job with a
stalled partition is shown as such everywhere.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from sparkpoint.common.events import AgentHeartbeat, JobRegistered, PartitionProgress


class Reporting(Protocol):
    """A job as these views need it (`sparkpoint.coordinator.service.owned.Reporting` is one)."""

    @property
    def registration(self) -> JobRegistered: ...

    @property
    def progress(self) -> AgentHeartbeat | None: ...

    @property
    def job_id(self) -> str: ...


STALL_AFTER_MS = 10_000
"""A partition with a lag that has not advanced for this long is stalled: ten rounds of the
slowest healthy job measured here (a round of 250,000 records per subtask takes about a
second), and well within what an operator watching a dashboard notices."""

HIGH_BACKPRESSURE = 0.5
LOW_BACKPRESSURE = 0.1
"""Flink's back-pressure levels: above 0.5 of the time held back is high, above 0.1 low."""


@dataclass(frozen=True)
class PartitionView:
    partition: PartitionProgress
    subtask: int
    """The source subtask that reads it (round robin, as the agent assigns them)."""
    idle_ms: int
    """Milliseconds since its position last moved (since the attempt started, if it has not)."""
    stalled: bool

    def as_json(self) -> dict[str, Any]:
        p = self.partition
        return {
            "topic": p.topic,
            "partition": p.partition,
            "subtask": self.subtask,
            "position": p.position,
            "end": p.end,
            "lag": p.lag,
            "records_in_per_second": p.records_in_per_second,
            "last_advanced": p.last_advanced,
            "ms_since_advanced": self.idle_ms,
            "stalled": self.stalled,
        }


def partitions(job: Reporting, beat: AgentHeartbeat, now_ms: int) -> list[PartitionView]:
    started = job.registration.timestamp
    views = []
    for index, partition in enumerate(beat.partitions):
        since = partition.last_advanced or started
        idle = max(0, now_ms - since)
        views.append(
            PartitionView(
                partition,
                index % max(1, job.registration.parallelism),
                idle,
                partition.lag > 0 and idle >= STALL_AFTER_MS,
            )
        )
    return views


def progress(job: Reporting, now_ms: int) -> dict[str, Any]:
    """``GET /jobs/{id}/progress``: what the job's agent last reported, and what it means."""
    beat = job.progress
    if beat is None:
        return {"reported": False, "stalled": False, "partitions": []}
    views = partitions(job, beat, now_ms)
    lags = [v.partition.lag for v in views]
    return {
        "reported": True,
        "timestamp": beat.timestamp,
        "attempt": beat.attempt,
        "records_in": beat.records_in,
        "records_out": beat.records_out,
        "records_in_per_second": beat.records_in_per_second,
        "records_out_per_second": beat.records_out_per_second,
        "backpressured_ms_per_second": beat.backpressured_ms_per_second,
        "lag": sum(lags),
        "lag_max": max(lags, default=0),
        "stalled": any(v.stalled for v in views),
        "partitions": [v.as_json() for v in views],
    }


# --- Flink's shapes -------------------------------------------------------------------------------


def watermarks(job: Reporting, vertex: int) -> list[dict[str, Any]]:
    """``GET /jobs/{id}/vertices/{v}/watermarks`` as Flink answers it: per subtask, the source
    stage's ``currentOutputWatermark`` (the sources' watermark) or the keyed stage's
    ``currentInputWatermark``, as strings of ms; none before a job with event time reported
    one (Flink's dashboard then says "No Watermark")."""
    beat = job.progress
    if beat is None or not beat.watermarks:
        return []
    if vertex == 0:
        name, values = "currentOutputWatermark", [beat.source_watermark] * len(beat.watermarks)
    else:
        name, values = "currentInputWatermark", list(beat.watermarks)
    return [{"id": f"{i}.{name}", "value": str(value)} for i, value in enumerate(values)]


def subtask_metrics(job: Reporting, vertex: int, now_ms: int) -> dict[int, dict[str, float]]:
    """Per subtask of a vertex (0: the source stage, 1: the keyed stage), Flink's task and
    source metrics that the heartbeats carry."""
    beat = job.progress
    parallelism = job.registration.parallelism
    out: dict[int, dict[str, float]] = {i: {} for i in range(parallelism)}
    if beat is None:
        return out
    if vertex == 0:
        held = float(beat.backpressured_ms_per_second)
        for i in out:
            out[i] = {
                **_watermark_metric(beat, i, "currentOutputWatermark"),
                "numRecordsInPerSecond": 0.0,
                "numRecordsOutPerSecond": 0.0,
                "pendingRecords": 0.0,
                "records-lag-max": 0.0,
                "sourceIdleTime": 0.0,
                "backPressuredTimeMsPerSecond": held,
            }
        for view in partitions(job, beat, now_ms):
            metrics = out[view.subtask]
            p = view.partition
            metrics["numRecordsOutPerSecond"] += p.records_in_per_second
            metrics["pendingRecords"] += p.lag
            metrics["records-lag-max"] = max(metrics["records-lag-max"], float(p.lag))
            metrics["sourceIdleTime"] = max(metrics["sourceIdleTime"], float(view.idle_ms))
            prefix = f"KafkaSourceReader.topic.{p.topic}.partition.{p.partition}"
            metrics[f"{prefix}.currentOffset"] = float(p.position)
    else:
        share = float(beat.records_out_per_second) / max(1, parallelism)
        for i in out:  # the keyed stage's output is counted per job: shown evenly per subtask
            out[i] = {
                **_watermark_metric(beat, i, "currentInputWatermark"),
                "numRecordsOutPerSecond": share,
                "backPressuredTimeMsPerSecond": 0.0,
            }
    return out


def _watermark_metric(beat: AgentHeartbeat, subtask: int, name: str) -> dict[str, float]:
    if subtask >= len(beat.watermarks):
        return {}
    value = beat.source_watermark if name == "currentOutputWatermark" else beat.watermarks[subtask]
    return {name: float(value)}


def vertex_metrics(
    job: Reporting, vertex: int, now_ms: int, get: list[str] | None
) -> list[dict[str, Any]]:
    """``GET /jobs/{id}/vertices/{v}/metrics``: the metric ids (``<subtask>.<name>``), or with
    ``get`` their values, as Flink answers."""
    flat = {
        f"{subtask}.{name}": value
        for subtask, metrics in subtask_metrics(job, vertex, now_ms).items()
        for name, value in metrics.items()
    }
    if get is None:
        return [{"id": name} for name in flat]
    return [{"id": name, "value": str(flat[name])} for name in get if name in flat]


def aggregated_metrics(
    job: Reporting, vertex: int, now_ms: int, get: list[str] | None
) -> list[dict[str, Any]]:
    """``GET /jobs/{id}/vertices/{v}/subtasks/metrics``: each metric over the subtasks (min,
    max, avg, sum, skew), or the ids without ``get``."""
    per_subtask = subtask_metrics(job, vertex, now_ms)
    names = sorted({name for metrics in per_subtask.values() for name in metrics})
    if get is None:
        return [{"id": name} for name in names]
    answer = []
    for name in get:
        values = [m[name] for m in per_subtask.values() if name in m]
        if not values:
            continue
        average = sum(values) / len(values)
        skew = (max(values) - average) / average * 100 if average else 0.0
        answer.append(
            {
                "id": name,
                "min": min(values),
                "max": max(values),
                "avg": average,
                "sum": sum(values),
                "skew": skew,
            }
        )
    return answer


def level(ratio: float) -> str:
    if ratio > HIGH_BACKPRESSURE:
        return "high"
    return "low" if ratio > LOW_BACKPRESSURE else "ok"


def backpressure(job: Reporting, vertex: int, now_ms: int) -> dict[str, Any]:
    """``GET /jobs/{id}/vertices/{v}/backpressure``: the source stage is back-pressured while a
    channel to the keyed stage is full (the agent measures the share of each second)."""
    beat = job.progress
    held = beat.backpressured_ms_per_second / 1000 if beat is not None and vertex == 0 else 0.0
    subtasks = [
        {
            "subtask": i,
            "attempt-number": beat.attempt if beat is not None else 0,
            "backpressure-level": level(held),
            "backpressureLevel": level(held),
            "ratio": held,
            "idleRatio": 0.0,
            "busyRatio": "NaN",
        }
        for i in range(job.registration.parallelism)
    ]
    return {
        "status": "ok" if beat is not None else "deprecated",
        "backpressure-level": level(held),
        "backpressureLevel": level(held),
        "end-timestamp": beat.timestamp if beat is not None else now_ms,
        "subtasks": subtasks,
    }


# --- Prometheus -------------------------------------------------------------------------------------

PROMETHEUS = (
    ("flink_taskmanager_job_task_numRecordsIn", "counter", "Records read from the sources in this attempt."),
    ("flink_taskmanager_job_task_numRecordsOut", "counter", "Records the keyed function emitted in this attempt."),
    ("flink_taskmanager_job_task_numRecordsInPerSecond", "gauge", "Records read per second."),
    ("flink_taskmanager_job_task_numRecordsOutPerSecond", "gauge", "Records emitted per second."),
    ("flink_taskmanager_job_task_backPressuredTimeMsPerSecond", "gauge", "Milliseconds per second the sources were held back by full channels."),
    ("flink_taskmanager_job_task_operator_KafkaSourceReader_KafkaConsumer_records_lag_max", "gauge", "The largest lag of any source partition, records."),
)  # fmt: skip
PARTITION_PROMETHEUS = (
    ("flink_taskmanager_job_task_operator_pendingRecords", "gauge", "Records in the partition not read yet (its lag)."),
    ("flink_taskmanager_job_task_operator_KafkaSourceReader_currentOffset", "gauge", "The offset of the partition's next record to read."),
    ("flink_taskmanager_job_task_operator_sourceIdleTime", "gauge", "Milliseconds since the partition's position last moved."),
    ("sparkpoint_source_stalled", "gauge", "1 when the partition has a lag and has not advanced for 10 s."),
)  # fmt: skip
WATERMARK_PROMETHEUS = (
    ("flink_taskmanager_job_task_operator_currentOutputWatermark", "gauge", "The sources' event-time watermark, ms since the epoch."),
    ("flink_taskmanager_job_task_operator_currentInputWatermark", "gauge", "A keyed subtask's event-time watermark, ms since the epoch."),
)  # fmt: skip


def prometheus_lines(jobs: Sequence[Reporting], now_ms: int) -> list[str]:
    lines: list[str] = []
    reported = [(job, job.progress) for job in jobs if job.progress is not None]
    for name, kind, help_text in PROMETHEUS:
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
        for job, beat in reported:
            assert beat is not None
            lag = max((p.lag for p in beat.partitions), default=0)
            value = {
                "flink_taskmanager_job_task_numRecordsIn": beat.records_in,
                "flink_taskmanager_job_task_numRecordsOut": beat.records_out,
                "flink_taskmanager_job_task_numRecordsInPerSecond": beat.records_in_per_second,
                "flink_taskmanager_job_task_numRecordsOutPerSecond": beat.records_out_per_second,
                "flink_taskmanager_job_task_backPressuredTimeMsPerSecond": beat.backpressured_ms_per_second,
            }.get(name, lag)  # fmt: skip
            lines.append(f"{name}{{{_job_labels(job)}}} {value}")
    for name, kind, help_text in PARTITION_PROMETHEUS:
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
        for job, beat in reported:
            assert beat is not None
            for view in partitions(job, beat, now_ms):
                p = view.partition
                value = {
                    "flink_taskmanager_job_task_operator_pendingRecords": p.lag,
                    "flink_taskmanager_job_task_operator_KafkaSourceReader_currentOffset": p.position,
                    "flink_taskmanager_job_task_operator_sourceIdleTime": view.idle_ms,
                }.get(name, int(view.stalled))  # fmt: skip
                labels = f'{_job_labels(job)},topic="{_escape(p.topic)}",partition="{p.partition}"'
                lines.append(f"{name}{{{labels}}} {value}")
    timed = [(job, beat) for job, beat in reported if beat is not None and beat.watermarks]
    for name, kind, help_text in WATERMARK_PROMETHEUS:
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
        for job, beat in timed:
            if name.endswith("currentOutputWatermark"):
                lines.append(f"{name}{{{_job_labels(job)}}} {beat.source_watermark}")
                continue
            for subtask, value in enumerate(beat.watermarks):
                labels = f'{_job_labels(job)},subtask_index="{subtask}"'
                lines.append(f"{name}{{{labels}}} {value}")
    return lines


def _job_labels(job: Reporting) -> str:
    return f'job_id="{job.job_id}",job_name="{_escape(job.registration.job_name)}"'


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
