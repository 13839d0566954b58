"""Checkpointing during recovery (FLIP-547): writes bench/results/recovery.json.

1. **Time to the first checkpoint after a restore**, as restored channel state grows (10 MB,
   100 MB, 1 GB), restored with parallelism 2 from a parallelism-1 checkpoint (a rescale: every
   restored file is filtered), with ``unaligned.during-recovery.enabled`` on; and off for the
   sizes that stay affordable (then the first checkpoint waits until every restored record is
   processed, Flink's behaviour before the FLIP). From the agent's start (Spark warm, coordinator
   running on the embedded broker, 200 ms interval) to its first completed checkpoint. The
   agent is made `PRODUCER_READY_S` before its start: an agent process starts Spark before it
   registers, so its producer is ready by then (a new one is not for 0.5-1 s).
   ``first_checkpoint_floor_s`` is one sequential read of the state: the first checkpoint waits
   for the split, which reads all of it, so none comes sooner. ``first_checkpoint_spread_floor``
   is the largest floor over the fastest measured first checkpoint: with the small restores as
   fast as they are, no split brings the spread below it on this disk.
   The channel state is made, not recorded: segments of the example job's records exactly as
   stage 1 writes them (its JSON decoding, its map, its key groups), persisted with the agent's
   own channel-state writer into a checkpoint directory with a ``_metadata``, restored by path.
2. **Restore throughput**: channel-state bytes filtered per second against a sequential read of
   the same files, both with the files' pages dropped from the page cache first.
3. **Inflation across rescales 1 -> 10 -> 1 -> 10**, a checkpoint during each recovery, with the
   agent's own functions (filter, admit, persist, read back) on the 100 MB state, without Spark:
   rows and bytes persisted against the original in-flight records.
4. **A split from an object store**: one filter task over 64 MB of restored files on moto's S3
   server, the next files fetched ahead and one at a time.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import threading
import time
import uuid
from concurrent.futures import Future
from pathlib import Path
from unittest import mock

from recording import start_coordinator, write_results

from sparkpoint.agent.example import example_job, generate, payments, positive
from sparkpoint.agent.formats import JsonValues
from sparkpoint.agent.recovery import channel_state
from sparkpoint.agent.recovery.restore import SOURCE_FORMAT
from sparkpoint.agent.recovery.split import (
    ChannelRecovery,
    FilterResult,
    FilterTask,
    filter_restored,
)
from sparkpoint.agent.rounds.channels import Channel, Segment
from sparkpoint.agent.rounds.frames import KEY_GROUP_COLUMN, to_ipc
from sparkpoint.agent.runtime import Agent, AgentOptions
from sparkpoint.agent.spark.session import spark_session
from sparkpoint.common.avro import EventCodec
from sparkpoint.common.broker import EmbeddedBroker
from sparkpoint.common.events import SnapshotType, StateHandle, StateHandleKind
from sparkpoint.common.keygroups import key_group_range, key_groups
from sparkpoint.common.metadata import Handle, SnapshotMetadata, SubtaskState
from tests.s3_server import start_s3_server

MB = 1024 * 1024
SIZES_MB = (10, 100, 1024)
WITHOUT_UP_TO_MB = 100
"""Sizes measured with during-recovery off too (processing 1 GB first takes minutes)."""
SEGMENT_ROWS = 50_000
PRODUCER_READY_S = 1.2
"""A new idempotent producer publishes only once it has its producer id, 0.5-1 s after it is
made (measured on the embedded broker). An agent process starts Spark first (8-15 s), so its
registration never waits for that; here Spark is warm, and the wait would be counted."""
MAX_PARALLELISM = 128
SETTINGS = {
    "execution.checkpointing.interval": "200ms",
    "execution.checkpointing.min-pause": "0ms",
    "execution.checkpointing.unaligned.enabled": "true",
    "execution.checkpointing.aligned-checkpoint-timeout": "0ms",
    "execution.checkpointing.unaligned.recover-output-on-downstream.enabled": "true",
}


def segment_bytes() -> tuple[bytes, int]:
    """One segment of the example job's records, as stage 1 writes it, and its rows."""
    events = list(payments(SEGMENT_ROWS))
    values = [e.to_json() for e in events]
    keys = [e.account.encode() for e in events]
    frame, _ = JsonValues().decode(values, keys, list(range(len(values))))
    frame = positive(frame).reset_index(drop=True)
    frame[KEY_GROUP_COLUMN] = key_groups(frame["account"].to_numpy(), MAX_PARALLELISM)
    return to_ipc(frame), len(frame)


