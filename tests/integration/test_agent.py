"""The agent on the real broker and real Spark, against a real coordinator: the example job's
committed output equals the plain-Python reference after a clean run, after SIGKILL at each
scripted point and a restore, after restores with parallelism 2 -> 4 -> 1, and when a bounded
job finishes. Agents that are killed run as processes, started as a user starts them."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow.parquet as pq
import pytest
from confluent_kafka import Consumer, TopicPartition

from sparkpoint.agent.example import ensure_topic, generate, payments, reference_output
from sparkpoint.agent.formats import AvroValues, ConfluentAvroValues
from sparkpoint.agent.job import DeliveryGuarantee, FileSource, Job, KafkaSink, KafkaSource
from sparkpoint.agent.recovery.restore import NoCheckpoint
from sparkpoint.agent.runtime import Agent, AgentOptions
from sparkpoint.agent.sinks.kafka import TRANSACTION_HEADER
from sparkpoint.common.avro import EventCodec
from sparkpoint.common.events import (
    CheckpointEventType,
    CheckpointFailureReason,
    CheckpointLifecycleEvent,
    FailoverRequest,
    JobStatus,
    SinkEpochPublished,
)
from sparkpoint.common.kafka import (
    EventPublisher,
    consumer_config,
    make_producer,
    replay_topic,
    true_end_offset,
)
from sparkpoint.common.topics import CHECKPOINT_EVENTS, CONTROL, SINK_MARKERS
from tests.agent_jobs import Slow, build
from tests.conftest import KafkaUnderTest
from tests.integration.test_formats import STAT, V1, V2, confluent, reference_read, reference_schema
from tests.running_coordinator import Running, coordinator_in_thread, wait

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parents[2]
RECORDS = 6_000
Output = tuple[str, str, int, int]


@pytest.fixture(scope="module")
def coordinator(
    kafka: KafkaUnderTest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Running]:
    with pytest.MonkeyPatch.context() as env:
        env.setenv("SPARKPOINT_TOPIC_PREFIX", f"t{uuid.uuid4().hex[:10]}.")
        yield from coordinator_in_thread(kafka, tmp_path_factory.mktemp("agent"))


@pytest.fixture(scope="module")
def payments_topic(kafka: KafkaUnderTest) -> str:
    """One input topic for the module (4 partitions): jobs only read it."""
    topic = f"payments-{uuid.uuid4().hex[:8]}"
    assert generate(kafka.bootstrap, topic, RECORDS) == RECORDS
    return topic


@pytest.fixture(scope="module")
def expected() -> list[Output]:
    return reference_output(payments(RECORDS), end_of_input=True)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def read_output(
    bootstrap: str, topic: str, decode: Callable[[bytes], Any] = json.loads
) -> list[Output]:
    """Everything committed to ``topic`` (read_committed), up to its true end offsets. A record
    of an exactly-once epoch counts only when a sink marker carries its transaction's token: the
    embedded broker shows aborted transactions to read_committed readers (a real Kafka hides
    them, and there this changes nothing)."""
    out = read_tokened(bootstrap, topic, decode, read_committed=True)
    committed = committed_transactions(bootstrap) if any(t for t, _ in out) else set()
    return sorted(row for token, row in out if token is None or token in committed)


def read_tokened(
    bootstrap: str, topic: str, decode: Callable[[bytes], Any], read_committed: bool
) -> list[tuple[str | None, Output]]:
    """Every record of ``topic`` up to its true end offsets, with its transaction token."""
    consumer = Consumer(consumer_config(bootstrap, read_committed=read_committed))
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        ends = {p: true_end_offset(consumer, topic, p) for p in partitions}
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        out: list[tuple[str | None, Output]] = []
        remaining = {p for p, end in ends.items() if end > 0}
        while remaining:
            for message in consumer.consume(10_000, 0.5):
                if message.error() is None:
                    token = dict(message.headers() or []).get(TRANSACTION_HEADER)
                    row = decode(message.value() or b"{}")
                    if not isinstance(row, tuple):  # the example job's record
                        row = (row["kind"], row["account"], row["id"], row["value"])
                    out.append((token.decode() if isinstance(token, bytes) else token, row))
            for tp in consumer.position([TopicPartition(topic, p) for p in remaining]):
                if tp.offset >= ends[tp.partition]:
                    remaining.discard(tp.partition)
    finally:
        consumer.close()
    return out


def committed_transactions(bootstrap: str) -> set[str]:
    """The transaction tokens the sink markers carry (markers are committed with their epoch)."""
    return {
        r.event.transaction
        for r in replay_topic(bootstrap, EventCodec(), SINK_MARKERS, read_committed=True)
        if isinstance(r.event, SinkEpochPublished) and r.event.transaction
    }


def read_files(directory: Path) -> list[Output]:
    out: list[Output] = []
    for path in sorted(directory.glob("part-*.parquet")):
        for row in pq.read_table(path).to_pylist():
            out.append((row["kind"], row["account"], row["id"], row["value"]))
    return sorted(out)


def difference(got: list[Output], want: list[Output]) -> str:
    missing, extra = Counter(want) - Counter(got), Counter(got) - Counter(want)
    return f"{sum(missing.values())} missing (e.g. {list(missing)[:2]}), {sum(extra.values())} duplicated or wrong (e.g. {list(extra)[:2]})"


def in_process(job: Job, coordinator: Running, spark: Any, **options: Any) -> Agent:
    """An agent in this process, on the session's Spark, checkpointing under the coordinator's
    storage root."""
    checkpoints = str(coordinator.root / "checkpoints")
    return Agent(
        job,
        AgentOptions(coordinator.bootstrap, checkpoint_dir=checkpoints, **options),
        EventCodec(),
        spark=spark,
    )


def run_in_process(
    job: Job, coordinator: Running, spark: Any, **options: Any
) -> tuple[JobStatus, Agent]:
    agent = in_process(job, coordinator, spark, **options)
    result: list[JobStatus] = []
    thread = threading.Thread(target=lambda: result.append(agent.run()), daemon=True)
    thread.start()
    thread.join(180)
    if thread.is_alive():
        agent.stop()
        thread.join(30)
        raise AssertionError(f"job {job.id} did not finish in 180 s")
    assert result, "the agent failed (see the log)"
    return result[0], agent


def agent_process(
    coordinator: Running,
    name: str,
    topic: str,
    output: str,
    *args: str,
    crash_at: str | None = None,
    sink: str = "kafka",
    max_records: int = 150,
    slow_ms: int = 0,
) -> subprocess.CompletedProcess[str]:
    """``slow_ms``: the keyed function sleeps that long per round (tests/agent_jobs.py's
    `Slow`), so the input takes rounds enough for a fault to land before it ends."""
    env = dict(os.environ)
    env |= {
        "TEST_JOB_NAME": name,
        "TEST_INPUT": topic,
        "TEST_OUTPUT": output,
        "TEST_SINK": sink,
        "TEST_MAX_RECORDS": str(max_records),
        "PYTHONPATH": str(ROOT),
    }
    env.pop("SPARKPOINT_CRASH_AT", None)
    if crash_at:
        env["SPARKPOINT_CRASH_AT"] = crash_at
    if slow_ms:  # else as the caller's environment says (test_agent_unaligned sets it there)
        env["TEST_SLOW_MS"] = str(slow_ms)
    command = [
        sys.executable, "-m", "sparkpoint.cli", "-v", "agent", "tests/agent_jobs.py:job",
        "--bootstrap", coordinator.bootstrap, "--master", "local[2]",
        "--checkpoint-dir", str(coordinator.root / "checkpoints"), *args,
    ]  # fmt: skip
    return subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240, check=False
    )


def killed(process: subprocess.CompletedProcess[str]) -> bool:
    return process.returncode == -signal.SIGKILL


# --- clean runs ------------------------------------------------------------------------------------


RESIDENT = pytest.mark.parametrize(
    "resident", [None, True], ids=["a Spark job per round", "resident tasks"]
)
"""The shared session runs a Spark job per round unless told otherwise (it is shared); an agent
that starts its own session on a local master uses resident tasks (`spark.resident`)."""


@RESIDENT
def test_a_bounded_job_commits_exactly_the_reference_and_finishes(
    coordinator: Running, spark: Any, payments_topic: str, expected: list[Output],
    resident: bool | None,
) -> None:  # fmt: skip
    output = unique("stats")
    job = build(unique("clean"), payments_topic, output)

    status, agent = run_in_process(job, coordinator, spark, resident_tasks=resident)
    assert agent.spark_jobs.resident is bool(resident)

    assert status is JobStatus.FINISHED
    got = read_output(coordinator.bootstrap, output)
    assert got == expected, difference(got, expected)
    assert agent.completed_checkpoints, "the final checkpoint completed"
    wait(lambda: job.id in coordinator.service.ended, what="the coordinator saw FINISHED")
    assert coordinator.service.ended[job.id].status is JobStatus.FINISHED
    with coordinator.client() as client:  # a finished job's checkpoint history stays readable
        history = client.get(f"/jobs/{job.id}/checkpoints").json()
    assert history["counts"]["completed"] >= 1


def test_the_file_sink_commits_part_files_exactly_once(
    coordinator: Running, spark: Any, payments_topic: str, expected: list[Output], tmp_path: Path
) -> None:
    job = build(unique("files"), payments_topic, str(tmp_path / "out"), sink="files")

    status, _ = run_in_process(job, coordinator, spark)

    assert status is JobStatus.FINISHED
    got = read_files(tmp_path / "out")
    assert got == expected, difference(got, expected)
    assert not list((tmp_path / "out").glob(".*inprogress*")), "no part file left in progress"


def test_records_travel_in_segment_files_and_backpressure_holds_the_source(
    coordinator: Running, spark: Any, payments_topic: str, expected: list[Output]
) -> None:
    output = unique("stats")
    job = build(unique("segments"), payments_topic, output, max_records=3_000)
    seen: list[tuple[int, bool, list[str]]] = []

    def watch(agent: Agent) -> None:
        queued = [s.path for c in agent.channels for s in c.segments]
        seen.append(
            (
                sum(c.appended_bytes for c in agent.channels),
                any(c.full for c in agent.channels),
                queued,
            )
        )

    agent = in_process(job, coordinator, spark, capacity_bytes=1, max_rows_per_round=400)
    agent.on_round = watch
    segment_dir = Path(agent.channel_dir)

    assert agent.run() is JobStatus.FINISHED
    got = read_output(coordinator.bootstrap, output)
    assert got == expected, difference(got, expected)
    assert seen[-1][0] > 0, "stage 1 wrote segment files"
    assert any(full for _, full, _ in seen), "a full channel was reported (the source paused)"
    assert any(queued for _, _, queued in seen)
    assert not segment_dir.exists() or not any(segment_dir.rglob("*.arrow")), "consumed, deleted"


@RESIDENT
def test_records_never_pass_through_the_driver(
    coordinator: Running, spark: Any, kafka: KafkaUnderTest, resident: bool | None
) -> None:
    """What the driver sends to Spark tasks and gets back is metadata: at most 1 byte per 100
    bytes of input (task results as Spark's own resultSize metric counts them, tasks as
    pickled; resident tasks: the frames each way)."""
    topic = unique("payments-big")
    assert generate(kafka.bootstrap, topic, 60_000) == 60_000  # Spark adds ~1.5 KB per task
    job = build(unique("driver"), topic, unique("stats"), max_records=50_000)

    status, agent = run_in_process(job, coordinator, spark, resident_tasks=resident)

    assert status is JobStatus.FINISHED and agent.input_bytes > 4_000_000
    assert agent.traffic.stages >= 2 and agent.traffic.from_tasks > 0  # Spark's figures arrived
    ratio = agent.traffic.total / agent.input_bytes
    assert ratio <= 0.01, (agent.traffic.to_tasks, agent.traffic.from_tasks, agent.input_bytes)


def test_avro_values_in_and_out_with_two_schema_ids_and_bad_values_skipped(
    coordinator: Running, spark: Any, kafka: KafkaUnderTest, caplog: pytest.LogCaptureFixture
) -> None:
    """Payments in the Confluent wire format under two schema ids (the second adds a field),
    three values that are not, and the stats out as Avro single-object values: the output,
    read with the ``avro`` package, is the reference; each bad value is logged with
    topic[partition]@offset."""
    topic, output = unique("payments-avro"), unique("stats-avro")
    ensure_topic(kafka.bootstrap, topic)
    producer = make_producer(kafka.bootstrap)
    events = list(payments(RECORDS))
    for i, event in enumerate(events):
        record = {"id": event.id, "account": event.account, "amount": event.amount, "ts": event.ts}
        value = (
            confluent(2, V2, record | {"currency": "EUR"}) if i % 2 else confluent(1, V1, record)
        )
        producer.produce(topic, value=value, key=event.account.encode())
        if i in (10, 2000, 4000):
            producer.produce(topic, value=b'{"json": true}', key=event.account.encode())
    assert producer.flush(30) == 0
    job = build(unique("avro"), topic, output, max_records=2_000)
    source = KafkaSource([topic], True, 2_000, ConfluentAvroValues(schemas={1: V1, 2: V2}))
    job = replace(job, source=source, sink=KafkaSink(output, value_format=AvroValues(STAT)))

    with caplog.at_level("WARNING", logger="sparkpoint.agent.runtime"):
        status, _ = run_in_process(job, coordinator, spark)

    assert status is JobStatus.FINISHED
    fingerprint = reference_schema(STAT).fingerprint("CRC-64-AVRO")

    def decode(value: bytes) -> Any:
        assert value[:10] == b"\xc3\x01" + fingerprint
        return reference_read(STAT, value[10:])

    got = read_output(coordinator.bootstrap, output, decode)
    assert got == reference_output(events, end_of_input=True), "exact"
    skipped = [r.getMessage() for r in caplog.records if "malformed" in r.getMessage()]
    assert len(skipped) == 3 and all(re.search(rf"{topic}\[\d\]@\d+", m) for m in skipped)


def test_at_least_once_sinks_publish_every_record_without_transactions(
    coordinator: Running, spark: Any, payments_topic: str, expected: list[Output]
) -> None:
    output = unique("stats")
    job = build(unique("alo"), payments_topic, output, guarantee=DeliveryGuarantee.AT_LEAST_ONCE)

    status, _ = run_in_process(job, coordinator, spark)

    assert status is JobStatus.FINISHED
    got = read_output(coordinator.bootstrap, output)  # no failure: exactly the reference
    assert got == expected, difference(got, expected)


# --- SIGKILL at scripted points, then restore -------------------------------------------------------


# kills after a completed checkpoint: the rescale test below; mid-batch: the S3 test of
# test_beyond_one_machine.py; every kill point: the campaigns of bench/chaos.py (`make chaos`).
# This one (30 s) runs in `make chaos`: a kill at after-ack and a restore from latest also run
# in `make test` from a user's project (tests/user_project, through sparkpoint.testing) and in
# test_initial_state.py
@pytest.mark.chaos
def test_a_killed_agent_restored_from_latest_commits_exactly_the_reference(
    coordinator: Running, payments_topic: str, expected: list[Output]
) -> None:
    """Killed once a checkpoint was acknowledged, before its completion reached the agent. Also:
    the restored run's checkpoint ids continue above every id the killed one used."""
    name, output = unique("killed"), unique("stats")
    checkpoints = coordinator.root / "checkpoints" / name
    point = "after-ack:2"

    first = agent_process(coordinator, name, payments_topic, output, crash_at=point)
    assert killed(first), f"expected SIGKILL at {point}:\n{first.stderr[-3000:]}"
    used = max(int(p.name.removeprefix("chk-")) for p in checkpoints.glob("chk-*"))
    second = agent_process(coordinator, name, payments_topic, output, "--restore", "latest")
    assert second.returncode == 0, second.stderr[-3000:]

    got = read_output(coordinator.bootstrap, output)
    assert got == expected, difference(got, expected)
    assert re.search(rf"restoring from {re.escape(str(checkpoints))}/chk-\d+\n", second.stderr)
    completed = [int(n) for n in re.findall(r"checkpoint (\d+) completed", second.stderr)]
    assert completed and min(completed) > used


