"""Channels: a log of segment files in order, capacity (backpressure), barriers (stage 2 never
takes records past the oldest barrier), at-least-once restart offsets, and the deletion of
consumed segment files unless a snapshot still references them."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkpoint.agent.rounds.channels import Channel, SegmentFiles, earliest_cut


def segment(tmp_path: Path, name: str, size: int = 10) -> str:
    """A segment file in the channel directory ``tmp_path``; its name, as channels keep it."""
    (tmp_path / name).write_bytes(b"x" * size)
    return name


def test_segments_are_taken_in_order_and_only_their_metadata_is_kept(tmp_path: Path) -> None:
    c = Channel(0)
    for name in ("a", "b", "c"):
        c.append(segment(tmp_path, name), 1, 10)
    assert [s.path for s in c.take(10)] == ["a", "b", "c"]
    assert c.queued_bytes == 30 and c.appended_bytes == 30


def test_consumed_segment_files_are_deleted(tmp_path: Path) -> None:
    c, files = Channel(0), SegmentFiles(str(tmp_path))
    name = segment(tmp_path, "s1", 50)
    c.append(name, 5, 50)
    files.discard(c.consumed(c.take(10)))
    assert c.queued_bytes == 0 and not c.segments
    assert not (tmp_path / name).exists()


def test_a_pinned_segment_file_outlives_its_consumption_until_released(tmp_path: Path) -> None:
    c, files = Channel(0), SegmentFiles(str(tmp_path))
    name = segment(tmp_path, "s1")
    c.append(name, 1, 10)
    files.pin([name])  # a snapshot references it (unaligned channel state)
    files.discard(c.consumed(c.take(10)))
    assert (tmp_path / name).exists()
    files.release([name])
    assert not (tmp_path / name).exists()


def test_a_channel_above_capacity_is_full_until_drained(tmp_path: Path) -> None:
    c = Channel(0, capacity=100)
    c.append(segment(tmp_path, "x", 80), 1, 80)
    assert not c.full and c.free_bytes() == 20
    c.append(segment(tmp_path, "y", 30), 1, 30)
    assert c.full and c.free_bytes() == 0
    c.consumed(c.take(1))
    assert not c.full


def test_take_stops_at_the_oldest_barrier_and_alignment_follows(tmp_path: Path) -> None:
    c = Channel(0)
    c.append(segment(tmp_path, "1"), 10, 10)
    c.append(segment(tmp_path, "2"), 10, 10)
    c.add_barrier(7)
    c.append(segment(tmp_path, "3"), 10, 10)

    first = c.take(1_000)
    assert [s.path for s in first] == ["1", "2"]
    assert not c.aligned(7)
    c.consumed(first)
    assert c.aligned(7)
    assert c.take(1_000) == [], "nothing past the barrier before the snapshot"
    c.remove_barrier(7)
    assert [s.path for s in c.take(1_000)] == ["3"]


def test_an_empty_channel_is_aligned_at_once_and_take_respects_the_row_limit(
    tmp_path: Path,
) -> None:
    c = Channel(0)
    c.add_barrier(1)
    assert c.aligned(1)
    c.remove_barrier(1)
    for i in range(5):
        c.append(segment(tmp_path, str(i)), 100, 10)
    assert len(c.take(250)) == 2
    assert len(c.take(10)) == 1, "at least one segment"
    assert not c.aligned(99), "an unknown barrier is never aligned"


def test_unprocessed_offsets_are_the_oldest_fetch_of_each_partition(tmp_path: Path) -> None:
    c = Channel(0)
    c.append(segment(tmp_path, "a"), 1, 10, ("t", 0), 100)
    c.append(segment(tmp_path, "b"), 1, 10, ("t", 1), 40)
    c.append(segment(tmp_path, "c"), 1, 10, ("t", 0), 150)
    assert c.unprocessed_from() == {("t", 0): 100, ("t", 1): 40}
    c.consumed(c.take(1))
    assert c.unprocessed_from() == {("t", 0): 150, ("t", 1): 40}


def test_before_barrier_is_what_an_unaligned_snapshot_carries(tmp_path: Path) -> None:
    c = Channel(0)
    c.append("a", 1, 10)
    c.append("b", 1, 10)
    c.add_barrier(7)
    c.append("c", 1, 10)
    taken = c.take(10)  # a round in flight: its segments stay queued until it completes

    assert [s.path for s in taken] == ["a", "b"]
    assert [s.path for s in c.before_barrier(7)] == ["a", "b"]
    assert [s.path for s in c.before_barrier(8)] == ["a", "b", "c"]  # no barrier: everything
    c.consumed(taken)
    assert c.before_barrier(7) == [] and c.aligned(7)


# --- the earliest consistent cut for an aligned barrier ----------------------------------------------


def fetched(channels: list[Channel], partition: int, first_offset: int, to: list[int]) -> None:
    """One fetch of ``p<partition>`` from ``first_offset``, with a segment for each channel in
    ``to``."""
    for i in to:
        channels[i].append(
            f"f{first_offset}-p{partition}-s{i}", 10, 10, ("t", partition), first_offset
        )


def test_the_cut_follows_the_round_in_flight_and_rewinds_the_sources_to_what_it_left() -> None:
    channels = [Channel(0), Channel(1)]
    fetched(channels, 0, 100, [0, 1])
    fetched(channels, 1, 500, [0, 1])
    taken = {i: c.take(1_000) for i, c in enumerate(channels)}  # the round in flight
    fetched(channels, 0, 150, [0, 1])  # read while it runs
    cut = earliest_cut(channels, taken, {("t", 0): 200, ("t", 1): 600})
    assert cut is not None
    sequences, positions = cut
    assert positions == {("t", 0): 150, ("t", 1): 600}  # p0's later fetch is read again
    for channel, sequence in zip(channels, sequences, strict=True):
        channel.add_barrier(7, sequence)
        assert [s.path for s in channel.take(1_000)] == [s.path for s in taken[channel.subtask]]
        channel.consumed(taken[channel.subtask])  # the round ends
        assert channel.aligned(7)  # no further round needed


def test_without_a_round_in_flight_the_cut_is_before_everything_queued() -> None:
    channels = [Channel(0), Channel(1)]
    fetched(channels, 0, 40, [0])
    cut = earliest_cut(channels, {}, {("t", 0): 90})
    assert cut is not None and cut[1] == {("t", 0): 40}
    for channel, sequence in zip(channels, cut[0], strict=True):
        channel.add_barrier(3, sequence)
    assert all(c.aligned(3) for c in channels)  # a snapshot at once, the segment read again


def test_no_cut_splits_a_fetch_between_channels_or_rewinds_restored_channel_state() -> None:
    channels = [Channel(0), Channel(1)]
    fetched(channels, 0, 100, [0, 1])
    taken = {0: channels[0].take(1_000)}  # channel 1's share of that fetch was not taken
    assert earliest_cut(channels, taken, {("t", 0): 200}) is None
    restored = [Channel(0)]
    restored[0].append_restored("restored", 10, 10)
    assert earliest_cut(restored, {}, {}) is None


def test_a_barrier_cannot_overtake_an_earlier_one() -> None:
    channel = Channel(0)
    channel.append("a", 1, 1)
    channel.add_barrier(1)
    with pytest.raises(ValueError, match="overtake"):
        channel.add_barrier(2, 0)
