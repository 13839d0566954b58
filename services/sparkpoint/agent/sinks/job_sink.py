"""The job's sink writer and its committer, across the attempts of the job: made from the job's
sink (Kafka or files), publishing from executors through Spark jobs in the pool ``sink`` (an
exactly-once Kafka sink with a local master writes ahead from a process of its own), kept
across a restart when every commit went through (an exactly-once sink), built anew otherwise."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from sparkpoint.agent.job import FileSink, Job, KafkaSink
from sparkpoint.agent.sinks import EpochCommitter, SinkWriter
from sparkpoint.agent.sinks.ahead import AheadPublisher
from sparkpoint.agent.sinks.files import FileSinkWriter
from sparkpoint.agent.sinks.kafka import KafkaSinkWriter
from sparkpoint.agent.spark.jobs import SINK_POOL, SparkJobs
from sparkpoint.common.avro import EventCodec

log = logging.getLogger(__name__)


class JobSink:
    def __init__(
        self, job: Job, bootstrap: str, codec: EventCodec, agent_id: str, jobs: SparkJobs
    ) -> None:
        self.job = job
        self.bootstrap = bootstrap
        self.codec = codec
        self.agent_id = agent_id
        self.jobs = jobs
        self.writer: SinkWriter = self._make()
        self.committer = EpochCommitter(self.writer, job.id)

    def _make(self) -> SinkWriter:
        sink = self.job.sink
        if isinstance(sink, KafkaSink):
            # with a local master the write-ahead process runs beside the executors; on a
            # cluster an epoch is published by a task, so records never reach the driver's host
            return KafkaSinkWriter(
                sink, self.bootstrap, self.codec, self.job.id, self.agent_id, self.job.key,
                run=self.run, write_ahead=AheadPublisher if self.jobs.local else None,
            )  # fmt: skip
        if isinstance(sink, FileSink):
            return FileSinkWriter(sink, self.job.id, run=self.run)
        raise TypeError(f"unknown sink {sink!r}")

    def run(self, work: Callable[[Any], int], tasks: list[Any]) -> list[int]:
        """Makes staged sink output visible from executors (`SinkRunner`): a Spark job in the
        sink's pool, a task each (the driver ships the files' names and gets counts back)."""
        if not tasks:
            return []
        counts = self.jobs.run(SINK_POOL, f"{self.job.id} sink: {len(tasks)} tasks", tasks, work)
        return [int(n) for n in counts]

    def after_failure(self) -> None:
        """Completed epochs made visible where possible (a restore publishes the rest). An
        exactly-once sink whose every commit went through is kept with its committer; one that
        failed a commit is built anew (its committer holds the error), and so is an
        at-least-once sink (it writes from the tasks, whose failure may have been its own).
        Either way the next publishing task's init_transactions aborts what was left open."""
        try:
            self.committer.drain()
            sound = self.writer.exactly_once
            if sound:  # what it wrote ahead for the failed attempt: the restore stages it again
                self.writer.abort_ahead()
        except Exception as exc:  # that epoch is published again by the restore
            log.warning("job %s: %s", self.job.id, exc)
            sound = False
        if sound:
            return
        self.close()
        self.writer = self._make()
        self.committer = EpochCommitter(self.writer, self.job.id)

    def close(self) -> None:
        self.committer.close()
        try:
            self.writer.close()
        except Exception as exc:  # closing after a failure: report, go on
            log.warning("job %s: closing the sink: %s", self.job.id, exc)
