"""The driver's books of keyed state (services/sparkpoint/agent/state/books.py): chains of runs
and bases per key group, what an incremental checkpoint copies and what it reuses, compaction
asked of rounds, garbage, and restores that read what a file is from its name. A fake clock;
files only where deleting them is the point."""

from __future__ import annotations

import shutil
from pathlib import Path

from sparkpoint.agent.state.backend import segment
from sparkpoint.agent.state.books import (
    FAN_IN,
    Chain,
    StateBackend,
    StateFile,
    restored_file,
)
from sparkpoint.agent.state.runs import Written
from sparkpoint.common.keygroups import KeyGroupRange

ALL = KeyGroupRange(0, 127)


def a_round(
    b: StateBackend, seq: int, groups: tuple[int, ...], subtask: int = 0, now: float = 0.0,
    touch: Path | None = None,
) -> None:  # fmt: skip
    """A round of ``subtask`` that wrote a run holding ``groups`` and whatever compaction the
    books asked of it."""
    asked = b.subtask_state(ALL, seq, subtask, now)
    path = b.run_path(seq, subtask)
    if touch is not None:
        for written in [path, asked.merge_path, *asked.base_paths.values()]:
            if written:
                Path(written).parent.mkdir(parents=True, exist_ok=True)
                Path(written).write_bytes(b"x")
    merged = None
    if asked.merge:
        held = sorted({g for p in asked.merge for g in asked.live()[p]})
        merged = (asked.merge_path, 5, tuple(held))
    written = Written((path, 10, groups), merged, dict.fromkeys(asked.materialize, 20))
    b.install(asked, written, seq, now)


def test_an_incremental_checkpoint_copies_only_files_written_since_the_last_completed() -> None:
    b = StateBackend("/state")
    a_round(b, 1, (1, 2))
    first = b.plan(1, ALL, True, "/chk-1", "/shared")
    assert [(u.first, u.last, u.new) for u, _ in first] == [(1, 2, True)]
    b.release(s for _, s in first)
    b.complete(1, is_savepoint=False)

    a_round(b, 2, (2,))
    second = b.plan(2, ALL, True, "/chk-2", "/shared")
    by_source = {u.path: u for u, _ in second}
    reused = next(u for u, _ in first)
    assert not by_source[reused.path].new, "the first round's run: its copy is reused"
    [(fresh, source)] = [(u, s) for u, s in second if u.new]
    assert source == b.run_path(2, 0) and fresh.path.startswith("/shared/run-00002-00002-")
    assert fresh.shared


def test_a_full_checkpoint_copies_everything_into_its_own_directory_and_is_no_base() -> None:
    b = StateBackend("/state")
    a_round(b, 1, (1, 2))
    b.plan(1, ALL, True, "/chk-1", "/shared")
    b.complete(1, is_savepoint=False)
    full = b.plan(2, ALL, False, "/chk-2", "/shared")
    assert all(u.new and u.path.startswith("/chk-2/") and not u.shared for u, _ in full)
    b.complete(2, is_savepoint=False)
    after = b.plan(3, ALL, True, "/chk-3", "/shared")
    assert all(u.new for u, _ in after), "the shared copies of 1 may be gone: copy again"


def test_a_savepoint_does_not_change_the_incremental_base() -> None:
    b = StateBackend("/state")
    a_round(b, 1, (1, 2))
    b.plan(1, ALL, True, "/chk-1", "/shared")
    b.complete(1, is_savepoint=False)
    b.plan(2, ALL, False, "/savepoint", "/shared")
    b.complete(2, is_savepoint=True)
    assert not any(u.new for u, _ in b.plan(3, ALL, True, "/chk-3", "/shared"))


def test_an_aborted_checkpoint_confirms_nothing() -> None:
    b = StateBackend("/state")
    a_round(b, 1, (1, 2))
    b.plan(1, ALL, True, "/chk-1", "/shared")
    b.abort(1)
    b.complete(1, is_savepoint=False)  # a late completion of an aborted id has nothing to confirm
    assert all(u.new for u, _ in b.plan(2, ALL, True, "/chk-2", "/shared"))


def test_a_file_the_key_groups_of_two_subtasks_share_is_copied_once_per_checkpoint() -> None:
    b = StateBackend("/state")
    a_round(b, 1, (10, 70))  # a restored run of an old subtask holding both halves
    low = b.plan(1, KeyGroupRange(0, 63), True, "/chk-1", "/shared")
    high = b.plan(1, KeyGroupRange(64, 127), True, "/chk-1", "/shared")
    assert [u.new for u, _ in low] == [True] and [u.new for u, _ in high] == [False]
    assert low[0][0].path == high[0][0].path


