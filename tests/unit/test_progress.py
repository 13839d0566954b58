"""A job's progress on a fake clock: what the agent reports with each heartbeat
(services/sparkpoint/agent/control/progress.py), how a round's reads are shared out (``max_offsets_per_trigger``),
and how the coordinator shows it (services/sparkpoint/coordinator/rest/progress_views.py): Flink's vertex
metrics, back-pressure and Prometheus names, and a stalled partition."""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest

from sparkpoint.agent.control.progress import RATE_WINDOW_S, Progress
from sparkpoint.agent.job import KafkaSource
from sparkpoint.agent.sources import share_by_backlog
from sparkpoint.common.events import AgentHeartbeat, JobRegistered, PartitionProgress
from sparkpoint.coordinator.rest import progress_views
from sparkpoint.coordinator.rest.progress_views import STALL_AFTER_MS
from tests.factories import JOB, T0, job_registered


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def wall_ms(self) -> int:
        return int(self.now * 1000)


def progress() -> tuple[Progress, FakeClock]:
    clock = FakeClock()
    tracked = Progress(clock=clock, wall_ms=clock.wall_ms)
    tracked.start({("payments", 0): 10, ("payments", 1): 0})
    return tracked, clock


# --- what the agent reports ------------------------------------------------------------------------


def test_rates_are_records_over_the_recent_window_and_counters_grow() -> None:
    tracked, clock = progress()
    tracked.report()  # the first heartbeat: nothing yet
    for _ in range(5):
        clock.now += 1
        tracked.read(("payments", 0), tracked.partitions[("payments", 0)].position + 100, 100)
        tracked.emitted(50)
        report = tracked.report()
    assert report["records_in"] == 500 and report["records_out"] == 250
    assert report["records_in_per_second"] == 100 and report["records_out_per_second"] == 50
    partitions = report["partitions"]
    assert isinstance(partitions, list)
    assert [(p.partition, p.position, p.records_in_per_second) for p in partitions] == [
        (0, 510, 100),
        (1, 0, 0),
    ]


def test_a_rate_falls_to_zero_within_the_window_once_reading_stops() -> None:
    tracked, clock = progress()
    tracked.report()
    clock.now += 1
    tracked.read(("payments", 0), 1_010, 1_000)
    assert tracked.report()["records_in_per_second"] == 1_000
    for _ in range(int(RATE_WINDOW_S) + 2):
        clock.now += 1
        report = tracked.report()
    assert report["records_in_per_second"] == 0 and report["records_in"] == 1_000


def test_a_partition_advances_only_when_its_position_moves() -> None:
    tracked, clock = progress()
    clock.now += 3
    tracked.read(("payments", 1), 0, 0)  # a round that found nothing
    assert tracked.partitions[("payments", 1)].last_advanced_ms == 0
    tracked.read(("payments", 1), 7, 7)
    assert tracked.partitions[("payments", 1)].last_advanced_ms == 103_000


def test_time_held_back_by_full_channels_is_reported_per_second() -> None:
    tracked, clock = progress()
    tracked.report()
    tracked.held(True)
    clock.now += 1.5
    tracked.held(True)  # still full: counted from when it filled
    clock.now += 0.5
    tracked.held(False)
    clock.now += 2
    report = tracked.report()
    assert report["backpressured_ms_per_second"] == 500  # 2 s of 4


def test_a_new_attempt_counts_from_zero() -> None:
    tracked, _ = progress()
    tracked.read(("payments", 0), 20, 10)
    tracked.start({("payments", 0): 15})
    report = tracked.report()
    assert report["records_in"] == 0
    assert [(p.partition, p.position) for p in report["partitions"]] == [(0, 15)]  # type: ignore[attr-defined]


