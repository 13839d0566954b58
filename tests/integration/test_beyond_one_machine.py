"""Beyond one machine: checkpoints, savepoints, state, channel segments and the file sink on
S3-compatible storage (moto's server, through s3fs), keyed state kept on local disk as its files
go to the store (read once per machine, local recovery), and the agent on a Spark standalone
cluster started from the pyspark package, a worker killed mid-run. The committed output is compared with
the plain-Python reference each time."""

from __future__ import annotations

import json
import logging
import os
import posixpath
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import s3fs

from sparkpoint.agent.checkpointing.acks import state_handle
from sparkpoint.agent.checkpointing.copies import SubtaskCopy, copy_snapshot
from sparkpoint.agent.example import generate, payments, reference_output
from sparkpoint.agent.job import ValueState
from sparkpoint.agent.recovery.restore import Restored, take_handle
from sparkpoint.agent.rounds.channels import SegmentFiles
from sparkpoint.agent.runtime import Agent, AgentOptions
from sparkpoint.agent.spark.standalone import StandaloneCluster
from sparkpoint.agent.state import local, runs
from sparkpoint.agent.state.backend import read_file
from sparkpoint.agent.state.books import StateBackend
from sparkpoint.agent.state.changelog import Run, changes
from sparkpoint.agent.state.runs import Written
from sparkpoint.common.avro import EventCodec
from sparkpoint.common.events import AcknowledgeCheckpoint, JobStatus, SnapshotType, StateHandleKind
from sparkpoint.common.keygroups import KeyGroupRange
from sparkpoint.common.metadata import SnapshotMetadata
from sparkpoint.common.storage import PathOutsideRoots, Storage
from tests.agent_jobs import FAST_CHECKPOINTS as FAST
from tests.agent_jobs import build
from tests.conftest import KafkaUnderTest
from tests.integration.test_agent import Output, difference, killed, read_output
from tests.running_coordinator import Running, coordinator_in_thread
from tests.s3_server import S3Server, start_s3_server

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parents[2]
RECORDS = 6_000


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    server = start_s3_server(tmp_path_factory.mktemp("moto") / "moto.log")
    with pytest.MonkeyPatch.context() as env:
        for key, value in server.environment().items():
            env.setenv(key, value)
        try:
            yield server
        finally:
            server.stop()


@pytest.fixture(scope="module")
def bucket(s3: S3Server) -> str:
    return s3.bucket()


@pytest.fixture(scope="module")
def coordinator(
    kafka: KafkaUnderTest, tmp_path_factory: pytest.TempPathFactory, bucket: str
) -> Iterator[Running]:
    with pytest.MonkeyPatch.context() as env:
        env.setenv("SPARKPOINT_TOPIC_PREFIX", f"t{uuid.uuid4().hex[:10]}.")
        yield from coordinator_in_thread(kafka, tmp_path_factory.mktemp("s3"), storage=bucket)


@pytest.fixture(scope="module")
def payments_topic(kafka: KafkaUnderTest) -> str:
    topic = f"payments-{uuid.uuid4().hex[:8]}"
    assert generate(kafka.bootstrap, topic, RECORDS) == RECORDS
    return topic


@pytest.fixture(scope="module")
def expected() -> list[Output]:
    return reference_output(payments(RECORDS), end_of_input=True)


def agent(
    coordinator: Running,
    bucket: str,
    name: str,
    topic: str,
    output: str,
    *args: str,
    crash_at: str | None = None,
    sink: str = "kafka",
    master: str = "local[2]",
    wait: bool = True,
    max_records: int = 300,
) -> subprocess.Popen[str]:
    env = dict(os.environ)
    env |= {
        "TEST_JOB_NAME": name, "TEST_INPUT": topic, "TEST_OUTPUT": output, "TEST_SINK": sink,
        "TEST_MAX_RECORDS": str(max_records), "PYTHONPATH": str(ROOT),
    }  # fmt: skip
    env.pop("SPARKPOINT_CRASH_AT", None)
    if crash_at:
        env["SPARKPOINT_CRASH_AT"] = crash_at
    command = [
        sys.executable, "-m", "sparkpoint.cli", "-v", "agent", "tests/agent_jobs.py:job",
        "--bootstrap", coordinator.bootstrap, "--master", master,
        "--checkpoint-dir", f"{bucket}/checkpoints", *args,
    ]  # fmt: skip
    process = subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    if wait:
        process.wait(300)
    return process


def finished(process: subprocess.Popen[str]) -> subprocess.CompletedProcess[str]:
    out, err = process.communicate(timeout=300)
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