@pytest.mark.chaos  # `make chaos`: 45-56 s; in make test, test_state_budget rescales 2 -> 4 -> 1
# with exact output and test_initial_state resumes a killed agent at parallelism 3
def test_restores_with_parallelism_2_then_4_then_1_commit_exactly_the_reference(
    coordinator: Running, payments_topic: str, expected: list[Output]
) -> None:
    """The first agent dies inside a sink transaction: the second epoch's publishing task has
    produced half of the epoch's records and flushed them, the transaction open in a Spark
    worker that dies with the agent. The restore (parallelism 4) fences, which aborts it, and
    publishes the epoch again; it dies at its first completed checkpoint, before the sink commits
    (the first, since the rest of the input may take only one round and the final checkpoint);
    the last restore runs with parallelism 1 to the end. On the embedded broker the aborted
    half stays visible to read_committed readers: `read_output` counts a record only when a
    marker carries its transaction's token, as a real Kafka hides it."""
    name, output = unique("rescaled"), unique("stats")

    # rounds of at least 0.3 s: the first agent dies in epoch 2 with input left to read
    first = agent_process(
        coordinator, name, payments_topic, output, crash_at="mid-publish:2", slow_ms=300
    )
    assert killed(first), first.stderr[-3000:]
    second = agent_process(
        coordinator, name, payments_topic, output, "--restore", "latest", "--parallelism", "4",
        crash_at="after-complete:1",
    )  # fmt: skip
    assert killed(second), second.stderr[-3000:]
    third = agent_process(
        coordinator, name, payments_topic, output, "--restore", "latest", "--parallelism", "1"
    )
    assert third.returncode == 0, third.stderr[-3000:]

    got = read_output(coordinator.bootstrap, output)
    assert got == expected, difference(got, expected)
    every = read_tokened(coordinator.bootstrap, output, json.loads, read_committed=False)
    left_open = {t for t, _ in every} - committed_transactions(coordinator.bootstrap)
    assert left_open, "the first agent's half epoch reached the broker, uncommitted"
    assert re.search(r"parallelism 4, [1-9]\d* key groups restored", second.stderr)
    assert re.search(r"parallelism 1, [1-9]\d* key groups restored", third.stderr)
    registrations = [j for j in (coordinator.service.ended.get(name),) if j is not None]
    assert registrations and registrations[0].registration.parallelism == 1


