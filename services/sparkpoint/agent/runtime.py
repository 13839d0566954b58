"""The agent: one process per job, the job's Spark driver, and its voice in the checkpoint
protocol (DESIGN.md sections 2 and 4.1).

One round of the loop:

1. read the control topic without blocking: triggers place a barrier at the tail of every
   channel and snapshot the source positions; completions publish sink epochs; aborts fold an
   epoch into the next; a failover request restarts the job from its latest checkpoint;
2. plan a fetch: every source partition with records beyond its position, up to the end it has
   now and within the source's bounds per round, nothing while a channel is full
   (backpressure);
   stage 1 runs as one Spark job (one task per partition) and appends segments to the channels;
3. stage 2 runs as one Spark job (one task per subtask with queued records), never past a
   barrier: new state versions and the round's output (staged for the current epoch);
4. a checkpoint whose barrier every channel has reached (or, unaligned, at once or once the
   aligned-checkpoint timeout ran out) is snapshotted: sparkpoint.agent.checkpointing.snapshots owns the
   snapshot, the acknowledgements, completions and aborts.

Subtasks: ``source-<i>`` (the positions of the partitions it owns) and ``keyed-<i>`` (its key
groups and its part of the staged sink output), i < parallelism.
"""

from __future__ import annotations

import contextlib
import logging
import posixpath
import shutil
import signal
import tempfile
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import TopicPartition
from fsspec.core import url_to_fs

from sparkpoint.agent.checkpointing.snapshots import (
    Copy,
    PendingSnapshot,
    SubtaskCheckpointing,
    now_ms,
)
from sparkpoint.agent.control.membership import Membership, RegistrationRefused, Superseded
from sparkpoint.agent.control.progress import Progress
from sparkpoint.agent.faults import crash_point
from sparkpoint.agent.formats import JsonValues, ValueFormat
from sparkpoint.agent.job import FileSink, FileSource, Job, KafkaSink, KafkaSource
from sparkpoint.agent.recovery import channel_state
from sparkpoint.agent.recovery.restore import (
    Restored,
    load,
    resolve_latest,
)
from sparkpoint.agent.recovery.split import (
    FILTER_BATCH_BYTES,
    HELD_BATCH_BYTES,
    ChannelRecovery,
    FilterResult,
    FilterTask,
    filter_restored,
)
from sparkpoint.agent.rounds.channels import DEFAULT_CAPACITY_BYTES, Channel, Segment, SegmentFiles
from sparkpoint.agent.rounds.stages import (
    FetchResult,
    FetchTask,
    ProcessResult,
    ProcessTask,
    UserCodeFailure,
    UserFunctionError,
    fetch_and_partition,
    guarded,
    output_file,
    process_subtask,
    unless_user_failed,
)
from sparkpoint.agent.sinks import EpochCommitter, SinkWriter, unpublished
from sparkpoint.agent.sinks.files import FileSinkWriter
from sparkpoint.agent.sinks.kafka import KafkaSinkWriter
from sparkpoint.agent.sources.files import FileSourceReader
from sparkpoint.agent.sources.kafka import KafkaSourceReader
from sparkpoint.agent.spark.traffic import DriverTraffic
from sparkpoint.agent.state.backend import (
    StateBackend,
    Version,
    job_dirs,
    local_path,
    working_path,
)
from sparkpoint.common.avro import EventCodec
from sparkpoint.common.checkpoint_store import latest_store_record
from sparkpoint.common.events import (
    CancelJob,
    FailoverRequest,
    JobRegistered,
    JobStatus,
    JobStatusChanged,
    NotifyCheckpointAborted,
    NotifyCheckpointComplete,
    Subtask,
    TriggerCheckpoint,
)
from sparkpoint.common.kafka import (
    ConsumerProfile,
    EventPublisher,
    EventSubscriber,
    end_offsets,
    make_consumer,
    make_producer,
    partition_of,
)
from sparkpoint.common.keygroups import key_group_range
from sparkpoint.common.limits import MAX_TEXT
from sparkpoint.common.options import in_families, normalise, without_effect
from sparkpoint.common.restarts import RestartConfig
from sparkpoint.common.settings import CheckpointConfig, ConfigError, RecoveryConfig
from sparkpoint.common.storage import absolute
from sparkpoint.common.topics import CONTROL, JOBS

log = logging.getLogger(__name__)

IDLE_WAIT_S = 0.05
"""How long the loop waits on the control topic when there is nothing to fetch or process."""

IN_FLIGHT_WAIT_S = 0.005
"""How long the loop listens for control events while a stage runs: triggers are answered
within this, and a finished stage is picked up within this."""

AFTER_REGISTERING = "latest, once registered"
"""What a restart restores when no checkpoint is named: the newest retained one, read after the
next attempt registered."""

RESET_WAIT_S = 1.0
"""How long a restart lets the failed attempt's rounds in flight finish (their results are
dropped) before cancelling them: a cancelled Spark task takes its Python worker with it, and
the restarted job's first round would pay ~1.3 s here for new workers."""

FILTER_ORDER_WAIT_S = 5.0
"""How long a filter job waits for the one submitted before it to reach Spark's scheduler
(building and shipping a job takes milliseconds; the wait only orders them)."""

MAX_STACKTRACE = 64 * 1024
"""The end of a failure's traceback that travels with RESTARTING and FAILED (the cause is last)."""

MAX_ROWS_PER_ROUND = 250_000
"""Rows a stage-2 task takes from its channel per round: bounds a round's latency and memory."""

COPY_THREADS = 4
"""Threads copying state files for snapshots (the asynchronous phase): I/O bound."""


@dataclass
class AgentOptions:
    bootstrap: str
    parallelism: int | None = None
    restore: str | None = None
    """A checkpoint or savepoint directory, or ``latest``."""
    allow_non_restored_state: bool = False
    master: str = "local[*]"
    spark_settings: dict[str, str] = field(default_factory=dict)
    checkpoint_dir: str | None = None
    capacity_bytes: int = DEFAULT_CAPACITY_BYTES
    channel_dir: str | None = None
    """Where stage-1 tasks write segments (a path or URL every executor reaches; each run uses
    a directory of its own under it, removed at its end); default: the agent's local disk on a
    local master, the job's task-owned storage otherwise."""
    max_rows_per_round: int = MAX_ROWS_PER_ROUND
    allow_fresh_start: bool = False
    """With ``restore="latest"``: start from the beginning when the job's checkpoints were
    discarded at its end, instead of refusing to."""
    claim_mode: str | None = None
    """``execution.state-recovery.claim-mode`` over the job's (CLAIM or NO_CLAIM)."""


