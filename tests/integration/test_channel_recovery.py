"""Restored channel state on real files (FLIP-547, `sparkpoint.agent.recovery.split`): filtered by the
executor function itself (run inline here instead of in a Spark job), admitted into real
channels, persisted again by `channel_state.persist` and restored again, across the seed's
rescale chain 1 -> 10 -> 1 -> 10."""

from __future__ import annotations

import ctypes
import mmap
import os
import threading
import time
import uuid
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from sparkpoint.agent.options import check_during_recovery
from sparkpoint.agent.recovery import channel_state
from sparkpoint.agent.recovery.filter_jobs import FilterJob
from sparkpoint.agent.recovery.split import (
    ChannelRecovery,
    FilterResult,
    FilterTask,
    ReadAhead,
    filter_restored,
)
from sparkpoint.agent.rounds.channels import Channel, Segment
from sparkpoint.agent.rounds.frames import KEY_GROUP_COLUMN, from_ipc, to_ipc
from sparkpoint.agent.state.backend import write_file
from sparkpoint.common.keygroups import key_group_range, key_groups
from sparkpoint.common.settings import CheckpointConfig, ConfigError

MAX_PARALLELISM = 128
RECORDS_PER_SEGMENT = 2_000
SEGMENTS = 5


def ranges(parallelism: int) -> list:
    return [key_group_range(MAX_PARALLELISM, parallelism, i) for i in range(parallelism)]


def inline(tasks: list[FilterTask]) -> Future[list[FilterResult]]:
    """What the agent's Spark job does with the tasks, on this thread."""
    done: Future[list[FilterResult]] = Future()
    done.set_result([filter_restored(task) for task in tasks])
    return done


def in_flight_segments(channel_dir: Path) -> list[Segment]:
    """A parallelism-1 job's in-flight records: segments as stage 1 writes them."""
    segments = []
    for k in range(SEGMENTS):
        users = [f"u{(k * RECORDS_PER_SEGMENT + n) % 997}" for n in range(RECORDS_PER_SEGMENT)]
        frame = pd.DataFrame({"user": users, "amount": range(RECORDS_PER_SEGMENT)})
        frame[KEY_GROUP_COLUMN] = key_groups(frame["user"].to_numpy(), MAX_PARALLELISM)
        data = to_ipc(frame)
        name = f"s0000/f{k:010d}.arrow"
        (channel_dir / "s0000").mkdir(parents=True, exist_ok=True)
        (channel_dir / name).write_bytes(data)
        segments.append(Segment(k + 1, name, len(frame), len(data)))
    return segments


def restored_files(
    source: Path,
) -> tuple[list[Segment], list[channel_state.ChannelStateFile]]:
    """`in_flight_segments` as a restore reads them from a parallelism-1 checkpoint."""
    segments = in_flight_segments(source)
    files = [
        channel_state.ChannelStateFile(
            0, k, str(source / s.path), s.rows, s.size, (0, 127), exact=True
        )
        for k, s in enumerate(segments)
    ]
    return segments, files


def rows_of(path: str, groups: tuple[int, int]) -> tuple[str, int, int]:
    """A file beside ``path`` with only its rows of ``groups``: (path, rows, bytes)."""
    frame = from_ipc(path)
    frame = frame[frame[KEY_GROUP_COLUMN].between(*groups)].reset_index(drop=True)
    data = to_ipc(frame)
    target = f"{path}.{groups[0]}-{groups[1]}.arrow"
    Path(target).write_bytes(data)
    return target, len(frame), len(data)


def checkpoint(
    channels: list[Channel], recovery: ChannelRecovery, channel_dir: Path, target: Path,
    checkpoint_id: int = 0,
) -> list[channel_state.ChannelStateFile]:  # fmt: skip
    """An unaligned snapshot of every subtask (nothing processed) with the channel state the
    agent's snapshot takes, read back as a restore reads it."""
    target.mkdir(parents=True)
    files = []
    for i, channel in enumerate(channels):
        in_flight = recovery.channel_state(channel, checkpoint_id)
        groups = key_group_range(MAX_PARALLELISM, len(channels), i)
        handles, _ = channel_state.persist(
            in_flight, str(channel_dir), str(target), i, (groups.start, groups.end)
        )
        if handles:
            files += channel_state.read_manifest(handles[0].path, i)
    return files


