"""The agent: one process per job, the job's Spark driver, and its voice in the checkpoint
protocol. This module is its lifecycle: start an attempt (restore, register), run its loop
(`loop`), restart after a failure as the job's restart strategy says, end. What it wires:

- `rounds.rounds`: stage 1 and stage 2 of each round, as Spark jobs beside the loop;
- `checkpointing.snapshots`: triggers, barriers, snapshots, acknowledgements, completions;
- `control.link` and `control.membership`: registration, lease, control events, status;
- `sinks.ledger`: the exactly-once sink's epochs until they are visible;
- `attempt`: the parts of each attempt; `recovery`: the snapshot restored and its channel state.

Subtasks: ``source-<i>`` (the positions of the partitions it owns) and ``keyed-<i>`` (its key
groups and its part of the staged sink output), i < parallelism.
"""

from __future__ import annotations

import logging
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from sparkpoint.agent.attempt import (
    Attempt,
    AttemptMaker,
    clean_task_owned,
    registration,
    remove_tree,
    restored_snapshot,
)
from sparkpoint.agent.checkpointing.pending import now_ms
from sparkpoint.agent.checkpointing.snapshots import (
    AttemptParts,
    Outcomes,
)
from sparkpoint.agent.control.link import ControlLink
from sparkpoint.agent.control.membership import Membership, RegistrationRefused, Superseded
from sparkpoint.agent.control.progress import Progress
from sparkpoint.agent.formats import JsonValues, ValueFormat, with_registry_settings
from sparkpoint.agent.job import Job, KafkaSource
from sparkpoint.agent.loop import JobLoop, Restart
from sparkpoint.agent.options import (
    MAX_ROWS_PER_ROUND,
    AgentOptions,
    JobSettings,
    Places,
    job_secrets,
)
from sparkpoint.agent.recovery.filter_jobs import FilterJobs
from sparkpoint.agent.recovery.restore import NoCheckpoint, Restored, latest_for_restart
from sparkpoint.agent.rounds.channels import Channel, SegmentFiles
from sparkpoint.agent.rounds.rounds import Rounds, RoundSettings
from sparkpoint.agent.sinks import EpochCommitter, SinkConflict, SinkWriter
from sparkpoint.agent.sinks.job_sink import JobSink
from sparkpoint.agent.sources import SourceMissing
from sparkpoint.agent.sources.files import FileSourceReader
from sparkpoint.agent.sources.kafka import KafkaSourceReader
from sparkpoint.agent.spark.jobs import SparkJobs
from sparkpoint.agent.state.backend import local_path
from sparkpoint.agent.wakeup import Wakeup, WakingPool
from sparkpoint.common.avro import EventCodec
from sparkpoint.common.checkpoint_store import latest_store_record
from sparkpoint.common.events import (
    JobRegistered,
    JobStatus,
)
from sparkpoint.common.kafka import EventPublisher, make_producer
from sparkpoint.common.kafka_config import Frozen, client_properties, frozen
from sparkpoint.common.keygroups import key_group_range
from sparkpoint.common.redaction import register_secrets

__all__ = ["MAX_ROWS_PER_ROUND", "SETUP", "Agent", "AgentOptions", "Restart"]

log = logging.getLogger(__name__)

SETUP = (NoCheckpoint, SinkConflict, SourceMissing)
"""Why a job could not start that its message says in full: logged without a traceback."""

AFTER_REGISTERING = "latest, once registered"
"""What a restart restores when no checkpoint is named: the newest retained one, read after the
next attempt registered."""

RESET_WAIT_S = 1.0
"""How long a restart lets the failed attempt's rounds in flight finish (their results are
dropped) before cancelling them: a cancelled Spark task takes its Python worker with it, and
the restarted job's first round would pay ~1.3 s here for new workers."""

COPY_THREADS = 4
"""Threads copying state files for snapshots (the asynchronous phase): I/O bound."""


