"""Channel state written by one parallelism and restored by another, twice (2 -> 4 -> 1), on
real files: every in-flight row reaches exactly one new subtask, in order, however often a
whole file is linked into later checkpoints."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from sparkpoint.agent.recovery import channel_state
from sparkpoint.agent.rounds.channels import Channel
from sparkpoint.agent.rounds.frames import KEY_GROUP_COLUMN, from_ipc, to_ipc
from sparkpoint.agent.rounds.process import keep_key_groups
from sparkpoint.agent.state.backend import link_or_copy
from sparkpoint.common.keygroups import key_group_range

MAX_PARALLELISM = 128


def restore(
    checkpoint: Path, old_parallelism: int, parallelism: int, channel_dir: Path
) -> list[Channel]:
    """What the agent does on restore: manifests read, files assigned and linked, queued with
    the key groups each one holds for its new subtask."""
    files = []
    for old in range(old_parallelism):
        files += channel_state.read_manifest(
            str(checkpoint / channel_state.manifest_name(old)), old
        )
    ranges = [key_group_range(MAX_PARALLELISM, parallelism, i) for i in range(parallelism)]
    channels = [Channel(i) for i in range(parallelism)]
    for subtask, share in channel_state.assign(files, ranges).items():
        mine = ranges[subtask]
        for f in share:
            name = f"s{subtask}/{checkpoint.name}-{f.old_subtask}-{f.order}.arrow"
            link_or_copy(f.path, str(channel_dir / name))
            overlap = (max(mine.start, f.key_groups[0]), min(mine.end, f.key_groups[1]))
            channels[subtask].append(name, f.rows, f.size, key_groups=overlap)
    return channels


def persist(channels: list[Channel], channel_dir: Path, checkpoint: Path) -> None:
    parallelism = len(channels)
    for i, channel in enumerate(channels):
        groups = key_group_range(MAX_PARALLELISM, parallelism, i)
        channel_state.persist(
            list(channel.segments), str(channel_dir), str(checkpoint), i, (groups.start, groups.end)
        )


def rows_seen(channels: list[Channel], channel_dir: Path) -> list[list[int]]:
    """Per subtask, the ids stage 2 would process, in order."""
    return [
        [
            i
            for s in channel.segments
            for i in keep_key_groups(from_ipc(str(channel_dir / s.path)), s.key_groups)["id"]
        ]
        for channel in channels
    ]


def test_rows_in_flight_survive_2_then_4_then_1_exactly_once_and_in_order(tmp_path: Path) -> None:
    ids = list(range(600))
    groups = [(i * 37) % MAX_PARALLELISM for i in ids]
    channel_dir = tmp_path / "run-1"
    channels = []
    for subtask in range(2):
        mine = key_group_range(MAX_PARALLELISM, 2, subtask)
        frame = pd.DataFrame({"id": ids, KEY_GROUP_COLUMN: groups})
        frame = frame[frame[KEY_GROUP_COLUMN].between(mine.start, mine.end)]
        channel = Channel(subtask)
        for k, part in enumerate([frame.iloc[:100], frame.iloc[100:]]):
            name = f"s{subtask}/seg-{k}.arrow"
            (channel_dir / f"s{subtask}").mkdir(parents=True, exist_ok=True)
            (channel_dir / name).write_bytes(to_ipc(part))
            channel.append(name, len(part), (channel_dir / name).stat().st_size)
        channels.append(channel)
    first = tmp_path / "chk-1"
    persist(channels, channel_dir, first)

    four = restore(first, 2, 4, tmp_path / "run-2")
    assert sorted(i for s in rows_seen(four, tmp_path / "run-2") for i in s) == ids
    second = tmp_path / "chk-2"
    persist(four, tmp_path / "run-2", second)  # whole files again, each in two subtasks

    one = restore(second, 4, 1, tmp_path / "run-3")
    (seen,) = rows_seen(one, tmp_path / "run-3")
    assert sorted(seen) == ids, "every row once"
    by_group: dict[int, list[int]] = {}
    for i in seen:
        by_group.setdefault(groups[i], []).append(i)
    assert all(v == sorted(v) for v in by_group.values()), "in order within each key group"