def restore(
    files: list[channel_state.ChannelStateFile], parallelism: int, channel_dir: Path,
    during_recovery: bool = True, capacity: int = 1 << 30,
) -> tuple[list[Channel], ChannelRecovery]:  # fmt: skip
    new_ranges = ranges(parallelism)
    channels = [Channel(i, capacity) for i in range(parallelism)]
    shares = channel_state.assign(files, new_ranges)
    recovery = ChannelRecovery.adopt(
        7, shares, new_ranges, channels, str(channel_dir), during_recovery, batch_bytes=capacity
    )
    return channels, recovery


def recover(recovery: ChannelRecovery, channels: list[Channel], channel_dir: Path) -> int:
    """Steps until every file is filtered; returns how many steps declined a trigger."""
    for declined in range(100):
        if recovery.not_ready(channels) is None:
            return declined
        recovery.step(channels, str(channel_dir), MAX_PARALLELISM, inline)
    raise AssertionError("filtering never ended")


def rows(files: list[channel_state.ChannelStateFile]) -> pd.DataFrame:
    frames = [from_ipc(f.path) for f in files]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def test_the_rescale_chain_1_10_1_10_persists_each_in_flight_record_once(tmp_path: Path) -> None:
    """Checkpoints during each recovery hold every original record exactly once, each in a file
    of the subtask owning its key group: the bytes stay those of the original (Flink before
    FLIP-547: 10x, then 100x)."""
    original_segments = in_flight_segments(tmp_path / "run0")
    original = rows([
        channel_state.ChannelStateFile(0, k, str(tmp_path / "run0" / s.path), s.rows, s.size, (0, 127), exact=True)
        for k, s in enumerate(original_segments)
    ])  # fmt: skip
    original_bytes = sum(s.size for s in original_segments)
    channel = Channel(0)
    for segment in original_segments:
        channel.append(segment.path, segment.rows, segment.size)
    files = checkpoint([channel], ChannelRecovery(), tmp_path / "run0", tmp_path / "chk-1")
    persisted_bytes: list[int] = []
    for step, parallelism in enumerate([10, 1, 10], start=2):
        channel_dir = tmp_path / f"run{step}"
        channels, recovery = restore(files, parallelism, channel_dir)
        declined = recover(recovery, channels, channel_dir)
        # only the first rescale filters: later, every file's key groups lie in one subtask's
        assert (declined > 0) == (step == 2), "triggers wait while files are filtered"
        assert recovery.read_bytes == (original_bytes if step == 2 else 0), "each file read once"
        files = checkpoint(channels, recovery, channel_dir, tmp_path / f"chk-{step}")

        persisted = rows(files)
        assert len(persisted) == len(original), f"after the rescale to {parallelism}"
        key = ["user", "amount"]
        assert (
            persisted.sort_values(key)
            .reset_index(drop=True)[key]
            .equals(original.sort_values(key).reset_index(drop=True)[key])
        )
        for state_file in files:  # every file holds only its subtask's key groups
            held = from_ipc(state_file.path)[KEY_GROUP_COLUMN]
            assert held.between(*state_file.key_groups).all()
        persisted_bytes.append(sum(f.size for f in files))
    # the files' Arrow framing aside (10 files where there were 5), the same bytes at every step
    assert persisted_bytes[0] < 1.10 * original_bytes, (persisted_bytes, original_bytes)
    assert persisted_bytes[0] == persisted_bytes[1] == persisted_bytes[2], persisted_bytes