@RESIDENT
def test_a_failover_request_restarts_the_job_from_its_latest_checkpoint(
    coordinator: Running, spark: Any, payments_topic: str, expected: list[Output],
    resident: bool | None,
) -> None:  # fmt: skip
    output = unique("stats")
    # a checkpoint every 200 ms: with checkpoints every second the job's ten rounds could end
    # before the first one (its first trigger comes up to an interval after the start, and a
    # warm session's rounds take about 100 ms): it then finished without a failover. Resident
    # tasks' rounds take a few tens of ms: thirty of them
    settings = {"execution.checkpointing.interval": "200ms"}
    max_records = 50 if resident else 150
    job = build(unique("failover"), payments_topic, output, max_records, settings=settings)
    agent = in_process(job, coordinator, spark, resident_tasks=resident)
    publisher = EventPublisher(make_producer(coordinator.bootstrap), EventCodec())
    sent: list[int] = []

    def fail_once(running: Agent) -> None:
        if not sent and running.completed_checkpoints:
            owned = coordinator.service.jobs[job.id]
            request = FailoverRequest(
                job.id, owned.core.owner_epoch, CheckpointFailureReason.CHECKPOINT_EXPIRED,
                "scripted", 3, int(time.time() * 1000),
                agent_id=running.agent_id, attempt=running.attempt,
            )  # fmt: skip
            publisher.publish_sync(CONTROL, job.id, request)
            sent.append(running.completed_checkpoints[-1])

    agent.on_round = fail_once
    status = agent.run()
    publisher.close()

    assert status is JobStatus.FINISHED
    assert sent and agent.attempt == 1, "the job restarted once"
    got = read_output(coordinator.bootstrap, output)
    assert got == expected, difference(got, expected)