def test_the_heartbeat_carries_the_report_through_the_codec() -> None:
    from sparkpoint.common.avro import EventCodec

    tracked, _ = progress()
    tracked.seen_ends([(("payments", 0), 50)])
    beat = AgentHeartbeat(JOB, "agent-a", 0, T0, **tracked.report())  # type: ignore[arg-type]
    codec = EventCodec()
    assert codec.decode(codec.encode(beat)) == beat
    assert beat.partitions[0].lag == 40 and beat.partitions[1].lag == 0  # end not known: 0


# --- a round's share of max_offsets_per_trigger ----------------------------------------------------


def test_without_a_bound_every_partition_reads_its_backlog_and_within_one_at_least_it() -> None:
    backlog: dict[tuple[str, int], int | None] = {("t", 0): 900, ("t", 1): 100}
    assert share_by_backlog(backlog, None) == {}
    assert share_by_backlog(backlog, 2_000) == {("t", 0): 1_800, ("t", 1): 200}


def test_a_bound_is_shared_by_backlog_and_every_partition_reads_at_least_one() -> None:
    backlog: dict[tuple[str, int], int | None] = {("t", 0): 9_000, ("t", 1): 1_000, ("t", 2): 1}
    shares = share_by_backlog(backlog, 1_000)
    assert shares == {("t", 0): 899, ("t", 1): 99, ("t", 2): 1}
    assert sum(shares.values()) <= 1_000


def test_source_bounds_are_validated() -> None:
    with pytest.raises(ValueError, match="max_offsets_per_trigger"):
        KafkaSource(["t"], max_offsets_per_trigger=0)
    with pytest.raises(ValueError, match="max_duration_per_trigger"):
        KafkaSource(["t"], max_duration_per_trigger="0ms")
    with pytest.raises(ValueError, match="duration"):
        KafkaSource(["t"], max_duration_per_trigger="soon")
    assert KafkaSource(["t"], max_duration_per_trigger="1s").max_duration_ms == 1_000


# --- what the coordinator shows --------------------------------------------------------------------


@dataclass
class Job:
    registration: JobRegistered
    progress: AgentHeartbeat | None

    @property
    def job_id(self) -> str:
        return self.registration.job_id


def heartbeat(*partitions: PartitionProgress, held_ms: int = 0) -> AgentHeartbeat:
    return AgentHeartbeat(
        JOB, "agent-a", 0, T0 + 20_000, 9_000, 8_000, 300, 250, held_ms, list(partitions)
    )


def partition(
    number: int, position: int, end: int, advanced: int = T0 + 19_000
) -> PartitionProgress:
    return PartitionProgress("payments", number, position, end, 100, advanced)


def test_a_partition_with_a_lag_that_has_not_advanced_for_the_stall_time_is_stalled() -> None:
    job = Job(
        job_registered(),
        heartbeat(
            partition(0, 500, 500, advanced=T0),  # no lag: idle, not stalled
            partition(1, 200, 900, advanced=T0 + 19_000),  # lag, moving
            partition(2, 200, 900, advanced=T0 + 20_000 - STALL_AFTER_MS),  # lag, stuck
            partition(3, 0, 50, advanced=0),  # never moved since the attempt started
        ),
    )
    shown = progress_views.progress(job, T0 + 20_000)
    assert [p["stalled"] for p in shown["partitions"]] == [False, False, True, True]
    assert shown["stalled"] and shown["lag"] == 700 + 700 + 50 and shown["lag_max"] == 700
    assert [p["subtask"] for p in shown["partitions"]] == [0, 1, 0, 1]  # round robin


def test_a_job_without_a_heartbeat_yet_reports_nothing_and_is_not_stalled() -> None:
    job = Job(job_registered(), None)
    assert progress_views.progress(job, T0) == {
        "reported": False,
        "stalled": False,
        "partitions": [],
    }
    assert progress_views.backpressure(job, 0, T0)["status"] == "deprecated"


