"""Channels: order, the memory budget (spill to disk beyond it), capacity (backpressure) and
barriers (stage 2 never takes records past the oldest barrier)."""

from __future__ import annotations

from pathlib import Path

from services.agent.channels import Channel


def channel(tmp_path: Path, budget: int = 100, capacity: int = 1_000) -> Channel:
    return Channel(0, tmp_path / "spill", budget, capacity)


def test_segments_beyond_the_memory_budget_are_spilled_and_read_back_in_order(
    tmp_path: Path,
) -> None:
    c = channel(tmp_path, budget=100)
    c.append(b"a" * 60, 1)
    c.append(b"b" * 60, 1)  # would exceed the budget: spilled
    c.append(b"c" * 30, 1)

    payloads = [s.payload() for s in c.take(10)]

    assert payloads[0] == b"a" * 60 and payloads[2] == b"c" * 30
    assert isinstance(payloads[1], str) and Path(payloads[1]).read_bytes() == b"b" * 60
    assert (c.in_memory, c.on_disk, c.spilled_total) == (90, 60, 60)


def test_consumed_segments_leave_memory_and_disk(tmp_path: Path) -> None:
    c = channel(tmp_path, budget=10)
    c.append(b"x" * 50, 5)
    spilled = c.segments[0].path
    c.consumed(c.take(10))
    assert c.queued_bytes == 0 and not c.segments
    assert spilled is not None and not Path(spilled).exists()


def test_a_channel_above_capacity_is_full_until_drained(tmp_path: Path) -> None:
    c = channel(tmp_path, capacity=100)
    c.append(b"x" * 80, 1)
    assert not c.full and c.free_bytes() == 20
    c.append(b"y" * 30, 1)
    assert c.full and c.free_bytes() == 0
    c.consumed(c.take(1))
    assert not c.full


def test_take_stops_at_the_oldest_barrier_and_alignment_follows(tmp_path: Path) -> None:
    c = channel(tmp_path)
    c.append(b"1", 10)
    c.append(b"2", 10)
    c.add_barrier(7)
    c.append(b"3", 10)

    first = c.take(1_000)
    assert [s.payload() for s in first] == [b"1", b"2"]
    assert not c.aligned(7)
    c.consumed(first)
    assert c.aligned(7)
    assert c.take(1_000) == [], "nothing past the barrier before the snapshot"
    c.remove_barrier(7)
    assert [s.payload() for s in c.take(1_000)] == [b"3"]


def test_an_empty_channel_is_aligned_at_once_and_take_respects_the_row_limit(
    tmp_path: Path,
) -> None:
    c = channel(tmp_path)
    c.add_barrier(1)
    assert c.aligned(1)
    c.remove_barrier(1)
    for i in range(5):
        c.append(bytes([i]), 100)
    assert len(c.take(250)) == 2
    assert len(c.take(10)) == 1, "at least one segment"
    assert not c.aligned(99), "an unknown barrier is never aligned"