def test_level_zero_runs_merge_once_there_are_fan_in_of_them_and_the_merge_heads_the_chain() -> (
    None
):
    b = StateBackend("/state")
    for seq in range(1, FAN_IN + 1):
        a_round(b, seq, (3,))
    assert len(b.chains[3].runs) == FAN_IN
    asked = b.subtask_state(ALL, FAN_IN + 1, 0, 0.0)
    assert len(asked.merge) == FAN_IN and asked.merge[0] == b.run_path(FAN_IN, 0)
    a_round(b, FAN_IN + 1, (3,))
    runs = b.chains[3].runs
    assert [(r.seq, r.level) for r in runs] == [(FAN_IN + 1, 0), (FAN_IN, 1)]


def test_key_groups_materialize_at_staggered_points_of_the_interval_a_share_per_round() -> None:
    b = StateBackend("/state", materialize_interval_s=60.0)
    groups = tuple(range(32))
    a_round(b, 1, groups, now=0.0)
    assert b.subtask_state(ALL, 2, 0, 0.0).materialize == (), "none is due at once"
    halfway = b.subtask_state(ALL, 2, 0, 30.0).materialize
    assert halfway and all(b.stagger(g) >= 30.0 for g in halfway), "staggered over the interval"
    asked = b.subtask_state(ALL, 2, 0, 60.0)
    assert len(asked.materialize) == 2, "1/16 of 32 key groups per round"
    oldest = sorted(groups, key=lambda g: -b.stagger(g))[:2]
    assert sorted(asked.materialize) == sorted(oldest)
    a_round(b, 2, groups, now=60.0)
    for group in asked.materialize:
        chain = b.chains[group]
        assert chain.runs == chain.log == () and chain.base is not None and chain.base.seq == 2
    assert all(len(b.chains[g].log) == 2 for g in groups if g not in asked.materialize)


def test_a_checkpoint_names_every_rounds_run_not_the_merges_lookups_read() -> None:
    b = StateBackend("/state")
    for seq in range(1, FAN_IN + 2):
        a_round(b, seq, (3,))
    chain = b.chains[3]
    assert [r.level for r in chain.runs] == [0, 1] and len(chain.log) == FAN_IN + 1
    named = {u.path: source for u, source in b.plan(1, ALL, True, "/chk", "/shared")}
    assert sorted(named.values()) == sorted(r.path for r in chain.log)


def test_a_restored_log_merges_into_one_run_in_the_first_round() -> None:
    b = StateBackend("/state")
    log = [StateFile(f"/shared/r{i}", 1, i, 0, 63, owned=False) for i in range(40)]
    b.restore(log, shared=True)
    assert len(b.subtask_state(ALL, b.seq(1), 0, 0.0).merge) == 40


def test_files_no_chain_names_are_deleted_once_no_snapshot_copies_from_them(
    tmp_path: Path,
) -> None:
    b = StateBackend(str(tmp_path / "state"), materialize_interval_s=60.0)
    a_round(b, 1, (1,), touch=tmp_path)
    first = Path(b.run_path(1, 0))
    plan = b.plan(1, ALL, True, "/chk-1", "/shared")
    a_round(b, 2, (1,), now=120.0, touch=tmp_path)  # key group 1 materialized: run 1 goes
    assert b.chains[1].runs == () and first.exists()
    # the round's own run is in its new base already: it goes at once
    assert b.collect_garbage() == [b.run_path(2, 0)]
    assert first.exists(), "pinned by the copy in progress"
    b.release(s for _, s in plan)
    assert str(first) in b.collect_garbage() and not first.exists()


def test_a_restore_reads_what_each_file_is_from_its_name_and_continues_after_its_rounds(
    tmp_path: Path,
) -> None:
    b = StateBackend("/state")
    base = StateFile("/x", 1, 7, 5, 5, "base")
    old_run = StateFile("/y", 1, 6, 0, 63, "run")
    new_run = StateFile("/z", 1, 9, 0, 63, "run", level=2)
    named = [
        restored_file(f"/shared/{f.copy_name()}", 1, f.first, f.last)
        for f in (base, old_run, new_run)
    ]
    assert [(f.kind, f.seq, f.level, f.owned) for f in named] == [
        ("base", 7, 0, False), ("run", 6, 0, False), ("run", 9, 2, False),
    ]  # fmt: skip
    legacy = restored_file("/shared/kg-00005-0123abcd.arrow", 1, 5, 5)
    assert legacy.kind == "legacy" and legacy.seq == -1

    b.restore(named, shared=True)
    assert b.chains[5] == Chain(named[0], (named[2],), (named[2],)), "run 6 precedes the base"
    assert b.chains[6] == Chain(None, (named[2], named[1]), (named[2], named[1]))
    assert b.seq(1) == 11, "rounds continue after the newest restored seq (9)"
    assert not any(u.new for u, _ in b.plan(1, ALL, True, "/chk", "/shared"))

    claimed = StateBackend(str(tmp_path / "state"))
    claimed.restore(named, shared=False)
    assert all(u.new for u, _ in claimed.plan(1, ALL, True, "/chk", "/shared"))
    a_round(claimed, claimed.seq(1), (5, 6), touch=tmp_path)
    claimed.collect_garbage()  # restored files are never the agent's to delete
    assert not any(f.owned for c in claimed.chains.values() for f in c.files() if f.seq < 10)


