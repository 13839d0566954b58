"""What the pytest plugin's fixtures stand on: a broker, a coordinator process, and `JobRunner`,
which runs a job's agent as a user runs it (``sparkpoint agent JOB``, a process of its own on
Spark ``local[*]``), kills it or the coordinator at named points, resumes from the latest
checkpoint (also with another parallelism) and reads back what was committed.

Broker, in order of preference: ``KAFKA_BOOTSTRAP_SERVERS`` if set; Apache Kafka through
testcontainers when a Docker engine answers; else the embedded broker (tansu).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pandas as pd
from confluent_kafka import Consumer, Producer, TopicPartition

from sparkpoint.agent.faults import POINTS
from sparkpoint.agent.job import FileSink, Job, KafkaSink, KafkaSource, load_job
from sparkpoint.common.avro import EventCodec
from sparkpoint.common.broker import EmbeddedBroker, free_port
from sparkpoint.common.events import SinkEpochPublished
from sparkpoint.common.kafka import consumer_config, make_admin, replay_topic, true_end_offset
from sparkpoint.common.topics import SINK_MARKERS, create_topics
from sparkpoint.testing.harness import Records, frame_of

log = logging.getLogger(__name__)

COORDINATOR = "coordinator"
"""`Fault.point` of a coordinator killed (SIGKILL) and started again while the agent runs."""


# --- the broker ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Kafka:
    bootstrap: str
    kind: str
    """``external`` (KAFKA_BOOTSTRAP_SERVERS), ``testcontainers`` or ``embedded``."""


def docker_answers() -> bool:
    try:
        import docker  # type: ignore[import-untyped]

        docker.from_env(timeout=3).ping()
        return True
    except Exception:
        return False


@contextlib.contextmanager
def kafka_for_tests(log_dir: Path) -> Iterator[Kafka]:
    external = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if external:
        yield Kafka(external, "external")
        return
    if docker_answers():
        from testcontainers.community.kafka import KafkaContainer

        with KafkaContainer().with_kraft() as container:
            yield Kafka(container.get_bootstrap_server(), "testcontainers")
        return
    with EmbeddedBroker(log_file=log_dir / "broker.log") as broker:
        yield Kafka(broker.bootstrap, "embedded")


# --- the coordinator ------------------------------------------------------------------------------


class CoordinatorProcess:
    """``sparkpoint coordinator`` in a process of its own, storage under ``root``; `kill` and
    `start` again (same port, same storage) are a coordinator failover."""

    def __init__(self, bootstrap: str, root: Path) -> None:
        self.bootstrap = bootstrap
        self.root = root
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.config = root / "coordinator.yaml"
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def checkpoint_dir(self) -> Path:
        return self.root / "checkpoints"

    def prepare(self) -> None:
        """Before each start: sparkpoint's topics, the storage roots' configuration."""
        self.root.mkdir(parents=True, exist_ok=True)
        create_topics(make_admin(self.bootstrap), partitions=2)
        self.config.write_text(
            f"execution.checkpointing.dir: {self.checkpoint_dir}\n"
            f"execution.checkpointing.savepoint-dir: {self.root / 'savepoints'}\n"
        )
        self.starts += 1

    def start(self, timeout_s: float = 60.0) -> CoordinatorProcess:
        self.prepare()
        out = open(self.root / f"coordinator-{self.starts}.log", "wb")  # noqa: SIM115
        with out:
            self.process = subprocess.Popen(
                [
                    sys.executable, "-m", "sparkpoint.cli", "coordinator", "--bootstrap",
                    self.bootstrap, "--rest-port", str(self.port), "--config", str(self.config),
                ],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            )  # fmt: skip
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the coordinator exited {self.process.returncode}: {out.name}")
            if self.get("/jobs/overview") is not None:
                return self
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"the coordinator did not answer within {timeout_s:.0f} s: {out.name}")

    def get(self, path: str) -> Any:
        """A REST answer, or None when the coordinator does not answer."""
        try:
            answer = httpx.get(f"{self.url}{path}", timeout=2)
        except httpx.HTTPError:
            return None
        return answer.json() if answer.status_code == 200 else None

    def kill(self) -> None:
        """SIGKILL: nothing is flushed or handed over."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(30)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()

    def completed_checkpoints(self, job_id: str) -> int:
        found = self.get(f"/jobs/{job_id}/checkpoints")
        return int(found.get("counts", {}).get("completed", 0)) if isinstance(found, dict) else 0


