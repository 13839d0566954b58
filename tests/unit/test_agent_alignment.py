"""Barrier handling as explicit states (aligned, unaligned at once, aligned then unaligned after
the timeout) and the assignment of channel state to the subtasks of a new parallelism. Pure
logic, fake times."""

from __future__ import annotations

from dataclasses import dataclass, field

from sparkpoint.agent.checkpointing.barriers import (
    Aligning,
    Snapshotted,
    first_state,
    next_switch_ms,
)
from sparkpoint.agent.recovery.channel_state import ChannelStateFile, assign
from sparkpoint.common.events import SnapshotType, TriggerCheckpoint
from sparkpoint.common.keygroups import key_group_range


@dataclass
class Control:
    """A `BarrierControl` whose alignment the test sets, recording the snapshots asked for."""

    is_aligned: bool = False
    snapshots: list[tuple[int, bool]] = field(default_factory=list)

    def aligned(self, checkpoint_id: int) -> bool:
        return self.is_aligned

    def snapshot(self, checkpoint_id: int, unaligned: bool) -> None:
        self.snapshots.append((checkpoint_id, unaligned))


def trigger(
    unaligned: bool, timeout_ms: int | None, savepoint: bool = False, checkpoint_id: int = 7
) -> TriggerCheckpoint:
    kind = SnapshotType.SAVEPOINT if savepoint else SnapshotType.CHECKPOINT
    return TriggerCheckpoint(
        "job", 1, checkpoint_id, 0, kind, not savepoint, unaligned, "chk-7",
        aligned_checkpoint_timeout_ms=timeout_ms,
    )  # fmt: skip


def test_aligned_checkpoints_wait_for_alignment_however_long() -> None:
    control = Control()
    state = first_state(trigger(False, 0), 1_000, control)
    assert state == Aligning(7) and control.snapshots == []
    assert state.on_round(control, 1_000_000) is state
    control.is_aligned = True
    assert state.on_round(control, 1_001) == Snapshotted(7)
    assert control.snapshots == [(7, False)]


def test_unaligned_with_timeout_zero_snapshots_at_once() -> None:
    control = Control()
    assert first_state(trigger(True, 0), 1_000, control) == Snapshotted(7)
    assert control.snapshots == [(7, True)]


def test_the_aligned_timeout_switches_to_unaligned_only_when_it_runs_out() -> None:
    control = Control()
    state = first_state(trigger(True, 500), 1_000, control)
    assert state == Aligning(7, 1_500) and control.snapshots == []
    assert state.on_round(control, 1_499) is state
    assert state.on_round(control, 1_500) == Snapshotted(7)
    assert control.snapshots == [(7, True)]


def test_the_loop_wakes_for_the_first_aligning_barrier_s_switch_to_unaligned() -> None:
    # nothing else wakes the job's loop for an aligned checkpoint's timeout (JobLoop.wait_s)
    control = Control()
    first = first_state(trigger(True, 900, checkpoint_id=8), 1_000, control)
    sooner = first_state(trigger(True, 500, checkpoint_id=9), 1_000, control)
    waiting = first_state(trigger(False, None, checkpoint_id=7), 1_000, control)
    assert next_switch_ms([Snapshotted(6), None, first, sooner]) == 1_900
    # barriers are taken in order: behind one waiting for alignment, a later timeout that has
    # passed must not end every sleep at once (the loop would turn without pause)
    assert next_switch_ms([waiting, sooner]) is None
    assert next_switch_ms([Snapshotted(7), None]) is None
    assert next_switch_ms([]) is None


def test_aligned_before_the_timeout_snapshots_aligned() -> None:
    control = Control(is_aligned=True)
    state = first_state(trigger(True, 500), 1_000, control)
    assert state.on_round(control, 1_499) == Snapshotted(7)
    assert control.snapshots == [(7, False)]


def test_a_snapshotted_checkpoint_ignores_later_rounds() -> None:
    control = Control(is_aligned=True)
    assert Snapshotted(7).on_round(control, 10**9) == Snapshotted(7)
    assert control.snapshots == []


def test_savepoints_stay_aligned_even_with_unaligned_enabled() -> None:
    control = Control()
    state = first_state(trigger(True, 0, savepoint=True), 0, control)
    assert state == Aligning(7) and state.on_round(control, 10**9) is state
    assert control.snapshots == []


def files_of(old_subtask: int, groups: tuple[int, int], count: int) -> list[ChannelStateFile]:
    return [
        ChannelStateFile(old_subtask, k, f"chk/channel-{old_subtask}-{k}", 10, 100, groups)
        for k in range(count)
    ]


def test_channel_state_goes_to_every_new_subtask_whose_key_groups_overlap_in_order() -> None:
    old = [key_group_range(128, 2, i) for i in range(2)]  # 0-63, 64-127
    files = files_of(1, (old[1].start, old[1].end), 2) + files_of(0, (old[0].start, old[0].end), 3)
    new = [key_group_range(128, 3, i) for i in range(3)]  # 0-42, 43-85, 86-127

    shares = assign(files, new)

    assert [f.path for f in shares[0]] == [f"chk/channel-0-{k}" for k in range(3)]
    assert [f.path for f in shares[1]] == [f"chk/channel-0-{k}" for k in range(3)] + [
        f"chk/channel-1-{k}" for k in range(2)
    ]  # old subtask 0's files first: each key group's records keep their order
    assert [f.path for f in shares[2]] == [f"chk/channel-1-{k}" for k in range(2)]


def test_channel_state_with_the_same_parallelism_stays_with_its_subtask() -> None:
    ranges = [key_group_range(128, 2, i) for i in range(2)]
    files = files_of(0, (ranges[0].start, ranges[0].end), 1)
    assert assign(files, ranges) == {0: files}
