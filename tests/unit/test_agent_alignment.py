"""The barrier policy (aligned, unaligned at once, aligned then unaligned after the timeout) and
the assignment of channel state to the subtasks of a new parallelism. Pure logic, fake times."""

from __future__ import annotations

from sparkpoint.agent.checkpointing.barriers import BarrierPolicy, Decision
from sparkpoint.agent.recovery.channel_state import ChannelStateFile, assign
from sparkpoint.common.keygroups import key_group_range


def test_aligned_checkpoints_wait_for_alignment_however_long() -> None:
    policy = BarrierPolicy.for_trigger(False, 0, False, received_ms=1_000)
    assert not policy.at_once
    assert policy.decide(aligned=False, now_ms=1_000_000) is Decision.WAIT
    assert policy.decide(aligned=True, now_ms=1_001) is Decision.ALIGNED
    assert policy.due_in_ms(1_000) is None


def test_unaligned_with_timeout_zero_snapshots_at_once() -> None:
    policy = BarrierPolicy.for_trigger(True, 0, False, received_ms=1_000)
    assert policy.at_once
    assert policy.decide(aligned=False, now_ms=1_000) is Decision.UNALIGNED


def test_the_aligned_timeout_switches_to_unaligned_only_when_it_runs_out() -> None:
    policy = BarrierPolicy.for_trigger(True, 500, False, received_ms=1_000)
    assert not policy.at_once
    assert policy.decide(aligned=False, now_ms=1_499) is Decision.WAIT
    assert policy.due_in_ms(1_200) == 300
    assert policy.decide(aligned=True, now_ms=1_499) is Decision.ALIGNED
    assert policy.decide(aligned=False, now_ms=1_500) is Decision.UNALIGNED


def test_savepoints_stay_aligned_even_with_unaligned_enabled() -> None:
    policy = BarrierPolicy.for_trigger(True, 0, True, received_ms=0)
    assert not policy.at_once
    assert policy.decide(aligned=False, now_ms=10**9) is Decision.WAIT


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