def test_a_file_source_is_read_to_its_end_and_the_job_finishes(
    coordinator: Running, spark: Any, expected: list[Output], tmp_path: Path
) -> None:
    """Accounts are split across the files (as Kafka partitions split keys): order is kept
    within a file, so one account's payments are in one file."""
    frame = pd.DataFrame([p.__dict__ for p in payments(RECORDS)])
    first = frame["account"].str[-1].astype(int) % 2 == 0
    frame[first].to_parquet(tmp_path / "payments-0.parquet")
    frame[~first].to_json(tmp_path / "payments-1.json", orient="records", lines=True)
    output = unique("stats")
    parquet = build(unique("parquet"), "unused", output)
    job = replace(
        parquet,
        source=FileSource(str(tmp_path / "payments-0.parquet"), "parquet", 1_000),
    )
    status, _ = run_in_process(job, coordinator, spark)
    assert status is JobStatus.FINISHED
    json_job = replace(
        parquet,
        name=unique("json"),
        source=FileSource(str(tmp_path / "payments-1.json"), "json", 1_000),
    )
    status, _ = run_in_process(json_job, coordinator, spark)
    assert status is JobStatus.FINISHED

    got = read_output(coordinator.bootstrap, output)
    assert got == expected, difference(got, expected)


def test_a_savepoint_then_stop_with_savepoint_moved_elsewhere_restores_with_parallelism_3(
    coordinator: Running, spark: Any, payments_topic: str, expected: list[Output]
) -> None:
    """The first savepoint is NATIVE (the backend's change runs, copied as they are), the
    stop's CANONICAL (Flink's default: every key group folded into one base); the canonical
    one, moved, restores with parallelism 3."""
    output = unique("stats")
    # rounds of at least 0.3 s: the stop (after three checkpoints) lands before the input ends
    job = replace(
        build(unique("savepoints"), payments_topic, output, max_records=100), function=Slow(300)
    )
    target = str(coordinator.root / "savepoints")
    requests: dict[str, str] = {}
    client = coordinator.client()

    def operate(agent: Agent) -> None:
        # once a round has processed records: the savepoint has keyed state
        if "savepoint" not in requests and agent.completed_checkpoints and agent.staged_outputs():
            body = {"target-directory": target, "cancel-job": False, "formatType": "NATIVE"}
            answer = client.post(f"/jobs/{job.id}/savepoints", json=body).json()
            requests["savepoint"] = answer["request-id"]
        elif (
            "savepoint" in requests
            and "stop" not in requests
            and len(agent.completed_checkpoints) >= 3
        ):
            answer = client.post(f"/jobs/{job.id}/stop", json={"targetDirectory": target}).json()
            requests["stop"] = answer["request-id"]

    agent = in_process(job, coordinator, spark)
    agent.on_round = operate
    status = agent.run()
    assert status is JobStatus.FINISHED and "stop" in requests
    assert not agent.source.finished(), "stopped before the end of its input"

    def location(trigger: str) -> str:
        answer = client.get(f"/jobs/{job.id}/savepoints/{trigger}").json()
        assert answer["status"]["id"] == "COMPLETED", answer
        return str(answer["operation"]["location"])

    first, stopped = location(requests["savepoint"]), location(requests["stop"])
    keyed: dict[str, list[tuple[str, list[int]]]] = {}
    for savepoint in (first, stopped):
        metadata = json.loads((Path(savepoint) / "_metadata").read_text())
        handles = [h for s in metadata["subtasks"] for h in s["state_handles"]]
        paths = [h["path"] for h in handles]
        # self-contained: every file inside, named relative to the savepoint's directory
        assert paths and all(not p.startswith("/") and "://" not in p for p in paths), paths
        assert all((Path(savepoint) / p).is_file() for p in paths)
        keyed[savepoint] = [
            (Path(h["path"]).name, h["key_groups"]) for h in handles if h["kind"] == "KEYED_STATE"
        ]
    # native: the rounds' change runs (no key group was materialized within the job's seconds)
    assert keyed[first] and all(name.startswith("run-") for name, _ in keyed[first])
    # canonical: one base per key group with state, each naming that key group alone
    canonical = keyed[stopped]
    assert canonical and all(name.startswith("base-") and a == b for name, (a, b) in canonical)
    groups = [a for _, (a, _) in canonical]
    assert len(groups) == len(set(groups))
    listed = client.get(f"/jobs/{job.id}/savepoints").json()
    assert {first, stopped} <= {s["location"] for s in listed["savepoints"]}

    # a savepoint restores from wherever it was moved: nothing in it names its old place
    moved = coordinator.root / "savepoints" / "moved-here" / Path(stopped).name
    moved.parent.mkdir(parents=True)
    shutil.move(stopped, moved)
    assert not Path(stopped).exists()
    status, restored = run_in_process(job, coordinator, spark, restore=str(moved), parallelism=3)
    client.close()
    assert status is JobStatus.FINISHED and restored.parallelism == 3
    got = read_output(coordinator.bootstrap, output)
    assert got == expected, difference(got, expected)