class Restart(Exception):
    """A failover request: restart the job from its latest completed checkpoint (or ``path``).
    Its text is the coordinator's reason, as the agent's log shows it."""

    def __init__(self, path: str | None, why: str = "") -> None:
        super().__init__(why or "failover requested")
        self.path = path


class Agent(SubtaskCheckpointing):
    def __init__(self, job: Job, options: AgentOptions, codec: EventCodec, spark: Any = None):
        self.job = job
        self.options = options
        self.codec = codec
        self.parallelism = options.parallelism or job.parallelism
        self.max_parallelism = job.max_parallelism
        self.job_id = job.id
        # Flink's current names (older ones resolved), so that defaults below never shadow them
        settings = {k: v for k, v in job.settings.items() if not in_families(k)}
        settings |= {k: str(v) for k, v in normalise(job.settings).items()}
        settings.setdefault("execution.checkpointing.incremental", "true")
        if options.claim_mode:
            settings["execution.state-recovery.claim-mode"] = options.claim_mode
        if options.checkpoint_dir:
            settings["execution.checkpointing.dir"] = options.checkpoint_dir
        settings.setdefault("execution.checkpointing.dir", CheckpointConfig().checkpoint_dir)
        for key in ("execution.checkpointing.dir", "execution.checkpointing.savepoint-dir"):
            if key in settings:  # relative directories mean this process's working directory
                settings[key] = absolute(settings[key])
        self.config = CheckpointConfig.from_options(settings, CheckpointConfig())
        self.recovery = RecoveryConfig.from_options(settings)
        check_during_recovery(self.config)
        self.restart_config = RestartConfig.from_options(settings)
        self.settings = settings
        self.no_effect = without_effect(settings)
        """Options the job sets that have no effect here: listed once at start."""
        self.checkpoint_dir = self.config.checkpoint_dir
        self.shared_dir, self.taskowned_dir = job_dirs(self.checkpoint_dir, self.job_id)
        self.agent_id = f"agent-{uuid.uuid4().hex[:8]}"
        # working state and staged output of this agent only: another agent of the job (one that
        # died, or one refused while this one runs) never shares a file with it
        self.run_dir = f"{self.taskowned_dir}/{self.agent_id}"
        self.state_dir = f"{self.run_dir}/state"
        self.sink_dir = f"{self.run_dir}/sink"
        self.spark = spark
        self.stopping = threading.Event()
        self.status: JobStatus = JobStatus.CREATED
        # one record per batch: registrations are replayed to the jobs topic's end offsets
        self.publisher = EventPublisher(
            make_producer(options.bootstrap, one_record_per_batch=True), codec
        )
        self.progress = Progress()
        """Records in and out and where each source partition stands, for the heartbeats."""
        self.membership = Membership(
            self.job_id, self.agent_id, self.publisher, self.stopping,
            lookup=lambda: latest_store_record(options.bootstrap, codec, self.job_id),
            progress=self.progress.report,
        )  # fmt: skip
        self.copier = ThreadPoolExecutor(COPY_THREADS, thread_name_prefix="snapshot-copy")
        self.janitor = ThreadPoolExecutor(1, thread_name_prefix="state-garbage")
        """Deletes replaced working state files: on an object store a round trip the loop need
        not wait for."""
        self._collecting: Future[list[str]] | None = None
        self.work_dir = Path(tempfile.mkdtemp(prefix=f"sparkpoint-{self.job_id}-"))
        self.sink: SinkWriter = self._sink_writer()
        self.committer = EpochCommitter(self.sink, self.job_id)
        self.subtasks = [f"source-{i}" for i in range(self.parallelism)] + [
            f"keyed-{i}" for i in range(self.parallelism)
        ]
        self.ranges = [
            key_group_range(self.max_parallelism, self.parallelism, i)
            for i in range(self.parallelism)
        ]
        self.source: KafkaSourceReader | FileSourceReader
        self.source_ends: dict[tuple[str, int], int] = {}
        """A bounded Kafka source's end offsets, kept across restarts in this process."""
        self.control: EventSubscriber
        self.channel_dir = (
            f"{options.channel_dir.rstrip('/')}/{self.job_id}-{self.agent_id}"
            if options.channel_dir
            else str(self.work_dir / "channels")
            if options.master.startswith("local")
            else f"{self.run_dir}/channels"
        )
        """Segments live here, written by stage-1 tasks, read by stage-2 tasks: never by the
        driver (on a cluster, storage every executor reaches)."""
        self.segment_files = SegmentFiles(self.channel_dir)
        self.restoring = ChannelRecovery()
        """Restored channel state on its way into the channels (`recovery`), per attempt."""
        self.stage1 = ThreadPoolExecutor(1, thread_name_prefix="stage-1")
        self.filters = ThreadPoolExecutor(2, thread_name_prefix="filter")
        """The filter jobs of restored channel state, submitted together (`recovery`)."""
        self._filter_submitted: FilterJob | None = None
        self._filters_cancelled = threading.Event()
        """Set when the attempt ends: a filter job not yet submitted to Spark is not submitted."""
        self._fetching: Future[list[FetchResult]] | None = None
        self.stage2 = ThreadPoolExecutor(1, thread_name_prefix="stage-2")
        self._processing: Future[list[ProcessResult]] | None = None
        self._round: tuple[int, dict[int, list[Segment]]] | None = None
        """The stage-2 round in flight: its version and the segments it took, per subtask."""
        self.fetches = 0
        self.traffic = DriverTraffic()
        self.input_bytes = 0
        """Bytes of the records stage 1 read (values), over every attempt."""
        self.stage_seconds: dict[str, float] = {"stage1": 0.0, "stage2": 0.0}
        """Wall time inside stage-1 and stage-2 Spark jobs (they overlap)."""
        self.running_once = False
        """The job ran at least once: later failures go to the restart strategy."""
        self.failures: list[Exception] = []
        self.last_failure_ms = 0
        self.restarts = 0
        self.processed_rows = 0
        """Rows stage 2 processed, over every attempt."""
        self.latest_completed: str | None = None
        """The newest checkpoint (not savepoint) this agent saw complete: what a restart restores."""
        self.started_from: str | None = None
        """The snapshot the job was first restored from, if any."""
        self.rounds = 0
        """Stage-2 rounds so far: numbers state versions and staged output files."""
        self.completed_checkpoints: list[int] = []
        self.aborted_checkpoints: list[int] = []
        self.declined_checkpoints: list[int] = []
        self.on_round: Callable[[Agent], None] | None = None
        self._control_resume: int | None = None
        """Where the control topic was read up to when the job restarts in this process."""
        self.start_seconds = 0.0
        """How long the last start took: restore, Spark warm-up, source positions, registration."""
        self.handle_signals = False
        """Ctrl-C and SIGTERM cancel the job cleanly (the command line sets this)."""

    # --- lifecycle -----------------------------------------------------------------------------

    def _sink_writer(self) -> SinkWriter:
        sink = self.job.sink
        if isinstance(sink, KafkaSink):
            return KafkaSinkWriter(
                sink, self.options.bootstrap, self.codec, self.job_id, self.agent_id, self.job.key,
                run=self._run_sink,
            )  # fmt: skip
        if isinstance(sink, FileSink):
            return FileSinkWriter(sink, self.job_id, run=self._run_sink)
        raise TypeError(f"unknown sink {sink!r}")

    def _source_reader(self) -> KafkaSourceReader | FileSourceReader:
        source = self.job.source
        if isinstance(source, FileSource):
            return FileSourceReader(source, self.parallelism)
        return KafkaSourceReader(
            source, self.options.bootstrap, self.parallelism, ends=self.source_ends
        )

    @property
    def _value_format(self) -> ValueFormat:
        source = self.job.source
        return source.value_format if isinstance(source, KafkaSource) else JsonValues()

    def _spark(self) -> Any:
        if self.spark is None:
            from sparkpoint.agent.spark.session import spark_session

            self.spark = spark_session(
                f"sparkpoint {self.job_id}", self.options.master, self.options.spark_settings
            )
        return self.spark

    def _warm_up(self) -> None:
        """Starts Spark and its Python workers before the job registers: a session takes 10 s or
        more to its first result, and triggers must not wait for that. A restart in this process
        finds them warm."""
        if self.running_once:
            return
        sc = self._spark().sparkContext
        if self.handle_signals:  # after the SparkContext: it installs a SIGINT handler of its own
            install_signal_handlers(self)
        sc.setJobDescription("warm-up")
        sc.parallelize(range(self.parallelism), self.parallelism).map(lambda x: x).collect()

    @property
    def attempt(self) -> int:
        """The attempt the coordinator accepted: every answer and status carries it."""
        return self.membership.attempt

    def run(self) -> JobStatus:
        """Runs the job until it finishes, is stopped, or fails for good; returns its final
        status. A failure after the job first ran goes to the restart strategy: the job restarts
        in this process (Spark stays warm) from its latest completed checkpoint, or fails."""
        restore = self.options.restore or self.recovery.path
        if self.no_effect:
            log.warning(
                "job %s: options without effect here (accepted as Flink accepts them): %s",
                self.job_id, ", ".join(self.no_effect),
            )  # fmt: skip
        self.strategy = self.restart_config.strategy(self.config.periodic)
        next_attempt = 0
        try:
            while True:
                try:
                    self._start(restore, next_attempt)
                    self._loop()
                    break
                except (RegistrationRefused, Superseded):
                    raise
                except Exception as failure:
                    if not self.running_once:
                        raise  # it never ran: nothing to restart, the cause is in the setup
                    delay = self._failed(failure)
                    if delay is None:
                        raise
                    next_attempt = self.attempt + 1
                    restore = self._restart_from(failure)
                    if self.stopping.wait(delay / 1000):
                        self._announce(JobStatus.CANCELED)
                        self.status = JobStatus.CANCELED
                        break
                    log.warning(
                        "job %s: restarting (attempt %d) from %s",
                        self.job_id, next_attempt, restore or "the beginning",
                    )  # fmt: skip
        except (RegistrationRefused, Superseded) as exc:
            # not this agent's job (any more): its status is not this agent's to announce
            log.error("job %s: %s", self.job_id, exc)
            self.status = JobStatus.FAILED
            raise
        except Exception as exc:
            log.exception("job %s failed", self.job_id)
            if self.membership.accepted and self.status is not JobStatus.FAILED:
                self._announce(JobStatus.FAILED, failure=exc)
            self.status = JobStatus.FAILED
            raise
        finally:
            self._close()
        return self.status

    def _failed(self, failure: Exception) -> int | None:
        """Tells the restart strategy; returns how long to wait before restarting, or None when
        the job fails for good (announced FAILED here)."""
        self.last_failure_ms = now_ms()
        self.strategy.notify_failure(self.last_failure_ms)
        self.failures.append(failure)
        if not self.strategy.can_restart() or self.stopping.is_set():
            log.error(
                "job %s failed; the %s restart strategy gives up after %d failures",
                self.job_id, self.strategy.name, len(self.failures),
            )  # fmt: skip
            self._announce(JobStatus.FAILED, failure=failure)
            self.status = JobStatus.FAILED
            return None
        delay = self.strategy.backoff_ms()
        log.warning(
            "job %s failed (%s: %s); %s restart in %d ms",
            self.job_id, type(failure).__name__, failure, self.strategy.name, delay,
        )  # fmt: skip
        self.status = JobStatus.RESTARTING
        self._announce(JobStatus.RESTARTING, failure=failure, restart_delay_ms=delay)
        self.restarts += 1
        self._reset()
        return delay

    def _restart_from(self, failure: Exception) -> str:
        """What a restart restores: the checkpoint a failover request names, else the latest
        one the coordinator retains once the next attempt is registered."""
        if isinstance(failure, Restart) and failure.path:
            return failure.path
        return AFTER_REGISTERING

    def _latest_for_restart(self) -> str | None:
        """The coordinator's newest retained checkpoint, else the newest this agent saw complete,
        else what the job was started from (a savepoint, say), else nothing."""
        try:
            record = latest_store_record(self.options.bootstrap, self.codec, self.job_id)
            found = resolve_latest(record, self.checkpoint_dir, self.job_id, True)
        except Exception as exc:  # unreadable now: what this agent saw complete
            log.warning("job %s: reading the checkpoint store failed: %s", self.job_id, exc)
            found = None
        return found or self.latest_completed or self.started_from

    def stop(self) -> None:
        """Cancel (Ctrl-C, SIGTERM): the job ends CANCELED at the end of the current round."""
        self.stopping.set()

    def _close(self) -> None:
        self.membership.stop_heartbeats()
        self._filters_cancelled.set()
        if self.restoring.futures and self.spark is not None:
            with contextlib.suppress(Exception):  # a split of restored channel state: redone
                self.traffic.cancel_open(self.spark.sparkContext)  # by the next restore
        self.stage1.shutdown(wait=True)
        self.stage2.shutdown(wait=True)
        self.filters.shutdown(wait=True)
        self.copier.shutdown(wait=True)
        backend: StateBackend | None = getattr(self, "backend", None)  # None: never started
        if backend is not None:
            self.janitor.submit(backend.collect_garbage)  # what the last rounds replaced
        self.janitor.shutdown(wait=True)
        self.committer.close()
        self.sink.close()
        self.publisher.close(10)
        for closable in ("control", "source"):
            resource = getattr(self, closable, None)
            if resource is not None:  # None: already closed after a failure
                try:
                    resource.close()
                except Exception as exc:  # closing after a failure: report, go on closing
                    log.warning("closing %s: %s", closable, exc)
        remove_tree(self.channel_dir)
        shutil.rmtree(self.work_dir, ignore_errors=True)
        if self.spark is not None and self.input_bytes:
            with contextlib.suppress(Exception):  # a figure, not worth failing a close for
                self.traffic.settle(self._spark().sparkContext, wait_s=2.0)
                log.info(
                    "job %s: %d input bytes; the driver shipped %d bytes to tasks and got %d "
                    "back (%.4f per input byte)",
                    self.job_id, self.input_bytes, self.traffic.to_tasks,
                    self.traffic.from_tasks, self.traffic.total / self.input_bytes,
                )  # fmt: skip

    def _reset(self) -> None:
        """After a failure: completed epochs made visible where possible (the restore publishes
        the rest), a sink that may have failed renewed, sources and channels let go."""
        self._filters_cancelled.set()
        in_flight: list[Future[Any]] = [
            f for f in (self._fetching, self._processing) if f is not None
        ] + self.restoring.futures
        _, unfinished = wait(in_flight, RESET_WAIT_S)
        if unfinished and self.spark is not None:  # read and processed again after the restore
            with contextlib.suppress(Exception):
                self.traffic.cancel_open(self.spark.sparkContext)
        for running in in_flight:
            with contextlib.suppress(Exception):
                running.result()
        self._fetching = self._processing = None
        self._round = None
        self.restoring = ChannelRecovery()
        self._filter_submitted = None
        self._filters_cancelled = threading.Event()
        remove_tree(self.channel_dir)
        try:
            self.committer.drain()
            sink_sound = self.sink.exactly_once
        except Exception as exc:  # that epoch is published again by the restore
            log.warning("job %s: %s", self.job_id, exc)
            sink_sound = False
        # an exactly-once sink whose every commit went through is kept with its committer; one
        # that failed a commit is built anew (its committer holds the error), and so is an
        # at-least-once sink (it writes from the loop, whose failure may have been its own).
        # Either way the next publishing task's init_transactions aborts what was left open
        control = getattr(self, "control", None)
        if control is not None:  # the next attempt reads on from here (a cancel sent meanwhile)
            with contextlib.suppress(Exception):
                where = TopicPartition(CONTROL.name(), self.partition)
                self._control_resume = control.consumer.position([where])[0].offset
        closing = [control, getattr(self, "source", None)]
        if not sink_sound:
            self.committer.close()
            closing.append(self.sink)
        for closable in closing:
            if closable is None:
                continue
            try:
                closable.close()
            except Exception as exc:  # closing after a failure: report, go on
                log.warning("job %s: closing after a failure: %s", self.job_id, exc)
        self.control = None  # type: ignore[assignment]  # opened again by the next start
        self.source = None  # type: ignore[assignment]
        if not sink_sound:
            self.sink = self._sink_writer()
            self.committer = EpochCommitter(self.sink, self.job_id)
        for channel in getattr(self, "channels", []):
            channel.clear()  # their files went with the channel directory

    def _start(self, restore: str | None, attempt: int) -> None:
        """Reads what it restores, starts Spark, registers, and only once the coordinator
        accepted this agent touches storage or sinks (a refused agent changes nothing). Before
        registering it may start splitting restored channel state into its local channel
        directory (`recovery`): that directory is its own and goes when it closes."""
        started = time.monotonic()
        if restore == AFTER_REGISTERING:
            # a restart: the next attempt registers first. From then on the coordinator hears
            # nothing of the failed attempt, so none of its checkpoints completes (subsuming the
            # one read below) while this attempt restores
            self._open_control()
            self._register(None, attempt)
            restore = self._latest_for_restart()
        restored = self._restored(restore) if restore is not None else None
        self._warm_up()
        self.channels = [Channel(i, self.options.capacity_bytes) for i in range(self.parallelism)]
        self.restoring = ChannelRecovery()
        self.backend = StateBackend(self.state_dir)
        self.source = self._source_reader()
        if restored is not None:
            unknown = {t for t, _ in restored.positions} - set(self.source.names)
            if unknown and not (
                self.options.allow_non_restored_state or self.recovery.ignore_unclaimed_state
            ):
                raise ValueError(
                    f"the snapshot has positions of topics {sorted(unknown)} that the job does not read; "
                    "pass --allow-non-restored-state to drop them"
                )
            self.backend.restore(restored.key_groups, restored.shared)
        self.source.start(restored.positions if restored else None)
        self.progress.start(self.source.positions)
        self.progress.seen_ends(self.source.ends.items())
        if restored is not None and restored.channel_state:
            self._adopt_channel_state(restored)
            if local_path(self.channel_dir) is not None and not restored.end_of_input:
                # the split of restored channel state starts now, while the coordinator answers
                # the registration (0.06-1 s measured): it writes only this agent's local channel
                # directory, which a refused agent removes at close with the split cancelled.
                # Channels on shared storage wait for the registration.
                self._recover_channels()
        self.pending: dict[int, PendingSnapshot] = {}
        self.orphans: list[Copy] = []
        """Copies of snapshots that will never be acknowledged: their new files go when done."""
        self.committing: dict[int, list[tuple[int, str]]] = {}
        """Epochs handed to the committer and not yet published: snapshots still name them."""
        self.sealed: dict[int, list[tuple[int, str]]] = {}
        """Epoch -> (subtask, staged output file) for epochs not yet committed."""
        self.unsealed: list[tuple[int, str]] = []
        """Output staged since the last barrier: the next epoch's."""
        self.end_of_input = False
        self.draining = None
        self.finished_before = restored is not None and restored.end_of_input
        """Restored from the final checkpoint of a bounded job: nothing is left to do."""
        self.highest_trigger = restored.checkpoint_id if restored else 0
        if not self.membership.accepted or self.attempt != attempt:
            self._open_control()
            self._register(restored, attempt)
        # accepted: this agent drives the job from here on
        self.membership.start_heartbeats()
        if restored is not None:
            self._publish_restored_epochs(restored)
        self._clean_task_owned()
        self.status = JobStatus.RUNNING
        if not self.running_once and restored is not None:
            self.started_from = restored.external_path
        self.running_once = True
        self.start_seconds = time.monotonic() - started
        log.info(
            "job %s running: agent %s attempt %d, parallelism %d, %d key groups restored, started in %.1f s",
            self.job_id, self.agent_id, self.attempt, self.parallelism,
            len(restored.key_groups) if restored else 0, self.start_seconds,
        )  # fmt: skip

    def _adopt_channel_state(self, restored: Restored) -> None:
        """Lines up an unaligned checkpoint's channel state ahead of any new input: each subtask
        gets the segments of the old subtasks whose key groups overlap its own, queued at once
        or, with during-recovery checkpoints, filtered first (`recovery`).
        ``recover-without-channel-state.checkpoint-id`` drops them."""
        if restored.checkpoint_id == self.recovery.without_channel_state_checkpoint_id:
            log.warning(
                "job %s: DROPPING the channel state of checkpoint %d (%d segments, %d rows) as "
                "execution.state-recovery.without-channel-state.checkpoint-id says: the records "
                "in flight when it was taken are lost to this job",
                self.job_id, restored.checkpoint_id, len(restored.channel_state),
                sum(f.rows for f in restored.channel_state),
            )  # fmt: skip
            return
        shares = channel_state.assign(restored.channel_state, self.ranges)
        self.restoring = ChannelRecovery.adopt(
            restored.checkpoint_id, shares, self.ranges, self.channels, self.channel_dir,
            self.config.unaligned_during_recovery,
            min(
                FILTER_BATCH_BYTES if local_path(self.channel_dir) is not None else HELD_BATCH_BYTES,
                self.options.capacity_bytes,
            ),
        )  # fmt: skip
        log.info(
            "job %s: %d segments of channel state queued ahead of new input%s",
            self.job_id, sum(len(f) for f in shares.values()),
            f" ({len(self.restoring.batches)} runs of files split by owner first)"
            if self.restoring.batches else "",
        )  # fmt: skip

    def _recover_channels(self) -> bool:
        """Filter jobs and admission of restored channel state (`recovery`)."""
        if not self.restoring.waiting and not self.restoring.futures:
            return False
        return self.restoring.step(
            self.channels, self.channel_dir, self.max_parallelism, self._submit_filter
        )

    def _submit_filter(self, tasks: list[FilterTask]) -> Future[list[FilterResult]]:
        """Runs a filter job on a thread of its own; jobs reach Spark in the order submitted
        (the recovery pool is FIFO: the first job's tasks take the first free core)."""
        after, this = self._filter_submitted, FilterJob(self._filters_cancelled)
        self._filter_submitted = this
        return self.filters.submit(self._run_filter, tasks, after, this)

    def _run_filter(
        self, tasks: list[FilterTask], after: FilterJob | None, this: FilterJob
    ) -> list[FilterResult]:
        try:
            sc = self._spark().sparkContext
            if after is not None:
                after.wait_scheduled(sc, FILTER_ORDER_WAIT_S)
            if this.cancelled.is_set():  # the attempt ended while this job waited its turn
                raise CancelledError("the split of restored channel state was cancelled")
            sc.setLocalProperty("spark.scheduler.pool", "recovery")  # shares cores with stage 2
            this.group = self.traffic.start_job(
                sc, f"{self.job_id} filter restored channel state", tasks
            )
            job = sc.parallelize(tasks, len(tasks)).map(filter_restored)
        except BaseException:
            this.ended.set()
            raise
        finally:
            this.built.set()
        try:
            return job.collect()  # type: ignore[no-any-return]
        finally:
            this.ended.set()

    def _run_sink(self, work: Callable[[Any], int], tasks: list[Any]) -> list[int]:
        """Makes staged sink output visible from executors (`SinkRunner`): a Spark job in the
        sink's pool, a task each (the driver ships the files' names and gets counts back)."""
        if not tasks:
            return []
        sc = self._spark().sparkContext
        sc.setLocalProperty("spark.scheduler.pool", "sink")
        self.traffic.start_job(sc, f"{self.job_id} sink: {len(tasks)} tasks", tasks)
        return [int(n) for n in sc.parallelize(tasks, len(tasks)).map(work).collect()]

    def _restored(self, restore: str) -> Restored | None:
        """The snapshot to restore. ``latest`` is the job's own (as a failover restores it);
        an explicit path follows the claim mode: only CLAIM lets the job build on its files."""
        own = restore == "latest" or restore in (self.latest_completed, self.started_from)
        if restore == "latest":
            record = latest_store_record(self.options.bootstrap, self.codec, self.job_id)
            found = resolve_latest(
                record, self.checkpoint_dir, self.job_id, self.options.allow_fresh_start
            )
            if found is None:
                return None
            path = found
        else:
            path = restore
        log.info("job %s: restoring from %s", self.job_id, path)
        restored = load(path, self.job_id, self.checkpoint_dir, self.max_parallelism)
        # NO_CLAIM: the first checkpoint copies every key group, the snapshot stays untouched
        restored.shared &= own or self.recovery.claims
        return restored

    def _publish_restored_epochs(self, restored: Restored) -> None:
        """Epochs <= the restored checkpoint completed; publish those the sink has not."""
        if not restored.epochs or not self.sink.exactly_once:
            return
        published = self.sink.published()
        if published is not None and published.epoch > restored.checkpoint_id:
            log.warning(
                "job %s: the sink already published epoch %d, after the restored checkpoint %d: "
                "output after that checkpoint is produced again (an older snapshot was restored)",
                self.job_id, published.epoch, restored.checkpoint_id,
            )  # fmt: skip
        log.info("job %s: the sink's newest published epoch: %s", self.job_id, published)
        for epoch in unpublished(restored.epochs, published):
            outputs = restored.epochs[epoch]
            if not all_exist(outputs):
                # staged files go only once their epoch is visible (the committer deletes them
                # after publishing; a later run cleans up only after publishing what it restored)
                log.info(
                    "job %s: epoch %d was published (its staged files are gone)", self.job_id, epoch
                )
                continue
            log.info(
                "job %s: epoch %d completed but is not published: publishing", self.job_id, epoch
            )
            self.committer.submit(epoch, outputs, delete=False)
        self.committer.drain()

    def _clean_task_owned(self) -> None:
        """Working state, staged output and segment files of earlier runs of the job (other
        agents, all gone: this one was accepted): nothing restored points at them any more."""
        fs, root = url_to_fs(self.taskowned_dir)
        if not fs.exists(root):
            return
        mine = posixpath.basename(url_to_fs(self.run_dir)[1])
        for entry in fs.ls(root, detail=False):
            if posixpath.basename(str(entry).rstrip("/")) != mine:
                fs.rm(entry, recursive=True)
        for directory in (self.state_dir, self.sink_dir):  # this agent's own, after a restart
            # a task of the failed attempt may still be writing here (cancelled jobs' Python
            # workers end a moment later): what it leaves has a round number never used again
            remove_tree(directory)
        if self.options.channel_dir:  # segments of the job's earlier runs under a shared root
            fs, root = url_to_fs(self.options.channel_dir)
            mine = posixpath.basename(url_to_fs(self.channel_dir)[1])
            for entry in fs.ls(root, detail=False) if fs.exists(root) else []:
                name = posixpath.basename(str(entry).rstrip("/"))
                if name.startswith(f"{self.job_id}-agent-") and name != mine:
                    fs.rm(entry, recursive=True)

    def _open_control(self) -> None:
        resume = self._control_resume
        consumer = make_consumer(self.options.bootstrap, profile=ConsumerProfile.CONTROL)
        topic = CONTROL.name()
        partitions = len(consumer.list_topics(topic, timeout=10).topics[topic].partitions)
        self.partition = partition_of(self.job_id, partitions)
        _, high = end_offsets(consumer, topic)[self.partition]
        start, self._control_resume = high, None
        if resume is not None and 0 <= resume <= high:
            start = resume  # a restart in this process: nothing sent since is missed
        self.control = EventSubscriber(consumer, self.codec)
        self.control.assign([TopicPartition(topic, self.partition, start)])

    def _register(self, restored: Restored | None, attempt: int) -> None:
        def build(attempt: int) -> JobRegistered:
            return JobRegistered(
                self.job_id, self.job.name, self.agent_id, attempt, JobStatus.RUNNING,
                self.parallelism, self.max_parallelism,
                [Subtask(f"source-{i}", i, r.start, r.end) for i, r in enumerate(self.ranges)]
                + [Subtask(f"keyed-{i}", i, r.start, r.end) for i, r in enumerate(self.ranges)],
                dict(self.settings), now_ms(),
                restored.checkpoint_id if restored else None,
                restored.external_path if restored else None,
            )  # fmt: skip

        response = self.membership.register(build, self.control, attempt)
        log.info(
            "job %s: registration accepted (attempt %d, next checkpoint id %s)",
            self.job_id, self.attempt, response.checkpoint_id_counter,
        )  # fmt: skip
        if self.membership.cancelled is not None:
            log.info("job %s: cancelled while it restarted", self.job_id)
            self.membership.cancelled = None
            self.stopping.set()  # CANCELED at the top of the loop

    def _announce(
        self,
        status: JobStatus,
        message: str | None = None,
        end_of_input: bool = False,
        failure: BaseException | None = None,
        restart_delay_ms: int | None = None,
    ) -> None:
        exception_name = stacktrace = None
        if failure is not None:
            exception_name = type(failure).__qualname__
            stacktrace = "".join(traceback.format_exception(failure))
            if isinstance(failure, UserFunctionError):  # the trace from the task, kept whole
                exception_name = failure.exception_name
                stacktrace = f"{stacktrace}\nraised in a Spark task:\n{failure.stacktrace}"
                message = message or str(failure)[:MAX_TEXT]  # already "Name: message"
            message = message or f"{exception_name}: {failure}"[:MAX_TEXT]
            stacktrace = stacktrace[-MAX_STACKTRACE:]
        event = JobStatusChanged(
            self.job_id, self.agent_id, self.attempt, status, now_ms(), message=message,
            end_of_input=end_of_input, exception_name=exception_name, stacktrace=stacktrace,
            restart_delay_ms=restart_delay_ms,
        )  # fmt: skip
        try:
            self.publisher.publish_sync(JOBS, self.job_id, event)
            registration = self.membership.registration
            if (end_of_input or status is JobStatus.RESTARTING) and registration is not None:
                # keep the registration as the job's latest record (compaction)
                self.publisher.publish_sync(JOBS, self.job_id, registration)
        except Exception as exc:
            log.error("job %s: could not publish status %s: %s", self.job_id, status.name, exc)

    # --- the loop ------------------------------------------------------------------------------

    def _loop(self) -> None:
        if self.finished_before:
            log.info(
                "job %s: restored from its final checkpoint (its input ended there): finished",
                self.job_id,
            )
            self._end(JobStatus.FINISHED)
            return
        while True:
            if self.stopping.is_set():
                self._end(JobStatus.CANCELED)
                return
            self.committer.check()
            if self._read_control(0):
                return
            busy = self._collect_fetch(wait=False)
            busy |= self._collect_process(wait=False)
            busy |= self._recover_channels()
            # a checkpoint aligned by the round that just ended is snapshotted before the next
            # round takes what lies behind its barrier
            self._snapshot_due()
            # stage 2 is submitted first and its Spark pool has priority (sparkpoint.agent.spark.session):
            # the records a round brought are processed before the next round is read, while
            # stage 1 of the next round uses the cores stage 2 leaves
            busy |= self._start_process()
            self._start_fetch()
            stages = [self._fetching, self._processing, *self.restoring.futures]
            self._await_copies([f for f in stages if f is not None])
            self._send_acks()
            self._collect_garbage()
            if (
                self.source.finished()
                and self._fetching is None
                and self._processing is None
                and not self.end_of_input
                and self._drained()
            ):
                self._finish_input()
                busy = True
            if self.on_round is not None:
                self.on_round(self)
            in_flight = (
                self._fetching is not None
                or self._processing is not None
                or bool(self.restoring.futures)
            )
            if not busy and self._read_control(IN_FLIGHT_WAIT_S if in_flight else IDLE_WAIT_S):
                return

    def _read_control(self, timeout_s: float) -> bool:
        """Handles the control events that arrived; true when the job ended."""
        for record in self.control.poll(timeout_s, 100):
            if (
                record.key == self.job_id
                and record.event is not None
                and self._on_control(record.event)
            ):
                return True
        return False

    def staged_outputs(self) -> list[str]:
        """Staged output files not yet published (exactly-once sinks), oldest epoch first."""
        staged = [o for epoch in sorted(self.sealed) for o in self.sealed[epoch]] + self.unsealed
        return [path for _, path in staged]

    def _drained(self) -> bool:
        """Nothing queued, and no restored channel state still on its way into a channel."""
        return all(not c.segments for c in self.channels) and not self.restoring.holds_input()

    # --- stage 1 ---------------------------------------------------------------------------------

    def _start_fetch(self) -> None:
        """Plans the next stage-1 round and submits it as a Spark job on a thread of its own.
        One is in flight at a time; none while a channel is full (backpressure)."""
        if self._fetching is not None:
            return
        full = any(c.full for c in self.channels)
        self.progress.held(full)
        if full or self.restoring.holds_input():
            return  # (restored channel state enters the channels first)
        planned = self.source.plan()
        self.progress.seen_ends(self.source.highs.items())
        if not planned:
            return
        self.fetches += 1
        source = self.job.source
        max_duration_s = source.max_duration_ms / 1000 if isinstance(source, KafkaSource) else 0.0
        by_subtask: dict[int, list[FetchTask]] = {}
        for (topic, partition), read in planned.items():
            by_subtask.setdefault(self.source.owner((topic, partition)), []).append(
                FetchTask(
                    self.options.bootstrap, topic, partition,
                    self.source.positions[(topic, partition)],
                    self.source.ends.get((topic, partition)), read.max_records, self.job.key,
                    self.max_parallelism, self.parallelism, source.format,
                    self.channel_dir, self.fetches, self._value_format, read.until, max_duration_s,
                )
            )  # fmt: skip
        self._fetching = self.stage1.submit(self._run_fetch, list(by_subtask.values()))

    def _run_fetch(self, tasks: list[list[FetchTask]]) -> list[FetchResult]:
        """One Spark task per source subtask, reading the partitions it owns."""
        map_function = self.job.map
        sc = self._spark().sparkContext
        sc.setLocalProperty("spark.scheduler.pool", "stage1")
        partitions = sum(len(t) for t in tasks)
        self.traffic.start_job(sc, f"{self.job_id} stage 1: {partitions} partitions", tasks)
        started = time.monotonic()
        results: list[list[FetchResult] | UserCodeFailure] = (
            sc.parallelize(tasks, len(tasks))
            .map(lambda t: guarded(fetch_and_partition, t, map_function))
            .collect()
        )
        self.stage_seconds["stage1"] += time.monotonic() - started
        return [r for each in unless_user_failed(results) for r in each]

    def _collect_fetch(self, wait: bool) -> bool:
        """Applies a finished stage-1 round: its segments join the channels (behind any barrier
        placed meanwhile: they belong to the next epoch) and the source positions advance."""
        fetching = self._fetching
        if fetching is None or (not wait and not fetching.done()):
            return False
        self._fetching = None
        results = fetching.result()  # a failure of stage 1 fails the job here
        fetched = 0
        for result in results:
            for offset, reason in result.malformed:
                log.warning(
                    "malformed record skipped: %s[%d]@%d: %s",
                    result.topic,
                    result.partition,
                    offset,
                    reason,
                )
            partition = (result.topic, result.partition)
            started_at = self.source.positions[partition]
            for subtask, name, rows, size in result.segments:
                self.channels[subtask].append(name, rows, size, partition, started_at)
            self.source.positions[partition] = result.next_offset
            self.source.capped[partition] = result.capped
            self.progress.read(partition, result.next_offset, result.records)
            fetched += result.records
            self.input_bytes += result.bytes_read
        if fetched:
            crash_point("mid-batch")
            if self.completed_checkpoints and self.backend.versions:
                crash_point("mid-batch-after-complete")
        return fetched > 0

    # --- stage 2 ---------------------------------------------------------------------------------

    def _start_process(self, end_of_input: bool = False) -> bool:
        """Plans the next stage-2 round and submits it as a Spark job on a thread of its own (one
        in flight at a time), so the loop goes on hearing triggers while it runs."""
        if self._processing is not None:
            return False
        taken = {i: c.take(self.options.max_rows_per_round) for i, c in enumerate(self.channels)}
        work = [i for i, segments in taken.items() if segments]
        if end_of_input:
            work = list(range(self.parallelism))
        if not work:
            return False
        self.rounds += 1
        version = self.rounds
        tasks = []
        for i in work:
            versions: dict[int, int | str] = {
                g: v.version if v.owned else v.path
                for g, v in self.backend.versions.items()
                if g in self.ranges[i]
            }
            tasks.append(
                ProcessTask(
                    i, self.channel_dir, [s.path for s in taken[i]], versions, self.state_dir,
                    version, output_file(self.sink_dir, self.rounds, i), end_of_input,
                    [s.key_groups for s in taken[i]], self.job.key, self.sink.direct(),
                )
            )  # fmt: skip
        self._round = (version, taken)
        self._processing = self.stage2.submit(self._run_process, tasks)
        return True

    def _run_process(self, tasks: list[ProcessTask]) -> list[ProcessResult]:
        function = self.job.function
        sc = self._spark().sparkContext
        sc.setLocalProperty("spark.scheduler.pool", "stage2")
        self.traffic.start_job(sc, f"{self.job_id} stage 2: {len(tasks)} subtasks", tasks)
        started = time.monotonic()
        results: list[ProcessResult | UserCodeFailure] = (
            sc.parallelize(tasks, len(tasks))
            .map(lambda t: guarded(process_subtask, t, function))
            .collect()
        )
        self.stage_seconds["stage2"] += time.monotonic() - started
        return unless_user_failed(results)

    def _collect_process(self, wait: bool) -> bool:
        """Applies a finished stage-2 round: new state versions, consumed segments, staged
        output (this epoch's: a snapshot taken while the round ran holds the state before it
        and the round's segments as channel state, so the output belongs after it)."""
        processing = self._processing
        if processing is None or (not wait and not processing.done()):
            return False
        assert self._round is not None
        version, taken = self._round
        self._processing = None
        self._round = None
        results = processing.result()  # a failure of stage 2 fails the job here
        outputs: list[tuple[int, str]] = []
        for result in results:
            for group, size in result.new_versions.items():
                path = working_path(self.state_dir, group, version)
                self.backend.install(group, Version(path, size, version))
            self.segment_files.discard(
                self.channels[result.subtask].consumed(taken[result.subtask])
            )
            size = sum(segment.size for segment in taken[result.subtask])
            for pending in self.pending.values():
                if not pending.snapshotted:
                    key = f"keyed-{result.subtask}"
                    pending.processed[key] = pending.processed.get(key, 0) + size
            if result.output_path is not None:
                outputs.append((result.subtask, result.output_path))
            self.progress.emitted(result.output_rows)
        if outputs:  # exactly-once (at-least-once sinks wrote from the tasks)
            self.unsealed.extend(outputs)
        self.processed_rows += sum(s.rows for segments in taken.values() for s in segments)
        return True

    def _collect_garbage(self) -> None:
        """One collection at a time on the janitor's thread, when a round replaced files."""
        if self.backend.has_garbage and (self._collecting is None or self._collecting.done()):
            self._collecting = self.janitor.submit(self.backend.collect_garbage)

    def _finish_input(self) -> None:
        """Bounded sources are read to their end and everything is processed: the keyed
        function's end-of-input hook runs, then the coordinator is asked for the final
        checkpoint (FLIP-147)."""
        self._collect_process(wait=True)
        self._start_process(end_of_input=True)
        self._collect_process(wait=True)
        self.end_of_input = True
        if self.draining is not None:  # stop-with-savepoint --drain: its savepoint, now
            trigger, self.draining = self.draining.trigger, None
            log.info("job %s: drained; taking savepoint %d", self.job_id, trigger.checkpoint_id)
            self._on_trigger(trigger, drained=True)
            return
        log.info("job %s: end of input; asking for the final checkpoint", self.job_id)
        self._announce(JobStatus.RUNNING, end_of_input=True)

    # --- the checkpoint protocol (sparkpoint.agent.checkpointing.snapshots) ----------------------------------------

    def _on_control(self, event: object) -> bool:
        """Handles one control event; true when the job ended."""
        if not self.membership.hears(event):
            return False
        if isinstance(event, TriggerCheckpoint):
            self._on_trigger(event)
        elif isinstance(event, NotifyCheckpointComplete):
            return self._on_complete(event)
        elif isinstance(event, NotifyCheckpointAborted):
            self._on_aborted(event)
        elif isinstance(event, FailoverRequest):
            raise Restart(
                event.restore_external_path,
                f"the coordinator asked for a failover: {event.reason.value} "
                f"({event.consecutive_failures} in a row): {event.message}",
            )
        elif isinstance(event, CancelJob):
            log.info(
                "job %s: cancelled by %s", self.job_id, event.requested_by or "the coordinator"
            )
            self.stopping.set()  # CANCELED at the end of this round, as Ctrl-C
        return False

    def _end(self, status: JobStatus) -> bool:
        self.committer.drain()  # the job ends once every completed epoch is visible
        self._announce(status)
        self.status = status
        return True