def test_a_full_channel_makes_filtered_segments_wait_and_snapshots_carry_them(
    tmp_path: Path,
) -> None:
    """Channels of one byte: each filter task takes one restored file, the first filtered segment
    enters its channel and the rest wait (spilled) in order; a snapshot meanwhile carries both,
    new input waits, and processing lets them in one by one."""
    _segments, files = restored_files(tmp_path / "run0")
    channels, recovery = restore(files, 2, tmp_path / "run1", capacity=1)
    assert recovery.holds_input() and recovery.not_ready(channels) is not None
    recover(recovery, channels, tmp_path / "run1")

    assert recovery.spilled > 0
    for i, channel in enumerate(channels):
        assert len(channel.segments) == 1, "one segment fills a one-byte channel"
        assert len(recovery.spilled_segments(i)) == SEGMENTS - 1
    channels[0].add_barrier(9)  # a barrier placed while segments wait
    channels[1].add_barrier(9)
    snapshot = checkpoint(channels, recovery, tmp_path / "run1", tmp_path / "chk", 9)
    assert len(rows(snapshot)) == SEGMENTS * RECORDS_PER_SEGMENT, "queued and spilled, once each"

    order = []
    while recovery.holds_input():
        for channel in channels:  # stage 2 processes what is queued
            order += [s.path for s in channel.consumed(list(channel.segments))]
        recovery.admit(channels)
    order += [s.path for s in channels[0].segments]
    names = [p for p in order if p.startswith("s0000/")]
    assert len(names) == SEGMENTS and names == sorted(names), "restored order kept"
    assert channels[0].barriers[0][1] == recovery.restored_through[0], "restored data precedes it"
    assert channels[1].barriers[0][1] == recovery.restored_through[1]


def test_without_during_recovery_every_segment_is_queued_and_triggers_wait_until_processed(
    tmp_path: Path,
) -> None:
    _segments, files = restored_files(tmp_path / "run0")
    channels, recovery = restore(files, 2, tmp_path / "run1", during_recovery=False, capacity=1)
    assert not recovery.holds_input(), "queued at once, whatever the capacity"
    assert [len(c.segments) for c in channels] == [SEGMENTS, SEGMENTS]
    assert channels[1].segments[0].key_groups == (64, 127), "stage 2 keeps its own rows"
    channels[1].append("s0001/new.arrow", 1, 1)
    for channel in channels:
        subtask, why = recovery.not_ready(channels) or ("", "")
        assert subtask == f"keyed-{channel.subtask}" and "during-recovery" in why
        channel.consumed(list(channel.segments)[:SEGMENTS])
    assert recovery.not_ready(channels) is None, "new input does not hold checkpoints back"


def test_without_a_rescale_files_are_queued_as_they_are_and_checkpoints_go_on(
    tmp_path: Path,
) -> None:
    segments, files = restored_files(tmp_path / "run0")
    channels, recovery = restore(files, 1, tmp_path / "run1")
    assert recovery.not_ready(channels) is None and not recovery.filtering()
    assert [s.rows for s in channels[0].segments] == [s.rows for s in segments]


def test_checkpoints_during_recovery_need_unaligned_and_output_recovered_downstream() -> None:
    during = CheckpointConfig(unaligned_during_recovery=True)
    with pytest.raises(ConfigError) as refused:
        check_during_recovery(during)
    assert refused.value.field == "execution.checkpointing.unaligned.during-recovery.enabled"
    assert "unaligned.enabled: true" in str(refused.value)
    assert "recover-output-on-downstream.enabled: true" in str(refused.value)
    check_during_recovery(
        CheckpointConfig(
            unaligned=True,
            unaligned_recover_output_on_downstream=True,
            unaligned_during_recovery=True,
        )
    )
    check_during_recovery(CheckpointConfig())