def in_flight_checkpoint(
    root: Path, job_id: str, size_mb: int, data: bytes, rows: int
) -> tuple[str, int]:
    """A parallelism-1 checkpoint whose channel state is ``size_mb`` of segments; (its path, its
    channel-state bytes)."""
    channel_dir = root / f"channels-{size_mb}"
    (channel_dir / "s0000").mkdir(parents=True)
    segments = []
    for k in range(max(1, size_mb * MB // len(data))):
        name = f"s0000/f{k:010d}.arrow"
        (channel_dir / name).write_bytes(data)
        segments.append(Segment(k + 1, name, rows, len(data)))
    target = root / job_id / "chk-1"
    target.mkdir(parents=True)
    handles, persisted = channel_state.persist(segments, str(channel_dir), str(target), 0, (0, 127))
    shutil.rmtree(channel_dir)
    source = target / "source-0.json"
    source.write_text(f'{{"format": {SOURCE_FORMAT}, "positions": {{}}, "end_of_input": false}}')
    subtasks = (
        SubtaskState("source-0", 0, (Handle(str(source), StateHandleKind.SOURCE_POSITIONS, 0),)),
        SubtaskState("keyed-0", persisted, tuple(as_handle(h) for h in handles)),
    )
    metadata = SnapshotMetadata(
        job_id, 1, SnapshotType.CHECKPOINT, int(time.time() * 1000), subtasks, 1, MAX_PARALLELISM
    )
    (target / "_metadata").write_bytes(metadata.to_json(str(target)))
    return str(target), persisted


def as_handle(handle: StateHandle) -> Handle:
    groups = None
    if handle.key_group_start is not None and handle.key_group_end is not None:
        groups = (handle.key_group_start, handle.key_group_end)
    return Handle(handle.path, handle.kind, handle.size_bytes, handle.shared, groups)


def drop_from_page_cache(directory: str) -> None:
    for path in Path(directory).iterdir():
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def sequential_read_mb_s(directory: str) -> float:
    drop_from_page_cache(directory)
    started, read = time.monotonic(), 0
    for path in sorted(Path(directory).glob("*.arrow")):
        with open(path, "rb", buffering=0) as f:
            while chunk := f.read(8 * MB):
                read += len(chunk)
    return read / MB / (time.monotonic() - started)


def first_checkpoint(
    bootstrap: str, codec: EventCodec, spark: object, root: Path, path: str, during: bool
) -> dict[str, float]:
    """Restores ``path`` with parallelism 2 and times the first completed checkpoint."""
    job_id = Path(path).parent.name
    settings = SETTINGS | {
        "execution.checkpointing.unaligned.during-recovery.enabled": str(during).lower()
    }
    job = example_job(job_id, "payments", f"out-{uuid.uuid4().hex[:6]}", settings=settings)
    options = AgentOptions(
        bootstrap, parallelism=2, restore=path, checkpoint_dir=str(root / "checkpoints")
    )
    agent = Agent(job, options, codec, spark=spark)
    marks: dict[str, float] = {}

    def watch(running: Agent) -> None:
        if running.completed_checkpoints and "first" not in marks:
            marks["first"] = time.monotonic()
            recovery = running.restoring
            if recovery.filter_started is not None and recovery.filter_ended is not None:
                marks["filter_s"] = recovery.filter_ended - recovery.filter_started
                marks["read_mb"] = recovery.read_bytes / MB
            running.stop()

    agent.on_round = watch
    drop_from_page_cache(path)
    time.sleep(PRODUCER_READY_S)
    started = time.monotonic()
    runner = threading.Thread(target=agent.run)
    runner.start()
    runner.join(900)
    assert "first" in marks, "no checkpoint completed"
    result = {"first_checkpoint_s": round(marks["first"] - started, 2)}
    if "filter_s" in marks:
        result["filter_s"] = round(marks["filter_s"], 2)
        result["filter_read_mb"] = round(marks["read_mb"], 1)
    return result


def inline(tasks: list[FilterTask]) -> Future[list[FilterResult]]:
    done: Future[list[FilterResult]] = Future()
    done.set_result([filter_restored(task) for task in tasks])
    return done


def inflation(root: Path, path: str) -> dict[str, object]:
    """The rescale chain 1 -> 10 -> 1 -> 10 with the agent's functions: each step restores the
    previous step's checkpoint, filters, and checkpoints before processing anything."""
    metadata = SnapshotMetadata.from_json((Path(path) / "_metadata").read_bytes(), path)
    manifest = next(
        h.path
        for s in metadata.subtasks
        for h in s.handles
        if h.kind is StateHandleKind.CHANNEL_STATE and h.path.endswith(".json")
    )
    files = channel_state.read_manifest(manifest, 0)
    original_rows = sum(f.rows for f in files)
    original_bytes = sum(f.size for f in files)
    steps = []
    for step, parallelism in enumerate((10, 1, 10), start=2):
        ranges = [key_group_range(MAX_PARALLELISM, parallelism, i) for i in range(parallelism)]
        channels = [Channel(i) for i in range(parallelism)]
        channel_dir = root / f"chain-{step}"
        recovery = ChannelRecovery.adopt(
            step, channel_state.assign(files, ranges), ranges, channels, str(channel_dir), True
        )
        while recovery.filtering() or recovery.futures:
            recovery.step(channels, str(channel_dir), MAX_PARALLELISM, inline)
        target = root / f"chain-chk-{step}"
        target.mkdir()
        files = []
        for i, channel in enumerate(channels):
            segments = recovery.channel_state(channel, 0)  # as an unaligned snapshot takes it
            groups = (ranges[i].start, ranges[i].end)
            handles, _ = channel_state.persist(segments, str(channel_dir), str(target), i, groups)
            if handles:
                files += channel_state.read_manifest(handles[0].path, i)
        rows = sum(f.rows for f in files)
        steps.append({
            "parallelism": parallelism,
            "rows_ratio": round(rows / original_rows, 4),
            "bytes_ratio": round(sum(f.size for f in files) / original_bytes, 4),
            "files": len(files),
        })  # fmt: skip
    return {
        "chain": "1 -> 10 -> 1 -> 10",
        "original_bytes": original_bytes,
        "steps": steps,
        "inflation_ratio": steps[-1]["rows_ratio"],
    }


OBJECT_STORE_MB = 64
"""Restored bytes split from an object store (moto's S3 server) by one filter task."""


def object_store_split(data: bytes) -> dict[str, float]:
    """One filter task over `OBJECT_STORE_MB` of restored files on moto's S3 server, with the
    next files fetched ahead (four at a time) and one at a time: restored MB/s each."""
    import s3fs

    from sparkpoint.agent.recovery import split as recovery

    s3 = start_s3_server()
    try:
        with mock.patch.dict(os.environ, s3.environment()):
            bucket = s3.bucket()
            count = OBJECT_STORE_MB * MB // len(data)
            paths = [f"{bucket}/chk-1/f{k:05d}.arrow" for k in range(count)]
            s3fs.S3FileSystem(skip_instance_cache=True).pipe({p: data for p in paths})
            rates = {}
            for name, ahead, threads in (("one_at_a_time", 0, 1), ("ahead", 8, 4)):
                channel_dir = tempfile.mkdtemp(prefix="sparkpoint-bench-split-")
                task = FilterTask(
                    1, [(p, (0, 127)) for p in paths], MAX_PARALLELISM, 2, channel_dir, "r"
                )
                with mock.patch.multiple(recovery, FETCHES_AHEAD=ahead, FETCH_THREADS=threads):
                    started = time.monotonic()
                    result = filter_restored(task)
                    elapsed = time.monotonic() - started
                rates[f"{name}_mb_s"] = round(result.read_bytes / MB / elapsed, 1)
                shutil.rmtree(channel_dir)
            return rates
    finally:
        s3fs.S3FileSystem.clear_instance_cache()  # bound to this server's endpoint
        s3.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=",".join(map(str, SIZES_MB)), help="MB, comma-separated")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    codec = EventCodec()
    root = Path(tempfile.mkdtemp(prefix="sparkpoint-bench-recovery-"))
    os.environ["SPARKPOINT_TOPIC_PREFIX"] = f"r{uuid.uuid4().hex[:8]}."
    data, rows = segment_bytes()
    runs: dict[str, dict[str, object]] = {}
    with EmbeddedBroker() as broker:
        service = start_coordinator(broker.bootstrap, root, partitions=4)
        generate(broker.bootstrap, "payments", 1_000)
        spark = spark_session("sparkpoint-bench-recovery", "local[2]")
        warm_up, _ = in_flight_checkpoint(root, "recovery-warm-up", 2, data, rows)
        first_checkpoint(broker.bootstrap, codec, spark, root, warm_up, during=True)  # not kept
        for size in sizes:
            path, persisted = in_flight_checkpoint(root, f"recovery-{size}mb", size, data, rows)
            run: dict[str, object] = {"channel_state_mb": round(persisted / MB, 1)}
            run["disk_sequential_read_mb_s"] = round(sequential_read_mb_s(path), 1)
            on = first_checkpoint(broker.bootstrap, codec, spark, root, path, during=True)
            run["during_recovery"] = on
            if "filter_s" in on:
                run["restore_mb_s"] = round(persisted / MB / on["filter_s"], 1)
                run["restore_vs_disk"] = round(
                    float(run["restore_mb_s"]) / float(run["disk_sequential_read_mb_s"]), 3
                )
                # no first checkpoint comes sooner: it waits for the split (the FLIP's phase 1),
                # which reads all of the state
                on["first_checkpoint_floor_s"] = round(
                    persisted / MB / float(run["disk_sequential_read_mb_s"]), 2
                )
            if size <= WITHOUT_UP_TO_MB:
                off_path, _ = in_flight_checkpoint(root, f"recovery-off-{size}mb", size, data, rows)
                run["without_during_recovery"] = first_checkpoint(
                    broker.bootstrap, codec, spark, root, off_path, during=False
                )
            runs[f"{size}mb"] = run
            print(size, "MB:", run, flush=True)
        service.stop()
    chain = inflation(
        root, in_flight_checkpoint(root, "chain", min(100, max(sizes)), data, rows)[0]
    )
    shutil.rmtree(root, ignore_errors=True)
    store = object_store_split(data)
    print("object store:", store, flush=True)
    firsts = [float(r["during_recovery"]["first_checkpoint_s"]) for r in runs.values()]  # type: ignore[index]
    floors = [float(r["during_recovery"]["first_checkpoint_floor_s"]) for r in runs.values()]  # type: ignore[index]
    results = {
        "benchmark": "recovery",
        "master": "local[2]",
        "rescale": "1 -> 2",
        "sizes": runs,
        "first_checkpoint_spread": round(max(firsts) / min(firsts), 2),
        "first_checkpoint_spread_floor": round(max(floors) / min(firsts), 2),
        "inflation": chain,
        "object_store_split": store,
    }
    print(results)
    print(f"wrote {write_results('recovery', results)}")


if __name__ == "__main__":
    main()