# --- faults ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fault:
    """A failure `JobRunner` injects. An agent point (``after-ack``, ``mid-publish``, ...:
    `sparkpoint.agent.faults.POINTS`) kills the agent (SIGKILL) the ``nth`` time it passes
    there; the next run restores from the latest checkpoint, with ``parallelism`` if given.
    `COORDINATOR` kills the coordinator once the running agent completed ``nth`` checkpoints
    and starts it again; the agent goes on."""

    point: str
    nth: int = 1
    parallelism: int | None = None

    def __post_init__(self) -> None:
        if self.point != COORDINATOR and self.point not in POINTS:
            raise ValueError(f"unknown fault point {self.point!r}: one of {[*POINTS, COORDINATOR]}")
        if self.nth < 1:
            raise ValueError(f"nth must be at least 1, got {self.nth}")


def kill_agent(point: str, nth: int = 1, resume_with: int | None = None) -> Fault:
    """The agent killed the ``nth`` time it passes ``point``; resumed from the latest checkpoint
    (with parallelism ``resume_with`` if given)."""
    return Fault(point, nth, resume_with)


def kill_coordinator(after_checkpoints: int = 1) -> Fault:
    """The coordinator killed once the agent completed ``after_checkpoints`` checkpoints, then
    started again on the same storage (a failover the agent rides through)."""
    return Fault(COORDINATOR, after_checkpoints)


class FaultNotReached(AssertionError):
    """A run ended before its fault: the input was too short to reach it."""


# --- a job's run ------------------------------------------------------------------------------------


@dataclass
class AgentRun:
    """One agent process of a `JobRun`."""

    parallelism: int
    fault: Fault | None
    returncode: int
    log: Path

    @property
    def killed(self) -> bool:
        return self.returncode == -signal.SIGKILL


@dataclass
class JobRun:
    """What `run_job` returns: the committed output and how the job got there."""

    job: Job
    """The job as it ran (its topics and name made unique for the test)."""
    output: pd.DataFrame
    """What the sink committed (a Kafka sink: read_committed, each exactly-once epoch only once
    its marker names its transaction), decoded with the sink's value format."""
    runs: list[AgentRun] = field(default_factory=list)
    coordinator_kills: int = 0

    @property
    def restarts(self) -> int:
        return len(self.runs) - 1