def test_a_file_queued_as_it_is_between_two_split_ones_keeps_its_place(tmp_path: Path) -> None:
    """Restored order A, C, B: A and B span both new subtasks and are split, C lies within
    subtask 0's key groups and is queued as it is. Subtask 0 must see A's rows, then C, then
    B's: A and B are never split as one batch around C."""
    source = tmp_path / "run0"
    a, c, b = in_flight_segments(source)[:3]
    c_path, c_rows, c_size = rows_of(str(source / c.path), (0, 31))
    files = [
        channel_state.ChannelStateFile(
            0, 0, str(source / a.path), a.rows, a.size, (0, 127), exact=True
        ),
        channel_state.ChannelStateFile(0, 1, c_path, c_rows, c_size, (0, 31), exact=True),
        channel_state.ChannelStateFile(
            0, 2, str(source / b.path), b.rows, b.size, (0, 127), exact=True
        ),
    ]
    channels, recovery = restore(files, 2, tmp_path / "run1")
    recover(recovery, channels, tmp_path / "run1")
    assert not recovery.holds_input()

    first = [from_ipc(str(tmp_path / "run1" / s.path)) for s in channels[0].segments]
    assert [s.key_groups for s in channels[0].segments] == [None, (0, 31), None]
    assert len(first[0]) + len(first[2]) == sum(
        len(from_ipc(str(source / s.path)).query(f"{KEY_GROUP_COLUMN} <= 63")) for s in (a, b)
    )
    assert (
        first[0]["amount"].tolist()
        == from_ipc(str(source / a.path)).query(f"{KEY_GROUP_COLUMN} <= 63")["amount"].tolist()
    ), "A's rows first, in their order"
    assert len(channels[1].segments) == 2, "subtask 1 gets A's and B's other rows"


def test_a_file_of_an_older_snapshot_is_split_even_within_one_subtasks_key_groups(
    tmp_path: Path,
) -> None:
    """Snapshots written before channel state recorded ``exact`` re-linked whole files under a
    narrower tag: such a file (tag 0-63, rows of every key group) is split, not queued as it
    is, so a checkpoint during recovery never persists the rows of 64-127 again."""
    source = tmp_path / "run0"
    segment = in_flight_segments(source)[0]
    legacy = channel_state.ChannelStateFile(
        0, 0, str(source / segment.path), segment.rows, segment.size, (0, 63)
    )
    channels, recovery = restore([legacy], 2, tmp_path / "run1")
    assert recovery.not_ready(channels) is not None, "split first"
    recover(recovery, channels, tmp_path / "run1")
    files = checkpoint(channels, recovery, tmp_path / "run1", tmp_path / "chk")
    held = rows(files)
    original = from_ipc(str(source / segment.path))
    assert len(held) == int((original[KEY_GROUP_COLUMN] <= 63).sum())
    assert held[KEY_GROUP_COLUMN].between(0, 63).all()
    assert all(f.exact for f in files), "persisted again as exact"