def test_vertex_metrics_have_flinks_ids_and_values_per_subtask() -> None:
    job = Job(job_registered(), heartbeat(partition(0, 500, 800), partition(1, 100, 150)))
    ids = {m["id"] for m in progress_views.vertex_metrics(job, 0, T0 + 20_000, None)}
    assert {"0.numRecordsOutPerSecond", "1.pendingRecords", "0.records-lag-max"} <= ids
    assert "0.KafkaSourceReader.topic.payments.partition.0.currentOffset" in ids
    values = progress_views.vertex_metrics(
        job, 0, T0 + 20_000, ["0.pendingRecords", "1.pendingRecords", "0.nothing"]
    )
    assert values == [
        {"id": "0.pendingRecords", "value": "300.0"},
        {"id": "1.pendingRecords", "value": "50.0"},
    ]
    summed = progress_views.aggregated_metrics(job, 0, T0 + 20_000, ["pendingRecords"])
    assert summed[0]["sum"] == 350.0 and summed[0]["max"] == 300.0


def test_backpressure_levels_follow_flinks_thresholds() -> None:
    for held, level in ((50, "ok"), (300, "low"), (800, "high")):
        job = Job(job_registered(), heartbeat(partition(0, 1, 2), held_ms=held))
        answer = progress_views.backpressure(job, 0, T0 + 20_000)
        assert answer["backpressureLevel"] == level
        assert [s["ratio"] for s in answer["subtasks"]] == [held / 1000] * 2
        assert progress_views.backpressure(job, 1, T0)["backpressureLevel"] == "ok"


def test_prometheus_lines_carry_flinks_metric_names_per_job_and_partition() -> None:
    job = Job(job_registered(), heartbeat(partition(0, 500, 800)))
    ended_quietly = Job(replace(job_registered("job-0002")), None)
    text = "\n".join(progress_views.prometheus_lines([job, ended_quietly], T0 + 20_000))
    assert (
        'flink_taskmanager_job_task_numRecordsInPerSecond{job_id="job-0001",job_name="payments"} 300'
        in text
    )
    assert (
        'flink_taskmanager_job_task_operator_pendingRecords{job_id="job-0001",job_name="payments",'
        'topic="payments",partition="0"} 300'
    ) in text
    assert "job-0002" not in text  # nothing reported: no figures invented


def test_watermarks_have_flinks_ids_per_subtask_and_none_without_event_time() -> None:
    untimed = Job(job_registered(), heartbeat(partition(0, 1, 2)))
    assert progress_views.watermarks(untimed, 0) == []
    assert progress_views.watermarks(untimed, 1) == []
    beat = replace(heartbeat(partition(0, 1, 2)), source_watermark=5_000, watermarks=[4_000, 3_000])
    timed = Job(job_registered(), beat)
    assert progress_views.watermarks(timed, 0) == [
        {"id": "0.currentOutputWatermark", "value": "5000"},
        {"id": "1.currentOutputWatermark", "value": "5000"},
    ]
    assert progress_views.watermarks(timed, 1) == [
        {"id": "0.currentInputWatermark", "value": "4000"},
        {"id": "1.currentInputWatermark", "value": "3000"},
    ]
    keyed = progress_views.vertex_metrics(timed, 1, T0, ["1.currentInputWatermark"])
    assert keyed == [{"id": "1.currentInputWatermark", "value": "3000.0"}]
    text = "\n".join(progress_views.prometheus_lines([timed, untimed], T0 + 20_000))
    assert (
        'flink_taskmanager_job_task_operator_currentInputWatermark{job_id="job-0001",'
        'job_name="payments",subtask_index="1"} 3000'
    ) in text
    assert text.count("currentOutputWatermark{") == 1


def test_the_agent_reports_watermarks_through_the_codec() -> None:
    from sparkpoint.common.avro import EventCodec

    tracked, _ = progress()
    tracked.watermarked(7_000, [6_000, -(2**63)])
    beat = AgentHeartbeat(JOB, "agent-a", 0, T0, **tracked.report())  # type: ignore[arg-type]
    codec = EventCodec()
    decoded = codec.decode(codec.encode(beat))
    assert decoded == beat and decoded.watermarks == [6_000, -(2**63)]
    tracked.start({})
    assert tracked.report()["watermarks"] == []
