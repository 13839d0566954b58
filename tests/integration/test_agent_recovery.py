"""Failover and savepoints as a Flink user knows them, on the real broker and real Spark:
restart strategies (a failing function restarts the job in its agent; a strategy that gives up
ends it FAILED), the exception history, relocatable savepoints, disposal, claim modes,
``--restore latest`` after stop-with-savepoint, at-least-once checkpoints, and a configuration
with every Flink 2.x option."""

from __future__ import annotations

import json
import shutil
import sys
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from confluent_kafka import Producer

from sparkpoint.agent.example import generate, payments, reference_output
from sparkpoint.agent.runtime import Agent
from sparkpoint.agent.sinks import kafka as sink_kafka
from sparkpoint.agent.sinks.kafka import KafkaSinkWriter, Publish
from sparkpoint.agent.spark.jobs import SparkJobs
from sparkpoint.common.events import JobStatus
from sparkpoint.common.kafka import producer_config
from tests import agent_jobs
from tests.agent_jobs import AlwaysFailing, FailingOnce, Slow, build
from tests.conftest import KafkaUnderTest
from tests.integration.test_agent import (
    Output,
    difference,
    in_process,
    read_output,
    run_in_process,
    unique,
)
from tests.running_coordinator import Running, coordinator_in_thread, wait

pytestmark = pytest.mark.spark

RECORDS = 4_000
ROOT = Path(__file__).resolve().parents[2]
FAST_RESTARTS = {
    "restart-strategy.type": "exponential-delay",
    "restart-strategy.exponential-delay.initial-backoff": "200ms",
    "restart-strategy.exponential-delay.max-backoff": "1s",
}


@pytest.fixture(scope="module", autouse=True)
def functions_travel_by_value() -> None:
    """The failing functions live in a test module Spark's workers cannot import."""
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[agent_jobs.__name__])  # type: ignore[no-untyped-call]


@pytest.fixture(scope="module")
def coordinator(
    kafka: KafkaUnderTest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Running]:
    with pytest.MonkeyPatch.context() as env:
        env.setenv("SPARKPOINT_TOPIC_PREFIX", f"t{uuid.uuid4().hex[:10]}.")
        yield from coordinator_in_thread(kafka, tmp_path_factory.mktemp("recovery"))


@pytest.fixture(scope="module")
def topic(kafka: KafkaUnderTest) -> str:
    name = f"payments-{uuid.uuid4().hex[:8]}"
    assert generate(kafka.bootstrap, name, RECORDS) == RECORDS
    return name


@pytest.fixture(scope="module")
def expected() -> list[Output]:
    return reference_output(payments(RECORDS), end_of_input=True)


# --- restart strategies -----------------------------------------------------------------------------