def test_the_filter_jobs_go_to_spark_together_and_may_finish_in_any_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first job splits each subtask's first batch (small, so processing starts early), the
    second every other batch; both are submitted at once, so the second runs on the cores the
    first leaves instead of after it. Whichever finishes first, each subtask's segments enter
    in the restored order."""
    segments, files = restored_files(tmp_path / "run0")
    monkeypatch.setattr("sparkpoint.agent.recovery.split.FIRST_BATCH_BYTES", segments[0].size)
    channels, recovery = restore(files, 2, tmp_path / "run1")
    submitted: list[tuple[list[FilterTask], Future[list[FilterResult]]]] = []

    def hold(tasks: list[FilterTask]) -> Future[list[FilterResult]]:
        submitted.append((tasks, Future()))
        return submitted[-1][1]

    recovery.step(channels, str(tmp_path / "run1"), MAX_PARALLELISM, hold)
    assert [[len(t.files) for t in tasks] for tasks, _ in submitted] == [[1], [SEGMENTS - 1]]
    assert recovery.not_ready(channels) is not None, "declined until both are split"

    for tasks, future in reversed(submitted):  # the big second job finishes first
        future.set_result([filter_restored(task) for task in tasks])
        recovery.step(channels, str(tmp_path / "run1"), MAX_PARALLELISM, hold)
    assert len(submitted) == 2, "nothing submitted again"
    assert recovery.not_ready(channels) is None and not recovery.holds_input()
    for i, channel in enumerate(channels):
        held = pd.concat([from_ipc(str(tmp_path / "run1" / s.path)) for s in channel.segments])
        mine = rows(files).query(f"{KEY_GROUP_COLUMN}.between({i * 64}, {i * 64 + 63})")
        assert held["amount"].tolist() == mine["amount"].tolist(), "the restored order"


def test_a_failed_filter_task_leaves_no_segment_file_behind(tmp_path: Path) -> None:
    """A task writes each new subtask's rows as it reads the restored files: when one is missing
    (the task fails, and the job with it), nothing it began is left under the channels."""
    segments, files = restored_files(tmp_path / "run0")
    channel_dir = tmp_path / "run1"
    task = FilterTask(
        1, [(files[0].path, (0, 127)), (str(tmp_path / "gone.arrow"), (0, 127))],
        MAX_PARALLELISM, 2, str(channel_dir), "r1",
    )  # fmt: skip
    with pytest.raises(FileNotFoundError):
        filter_restored(task)
    assert [p for p in channel_dir.rglob("*") if p.is_file()] == []

    result = filter_restored(
        FilterTask(1, task.files[:1], MAX_PARALLELISM, 2, str(channel_dir), "r1")
    )
    assert sum(rows for _, rows, _ in result.outputs.values()) == segments[0].rows
    assert sorted(p.name for p in channel_dir.rglob("*") if p.is_file()) == ["r1.arrow"] * 2


def test_a_filter_task_puts_its_outputs_whole_where_the_channels_are_not_local(
    tmp_path: Path,
) -> None:
    """Channel storage that is not a local path (fsspec's memory file system here, as an object
    store would be): each new subtask's output is put whole when the task ends."""
    from sparkpoint.agent.state.backend import read_table

    segments, files = restored_files(tmp_path / "run0")
    channel_dir = f"memory://filter-{tmp_path.name}"
    task = FilterTask(
        1, [(f.path, (0, 127)) for f in files[:2]], MAX_PARALLELISM, 2, channel_dir, "r1"
    )
    result = filter_restored(task)
    assert sorted(result.outputs) == [0, 1]
    held = 0
    for subtask, (name, rows, size) in result.outputs.items():
        table, read = read_table(f"{channel_dir}/{name}")
        groups = table[KEY_GROUP_COLUMN].to_pylist()
        assert table.num_rows == rows and read == size
        assert all(g // 64 == subtask for g in groups), "only the subtask's key groups"
        held += rows
    assert held == segments[0].rows + segments[1].rows


@pytest.mark.parametrize("local", [True, False])
def test_a_filter_task_that_fails_reports_its_own_error_and_puts_nothing(
    tmp_path: Path, local: bool
) -> None:
    """The second restored file is not an Arrow stream: the task's error is the reader's, and
    neither a local channel directory nor a remote one gets any output."""
    _segments, files = restored_files(tmp_path / "run0")
    broken = tmp_path / "broken.arrow"
    broken.write_bytes(b"not an arrow stream")
    channel_dir = str(tmp_path / "run1") if local else f"memory://broken-{tmp_path.name}"
    task = FilterTask(
        1, [(files[0].path, (0, 127)), (str(broken), (0, 127))],
        MAX_PARALLELISM, 2, channel_dir, "r1",
    )  # fmt: skip
    with pytest.raises(pa.ArrowInvalid):
        filter_restored(task)
    if local:
        assert not (tmp_path / "run1").exists() or not any(
            p.is_file() for p in (tmp_path / "run1").rglob("*")
        )
    else:
        import fsspec

        fs = fsspec.filesystem("memory")
        assert not fs.exists(f"/broken-{tmp_path.name}")


def in_page_cache(path: Path) -> bool:
    """Whether every page of the file is in the page cache: ``mincore`` of a mapping never
    touched (a read, even one that may not wait, starts the kernel's read-ahead)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as mapped:
        pages = (len(mapped) + mmap.PAGESIZE - 1) // mmap.PAGESIZE
        vector = ctypes.create_string_buffer(pages)
        view = np.frombuffer(mapped, dtype=np.uint8)
        assert libc.mincore(ctypes.c_void_p(view.ctypes.data), len(mapped), vector) == 0
        del view  # the mapping closes only once nothing points into it
        return all(b & 1 for b in vector.raw)


def test_a_filter_task_asks_the_disk_for_the_files_ahead_of_the_one_it_splits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before each restored file is read, the files after it are requested from the disk up to
    the read-ahead bytes (the kernel reads them while the task splits): requested ones end up
    in the page cache without being read, the others are not asked for yet."""
    segments, files = restored_files(tmp_path / "run0")
    paths = [Path(f.path) for f in files]
    for path in paths:  # out of the page cache, as restored state mostly is
        fd = os.open(path, os.O_RDONLY)
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
    if any(map(in_page_cache, paths)):
        pytest.skip("the files stay in memory here (tmpfs): there is nothing to read ahead")
    monkeypatch.setattr(
        "sparkpoint.agent.recovery.split.READ_AHEAD_BYTES", 2 * segments[0].size - 1
    )

    ahead = ReadAhead([str(p) for p in paths] + [str(tmp_path / "gone.arrow")])
    table, _ = ahead.read(0)
    assert table.num_rows == segments[0].rows
    assert ahead.requested == 3, "the file read and two ahead of it"
    deadline = time.monotonic() + 5
    while not all(map(in_page_cache, paths[:3])) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [in_page_cache(p) for p in paths] == [True, True, True, False, False]
    ahead.read(1)
    assert ahead.requested == 4
    for k in (2, 3, 4):
        ahead.read(k)
    assert ahead.requested == 6, "a file that is gone is asked for, and left to its read"
    with pytest.raises(FileNotFoundError):
        ahead.read(5)


def test_a_filter_task_fetches_the_files_ahead_from_an_object_store_together(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Restored files on an object store (fsspec's memory file system here): the next ones are
    fetched while one is split, several at once, no more than the fetches ahead (nor, where
    the files' sizes are known, than the bytes ahead), and the split is the same as from local
    files."""
    from sparkpoint.agent.state.backend import read_file

    segments, files = restored_files(tmp_path / "run0")
    remote = [f"memory://ahead-{tmp_path.name}/{Path(f.path).name}" for f in files]
    for path, state_file in zip(remote, files, strict=True):
        write_file(path, Path(state_file.path).read_bytes())
    monkeypatch.setattr("sparkpoint.agent.recovery.split.FETCHES_AHEAD", 2)
    together = threading.Barrier(2, timeout=10)
    fetched: list[str] = []

    def fetch(path: str) -> bytes:
        fetched.append(path)
        if path in remote[:2]:
            together.wait()  # the first two are under way at the same time, or this breaks
        return read_file(path)

    monkeypatch.setattr("sparkpoint.agent.recovery.split.read_file", fetch)
    with ReadAhead(remote) as ahead:
        table, size = ahead.read(0)
        assert (table.num_rows, size) == (segments[0].rows, segments[0].size)
        assert ahead.requested == 3, "the file read and two ahead of it"
        ahead.read(1)
        assert ahead.requested == 4
    assert set(fetched) <= set(remote[:4])
    monkeypatch.setattr("sparkpoint.agent.recovery.split.FETCHES_AHEAD", 8)
    monkeypatch.setattr("sparkpoint.agent.recovery.split.READ_AHEAD_BYTES", segments[1].size)
    with ReadAhead(remote[2:], [s.size for s in segments[2:]]) as ahead:  # sizes known
        ahead.read(0)
        assert ahead.requested == 2, "the next file only: it fills the bytes ahead"

    channel_dir = tmp_path / "run1"
    split = {}
    for paths in (remote, [f.path for f in files]):
        task = FilterTask(
            1, [(p, (0, 127)) for p in paths], MAX_PARALLELISM, 2, str(channel_dir), "r"
        )
        result = filter_restored(task)
        split[paths[0]] = {
            subtask: from_ipc(str(channel_dir / name)).to_dict("list")
            for subtask, (name, _, _) in result.outputs.items()
        }
    assert split[remote[0]] == split[files[0].path], "the same split as from local files"


def test_a_restored_file_all_within_one_new_subtask_goes_to_it_whole(tmp_path: Path) -> None:
    """A restored file whose rows all belong to one new subtask (its key groups were that
    subtask's, but it was tagged with the old wider range): that subtask gets every row, in
    order, and no other subtask gets a file (the task writes such a file whole, unfiltered)."""
    frame = pd.DataFrame({"user": [f"u{n}" for n in range(4_000)], "amount": range(4_000)})
    frame[KEY_GROUP_COLUMN] = key_groups(frame["user"].to_numpy(), MAX_PARALLELISM)
    frame = frame[frame[KEY_GROUP_COLUMN] >= 64].reset_index(drop=True)  # new subtask 1's
    source = tmp_path / "old.arrow"
    source.write_bytes(to_ipc(frame))
    task = FilterTask(1, [(str(source), (0, 127))], MAX_PARALLELISM, 2, str(tmp_path / "ch"), "r")
    result = filter_restored(task)
    assert set(result.outputs) == {1}
    name, rows, _ = result.outputs[1]
    assert rows == len(frame)
    assert from_ipc(str(tmp_path / "ch" / name))["amount"].tolist() == frame["amount"].tolist()


def test_a_filter_job_reaches_spark_only_after_the_one_submitted_before_it(spark: Any) -> None:
    """The job splitting each subtask's first rows is submitted first and must run first: the
    next job waits until Spark's scheduler has it, not merely until it was built. Here the
    first job's thread is slow between building its job and submitting it; the second job
    still gets the higher job id (the recovery pool runs jobs in that order)."""
    sc = spark.sparkContext
    first, second = FilterJob(), FilterJob()
    groups = [f"order-{uuid.uuid4().hex[:8]}-{n}" for n in (1, 2)]

    def run(job: FilterJob, after: FilterJob | None, group: str, pause_s: float) -> None:
        if after is not None:
            after.wait_scheduled(sc, 10.0)
        sc.setLocalProperty("spark.scheduler.pool", "recovery")
        sc.setJobGroup(group, group)
        job.group = group
        rdd = sc.parallelize([1], 1).map(lambda n: n)
        job.built.set()
        time.sleep(pause_s)  # built, not yet submitted
        rdd.collect()

    threads = [
        threading.Thread(target=run, args=(first, None, groups[0], 0.5)),
        threading.Thread(target=run, args=(second, first, groups[1], 0.0)),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    tracker = sc.statusTracker()
    ids = [tracker.getJobIdsForGroup(group) for group in groups]
    assert all(ids), ids
    assert max(ids[0]) < min(ids[1]), f"the first job was submitted first: {ids}"


@pytest.mark.parametrize("how", ["ended", "cancelled"])
def test_a_filter_job_that_never_reaches_spark_does_not_hold_up_the_next(
    spark: Any, how: str
) -> None:
    """The next job waits for this one to be listed by Spark, but not for a job that failed
    before it got there, nor once the attempt ended: it goes on at once instead of waiting out
    its timeout (here 600 s; the thread is given 30)."""
    job = FilterJob()
    job.group = f"never-{uuid.uuid4().hex[:8]}"
    job.built.set()
    getattr(job, how).set()
    waiting = threading.Thread(
        target=job.wait_scheduled, args=(spark.sparkContext, 600.0), daemon=True
    )
    waiting.start()
    waiting.join(30)
    assert not waiting.is_alive()