def test_expired_checkpoints_fold_their_output_into_the_next_epoch_and_nothing_is_lost(
    coordinator: Running, spark: Any, payments_topic: str, expected: list[Output]
) -> None:
    """Checkpoints expire (timeout 1 ms) until a PATCH gives them time: the epochs of the
    aborted ones are published with the next completed checkpoint, exactly once."""
    output = unique("stats")
    settings = {
        "execution.checkpointing.timeout": "1ms",
        "execution.checkpointing.tolerable-failed-checkpoints": "1000",
    }
    job = build(unique("expiring"), payments_topic, output, max_records=100, settings=settings)
    patched: list[int] = []
    client = coordinator.client()

    def extend_after_two_aborts(agent: Agent) -> None:
        # stage 2 runs beside the loop: aborts may be heard before its first round's output
        if not patched and len(agent.aborted_checkpoints) >= 2 and agent.staged_outputs():
            answer = client.patch(
                f"/jobs/{job.id}/checkpoints/configuration", json={"checkpointTimeout": 60_000}
            )
            assert answer.status_code == 200, answer.text
            patched.append(len(agent.completed_checkpoints))

    agent = in_process(job, coordinator, spark)
    agent.on_round = extend_after_two_aborts
    status = agent.run()

    assert status is JobStatus.FINISHED and patched
    assert patched[0] == 0, "output was staged through aborted epochs, none completed before"
    assert agent.completed_checkpoints and min(agent.completed_checkpoints) > min(
        agent.aborted_checkpoints
    )
    history = client.get(f"/jobs/{job.id}/checkpoints").json()
    client.close()
    assert history["counts"]["failed"] >= 2
    got = read_output(coordinator.bootstrap, output)
    assert got == expected, difference(got, expected)