@dataclass
class FilterJob:
    """A filter job on its way to Spark: the next one is submitted only once this one's tasks
    are queued (the recovery pool is FIFO by job, so its tasks then take the first free core).
    Setting an event before ``collect`` did not order them: both threads then raced to the
    scheduler, and the job splitting each subtask's first rows sometimes ran last."""

    cancelled: threading.Event = field(default_factory=threading.Event)
    """The attempt's: set when it ends (`Agent._close`, `Agent._reset`)."""
    built: threading.Event = field(default_factory=threading.Event)
    group: str | None = None
    """Its Spark job group, once built."""
    ended: threading.Event = field(default_factory=threading.Event)
    """Its collect returned or raised, or it was never submitted."""

    def wait_scheduled(self, sc: Any, timeout_s: float) -> None:
        """Returns once Spark's scheduler has the job (its status tracker lists it; the
        scheduler handles one submission at a time, so a job submitted after this one is
        queued after it), once it ended (failed before it got there, or cancelled), or after
        ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        if not self.built.wait(timeout_s) or self.group is None:
            return  # building it failed: its own thread reports that
        tracker = sc.statusTracker()
        while (
            not tracker.getJobIdsForGroup(self.group)
            and not self.ended.is_set()
            and not self.cancelled.is_set()
            and time.monotonic() < deadline
        ):
            time.sleep(0.002)


def check_during_recovery(config: CheckpointConfig) -> None:
    """Checkpoints during recovery need unaligned checkpoints and restored output on the
    downstream side (FLIP-547): refused at start otherwise."""
    if config.unaligned_during_recovery and not (
        config.unaligned and config.unaligned_recover_output_on_downstream
    ):
        missing = [
            f"execution.checkpointing.{name}: true"
            for name, value in (
                ("unaligned.enabled", config.unaligned),
                (
                    "unaligned.recover-output-on-downstream.enabled",
                    config.unaligned_recover_output_on_downstream,
                ),
            )
            if not value
        ]
        raise ConfigError(
            "execution.checkpointing.unaligned.during-recovery.enabled",
            f"checkpoints during recovery need {' and '.join(missing)}",
        )


def remove_tree(url: str) -> None:
    """Deletes a directory (local path or URL) that may not exist."""
    try:
        fs, root = url_to_fs(url)
        if fs.exists(root):
            fs.rm(root, recursive=True)
    except OSError as exc:
        log.warning("could not remove %s: %s", url, exc)


def all_exist(paths: list[str]) -> bool:
    for path in paths:
        fs, target = url_to_fs(path)
        if not fs.exists(target):
            return False
    return True


def install_signal_handlers(agent: Agent) -> None:
    def stop(signum: int, frame: object) -> None:
        log.info("signal %d: stopping job %s", signum, agent.job_id)
        agent.stop()

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