def test_a_restore_the_job_does_not_keep_is_adopted_and_the_snapshot_never_read_again(
    tmp_path: Path,
) -> None:
    """NO_CLAIM, a savepoint, a full checkpoint: the restored files become working files (linked
    on one file system), the chains name only those, the first checkpoint copies them as any
    working file, and the snapshot may go at once; a segment of a merged file is adopted as its
    bytes alone."""
    snapshot = tmp_path / "snapshot"
    snapshot.mkdir()
    base = StateFile("", 0, 7, 5, 5, "base").copy_name()
    run = StateFile("", 0, 9, 0, 63, "run").copy_name()
    (snapshot / base).write_bytes(b"base")
    (snapshot / "merged").write_bytes(b"..run-bytes..")
    named = [
        restored_file(str(snapshot / base), 4, 5, 5),
        restored_file(segment(str(snapshot / "merged"), 2, 9, run), 9, 0, 63),
    ]
    b = StateBackend(str(tmp_path / "state"))
    b.restore(named, shared=False)

    assert b.adopt() == 13
    shutil.rmtree(snapshot)
    files = {f.path: f for c in b.chains.values() for f in [*c.files(), *c.log]}
    assert all(f.owned and f.path.startswith(f"{b.state_dir}/adopted/") for f in files.values())
    assert sorted(Path(p).read_bytes() for p in files) == [b"base", b"run-bytes"]
    assert [(f.kind, f.seq) for f in b.chains[5].files()] == [("run", 9), ("base", 7)]
    assert all(u.new for u, _ in b.plan(1, ALL, True, "/chk", "/shared"))
    assert b.collect_garbage() == [], "the chains name every adopted file"


def test_a_canonical_savepoint_folds_every_key_group_with_state_and_pins_what_it_reads() -> None:
    b = StateBackend("/state", materialize_interval_s=60.0)
    a_round(b, 1, (1, 2))
    a_round(b, 2, (2,), now=120.0)  # key groups 1 and 2 get bases; run 2 holds key group 2
    a_round(b, 3, (2, 3), now=121.0)
    state, pinned = b.canonical(ALL, "/savepoint")
    assert state.materialize == (1, 2, 3) and not state.merge
    names = {g: p.rsplit("/", 1)[1] for g, p in state.base_paths.items()}
    assert all(p.startswith("/savepoint/base-") for p in state.base_paths.values())
    assert names[3].startswith("base-00003-000000000003-"), "named by its newest change"
    # a restore of the bases alone reads each as its key group's whole state
    restored = [restored_file(p, 1, g, g) for g, p in state.base_paths.items()]
    assert [(f.kind, f.first) for f in restored] == [("base", 1), ("base", 2), ("base", 3)]
    read = {f.path for c in b.chains.values() for f in c.files()}
    assert set(pinned) == read
    a_round(b, 4, (1, 2, 3), now=300.0)  # everything materialized again: the old files go
    assert not set(b.collect_garbage()) & read, "pinned until the fold is done"
    b.release(pinned)
    assert set(b.collect_garbage()) >= read - {f.path for c in b.chains.values() for f in c.files()}


def test_runs_merge_only_while_they_fit_in_the_memory_budget() -> None:
    b = StateBackend("/state", memory_bytes=45)
    for seq in range(1, FAN_IN + 1):
        a_round(b, seq, (1,))  # runs of 10 bytes: eight are 80 bytes, over the budget
    assert not b.subtask_state(ALL, b.seq(FAN_IN + 1), 0, 0.0).merge
    roomy = StateBackend("/state", memory_bytes=80)
    for seq in range(1, FAN_IN + 1):
        a_round(roomy, seq, (1,))
    assert len(roomy.subtask_state(ALL, roomy.seq(FAN_IN + 1), 0, 0.0).merge) == FAN_IN


def test_a_merge_that_holds_nothing_live_drops_its_runs_and_its_empty_file_goes() -> None:
    """A restored run can span key groups it has no rows of: merged for those, it holds
    nothing. Its runs leave the chains (they held nothing there) and the empty merged file is
    garbage; the books do not fail on a merge of no key group (a restore at parallelism 3 did)."""
    b = StateBackend("/state")
    for seq in range(1, FAN_IN + 1):
        a_round(b, seq, (1,))
    asked = b.subtask_state(ALL, FAN_IN + 1, 0, 0.0)
    assert asked.merge, "the books ask for a merge of the full level"
    written = Written(None, (asked.merge_path, 0, ()), {})
    b.install(asked, written, FAN_IN + 1, 0.0)
    assert not any(r.path in set(asked.merge) for r in b.chains[1].runs)
    assert asked.merge_path in b.collect_garbage()