class Agent:
    def __init__(self, job: Job, options: AgentOptions, codec: EventCodec, spark: Any = None):
        self.job, self.options, self.codec = job, options, codec
        self.parallelism = options.parallelism or job.parallelism
        self.max_parallelism = job.max_parallelism
        self.job_id = job.id
        register_secrets(job_secrets(job))
        resolved = JobSettings.of(job, options)
        self.settings, self.config = resolved.settings, resolved.config
        self.recovery, self.restart_config = resolved.recovery, resolved.restarts
        self.no_effect = resolved.no_effect
        self.checkpoint_dir = self.config.checkpoint_dir
        work_dir = Path(tempfile.mkdtemp(prefix=f"sparkpoint-{self.job_id}-"))
        self.places = Places.of(self.job_id, self.checkpoint_dir, options, work_dir)
        self.agent_id, self.channel_dir = self.places.agent_id, self.places.channel_dir
        self.ranges = [
            key_group_range(self.max_parallelism, self.parallelism, i)
            for i in range(self.parallelism)
        ]
        self.subtasks = [f"source-{i}" for i in range(self.parallelism)] + [
            f"keyed-{i}" for i in range(self.parallelism)
        ]
        self.stopping = threading.Event()
        self.status: JobStatus = JobStatus.CREATED
        self._connect(codec)
        self.spark_jobs = SparkJobs(
            f"sparkpoint {self.job_id}", options.master, options.spark_settings, spark,
            options.resident_tasks,
        )  # fmt: skip
        wake = self.wakeup = Wakeup()  # the loop sleeps on it: control events, pools' futures
        self.stages = Rounds(self._round_settings(), self.spark_jobs, self.progress, wake.set)
        self.filter_jobs = FilterJobs(self.spark_jobs, self.job_id, wake)
        self.copier = WakingPool(wake, COPY_THREADS, thread_name_prefix="snapshot-copy")
        self.janitor = ThreadPoolExecutor(1, thread_name_prefix="state-garbage")
        """Deletes replaced working state files: on an object store a round trip the loop need
        not wait for."""
        self.segment_files = SegmentFiles(self.channel_dir)
        self.job_sink = JobSink(job, options.bootstrap, codec, self.agent_id, self.spark_jobs)
        self.outcomes = Outcomes()
        self.attempts = AttemptMaker(
            job, options, self.config, self.recovery, self.places, self.ranges,
            len(self.subtasks), self.publisher, self.agent_id, self.copier, self.segment_files,
            self.outcomes, self.progress, self.stages.taken, lambda: self.attempt, {}, self.spark_jobs,
        )  # fmt: skip
        self.current: Attempt | None = None
        self.running_once = False
        """The job ran at least once: later failures go to the restart strategy."""
        self.failures: list[Exception] = []
        self.restarts = 0
        self.started_from: str | None = None
        """The snapshot the job was first restored from, if any."""
        self.on_round: Callable[[Agent], None] | None = None
        self.start_seconds = 0.0
        """How long the last start took: restore, Spark warm-up, source positions, registration."""
        self.handle_signals = False
        """Ctrl-C and SIGTERM cancel the job cleanly (the command line sets this)."""

    def _connect(self, codec: EventCodec) -> None:
        """The publisher, the lease and the control link (one record per batch: registrations
        are replayed to the jobs topic's end offsets)."""
        bootstrap = self.options.bootstrap
        self.publisher = EventPublisher(make_producer(bootstrap, one_record_per_batch=True), codec)
        self.progress = Progress()
        """Records in and out and where each source partition stands, for the heartbeats."""
        self.membership = Membership(
            self.job_id, self.agent_id, self.publisher, self.stopping,
            lookup=lambda: latest_store_record(bootstrap, codec, self.job_id),
            progress=self.progress.report,
        )  # fmt: skip
        self.link = ControlLink(
            bootstrap, codec, self.job_id, self.agent_id, self.publisher, self.membership, now_ms
        )

    def _round_settings(self) -> RoundSettings:
        source, job = self.job.source, self.job
        value_format: ValueFormat = JsonValues()
        properties: Frozen = ()
        if isinstance(source, KafkaSource):
            value_format = with_registry_settings(source.value_format)
            properties = frozen(client_properties(), source.properties)
        return RoundSettings(
            self.job_id, self.options.bootstrap, source, value_format, job.map, job.function,
            job.key, self.max_parallelism, self.ranges, self.channel_dir,
            self.places.state_dir, self.places.sink_dir, self.options.max_rows_per_round,
            properties,
            self.config.buffer_debloat_target_ms if self.config.buffer_debloat else None,
            self.config.buffer_debloat_samples, self.config.buffer_timeout_ms / 1000,
        )  # fmt: skip

    # --- what tests, benchmarks and the command line read ------------------------------------

    @property
    def sink(self) -> SinkWriter:
        return self.job_sink.writer

    @property
    def committer(self) -> EpochCommitter:
        return self.job_sink.committer

    @property
    def attempt(self) -> int:
        """The attempt the coordinator accepted: every answer and status carries it."""
        return self.membership.attempt

    @property
    def parts(self) -> AttemptParts:
        assert self.current is not None, "the job has not started"
        return self.current.parts

    @property
    def channels(self) -> list[Channel]:
        return self.parts.channels

    @property
    def source(self) -> KafkaSourceReader | FileSourceReader:
        return self.parts.source

    @property
    def finished_before(self) -> bool:
        return self.current is not None and self.current.finished_before

    @property
    def highest_trigger(self) -> int:
        """The newest checkpoint id the job's current attempt was triggered for."""
        return self.current.checkpointer.highest_trigger if self.current is not None else 0

    @property
    def completed_checkpoints(self) -> list[int]:
        return self.outcomes.completed

    @property
    def aborted_checkpoints(self) -> list[int]:
        return self.outcomes.aborted

    @property
    def declined_checkpoints(self) -> list[int]:
        return self.outcomes.declined

    @property
    def latest_completed(self) -> str | None:
        return self.outcomes.latest_completed

    def staged_outputs(self) -> list[str]:
        """Staged output files not yet published (exactly-once sinks), oldest epoch first."""
        return self.parts.ledger.staged_outputs() if self.current is not None else []

    @property
    def rounds(self) -> int:
        return self.stages.rounds

    @property
    def fetches(self) -> int:
        return self.stages.fetches

    @property
    def processed_rows(self) -> int:
        return self.stages.processed_rows

    @property
    def input_bytes(self) -> int:
        return self.stages.input_bytes

    @property
    def stage_seconds(self) -> dict[str, float]:
        return self.spark_jobs.stage_seconds

    @property
    def traffic(self) -> Any:
        return self.spark_jobs.traffic

    @property
    def spark(self) -> Any:
        return self.spark_jobs.session() if self.spark_jobs.started else None

    # --- lifecycle -------------------------------------------------------------------------------

    def run(self) -> JobStatus:
        """Runs the job until it finishes, is stopped, or fails for good; returns its final
        status. A failure after the job first ran goes to the restart strategy: the job restarts
        in this process (Spark stays warm) from its latest completed checkpoint, or fails."""
        if self.no_effect:
            log.warning(
                "job %s: options without effect here (accepted as Flink accepts them): %s",
                self.job_id, ", ".join(self.no_effect),
            )  # fmt: skip
        self.strategy = self.restart_config.strategy(self.config.periodic)
        try:
            self._attempts(self.options.restore or self.recovery.path)
        except (RegistrationRefused, Superseded) as exc:
            # not this agent's job (any more): its status is not this agent's to announce
            log.error("job %s: %s", self.job_id, exc)
            self.status = JobStatus.FAILED
            raise
        except Exception as exc:  # a cause the user can act on in a line, anything else in full
            log.error("job %s failed: %s", self.job_id, exc, exc_info=not isinstance(exc, SETUP))
            if self.membership.accepted and self.status is not JobStatus.FAILED:
                self.link.announce(JobStatus.FAILED, failure=exc)
            self.status = JobStatus.FAILED
            raise
        finally:
            self._close()
        return self.status

    def _attempts(self, restore: str | None) -> None:
        next_attempt = 0
        while True:
            try:
                self._start(restore, next_attempt)
                self._loop()
                return
            except (RegistrationRefused, Superseded):
                raise
            except Exception as failure:
                if not self.running_once:
                    raise  # it never ran: nothing to restart, the cause is in the setup
                delay = self._failed(failure)
                if delay is None:
                    raise
                next_attempt = self.attempt + 1
                restore = restart_point(failure)
                if self.stopping.wait(delay / 1000):
                    self.link.announce(JobStatus.CANCELED)
                    self.status = JobStatus.CANCELED
                    return
                log.warning(
                    "job %s: restarting (attempt %d) from %s",
                    self.job_id, next_attempt, restore or "the beginning",
                )  # fmt: skip

    def _failed(self, failure: Exception) -> int | None:
        """Tells the restart strategy; returns how long to wait before restarting, or None when
        the job fails for good (announced FAILED here)."""
        self.strategy.notify_failure(now_ms())
        self.failures.append(failure)
        if not self.strategy.can_restart() or self.stopping.is_set():
            log.error(
                "job %s failed; the %s restart strategy gives up after %d failures",
                self.job_id, self.strategy.name, len(self.failures),
            )  # fmt: skip
            self.link.announce(JobStatus.FAILED, failure=failure)
            self.status = JobStatus.FAILED
            return None
        delay = self.strategy.backoff_ms()
        log.warning(
            "job %s failed (%s: %s); %s restart in %d ms",
            self.job_id, type(failure).__name__, failure, self.strategy.name, delay,
        )  # fmt: skip
        self.status = JobStatus.RESTARTING
        self.link.announce(JobStatus.RESTARTING, failure=failure, restart_delay_ms=delay)
        self.restarts += 1
        self._reset()
        return delay

    def stop(self) -> None:
        """Cancel (Ctrl-C, SIGTERM): the job ends CANCELED at the end of the current round."""
        self.stopping.set()
        self.wakeup.set()

    def _close(self) -> None:
        self.spark_jobs.settle()
        self.membership.stop_heartbeats()
        self.filter_jobs.end_attempt()
        if self.current is not None and self.current.parts.restoring.futures:
            self.spark_jobs.cancel_open()  # a split of restored channel state: redone later
        self.stages.shutdown()
        self.filter_jobs.shutdown()
        self.copier.shutdown(wait=True)
        if self.current is not None:  # what the last rounds replaced
            self.janitor.submit(self.current.parts.backend.collect_garbage)
        self.janitor.shutdown(wait=True)
        self.job_sink.close()
        self.publisher.close(10)
        self.link.disconnect(keep_position=False)
        if self.current is not None:
            self.current.close_source()
        remove_tree(self.channel_dir)
        shutil.rmtree(self.places.work_dir, ignore_errors=True)
        self.spark_jobs.close()
        self.spark_jobs.report_traffic(self.job_id, self.input_bytes)

    def _reset(self) -> None:
        """After a failure: the failed attempt's rounds and splits let go (their records are
        read again after the restore), the sink settled (`JobSink.after_failure`)."""
        self.filter_jobs.end_attempt()
        attempt = self.current
        restoring = attempt.parts.restoring.futures if attempt is not None else []
        self.stages.settle(RESET_WAIT_S, restoring)
        remove_tree(self.channel_dir)
        self.job_sink.after_failure()
        self.link.disconnect(keep_position=True)  # the next attempt reads on from here
        if attempt is not None:
            attempt.close_source()
            for channel in attempt.parts.channels:
                channel.clear()  # their files went with the channel directory

    # --- starting an attempt -------------------------------------------------------------------------

    def _start(self, restore: str | None, attempt: int) -> None:
        """Reads what it restores, starts Spark, registers, and only once the coordinator
        accepted this agent touches storage or sinks (a refused agent changes nothing). Before
        registering it may start splitting restored channel state into its local channel
        directory (`recovery`): that directory is its own and goes when it closes."""
        started, own = time.monotonic(), False
        self.spark_jobs.start_warm_up(self.parallelism)  # Spark starts while the rest is read
        if restore == AFTER_REGISTERING:
            # a restart: the next attempt registers first. From then on the coordinator hears
            # nothing of the failed attempt, so none of its checkpoints completes (subsuming the
            # one read below) while this attempt restores
            self.link.connect()
            self.link.register(lambda n: self._registration(None, n), attempt)
            self._cancelled_while_restarting()
            restore, own = latest_for_restart(
                self.options.bootstrap, self.codec, self.checkpoint_dir, self.job_id,
                self.latest_completed, self.started_from,
            ), True  # fmt: skip
        restored = self._restored(restore, own) if restore is not None else None
        self.current = self._new_attempt(restored)
        self._warm_up()
        if not self.membership.accepted or self.attempt != attempt:
            self.link.connect()
            self.link.register(lambda n: self._registration(restored, n), attempt)
            self._cancelled_while_restarting()
        # accepted: this agent drives the job from here on
        self.membership.start_heartbeats()
        if restored is not None:
            self.current.parts.ledger.publish_restored(restored.epochs, restored.checkpoint_id)
        clean_task_owned(self.places, self.options, self.job_id)
        if restored is not None and not restored.shared:  # a snapshot the job does not keep
            self.current.parts.backend.adopt()
        self.status = JobStatus.RUNNING
        if not self.running_once and restored is not None:
            self.started_from = restored.external_path
        self.running_once = True
        self.start_seconds = time.monotonic() - started
        log.info(
            "job %s running: agent %s attempt %d, parallelism %d, %d key groups restored, started in %.1f s",
            self.job_id, self.agent_id, self.attempt, self.parallelism,
            restored.key_group_count if restored else 0, self.start_seconds,
        )  # fmt: skip

    def _restored(self, restore: str, own: bool) -> Restored | None:
        own = own or restore == "latest" or restore in (self.latest_completed, self.started_from)
        return restored_snapshot(
            restore, self.job_id, self.places, self.options, self.recovery, self.codec,
            self.max_parallelism, own,
        )  # fmt: skip

    def _warm_up(self) -> None:
        """Spark and its Python workers started (`_start` began it) before the job registers (a
        session takes seconds to its first result, and triggers must not wait for that). A
        restart in this process finds them warm."""
        if self.running_once:
            return
        self.spark_jobs.warm_up(self.parallelism)
        self.sink.prepare()
        if self.handle_signals:  # after the SparkContext: it installs a SIGINT handler of its own
            install_signal_handlers(self)

    def _new_attempt(self, restored: Restored | None) -> Attempt:
        """The parts of a new attempt; its split of restored channel state starts at once into
        a local channel directory (it overlaps the registration; channels on shared storage wait
        for it)."""
        attempt = self.attempts.make(restored, self.sink, self.committer)
        local = local_path(self.channel_dir) is not None
        if restored is not None and local and not restored.end_of_input:
            self._loop_of(attempt).recover_channels()
        return attempt

    def _registration(self, restored: Restored | None, attempt: int) -> JobRegistered:
        return registration(
            self.job, self.agent_id, attempt, self.ranges, self.settings, restored, now_ms()
        )

    def _cancelled_while_restarting(self) -> None:
        if self.membership.cancelled is not None:
            log.info("job %s: cancelled while it restarted", self.job_id)
            self.membership.cancelled = None
            self.stopping.set()  # CANCELED at the top of the loop

    # --- the loop ----------------------------------------------------------------------------------

    def _loop(self) -> None:
        assert self.current is not None
        self._end(self._loop_of(self.current).run())

    def _loop_of(self, attempt: Attempt) -> JobLoop:
        return JobLoop(
            self.job_id, attempt, self.stages, self.link, self.sink, self.committer,
            self.filter_jobs, self.segment_files, self.janitor, self.channel_dir,
            self.max_parallelism, self.stopping.is_set, self.stop, self._after_turn, self.wakeup,
        )  # fmt: skip

    def _after_turn(self) -> None:
        if self.on_round is not None:
            self.on_round(self)

    def _end(self, status: JobStatus) -> None:
        self.committer.drain()  # the job ends once every completed epoch is visible
        self.link.announce(status)
        self.status = status


def restart_point(failure: Exception) -> str:
    """What a restart restores: the checkpoint a failover request names, else the latest one
    the coordinator retains once the next attempt is registered."""
    if isinstance(failure, Restart) and failure.path:
        return failure.path
    return AFTER_REGISTERING


def install_signal_handlers(agent: Agent) -> None:
    def stop(signum: int, frame: object) -> None:
        log.info("signal %d: stopping job %s", signum, agent.job_id)
        agent.stop()

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