def test_a_snapshot_that_cannot_be_written_is_declined_and_later_checkpoints_complete(
    coordinator: Running, spark: Any, payments_topic: str, expected: list[Output]
) -> None:
    """A plain file where the shared directory belongs: copies fail even for root, subtasks
    decline (CHECKPOINT_ASYNC_EXCEPTION); once it is gone, checkpoints complete again."""
    output = unique("stats")
    settings = {"execution.checkpointing.tolerable-failed-checkpoints": "1000"}
    job = build(unique("declining"), payments_topic, output, max_records=100, settings=settings)
    blocker = coordinator.root / "checkpoints" / job.id / "shared"
    blocker.parent.mkdir(parents=True, exist_ok=True)
    blocker.write_text("not a directory")

    def unblock_after_two_declines(agent: Agent) -> None:
        if blocker.is_file() and len(set(agent.declined_checkpoints)) >= 2:
            blocker.unlink()

    agent = in_process(job, coordinator, spark)
    agent.on_round = unblock_after_two_declines
    status = agent.run()

    assert status is JobStatus.FINISHED and not blocker.is_file()
    events = replay_topic(coordinator.bootstrap, EventCodec(), CHECKPOINT_EVENTS)
    reasons = {
        e.checkpoint_id: e.failure_reason
        for r in events
        if isinstance(e := r.event, CheckpointLifecycleEvent) and e.job_id == job.id
    }
    for declined in set(agent.declined_checkpoints):
        assert reasons[declined] is CheckpointFailureReason.CHECKPOINT_ASYNC_EXCEPTION
    assert agent.completed_checkpoints and max(agent.completed_checkpoints) > max(
        agent.declined_checkpoints
    )
    got = read_output(coordinator.bootstrap, output)
    assert got == expected, difference(got, expected)