def read_parquet(url: str) -> list[Output]:
    fs = s3fs.S3FileSystem(skip_instance_cache=True)
    out: list[Output] = []
    for path in sorted(fs.glob(f"{url}/part-*.parquet")):
        with fs.open(path, "rb") as source:
            for row in pq.read_table(source).to_pylist():
                out.append((row["kind"], row["account"], row["id"], row["value"]))
    return sorted(out)


def objects(url: str) -> list[str]:
    return s3fs.S3FileSystem(skip_instance_cache=True).find(url)


@pytest.mark.chaos  # `make chaos`: 45-56 s; in make test, the S3 tests below cover the object
# store paths, and the user project and test_initial_state a kill with a rescaled resume
def test_everything_on_s3_through_a_kill_and_a_rescaled_restore(
    coordinator: Running, s3: S3Server, bucket: str, spark: Any, payments_topic: str,
    expected: list[Output], caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    """Checkpoints with their state, channel segments, and the file sink's part files on S3: an
    agent SIGKILLed mid-batch with segments in flight, restored from S3 with parallelism 3; the
    finished job started again from latest (in this process, on the session's Spark: a process
    would spend 10-15 s starting its own) restores its final checkpoint from S3 and emits
    nothing."""
    name = f"s3-{uuid.uuid4().hex[:8]}"
    output, channels = f"{bucket}/out/{name}", f"{bucket}/channels"
    common = ("--channel-dir", channels)

    # killed in the second round after the first completed checkpoint (rounds processed by then
    # wrote key-group state): a fixed round (mid-batch:3) came before any checkpoint had
    # completed on S3 once in a clean-clone run
    first = finished(agent(coordinator, bucket, name, payments_topic, output, *common,
                           crash_at="mid-batch-after-complete:2", sink="files"))  # fmt: skip
    assert killed(first), first.stderr[-3000:]
    stored = objects(f"{bucket}/checkpoints/{name}")
    assert any(p.endswith("/_metadata") for p in stored), "a completed checkpoint on S3"
    assert any("/taskowned/" in p for p in stored), "key-group state written by tasks to S3"
    in_flight = [p for p in objects(channels) if f"/{name}-agent-" in p and p.endswith(".arrow")]
    assert in_flight, "the killed run had segments in flight, left for the next run to clean up"
    second = finished(agent(coordinator, bucket, name, payments_topic, output, *common,
                            "--restore", "latest", "--parallelism", "3", sink="files"))  # fmt: skip
    assert second.returncode == 0, second.stderr[-3000:]
    assert "restoring from s3://" in second.stderr

    got = read_parquet(output)
    assert got == expected, difference(got, expected)
    assert not [p for p in objects(output) if "inprogress" in p], "no part file left in progress"
    assert objects(f"{channels}") == [], "each run's segments are gone once it ended"

    parts = objects(output)
    spark.sparkContext.environment.update(s3.environment())  # as in the savepoints test below
    job = build(name, payments_topic, output, max_records=300, sink="files")
    options = AgentOptions(
        coordinator.bootstrap, restore="latest", checkpoint_dir=f"{bucket}/checkpoints",
        channel_dir=channels,
    )  # fmt: skip
    again = Agent(job, options, EventCodec(), spark=spark)
    with caplog.at_level(logging.INFO, logger="sparkpoint.agent"):
        assert again.run() is JobStatus.FINISHED and again.finished_before
    assert "restored from its final checkpoint (its input ended there): finished" in caplog.text
    assert objects(output) == parts, "nothing published again"


def test_storage_roots_confine_s3_urls(bucket: str) -> None:
    storage = Storage([f"{bucket}/checkpoints"])
    storage.write_atomic(f"{bucket}/checkpoints/job/chk-1/_metadata", b"meta")
    assert storage.read(f"{bucket}/checkpoints/job/chk-1/_metadata") == b"meta"
    for outside in (
        f"{bucket}/elsewhere/_metadata",
        f"{bucket}/checkpoints/../elsewhere/_metadata",
        f"{bucket}-other/checkpoints/job/_metadata",
        "s3://another-bucket/checkpoints/job/_metadata",
    ):
        with pytest.raises(PathOutsideRoots):
            storage.write_atomic(outside, b"x")
    assert objects(f"{bucket}/elsewhere") == []


def record_first_arguments(monkeypatch: pytest.MonkeyPatch, method: str) -> list[str]:
    """The first argument of every call of an async s3fs method from now on."""
    seen: list[str] = []
    original = getattr(s3fs.S3FileSystem, method)

    async def recorded(self: s3fs.S3FileSystem, first: str, *args: Any, **kwargs: Any) -> Any:
        seen.append(first)
        return await original(self, first, *args, **kwargs)

    monkeypatch.setattr(s3fs.S3FileSystem, method, recorded)
    return seen


def record_lookups(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths s3fs looks up (``_info``: a HEAD, or a LIST for a prefix) from now on."""
    return record_first_arguments(monkeypatch, "_info")


def test_deletes_on_an_object_store_ask_nothing_first(
    bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A discarded checkpoint's shared files go in one bulk delete, nothing asked first (a
    missing one too: a discard may be retried), its directory goes whole; the agent's segment
    and state files likewise."""
    from sparkpoint.agent.state.backend import delete_file, delete_files, read_file, write_file

    storage = Storage([f"{bucket}/d"])
    shared = [f"{bucket}/d/job/shared/{name}" for name in ("a", "b")]
    for path in [*shared, f"{bucket}/d/job/chk-3/_metadata", f"{bucket}/d/job/chk-3/x"]:
        write_file(path, b"data")
    assert read_file(shared[0]) == b"data"
    looked_up, called = record_lookups(monkeypatch), record_calls(monkeypatch)
    gone = storage.delete([*shared, f"{bucket}/d/job/shared/missing"], f"{bucket}/d/job/chk-3")
    assert "delete_object" not in called, f"a DELETE per file: {called}"
    assert gone == 4 and objects(f"{bucket}/d") == []
    assert not [p for p in looked_up if "/shared/" in p], looked_up
    write_file(f"{bucket}/d/segment", b"s")
    write_file(f"{bucket}/d/state", b"s")
    delete_file(f"{bucket}/d/segment")
    delete_files([f"{bucket}/d/state", f"{bucket}/d/state"])
    assert objects(f"{bucket}/d") == []
    assert not [p for p in looked_up if p.endswith(("/segment", "/state"))], looked_up


def count_in_flight(monkeypatch: pytest.MonkeyPatch, *methods: str) -> list[int]:
    """From now on, the most calls of these async s3fs methods in flight at once, in ``[0]``
    (set it back to 0 to count afresh)."""
    in_flight, most = [0], [0]

    def counted(method: Any) -> Any:
        async def wrapper(self: s3fs.S3FileSystem, *args: Any, **kwargs: Any) -> Any:
            in_flight[0] += 1
            most[0] = max(most[0], in_flight[0])
            try:
                return await method(self, *args, **kwargs)
            finally:
                in_flight[0] -= 1

        return wrapper

    for name in methods:
        monkeypatch.setattr(s3fs.S3FileSystem, name, counted(getattr(s3fs.S3FileSystem, name)))
    return most


def test_a_rounds_files_are_in_flight_together_on_an_object_store(
    bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stage 2 writes a round's state files, and reads those its worker has not cached, as
    requests in flight together (a round trip for them all, not one per key group); each file
    is still one PUT or GET of its whole bytes, and a read asks nothing first (no HEAD for the
    size)."""
    from sparkpoint.agent.state.backend import read_files, write_files

    most = count_in_flight(monkeypatch, "_pipe_file", "_cat_file")
    files = {f"{bucket}/round/kg-{group:05d}.arrow": bytes([group]) * 1000 for group in range(16)}
    write_files(files)
    assert most[0] > 1, "the PUTs went one after another"
    assert sorted(objects(f"{bucket}/round")) == sorted(p[len("s3://") :] for p in files)
    most[0] = 0
    looked_up = record_lookups(monkeypatch)
    assert read_files(list(files)) == files
    assert most[0] > 1, "the GETs went one after another"
    assert looked_up == [], "a read asked for the size first"
    assert read_files([]) == {}


def record_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The S3 API operations s3fs calls from now on (``delete_objects``, ``copy_object``...)."""
    return record_first_arguments(monkeypatch, "_call_s3")


def test_a_rounds_garbage_is_one_bulk_delete_and_copies_stay_on_the_store(
    s3: S3Server, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The working state files a round replaced go in one DeleteObjects per bucket (a DELETE
    each held the agent's loop for a round trip per key group), missing ones too; a copy from
    one S3 path to another (a savepoint's staged output, a state file) is made by the store,
    a snapshot's copies are in flight together, and a gone source still says so."""
    from sparkpoint.agent.state.backend import (
        copy_file,
        delete_files,
        link_or_copy_all,
        read_file,
        write_file,
    )

    other = s3.bucket()
    garbage = [f"{bucket}/gc/kg-{group:05d}/v1.arrow" for group in range(40)]
    garbage += [f"{other}/gc/kg-{group:05d}/v1.arrow" for group in range(3)]
    for path in garbage:
        write_file(path, b"v1")
    called = record_calls(monkeypatch)
    delete_files([*garbage, f"{bucket}/gc/kg-99999/v1.arrow"])
    assert called == ["delete_objects", "delete_objects"], called
    assert objects(f"{bucket}/gc") == [] and objects(f"{other}/gc") == []

    write_file(f"{bucket}/gc/part-0", b"staged output")
    called.clear()
    copy_file(f"{bucket}/gc/part-0", f"{bucket}/savepoint/sink/part-0")
    assert called == ["head_object", "copy_object"], called
    assert read_file(f"{bucket}/savepoint/sink/part-0") == b"staged output"
    with pytest.raises(FileNotFoundError):
        copy_file(f"{bucket}/gc/published", f"{bucket}/savepoint/sink/published")

    pairs = [(f"{bucket}/gc/kg-{g:05d}", f"{bucket}/chk-1/kg-{g:05d}") for g in range(12)]
    for source, _ in pairs:
        write_file(source, source.encode())
    most = count_in_flight(monkeypatch, "_cp_file")
    called.clear()
    link_or_copy_all(pairs)
    assert most[0] > 1, "the copies went one after another"
    assert called.count("copy_object") == len(pairs) and "get_object" not in called, called
    assert all(read_file(target) == source.encode() for source, target in pairs)
    with pytest.raises(FileNotFoundError):
        link_or_copy_all([*pairs, (f"{bucket}/gc/gone", f"{bucket}/chk-1/gone")])


@pytest.mark.chaos  # `make chaos`: 100-125 s of the suite's budget; bench/cluster.py runs the cluster
def test_the_agent_on_a_standalone_cluster_through_a_lost_worker_and_a_sigkill(
    coordinator: Running, kafka: KafkaUnderTest, bucket: str
) -> None:
    """Two workers of one core; the first agent loses a worker mid-run, then is SIGKILLed; the
    second restores from S3 on the surviving worker. Executors share no disk with the driver:
    everything goes through S3. Half the module's input: on one core with S3 (moto) a round
    takes about 10 s here, and the other half took 70-90 s more."""
    payments_topic = f"payments-{uuid.uuid4().hex[:8]}"
    assert generate(kafka.bootstrap, payments_topic, RECORDS // 2) == RECORDS // 2
    expected = reference_output(payments(RECORDS // 2), end_of_input=True)
    name, output = f"cluster-{uuid.uuid4().hex[:8]}", f"stats-{uuid.uuid4().hex[:8]}"
    with StandaloneCluster(workers=2, cores=1, memory="1g") as cluster:
        first = agent(coordinator, bucket, name, payments_topic, output,
                      crash_at="after-ack:4", master=cluster.master_url, wait=False)  # fmt: skip
        deadline = time.monotonic() + 240
        while not any(p.endswith("/_metadata") for p in objects(f"{bucket}/checkpoints/{name}")):
            assert first.poll() is None, finished(first).stderr[-3000:]
            assert time.monotonic() < deadline, "no checkpoint completed on the cluster"
            time.sleep(0.5)
        cluster.kill_worker(1)  # a lost machine, executors and all, mid-run
        result = finished(first)
        assert killed(result), result.stderr[-3000:]
        second = finished(agent(coordinator, bucket, name, payments_topic, output,
                                "--restore", "latest", master=cluster.master_url))  # fmt: skip
        assert second.returncode == 0, second.stderr[-3000:]

    got = read_output(kafka.bootstrap, output)
    assert got == expected, difference(got, expected)


def test_metadata_and_part_files_are_one_put_on_an_object_store(
    bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No temporary object and no rename (on S3 a copy and a delete): the final key is written
    once, and a PUT shows all of an object or nothing."""
    import pandas as pd

    from sparkpoint.agent.job import DeliveryGuarantee, FileSink
    from sparkpoint.agent.sinks.files import FileSinkWriter

    def no_rename(*args: object, **kwargs: object) -> None:
        raise AssertionError("renamed on an object store")

    monkeypatch.setattr(s3fs.S3FileSystem, "mv", no_rename)
    Storage([f"{bucket}/cp"]).write_atomic(f"{bucket}/cp/job/chk-7/_metadata", b"m" * 100_000)
    staged = f"{bucket}/staged/out-r1-s0-abc.arrow"
    frame = pd.DataFrame({"kind": ["total"], "account": ["a"], "id": [1], "value": [5]})
    with s3fs.S3FileSystem(skip_instance_cache=True).open(staged, "wb") as out:
        import pyarrow as pa

        with pa.ipc.new_stream(out, pa.Schema.from_pandas(frame, preserve_index=False)) as writer:
            writer.write_table(pa.Table.from_pandas(frame, preserve_index=False))
    sink = FileSinkWriter(FileSink(f"{bucket}/sink", DeliveryGuarantee.EXACTLY_ONCE), "job")
    assert sink.publish_epoch(3, [staged]) == 1
    assert sink.publish_epoch(3, [staged]) == 0, "committed before: not written again"
    assert objects(f"{bucket}/cp/job") == [f"{bucket[5:]}/cp/job/chk-7/_metadata"]
    assert [p.rsplit("/", 1)[1] for p in objects(f"{bucket}/sink")] == [
        "part-0000000003-r1-s0-abc.parquet"
    ]
    assert read_parquet(f"{bucket}/sink") == [("total", "a", 1, 5)]


@pytest.mark.chaos  # `make chaos`: 45-60 s; the local savepoint test moves and restores one
def test_savepoints_on_s3_are_self_contained_and_restore_with_another_parallelism(
    coordinator: Running, s3: S3Server, bucket: str, spark: Any, payments_topic: str,
    expected: list[Output],
) -> None:  # fmt: skip
    """A savepoint and a stop-with-savepoint to s3://, listed, every state file inside the
    savepoint's prefix; the job restored from the stop's savepoint with parallelism 3."""
    # the session's Spark started before the S3 server: its Python workers learn the
    # credentials from the context's environment (as spark.executorEnv.* on a cluster)
    spark.sparkContext.environment.update(s3.environment())
    name, output = f"s3-savepoints-{uuid.uuid4().hex[:8]}", f"stats-{uuid.uuid4().hex[:8]}"
    job = build(name, payments_topic, output, max_records=200)
    target = f"{bucket}/savepoints"
    requests: dict[str, str] = {}
    client = coordinator.client()

    def operate(agent: Agent) -> None:
        if "savepoint" not in requests and agent.completed_checkpoints:
            body = {"target-directory": target, "cancel-job": False}
            requests["savepoint"] = client.post(f"/jobs/{job.id}/savepoints", json=body).json()[
                "request-id"
            ]
        elif (
            "savepoint" in requests
            and "stop" not in requests
            and len(agent.completed_checkpoints) >= 3
        ):
            answer = client.post(f"/jobs/{job.id}/stop", json={"targetDirectory": target}).json()
            requests["stop"] = answer["request-id"]

    options = AgentOptions(coordinator.bootstrap, checkpoint_dir=f"{bucket}/checkpoints")
    agent = Agent(job, options, EventCodec(), spark=spark)
    agent.on_round = operate
    assert agent.run() is JobStatus.FINISHED and "stop" in requests

    def location(trigger: str) -> str:
        answer = client.get(f"/jobs/{job.id}/savepoints/{trigger}").json()
        assert answer["status"]["id"] == "COMPLETED", answer
        return str(answer["operation"]["location"])

    first, stopped = location(requests["savepoint"]), location(requests["stop"])
    fs = s3fs.S3FileSystem(skip_instance_cache=True)
    for savepoint in (first, stopped):
        assert savepoint.startswith(f"{target}/")
        metadata = json.loads(fs.cat(f"{savepoint}/_metadata"))
        paths = [h["path"] for s in metadata["subtasks"] for h in s["state_handles"]]
        assert paths and all("://" not in p and not p.startswith("/") for p in paths), paths
        assert all(fs.exists(f"{savepoint}/{p}") for p in paths)
    listed = client.get(f"/jobs/{job.id}/savepoints").json()
    assert {first, stopped} <= {s["location"] for s in listed["savepoints"]}

    restored = Agent(
        job,
        AgentOptions(coordinator.bootstrap, checkpoint_dir=f"{bucket}/checkpoints",
                     restore=stopped, parallelism=3),
        EventCodec(),
        spark=spark,
    )  # fmt: skip
    assert restored.run() is JobStatus.FINISHED and restored.parallelism == 3
    client.close()
    got = read_output(coordinator.bootstrap, output)
    assert got == expected, difference(got, expected)


def test_local_recovery_reads_restored_state_from_this_machines_disk_and_not_after_a_move(
    coordinator: Running, s3: S3Server, bucket: str, payments_topic: str,
    expected: list[Output], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """Local backup on, state on S3: an agent on "machine A" (a local directory) is killed; the
    restart on "machine B" finds no local copies, reads every restored file from S3 and is
    killed in turn; the restart on B again restores from B's disk: no restored state file is
    read from S3. The output is exact. Rounds of 0.3 s over 100 records a partition keep input
    left for both kills (a fast machine otherwise reaches the end of input on B first)."""
    name, output = f"local-{uuid.uuid4().hex[:8]}", f"stats-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("TEST_SLOW_MS", "300")

    def run(machine: str, *args: str, crash_at: str | None = None) -> tuple[str, int]:
        settings = {
            **FAST, "execution.checkpointing.local-backup.enabled": "true",
            "execution.checkpointing.local-backup.dirs": str(tmp_path / machine),
            "execution.state-recovery.from-local": "true",
        }  # fmt: skip
        monkeypatch.setenv("TEST_SETTINGS", json.dumps(settings))
        since = s3.log_size()
        done = finished(agent(coordinator, bucket, name, payments_topic, output, *args,
                              crash_at=crash_at, max_records=100))  # fmt: skip
        ok = killed(done) if crash_at else done.returncode == 0
        assert ok, done.stderr[-3000:]
        return done.stderr, s3.gets(f"/checkpoints/{name}/shared/", since)

    run("a", crash_at="mid-batch-after-complete:2")
    on_b, read_on_b = run("b", "--restore", "latest", crash_at="mid-batch-after-complete:2")
    restored = re.search(r"local recovery: 0 of (\d+) restored state files", on_b)
    assert restored and int(restored[1]) > 0, on_b[-3000:]
    assert read_on_b >= int(restored[1]), "moved: every restored file read from S3"
    again, read_again = run("b", "--restore", "latest")
    recovered = re.search(r"local recovery: (\d+) of (\d+) restored state files", again)
    assert recovered and recovered[1] == recovered[2] != "0", again[-3000:]
    assert read_again == 0, "restored from this machine's disk"
    got = read_output(coordinator.bootstrap, output)
    assert got == expected, difference(got, expected)


@pytest.mark.chaos  # two agent processes, about 65 s: `make chaos` (file merging's handles and
# admission are unit-tested, and test_agent_recovery runs a job with it on)
def test_file_merging_writes_a_checkpoints_copies_as_one_object_per_subtask_and_restores(
    coordinator: Running, bucket: str, payments_topic: str, expected: list[Output],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """File merging (FLIP-306) on, state on S3, rounds of 0.1 s, checkpoints every 2 s and key
    groups materialized every 2 s (many small files: runs and bases): a job SIGKILLed after its
    second completed checkpoint left in ``shared/`` only merged objects, at most one per subtask
    and checkpoint; the latest ``_metadata`` names segments of them (offset and state file), each
    inside its object; the restart reads the segments back and the output is exact. (How many
    segments an object holds depends on how many rounds a checkpoint saw, which a loaded machine
    changes: the file-level test below fills one with several.)"""
    name, output = f"merge-{uuid.uuid4().hex[:8]}", f"stats-{uuid.uuid4().hex[:8]}"
    settings = {
        **FAST, "execution.checkpointing.interval": "2s",
        "execution.checkpointing.file-merging.enabled": "true",
        "state.changelog.periodic-materialize.interval": "2s",
    }  # fmt: skip
    monkeypatch.setenv("TEST_SETTINGS", json.dumps(settings))
    monkeypatch.setenv("TEST_SLOW_MS", "100")  # rounds of 0.1 s: several runs a checkpoint
    first = finished(agent(coordinator, bucket, name, payments_topic, output,
                           crash_at="after-complete:2", max_records=30))  # fmt: skip
    assert killed(first), first.stderr[-3000:]
    job_dir = f"{bucket}/checkpoints/{name}"
    shared = objects(f"{job_dir}/shared")
    assert shared and all(posixpath.basename(p).startswith("merged-") for p in shared), shared
    latest = max(p for p in objects(job_dir) if p.endswith("/_metadata"))
    directory = f"s3://{posixpath.dirname(latest)}"
    metadata = SnapshotMetadata.from_json(read_file(f"s3://{latest}"), directory)
    keyed = [
        h for s in metadata.subtasks for h in s.handles if h.kind is StateHandleKind.KEYED_STATE
    ]
    assert keyed and all(h.offset is not None and h.segment for h in keyed), keyed[:3]
    fs = s3fs.S3FileSystem(skip_instance_cache=True)
    for handle in keyed:
        assert handle.path.removeprefix("s3://") in shared
        assert handle.offset is not None and handle.offset + handle.size <= fs.size(handle.path)
    checkpoint_id = int(posixpath.basename(posixpath.dirname(latest)).removeprefix("chk-"))
    # one per subtask and checkpoint, counting one in flight at the kill
    assert len(shared) <= 2 * (checkpoint_id + 1), (checkpoint_id, shared)

    second = finished(agent(coordinator, bucket, name, payments_topic, output,
                            "--restore", "latest", max_records=30))  # fmt: skip
    assert second.returncode == 0, second.stderr[-3000:]
    assert "restoring from s3://" in second.stderr
    got = read_output(coordinator.bootstrap, output)
    assert got == expected, difference(got, expected)


@pytest.mark.chaos  # five agent processes, about 100 s: `make chaos` (a kill and a rescaled
# restore on S3 stay in the suite)
def test_exactly_once_on_s3_through_a_sigkill_at_each_kill_point_in_turn(
    coordinator: Running, bucket: str, payments_topic: str, expected: list[Output],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """One job, its checkpoints and state on S3, SIGKILLed at each kill point in turn (after an
    acknowledgement, after a completion before the sink commits, inside a sink transaction, in
    a round after a completed checkpoint), each time restarted from its latest checkpoint, then
    run to its end: the committed output is exactly the reference. Rounds of 0.5 s over 60
    records a partition keep input left for every kill."""
    name, output = f"kills-{uuid.uuid4().hex[:8]}", f"stats-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("TEST_SLOW_MS", "500")
    restore: tuple[str, ...] = ()
    for point in ("after-ack:2", "after-complete:1", "mid-publish:1", "mid-batch-after-complete:2"):
        run = finished(agent(coordinator, bucket, name, payments_topic, output, *restore,
                             crash_at=point, max_records=60))  # fmt: skip
        assert killed(run), f"{point}: {run.stderr[-3000:]}"
        restore = ("--restore", "latest")
    last = finished(agent(coordinator, bucket, name, payments_topic, output, *restore,
                          max_records=60))  # fmt: skip
    assert last.returncode == 0, last.stderr[-3000:]
    assert "restoring from s3://" in last.stderr
    got = read_output(coordinator.bootstrap, output)
    assert got == expected, difference(got, expected)


# --- keyed state on local disk, its files on the store ---------------------------------------


STATE = {"total": ValueState("float64")}


def a_run(keys: int, offset: float = 0.0) -> Run:
    names = np.array([f"user-{i}" for i in range(keys)], dtype=object)
    groups = np.arange(keys, dtype=np.int64) % 8
    after = {"total": pd.Series(np.arange(keys, dtype="float64") + offset, index=names)}
    return changes({"total": pd.Series([], dtype="float64")}, after, STATE, names, groups)


@pytest.fixture
def empty_worker_cache() -> Iterator[None]:
    runs._CACHE.clear()
    runs._CACHE_BYTES = 0
    yield
    runs._CACHE.clear()
    runs._CACHE_BYTES = 0


def test_a_file_on_the_store_is_read_once_per_machine_then_mapped_from_local_disk(
    bucket: str, tmp_path: Path, empty_worker_cache: None
) -> None:
    local_dir = str(tmp_path / "local" / "job")
    path = f"{bucket}/local-state/r000000000001-s0000.arrow"
    size = runs.write(path, a_run(1000), local_dir)
    assert read_file(path) and os.path.getsize(local.cached(local_dir, path)) == size
    assert runs.cache_bytes() == 0, "mapped from local disk: no bytes held in memory"

    runs._CACHE.clear()  # another worker on this machine
    before = list(runs.DOWNLOADED)
    found = runs.load({path: None}, STATE, local_dir)
    assert before == runs.DOWNLOADED, "read from the local copy, not the store"
    assert found[path].rows["total"].num_rows == 1000

    runs._CACHE.clear()  # another machine: nothing local, read from the store and kept
    elsewhere = str(tmp_path / "elsewhere" / "job")
    runs.load({path: None}, STATE, elsewhere)
    assert runs.DOWNLOADED[0] == before[0] + 1 and os.path.exists(local.cached(elsewhere, path))


def test_a_checkpoint_copy_is_a_local_link_until_forgotten_and_a_restore_keeps_only_its_own(
    tmp_path: Path,
) -> None:
    local_dir = str(tmp_path / "job")
    working, copy = "s3://b/taskowned/a/state/r1.arrow", "s3://b/shared/run-1.arrow"
    assert not local.link(local_dir, working, copy), "no local copy of the working file"
    origin = Path(local.cached(local_dir, working))
    origin.parent.mkdir(parents=True)
    origin.write_bytes(b"run")
    assert local.link(local_dir, working, copy) and local.link(local_dir, working, copy)
    alias = Path(local.cached(local_dir, copy))
    assert alias.read_bytes() == b"run" and alias.stat().st_ino == origin.stat().st_ino

    assert local.keep_only(local_dir, [copy, "s3://b/shared/never-kept.arrow"]) == 1
    assert alias.exists() and not origin.exists()
    local.forget(local_dir, [copy])
    assert not alias.exists()
    assert local.job_local_dir("/a, /b", "job/1") == "/a/job_1"


def test_the_workers_memory_holds_at_most_its_budget_of_files_read_whole(
    bucket: str, empty_worker_cache: None
) -> None:
    paths = [f"{bucket}/local-state/r{i:012d}-s0000.arrow" for i in range(6)]
    sizes = [runs.write(p, a_run(2000, offset=i)) for i, p in enumerate(paths)]
    budget = 2 * max(sizes) + 1
    runs._CACHE.clear()
    runs._CACHE_BYTES = 0
    for path in paths:  # no local directory: each file is held in memory
        found = runs.load({path: None}, STATE, None, budget)
        assert found[path].rows["total"].num_rows == 2000
        assert runs.cache_bytes() <= budget
    assert list(runs._CACHE) == paths[-2:], "the oldest went first"
    runs.remember("huge", next(iter(runs._CACHE.values()))[0], budget + 1, budget)
    assert runs.cache_bytes() <= budget and "huge" not in runs._CACHE


@pytest.mark.parametrize("where", ["local disk", "S3"])
def test_file_merging_copies_are_segments_of_one_file_that_restore_as_the_runs_written(
    where: str, bucket: str, tmp_path: Path, empty_worker_cache: None
) -> None:
    """File merging at the level of files: a snapshot's new copies of three runs, the largest
    above the merged file's limit, are one merged file holding the two small ones in order and
    a whole copy of the large one. Their handles name the merged file with offsets; the
    ``_metadata`` written from them and read back gives the same segments, which load as the
    runs that were written (memory-mapped on local disk, range reads on the store), and the
    next incremental checkpoint references the segments without copying again."""
    root = str(tmp_path) if where == "local disk" else f"{bucket}/merging-{uuid.uuid4().hex[:8]}"
    backend = StateBackend(f"{root}/state")
    written: dict[str, Run] = {}
    for seq, keys in enumerate((100, 200, 5000), start=1):
        asked = backend.subtask_state(range(8), seq, 0, now=0.0)
        path, run = backend.run_path(seq, 0), a_run(keys, offset=seq)
        written[path] = run
        size = runs.write(path, run)
        backend.install(asked, Written((path, size, tuple(range(8))), None, {}), seq, now=0.0)
    sizes = sorted(
        os.path.getsize(p) if where == "local disk" else len(read_file(p)) for p in written
    )
    backend.merged_file_bytes = sizes[0] + sizes[1]

    plan = backend.plan(1, range(8), True, f"{root}/chk-1", f"{root}/shared")
    rest = SubtaskCopy(
        0, KeyGroupRange(0, 7), f"{root}/chk-1/sink-0.json", {}, [], f"{root}/chk-1", ""
    )
    copied = copy_snapshot(plan, rest, backend, SegmentFiles())
    handles = [state_handle(u) for u, _ in copied.plan]
    segments = [h for h in handles if h.offset is not None]
    assert len(segments) == 2 and len({h.path for h in segments}) == 1
    assert sorted(h.offset for h in segments) == [0, sizes[0]]
    assert len([h for h in handles if h.offset is None]) == 1, "the large run copied whole"
    assert len(read_file(segments[0].path)) == sizes[0] + sizes[1]
    whole = next(h.path for h in handles if h.offset is None)
    assert sorted(copied.new_files()) == sorted([segments[0].path, whole]), "what an abort deletes"

    codec = EventCodec()  # the acknowledgement as it travels
    sent = AcknowledgeCheckpoint("job", 1, "keyed-0", 0, 0, handles, 0, 0, 0, 0, 0, False)
    ack = codec.decode(codec.encode(sent))
    assert isinstance(ack, AcknowledgeCheckpoint) and ack.state_handles == handles
    metadata = SnapshotMetadata.from_acknowledgements("job", 1, SnapshotType.CHECKPOINT, 0, [ack])
    again = SnapshotMetadata.from_json(metadata.to_json(f"{root}/chk-1"), f"{root}/chk-1")
    restored = Restored(1, f"{root}/chk-1", False)
    for handle in again.subtasks[0].handles:
        take_handle(restored, "keyed-0", handle, f"{root}/shared/")
    assert set(restored.state_files) == {u.path for u, _ in copied.plan}
    runs._CACHE.clear()
    loaded = runs.load(dict.fromkeys(restored.state_files), STATE)
    by_seq = {f.seq: loaded[p] for p, f in restored.state_files.items()}
    for seq, path in enumerate(written, start=1):
        assert by_seq[seq].rows["total"].equals(written[path].rows["total"])

    backend.complete(1, is_savepoint=False)
    reused = backend.plan(2, range(8), True, f"{root}/chk-2", f"{root}/shared")
    assert [u.path for u, source in reused if source is None] == [u.path for u, _ in copied.plan]