class JobRunner:
    """Runs jobs against one broker and one coordinator; each `run` a job of its own."""

    def __init__(self, kafka: Kafka, coordinator: CoordinatorProcess, work: Path) -> None:
        self.kafka = kafka
        self.coordinator = coordinator
        self.work = work

    def run(
        self,
        job: Job | str,
        input: Records | Mapping[str, Records] = (),
        *,
        faults: Sequence[Fault] = (),
        parallelism: int | None = None,
        partitions: int = 4,
        rate: float | None = None,
        until: int | Callable[[pd.DataFrame], bool] | None = None,
        timeout_s: float = 180.0,
        master: str = "local[*]",
    ) -> JobRun:
        """Produces ``input`` (records of the job's one source topic, or topic -> records) and
        runs the job's agent until the job ends: a bounded source to its end (FINISHED); an
        unbounded one until ``until`` (a number of output records, or a test of the output)
        holds, or, without ``until``, until the input is read and the output stopped growing
        for 3 s, then it is cancelled. ``rate``: records/s produced while the job runs (live
        input) instead of all before it starts. ``faults`` are injected in order: each agent
        kill ends a run, the next resumes from the latest checkpoint."""
        job = load_job(job) if isinstance(job, str) else job
        if rate is not None and is_bounded(job):
            raise ValueError(
                "rate= produces the input while the job runs, but the job's source is bounded "
                "(it reads up to the end it finds at start): use an unbounded source for live input"
            )
        tag = uuid.uuid4().hex[:8]
        job, renamed = unique(job, tag, self.work / tag)
        directory = self.work / job.id
        directory.mkdir(parents=True, exist_ok=True)
        topics = input_by_topic(job, input, renamed)
        create(self.kafka.bootstrap, [*renamed.values()], partitions)
        feed = Feed(self.kafka.bootstrap, job, topics, rate)
        if rate is None:
            feed.run()
        else:
            feed.start()
        spec = pickled_job(job, directory)
        result = JobRun(job, pd.DataFrame())
        deadline = time.monotonic() + timeout_s
        agent_faults = [f for f in faults if f.point != COORDINATOR]
        coordinator_faults = [f for f in faults if f.point == COORDINATOR]
        width = parallelism or job.parallelism
        try:
            for number in range(len(agent_faults) + 1):
                fault = agent_faults[number] if number < len(agent_faults) else None
                restore = number > 0
                run = self._agent(job, spec, directory, number, width, fault, restore, master)
                returncode = self._wait(run, job, feed, coordinator_faults, result, until, deadline)
                result.runs.append(AgentRun(width, fault, returncode, run.log))
                if fault is not None and returncode != -signal.SIGKILL:
                    raise FaultNotReached(
                        f"run {number + 1} ended ({returncode}) before the agent passed "
                        f"{fault.point!r} {fault.nth} time(s): give the job more input or a "
                        f"slower pace, or choose an earlier point\n{tail(run.log)}"
                    )
                if fault is None and returncode not in (0, -signal.SIGTERM):
                    raise AssertionError(f"the agent failed ({returncode})\n{tail(run.log)}")
                if fault is not None and fault.parallelism:
                    width = fault.parallelism
            if coordinator_faults:
                raise FaultNotReached(
                    f"the job ended before {coordinator_faults[0].nth} checkpoint(s) completed: "
                    "the coordinator was not killed"
                )
        finally:
            feed.stop()
        result.output = committed_output(self.kafka.bootstrap, job)
        return result

    def _agent(
        self, job: Job, spec: str, directory: Path, number: int, width: int, fault: Fault | None,
        restore: bool, master: str,
    ) -> Started:  # fmt: skip
        env = dict(os.environ)
        env.pop("SPARKPOINT_CRASH_AT", None)
        if fault is not None:
            env["SPARKPOINT_CRASH_AT"] = f"{fault.point}:{fault.nth}"
        command = [
            sys.executable, "-m", "sparkpoint.cli", "-v", "agent", spec,
            "--bootstrap", self.kafka.bootstrap, "--master", master,
            "--checkpoint-dir", str(self.coordinator.checkpoint_dir),
            "--parallelism", str(width),
            *(["--restore", "latest"] if restore else []),
        ]  # fmt: skip
        log_path = directory / f"agent-{number + 1}.log"
        with open(log_path, "wb") as out:
            process = subprocess.Popen(
                command, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        return Started(process, log_path)

    def _wait(
        self,
        run: Started,
        job: Job,
        feed: Feed,
        coordinator_faults: list[Fault],
        result: JobRun,
        until: int | Callable[[pd.DataFrame], bool] | None,
        deadline: float,
    ) -> int:
        bounded = is_bounded(job)
        last_count, quiet_since, looked = -1, time.monotonic(), 0.0
        while run.process.poll() is None:
            now = time.monotonic()
            if now > deadline:
                run.process.kill()
                run.process.wait(30)
                raise TimeoutError(f"job {job.id} did not end in time\n{tail(run.log)}")
            if (
                coordinator_faults
                and self.coordinator.completed_checkpoints(job.id) >= coordinator_faults[0].nth
            ):
                coordinator_faults.pop(0)
                self.coordinator.kill()
                self.coordinator.start()
                result.coordinator_kills += 1
            if not bounded and feed.done and not coordinator_faults and now - looked >= 1.0:
                looked = now  # the output read whole: once a second
                output = committed_output(self.kafka.bootstrap, job)
                if len(output) != last_count:
                    last_count, quiet_since = len(output), now
                if (
                    (until is None and now - quiet_since >= 3.0)
                    or (isinstance(until, int) and len(output) >= until)
                    or (callable(until) and until(output))
                ):
                    run.process.send_signal(signal.SIGTERM)
                    break
            time.sleep(0.2)
        return run.process.wait(60)


@dataclass
class Started:
    process: subprocess.Popen[bytes]
    log: Path


def tail(path: Path, lines: int = 40) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    return ""


def is_bounded(job: Job) -> bool:
    return not isinstance(job.source, KafkaSource) or job.source.bounded


def unique(job: Job, tag: str, files: Path) -> tuple[Job, dict[str, str]]:
    """``job`` with its name, its Kafka topics and its file sink's directory made unique to one
    test; returns it and the topics' new names."""
    renamed: dict[str, str] = {}

    def rename(topic: str) -> str:
        return renamed.setdefault(topic, f"{topic}-{tag}")

    source, sink = job.source, job.sink
    if isinstance(source, KafkaSource):
        source = dataclasses.replace(source, topics=[rename(t) for t in source.topics])
    if isinstance(sink, KafkaSink):
        sink = dataclasses.replace(
            sink,
            topic=rename(sink.topic),
            side_outputs={k: rename(v) for k, v in sink.side_outputs.items()},
        )
    elif isinstance(sink, FileSink):
        sink = dataclasses.replace(sink, directory=str(files / "output"))
    built = dataclasses.replace(
        job, name=f"{job.name}-{tag}", job_id=None, source=source, sink=sink
    )
    return built, renamed


def input_by_topic(
    job: Job, input: Records | Mapping[str, Records], renamed: Mapping[str, str]
) -> dict[str, pd.DataFrame]:
    if isinstance(input, Mapping):
        unknown = [t for t in input if t not in renamed]
        if unknown:
            raise ValueError(f"input for topics the job does not read: {unknown}")
        return {renamed[t]: frame_of(rows) for t, rows in input.items()}
    if not isinstance(job.source, KafkaSource):
        raise ValueError("input given, but the job's source is not Kafka")
    if len(job.source.topics) != 1:
        raise ValueError(f"the job reads {job.source.topics}: give input as topic -> records")
    return {job.source.topics[0]: frame_of(input)}


def create(bootstrap: str, topics: Iterable[str], partitions: int) -> None:
    from confluent_kafka.admin import NewTopic

    admin = make_admin(bootstrap)
    wanted = [NewTopic(t, partitions, 1) for t in topics]
    for topic, future in admin.create_topics(wanted).items():
        try:
            future.result(timeout=30)
        except Exception as exc:
            if "TOPIC_ALREADY_EXISTS" not in str(exc):
                raise RuntimeError(f"creating topic {topic}: {exc}") from exc


class Feed:
    """Produces the input: each record keyed by the job's key column, in the source's value
    format; all at once, or ``rate`` records/s on a thread while the job runs."""

    def __init__(
        self, bootstrap: str, job: Job, topics: Mapping[str, pd.DataFrame], rate: float | None
    ) -> None:
        assert isinstance(job.source, KafkaSource) or not topics
        self.job = job
        self.producer = Producer(
            {"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5}
        )
        self.batches = [(topic, frame) for topic, frame in topics.items() if len(frame)]
        self.rate = rate
        self.done = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def records(self) -> Iterator[tuple[str, bytes, bytes | None]]:
        source = self.job.source
        assert isinstance(source, KafkaSource)
        for topic, frame in self.batches:
            values = source.value_format.encode(frame)
            keys = (
                [str(k).encode() for k in frame[self.job.key].tolist()]
                if self.job.key in frame.columns
                else [None] * len(values)
            )
            yield from ((topic, v, k) for v, k in zip(values, keys, strict=True))

    def run(self) -> None:
        started = time.monotonic()
        for n, (topic, value, key) in enumerate(self.records(), start=1):
            if self._stop.is_set():
                break
            while True:
                try:
                    self.producer.produce(topic, value=value, key=key)
                    break
                except BufferError:
                    self.producer.poll(0.05)
            if self.rate:
                ahead = n / self.rate - (time.monotonic() - started)
                if ahead > 0:
                    self.producer.poll(ahead)
        if self.producer.flush(60):
            raise RuntimeError("input records left undelivered")
        self.done = True

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name="sparkpoint-feed", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(60)


def pickled_job(job: Job, directory: Path) -> str:
    """``job`` as a job file the agent loads (``sparkpoint agent <file>:job``): pickled by value
    where its code is not importable from an installed package (a test module's classes)."""
    from pyspark import cloudpickle

    inner = getattr(job.function, "processor", None)  # a SparkProcessor's StatefulProcessor
    modules = {
        type(job.function).__module__,
        getattr(job.map, "__module__", None),
        *([type(inner).__module__] if inner is not None else []),
    }
    registered = []
    for name in modules:
        module = sys.modules.get(name or "")
        if module is None or name is None or name.startswith("sparkpoint.") or _installed(module):
            continue
        cloudpickle.register_pickle_by_value(module)  # type: ignore[no-untyped-call]
        registered.append(module)
    try:
        (directory / "job.pkl").write_bytes(cloudpickle.dumps(job))  # type: ignore[no-untyped-call]
    finally:
        for module in registered:
            cloudpickle.unregister_pickle_by_value(module)  # type: ignore[no-untyped-call]
    loader = directory / "job.py"
    loader.write_text(
        '"""Written by sparkpoint.testing: the test\'s job, unpickled."""\n'
        "import pickle\nfrom pathlib import Path\n\n"
        "job = pickle.loads(Path(__file__).with_name('job.pkl').read_bytes())\n"
    )
    return f"{loader}:job"


def _installed(module: Any) -> bool:
    path = str(getattr(module, "__file__", "") or "")
    return "site-packages" in path or "dist-packages" in path


# --- committed output -----------------------------------------------------------------------------


def committed_output(bootstrap: str, job: Job) -> pd.DataFrame:
    """What the job's sink committed, decoded with its value format."""
    sink = job.sink
    if isinstance(sink, FileSink):
        import pyarrow.parquet as pq

        files = sorted(Path(sink.directory).glob("part-*.parquet"))
        frames = [pq.read_table(f).to_pandas() for f in files]
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    values = committed_values(bootstrap, sink.topic)
    if not values:
        return pd.DataFrame()
    frame, _ = sink.value_format.decode(values, [None] * len(values), list(range(len(values))))
    return frame


def committed_values(bootstrap: str, topic: str) -> list[bytes]:
    """Every committed value of ``topic`` up to its end offsets. A record of an exactly-once
    epoch counts only when a sink marker names its transaction: the embedded broker shows
    aborted transactions to read_committed readers (a real Kafka hides them; there this
    changes nothing)."""
    from sparkpoint.agent.sinks.kafka import TRANSACTION_HEADER

    consumer = Consumer(consumer_config(bootstrap, read_committed=True))
    found: list[tuple[str | None, bytes]] = []
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        ends = {p: true_end_offset(consumer, topic, p) for p in partitions}
        remaining = {p for p, end in ends.items() if end > 0}
        consumer.assign([TopicPartition(topic, p, 0) for p in remaining])
        while remaining:
            for message in consumer.consume(10_000, 0.5):
                if message.error() is None:
                    token = dict(message.headers() or []).get(TRANSACTION_HEADER)
                    text = token.decode() if isinstance(token, bytes) else token
                    found.append((text, message.value() or b""))
            for tp in consumer.position([TopicPartition(topic, p) for p in remaining]):
                if tp.offset >= ends[tp.partition]:
                    remaining.discard(tp.partition)
    finally:
        consumer.close()
    if not any(t for t, _ in found):
        return [v for _, v in found]
    committed = {
        r.event.transaction
        for r in replay_topic(bootstrap, EventCodec(), SINK_MARKERS.name(), read_committed=True)
        if isinstance(r.event, SinkEpochPublished) and r.event.transaction
    }
    return [v for t, v in found if t is None or t in committed]