def test_a_function_that_fails_once_restarts_the_job_and_the_output_is_exact(
    coordinator: Running, spark: Any, topic: str, expected: list[Output], tmp_path: Path
) -> None:
    output = unique("stats")
    job = build(unique("once"), topic, output, max_records=100, settings=FAST_RESTARTS)
    job = replace(job, function=FailingOnce(RECORDS // 2, str(tmp_path / "failed")))

    status, agent = run_in_process(job, coordinator, spark)

    assert status is JobStatus.FINISHED and agent.restarts == 1 and agent.attempt >= 1
    got = read_output(coordinator.bootstrap, output)
    assert got == expected, difference(got, expected)
    with coordinator.client() as client:
        entries = client.get(f"/jobs/{job.id}/exceptions").json()["exceptionHistory"]["entries"]
        details = client.get(f"/jobs/{job.id}").json()
        overview = client.get("/jobs/overview").json()["jobs"]
    assert len(entries) == 1 and "scripted failure" in entries[0]["stacktrace"]
    # the function's own exception, with the trace from the task where it raised
    assert entries[0]["exceptionName"] == "RuntimeError"
    assert "raised in a Spark task" in entries[0]["stacktrace"]
    assert "in process" in entries[0]["stacktrace"].split("raised in a Spark task")[1]
    assert details["state"] == "FINISHED" and details["timestamps"]["RESTARTING"] > 0
    assert len(details["vertices"]) == 2 and details["sparkpoint"]["restarts"] == 1
    assert [j["restarts"] for j in overview if j["sparkpoint"]["job_id"] == job.id] == [1]


def test_a_failed_sink_commit_renews_the_sink_and_a_sound_one_is_kept_across_restarts(
    coordinator: Running,
    spark: Any,
    topic: str,
    expected: list[Output],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first commit fails half-way (its marker refused; the real producer aborts the
    transaction): the restart builds a new sink. The function's failure later restarts the job
    with every commit through: that sink is kept. The failing commit runs in this process (a
    Spark task's cannot be scripted from here), the others in Spark tasks: the sink publishes
    as on a cluster (with a local master it writes ahead, `test_a_fenced_write_ahead_...`)."""
    monkeypatch.setattr(SparkJobs, "local", property(lambda _: False))
    output = unique("stats")
    # rounds of 25 records a partition: the first checkpoint (whose epoch's commit fails) comes
    # well before the payment the function fails on (over rounds of 100, a fast machine had
    # checkpointed past it, and the renewed sink never saw it)
    job = build(unique("commit"), topic, output, max_records=25, settings=FAST_RESTARTS)
    renewed = tmp_path / "renewed"  # the function fails only in a round of the renewed sink,
    # so its failure is a restart of its own, never folded into the commit's (under load the two
    # could land in one iteration of the loop)
    job = replace(
        job, function=FailingOnce(RECORDS * 3 // 4, str(tmp_path / "failed"), str(renewed))
    )
    agent = in_process(job, coordinator, spark)
    first_sink = agent.sink
    assert isinstance(first_sink, KafkaSinkWriter)
    run, send = first_sink.run, sink_kafka.send_records
    refused: list[str] = []

    def refuse_the_first_marker(work: Callable[[Any], int], tasks: list[Publish]) -> list[int]:
        (task,) = tasks
        if refused or task.epoch is None:
            return run(work, tasks)

        def send_but_the_marker(producer: Any, topic: str, *records: Any) -> None:
            if topic == task.markers:
                refused.append(topic)
                # the epoch's records reach the broker before the abort (else it depends on
                # timing): a reader must not count them, as a real Kafka's read_committed does not
                producer.flush(30)
                raise RuntimeError("scripted: the marker could not be queued")
            send(producer, topic, *records)

        with monkeypatch.context() as patch:
            patch.setattr(sink_kafka, "send_records", send_but_the_marker)
            return [work(task)]

    first_sink.run = refuse_the_first_marker
    sinks: list[object] = []

    def on_round(running: Agent) -> None:
        sinks.append(running.sink)
        if running.sink is not first_sink:
            renewed.touch()

    agent.on_round = on_round

    status = agent.run()

    assert status is JobStatus.FINISHED and refused and agent.restarts == 2
    assert sinks[0] is first_sink and agent.sink is not first_sink
    assert len({id(s) for s in sinks}) == 2, "the function's failure kept the renewed sink"
    got = read_output(coordinator.bootstrap, output)
    assert got == expected, difference(got, expected)
    assert "committing a sink epoch failed" in str(agent.failures[0])


@pytest.mark.parametrize("case", ["unseen", "full"])
def test_a_restart_never_reads_files_the_restored_checkpoint_lets_go_once_subsumed(
    coordinator: Running,
    spark: Any,
    topic: str,
    expected: list[Output],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    case: str,
) -> None:
    """``unseen``: the checkpoint a restart restores completed while the failed attempt stopped,
    its notice never handled (forced here: the agent sees none complete). The job owns it all
    the same and builds on its shared files; it took it for a snapshot of someone else's, its
    first checkpoint copied every file, the restored checkpoint was subsumed and its files
    deleted under the rounds still reading them (restart after restart, FileNotFoundError).
    ``full``: without incremental checkpoints the restored files lie in the checkpoint's own
    directory, which goes once it is subsumed: the restart adopts them as working files."""
    if case == "unseen":
        monkeypatch.setattr(Agent, "latest_completed", property(lambda _: None))
    settings = FAST_RESTARTS | {"execution.checkpointing.interval": "200ms"}
    if case == "full":
        settings |= {"execution.checkpointing.incremental": "false"}
    output = unique("stats")
    job = build(unique(f"restart-{case}"), topic, output, max_records=50, settings=settings)
    job = replace(job, function=FailingOnce(RECORDS // 2, str(tmp_path / "failed")))

    status, agent = run_in_process(job, coordinator, spark)

    assert status is JobStatus.FINISHED and agent.restarts == 1, agent.failures
    got = read_output(coordinator.bootstrap, output)
    assert got == expected, difference(got, expected)


def test_a_fenced_write_ahead_fails_its_commit_and_the_restore_publishes_exactly_once(
    coordinator: Running, spark: Any, topic: str, expected: list[Output]
) -> None:
    """With a local master the sink writes ahead (`sinks.ahead`). Once it committed an epoch,
    another producer of the sink's transactional id fences the write-ahead process: its open
    transaction is aborted and its next commit fails. The job restarts with a new sink (and a
    new process), and the restore publishes the completed epochs: the output is exact."""
    output = unique("stats")
    job = replace(
        build(unique("fenced"), topic, output, max_records=100, settings=FAST_RESTARTS),
        function=Slow(200),
    )
    agent = in_process(job, coordinator, spark)
    first_sink = agent.sink
    assert isinstance(first_sink, KafkaSinkWriter) and first_sink.writes_ahead
    fenced: list[int] = []

    def fence_once_a_checkpoint_completed(running: Agent) -> None:
        # once it committed an epoch: its producer exists (one made after the fence would fence)
        if not fenced and running.committer.published_through and running.sink is first_sink:
            zombie_hunter = Producer(
                producer_config(coordinator.bootstrap, transactional_id=first_sink.transactional_id)
            )
            zombie_hunter.init_transactions(30)
            fenced.append(running.committer.published_through)

    agent.on_round = fence_once_a_checkpoint_completed

    status = agent.run()

    assert status is JobStatus.FINISHED and fenced and agent.restarts == 1
    assert agent.sink is not first_sink and agent.sink.writes_ahead
    assert "committing a sink epoch failed" in str(agent.failures[0])
    got = read_output(coordinator.bootstrap, output)
    assert got == expected, difference(got, expected)


def test_an_epoch_still_being_published_is_named_by_the_next_checkpoint(
    coordinator: Running, spark: Any, topic: str, expected: list[Output]
) -> None:
    """The first commit is held until a later checkpoint has completed: that checkpoint's sink
    manifests must still name the epoch (a restore from it publishes the epoch if the agent
    died before the commit ended; dropped from the manifest, the epoch would be lost)."""
    output = unique("stats")
    # rounds of at least 0.3 s: the input lasts past a second checkpoint (reading it all before
    # then, the job would end with its final checkpoint and no later one to look at)
    job = replace(build(unique("held"), topic, output, max_records=100), function=Slow(300))
    agent = in_process(job, coordinator, spark)
    publish = agent.sink.publish_epoch
    held: list[int] = []
    release = threading.Event()
    named: list[bool] = []

    def held_publish(epoch: int, outputs: list[str]) -> int:
        if not held:
            held.append(epoch)
            release.wait(120)
        return publish(epoch, outputs)

    def check_once_a_later_checkpoint_completed(running: Agent) -> None:
        later = [c for c in running.completed_checkpoints if held and c > held[0]]
        if later and not release.is_set():
            manifests = Path(running.latest_completed or "").glob("sink-*.json")
            epochs = {e for m in manifests for e in json.loads(m.read_text())}
            named.append(str(held[0]) in epochs)
            release.set()

    agent.sink.publish_epoch = held_publish  # type: ignore[method-assign]
    agent.on_round = check_once_a_later_checkpoint_completed

    status = agent.run()

    assert status is JobStatus.FINISHED and named == [True]
    got = read_output(coordinator.bootstrap, output)
    assert got == expected, difference(got, expected)


def test_fixed_delay_gives_up_after_its_attempts_and_keeps_the_checkpoints(
    coordinator: Running, spark: Any, topic: str
) -> None:
    settings = {
        "restart-strategy.type": "fixed-delay",
        "restart-strategy.fixed-delay.attempts": "2",
        "restart-strategy.fixed-delay.delay": "100ms",
        "execution.checkpointing.externalized-checkpoint-retention": "RETAIN_ON_CANCELLATION",
    }
    job = build(unique("doomed"), topic, unique("stats"), max_records=50, settings=settings)
    # rounds of at least 0.3 s over 200 records: a checkpoint completes before the failure (with
    # rounds that write only what changed, the job once failed before its first checkpoint)
    job = replace(job, function=AlwaysFailing(RECORDS // 2, slow_ms=300))
    agent = in_process(job, coordinator, spark)

    with pytest.raises(Exception, match="every time"):  # Spark wraps it in its own type
        agent.run()

    assert agent.status is JobStatus.FAILED and len(agent.failures) == 3  # 1 + 2 restarts
    wait(lambda: job.id in coordinator.service.ended, what="the coordinator saw FAILED")
    ended = coordinator.service.ended[job.id]
    assert ended.status is JobStatus.FAILED and ended.history.restarts == 2
    assert ended.core.store.latest_checkpoint() is not None, "FAILED keeps the checkpoints"
    with coordinator.client() as client:
        entries = client.get(f"/jobs/{job.id}/exceptions").json()["exceptionHistory"]["entries"]
    assert len(entries) == 3


# --- savepoints: relocatable, disposable, claimed or not ----------------------------------------------


def take_savepoint_and_stop(
    coordinator: Running, spark: Any, topic: str, output: str, name: str, **options: Any
) -> tuple[Agent, str]:
    """Runs a job until its second completed checkpoint, then stops it with a savepoint."""
    # rounds of at least 0.3 s: the stop lands before the input ends
    job = replace(build(name, topic, output, max_records=60, **options), function=Slow(300))
    stopped: list[str] = []
    client = coordinator.client()

    def stop_after_two(agent: Agent) -> None:
        if not stopped and len(agent.completed_checkpoints) >= 2:
            target = str(coordinator.root / "savepoints")
            answer = client.post(f"/jobs/{job.id}/stop", json={"targetDirectory": target})
            stopped.append(answer.json()["request-id"])

    agent = in_process(job, coordinator, spark)
    agent.on_round = stop_after_two
    assert agent.run() is JobStatus.FINISHED and stopped
    answer = client.get(f"/jobs/{job.id}/savepoints/{stopped[0]}").json()
    client.close()
    return agent, str(answer["operation"]["location"])


def test_a_cancel_while_the_job_waits_to_restart_ends_it_canceled_after_the_restart(
    coordinator: Running, spark: Any, topic: str, tmp_path: Path
) -> None:
    """``flink cancel`` during a restart strategy's delay: the attempt it was addressed to is
    gone, and the next attempt of the same agent reads it and ends the job CANCELED."""
    slow = {
        "restart-strategy.type": "fixed-delay",
        "restart-strategy.fixed-delay.delay": "4s",
        "restart-strategy.fixed-delay.attempts": "3",
    }
    job = build(unique("cancel"), topic, unique("stats"), 100, bounded=False, settings=slow)
    job = replace(job, function=FailingOnce(RECORDS // 4, str(tmp_path / "failed")))
    agent = in_process(job, coordinator, spark)
    result: list[JobStatus] = []
    thread = threading.Thread(target=lambda: result.append(agent.run()), daemon=True)
    thread.start()
    with coordinator.client() as client:
        wait(
            lambda: client.get(f"/jobs/{job.id}").json().get("state") == "RESTARTING",
            60,
            "RESTARTING",
        )
        cancelled = client.patch(f"/v1/jobs/{job.id}", params={"mode": "cancel"})
        assert cancelled.status_code == 202, cancelled.text
        thread.join(120)
        assert result == [JobStatus.CANCELED] and agent.restarts == 1
        wait(lambda: client.get(f"/jobs/{job.id}").json()["state"] == "CANCELED", 30, "CANCELED")


def test_stop_with_drain_ends_the_input_fires_its_windows_and_a_restore_finds_it_finished(
    coordinator: Running, kafka: KafkaUnderTest, spark: Any, expected: list[Output]
) -> None:
    """``flink stop --drain``: an unbounded job's input ends where reading stands (records
    written after are not read), the keyed function's end-of-input hook fires every window, the
    savepoint holds the ended input, and the job is FINISHED with exactly the reference of a
    bounded run over the records read. A savepoint asked for during the drain (a higher id)
    neither loses the drain's savepoint nor ends the job early."""
    topic = f"payments-{uuid.uuid4().hex[:8]}"
    assert generate(kafka.bootstrap, topic, RECORDS) == RECORDS
    output, name = unique("stats"), unique("drain")
    job = build(name, topic, output, max_records=500, bounded=False)
    stopped: list[str] = []
    client = coordinator.client()

    def drain_once_all_is_read(agent: Agent) -> None:
        if not stopped and sum(agent.source.positions.values()) >= RECORDS:
            target = str(coordinator.root / "savepoints")
            body = {"targetDirectory": target, "drain": True}
            stopped.append(client.post(f"/v1/jobs/{job.id}/stop", json=body).json()["request-id"])
            later = client.post(f"/jobs/{job.id}/savepoints", json={"target-directory": target})
            stopped.append(later.json()["request-id"])
            # written after the input ended: never read
            assert generate(kafka.bootstrap, topic, 500, start_id=RECORDS) == 500

    agent = in_process(job, coordinator, spark)
    agent.on_round = drain_once_all_is_read
    assert agent.run() is JobStatus.FINISHED and stopped
    drained, later = (
        client.get(f"/jobs/{job.id}/savepoints/{request}").json() for request in stopped
    )
    client.close()
    assert drained["status"]["id"] == later["status"]["id"] == "COMPLETED", (drained, later)
    got = read_output(coordinator.bootstrap, output)
    assert got == expected, difference(got, expected)

    status, again = run_in_process(
        job, coordinator, spark, restore=str(drained["operation"]["location"])
    )
    assert status is JobStatus.FINISHED and again.finished_before  # nothing left to do
    got = read_output(coordinator.bootstrap, output)
    assert got == expected, difference(got, expected)


def test_stop_with_savepoint_then_restore_latest_resumes_from_it_and_emits_nothing_twice(
    coordinator: Running, spark: Any, topic: str, expected: list[Output]
) -> None:
    output = unique("stats")
    name = unique("resume")
    settings = {
        "execution.checkpointing.externalized-checkpoint-retention": "NO_EXTERNALIZED_CHECKPOINTS"
    }
    _, savepoint = take_savepoint_and_stop(
        coordinator, spark, topic, output, name, settings=settings
    )
    wait(lambda: name in coordinator.service.ended, what="the job ended")

    job = build(name, topic, output, max_records=500, settings=settings)
    status, again = run_in_process(job, coordinator, spark, restore="latest")

    assert status is JobStatus.FINISHED and again.started_from == savepoint
    got = read_output(coordinator.bootstrap, output)
    assert got == expected, difference(got, expected)


def test_savepoints_are_listed_wherever_written_and_disposal_deletes_only_savepoints(
    coordinator: Running, spark: Any, topic: str
) -> None:
    name = unique("dispose")
    _, savepoint = take_savepoint_and_stop(coordinator, spark, topic, unique("stats"), name)
    with coordinator.client() as client:
        listed = client.get(f"/jobs/{name}/savepoints").json()["savepoints"]
        assert [(s["location"], s["kind"], s["exists"]) for s in listed] == [
            (savepoint, "stop", True)
        ]
        outside = client.post("/savepoint-disposal", json={"savepoint-path": "/etc"})
        checkpoint = next((coordinator.root / "checkpoints" / name).glob("chk-*"), None)
        not_savepoint = client.post(
            "/savepoint-disposal", json={"savepoint-path": str(checkpoint or coordinator.root)}
        )
        done = client.post("/savepoint-disposal", json={"savepoint-path": savepoint})
        again = client.get(f"/jobs/{name}/savepoints").json()["savepoints"]
    assert outside.status_code == 400 and "savepoint-path" in outside.json()["errors"][0]
    assert not_savepoint.status_code == 400
    assert done.status_code == 200 and done.json()["operation"] == {}
    assert not Path(savepoint).exists()
    assert [(s["status"], s["exists"]) for s in again] == [("DISPOSED", False)]


@pytest.mark.parametrize("claim", ["NO_CLAIM", "CLAIM"])
def test_claim_modes_decide_who_owns_the_restored_snapshot(
    coordinator: Running, spark: Any, topic: str, expected: list[Output], claim: str
) -> None:
    output = unique("stats")
    name = unique(f"claim-{claim.lower()}")
    _, savepoint = take_savepoint_and_stop(coordinator, spark, topic, output, name)
    before = sorted(p.name for p in Path(savepoint).rglob("*"))

    job = build(name, topic, output, max_records=500)
    status, _ = run_in_process(job, coordinator, spark, restore=savepoint, claim_mode=claim)

    assert status is JobStatus.FINISHED
    got = read_output(coordinator.bootstrap, output)
    assert got == expected, difference(got, expected)
    if claim == "NO_CLAIM":  # never touched
        assert sorted(p.name for p in Path(savepoint).rglob("*")) == before
    else:  # the job owned it: subsumed by its own checkpoints, then deleted
        wait(lambda: not Path(savepoint).exists(), what="the claimed savepoint deleted")


def test_a_no_claim_snapshot_may_be_deleted_once_the_first_checkpoint_completed(
    coordinator: Running, spark: Any, topic: str, expected: list[Output]
) -> None:
    """Flink's NO_CLAIM: once the restored job's first checkpoint completed, it no longer depends
    on the snapshot, which its owner may delete. The agent adopts the restored files as working
    files before its first round, so nothing reads the snapshot after the restore (before, the
    rounds read its bases until they were materialized again: deleted, the job failed)."""
    output = unique("stats")
    name = unique("deleted")
    _, savepoint = take_savepoint_and_stop(coordinator, spark, topic, output, name)
    settings = {"execution.checkpointing.interval": "200ms"}
    job = build(name, topic, output, max_records=50, settings=settings)
    agent = in_process(job, coordinator, spark, restore=savepoint, claim_mode="NO_CLAIM")
    deleted: list[int] = []

    def delete_after_the_first_checkpoint(running: Agent) -> None:
        if not deleted and running.completed_checkpoints:
            shutil.rmtree(savepoint)
            deleted.append(running.rounds)

    agent.on_round = delete_after_the_first_checkpoint
    status = agent.run()

    assert status is JobStatus.FINISHED and deleted and agent.restarts == 0, agent.failures
    assert agent.rounds > deleted[0], "no round ran after the snapshot was deleted"
    got = read_output(coordinator.bootstrap, output)
    assert got == expected, difference(got, expected)


def test_a_snapshot_of_another_max_parallelism_is_refused(
    coordinator: Running, spark: Any, topic: str
) -> None:
    name = unique("maxp")
    _, savepoint = take_savepoint_and_stop(coordinator, spark, topic, unique("stats"), name)
    job = replace(build(name, topic, unique("stats")), max_parallelism=256)
    with pytest.raises(ValueError, match="max parallelism 128"):
        in_process(job, coordinator, spark, restore=savepoint).run()


# --- at-least-once, and Flink's whole option set ---------------------------------------------------------


def test_at_least_once_checkpoints_do_not_wait_and_lose_nothing(
    coordinator: Running, spark: Any, topic: str, expected: list[Output]
) -> None:
    output = unique("stats")
    # checkpoints every 200 ms over rounds of 50 records a partition: two complete before the end
    # (at 1 s over rounds of 100, a fast machine ran the input through before the second)
    settings = {
        "execution.checkpointing.mode": "AT_LEAST_ONCE",
        "execution.checkpointing.interval": "200ms",
    }
    job = build(unique("alo-mode"), topic, output, max_records=50, settings=settings)
    agent = in_process(job, coordinator, spark)
    thread = threading.Thread(target=agent.run, daemon=True)
    thread.start()
    wait(lambda: len(agent.completed_checkpoints) >= 2, timeout_s=120, what="two checkpoints")
    agent.stop()
    thread.join(60)
    with coordinator.client() as client:  # nothing was processed while a checkpoint waited
        for checkpoint_id in agent.completed_checkpoints:
            details = client.get(f"/jobs/{job.id}/checkpoints/details/{checkpoint_id}").json()
            keyed = [s for s in details["subtasks"] if s["subtask_id"].startswith("keyed-")]
            assert keyed and all(s["alignment"]["processed"] == 0 for s in keyed), details

    again = build(job.id, topic, output, max_records=500, settings=settings)
    status, _ = run_in_process(again, coordinator, spark, restore="latest")
    assert status is JobStatus.FINISHED
    got = Counter(read_output(coordinator.bootstrap, output))
    missing = Counter(expected) - got
    assert not missing, f"{sum(missing.values())} records lost"


def test_a_flink_configuration_with_every_2x_option_starts_and_lists_those_without_effect(
    coordinator: Running, spark: Any, topic: str, expected: list[Output]
) -> None:
    flink = yaml.safe_load((ROOT / "tests" / "flink-2.3-config.yaml").read_text())
    for key in list(flink):
        if key.endswith((".dir", "savepoint-dir")) or key.startswith("restart-strategy"):
            del flink[key]  # the test's storage roots and restart timing stay
    output = unique("stats")
    job = build(unique("flink-conf"), topic, output, settings={k: str(v) for k, v in flink.items()})
    status, agent = run_in_process(job, coordinator, spark)
    assert status is JobStatus.FINISHED
    assert "execution.checkpointing.file-merging.pool-blocking" in agent.no_effect
    assert "execution.checkpointing.file-merging.enabled" not in agent.no_effect  # FLIP-306
    with coordinator.client() as client:
        config = client.get(f"/jobs/{job.id}/config").json()
    assert "execution.checkpointing.file-merging.pool-blocking" in config["sparkpoint"]["no_effect"]
    assert config["execution-config"]["restart-strategy"].startswith("Restart with exponential")
    got = read_output(coordinator.bootstrap, output)
    assert got == expected, difference(got, expected)