# --- the whole lifecycle: runs of one job id, and a second agent ----------------------------------


def error_line(process: subprocess.CompletedProcess[str]) -> str:
    """The one line the command prints about what went wrong (``sparkpoint: ...``)."""
    lines = [line for line in process.stderr.splitlines() if line.startswith("sparkpoint: ")]
    assert lines, process.stderr[-3000:]
    return lines[-1]


def triggered_ids(coordinator: Running, job_id: str) -> list[int]:
    """Every checkpoint id the audit topic shows triggered for the job, in order."""
    return [
        e.checkpoint_id
        for r in replay_topic(coordinator.bootstrap, EventCodec(), CHECKPOINT_EVENTS)
        if isinstance(e := r.event, CheckpointLifecycleEvent)
        and e.job_id == job_id
        and e.event_type is CheckpointEventType.TRIGGERED
    ]


def test_a_finished_job_restarted_from_latest_restores_its_final_checkpoint_and_emits_nothing(
    coordinator: Running, spark: Any, payments_topic: str, expected: list[Output]
) -> None:
    output = unique("stats")
    job = build(unique("rerun"), payments_topic, output)
    status, _ = run_in_process(job, coordinator, spark)
    assert status is JobStatus.FINISHED
    wait(lambda: job.id in coordinator.service.ended, what="the coordinator saw FINISHED")

    status, again = run_in_process(job, coordinator, spark, restore="latest")

    assert status is JobStatus.FINISHED and again.finished_before
    got = read_output(coordinator.bootstrap, output)
    assert got == expected, difference(got, expected)
    ids = triggered_ids(coordinator, job.id)
    assert ids and len(ids) == len(set(ids)), f"checkpoint ids reused: {ids}"


def test_a_finished_job_whose_checkpoints_were_discarded_starts_over_only_on_purpose(
    coordinator: Running, spark: Any, payments_topic: str, expected: list[Output], tmp_path: Path
) -> None:
    settings = {
        "execution.checkpointing.externalized-checkpoint-retention": "NO_EXTERNALIZED_CHECKPOINTS"
    }
    job = build(
        unique("discarded"), payments_topic, str(tmp_path / "out"), sink="files", settings=settings
    )
    status, _ = run_in_process(job, coordinator, spark)
    assert status is JobStatus.FINISHED
    wait(lambda: job.id in coordinator.service.ended, what="the coordinator saw FINISHED")
    committed = {p.name: p.read_bytes() for p in (tmp_path / "out").glob("part-*.parquet")}

    refused = in_process(job, coordinator, spark, restore="latest")
    with pytest.raises(NoCheckpoint) as error:
        refused.run()
    for part in ("FINISHED", "NO_EXTERNALIZED_CHECKPOINTS", "--allow-fresh-start"):
        assert part in str(error.value), error.value

    status, _ = run_in_process(job, coordinator, spark, restore="latest", allow_fresh_start=True)
    assert status is JobStatus.FINISHED
    got = read_files(tmp_path / "out")
    assert got == sorted(expected + expected), "two whole runs, on purpose"
    for part, data in committed.items():  # the first run's files, untouched
        assert (tmp_path / "out" / part).read_bytes() == data
    ids = triggered_ids(coordinator, job.id)
    assert len(ids) == len(set(ids)), f"checkpoint ids reused: {ids}"


def test_a_second_agent_for_a_running_job_exits_with_a_clear_message_and_changes_nothing(
    coordinator: Running, spark: Any, payments_topic: str, expected: list[Output]
) -> None:
    name, output = unique("twice"), unique("stats")
    job = build(name, payments_topic, output, max_records=600)
    first = in_process(job, coordinator, spark)
    second_done = threading.Event()
    # the first agent holds after its first round (its heartbeats go on) until the second one
    # has been answered: it is certainly running meanwhile

    def hold(agent: Agent) -> None:
        if agent.rounds:
            second_done.wait(180)

    first.on_round = hold
    result: list[JobStatus] = []
    thread = threading.Thread(target=lambda: result.append(first.run()), daemon=True)
    thread.start()
    wait(lambda: name in coordinator.service.jobs, timeout_s=120, what="the first agent runs")

    second = agent_process(coordinator, name, payments_topic, output, max_records=600)
    second_done.set()
    thread.join(240)

    assert second.returncode == 1, second.stderr[-3000:]
    message = error_line(second)
    assert "already running" in message and first.agent_id in message, message
    assert result == [JobStatus.FINISHED]
    got = read_output(coordinator.bootstrap, output)
    assert got == expected, difference(got, expected)
