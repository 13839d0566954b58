"""The key-group state: typed state through KeyedState, the Arrow file of a key group, and the
backend's books (what an incremental checkpoint copies, what it reuses, what may be deleted)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from sparkpoint.agent.job import KeyedState, ListState, MapState, ValueState
from sparkpoint.agent.state.backend import (
    StateBackend,
    Version,
    decode_state,
    encode_state,
    link_or_copy,
    read_file,
    write_file,
)

DECLARED = {
    "total": ValueState("int64"),
    "recent": ListState("float64"),
    "windows": MapState("int64", "int64"),
}


def test_value_list_and_map_state_round_trip_through_one_arrow_file() -> None:
    state = KeyedState(DECLARED, {})
    state.update_value("total", pd.Series([5, 7], index=["a", "b"]))
    state.add_to_list("recent", pd.Series([1.5, 2.5, 3.5], index=["a", "a", "b"]))
    windows = pd.Series([3, 4], index=pd.MultiIndex.from_tuples([("a", 0), ("a", 10_000)]))
    state.put_in_map("windows", windows)

    decoded = decode_state(encode_state(state.frames()), DECLARED)

    assert decoded["total"].to_dict() == {"a": 5, "b": 7}
    assert decoded["recent"].tolist() == [1.5, 2.5, 3.5]
    assert list(decoded["recent"].index) == ["a", "a", "b"]
    assert decoded["windows"].to_dict() == {("a", 0): 3, ("a", 10_000): 4}
    assert decoded["windows"].dtype == "int64"


def test_decoded_map_state_has_the_index_from_arrays_builds_and_empty_states_are_separate() -> None:
    keys = ["b", "a", "b", "c"]
    user_keys = [10_000, 0, 0, 5]
    windows = pd.Series([1, 2, 3, 4], index=pd.MultiIndex.from_arrays([keys, user_keys]))
    state = KeyedState(DECLARED, {})
    state.put_in_map("windows", windows)

    decoded = decode_state(encode_state(state.frames()), DECLARED)["windows"]
    expected = pd.MultiIndex.from_arrays([keys, user_keys], names=["key", "user_key"])

    assert decoded.index.equals(expected) and decoded.index.names == ["key", "user_key"]
    assert [list(level) for level in decoded.index.levels] == [["a", "b", "c"], [0, 5, 10_000]]
    assert decoded.loc[("b", 0)] == 3 and decoded.index.is_unique
    # states the file does not hold come back empty, each its own object
    first, second = (decode_state(encode_state({}), DECLARED) for _ in range(2))
    first["total"].name = "renamed"
    first["windows"].index.names = ["account", "window"]  # user code may rename its index
    first["total"].index.name = "account"
    assert len(first["windows"]) == 0 and second["total"].name != "renamed"
    assert list(second["windows"].index.names) == ["key", "user_key"]
    assert second["total"].index.name == "key"
    assert list(decode_state(encode_state({}), DECLARED)["windows"].index.names) == [
        "key",
        "user_key",
    ]
    assert isinstance(first["windows"].index, pd.MultiIndex)


def test_updates_replace_only_the_keys_given() -> None:
    state = KeyedState(DECLARED, {})
    state.update_value("total", pd.Series([1, 2], index=["a", "b"]))
    state.update_value("total", pd.Series([10], index=["b"]))
    state.clear_value("total", ["a"])
    state.set_list("recent", pd.Series([1.0, 2.0], index=["a", "a"]))
    state.set_list("recent", pd.Series([9.0], index=["a"]))
    state.put_in_map("windows", pd.Series([1], index=pd.MultiIndex.from_tuples([("a", 0)])))
    state.remove_from_map("windows", pd.MultiIndex.from_tuples([("a", 0)]))

    assert state.value("total").to_dict() == {"b": 10}
    assert state.list("recent").tolist() == [9.0]
    assert len(state.map("windows")) == 0
    assert state.changed == {"total", "recent", "windows"}


def test_using_a_state_as_another_kind_or_undeclared_is_an_error() -> None:
    state = KeyedState(DECLARED, {})
    with pytest.raises(TypeError, match="is a ValueState, not a MapState"):
        state.map("total")
    with pytest.raises(KeyError, match="not declared"):
        state.value("nope")


def test_state_in_a_snapshot_that_the_job_no_longer_declares_is_dropped() -> None:
    state = KeyedState(DECLARED, {})
    state.update_value("total", pd.Series([1], index=["a"]))
    decoded = decode_state(encode_state(state.frames()), {"other": ValueState()})
    assert set(decoded) == {"other"} and len(decoded["other"]) == 0


def backend(tmp_path: Path) -> StateBackend:
    b = StateBackend(str(tmp_path / "state"))
    for group in (1, 2):
        path = tmp_path / f"v1-{group}"
        path.write_bytes(b"x")
        b.install(group, Version(str(path), 10, 1))
    return b


def test_an_incremental_checkpoint_copies_only_key_groups_changed_since_the_last_completed(
    tmp_path: Path,
) -> None:
    b = backend(tmp_path)
    first = b.plan(1, [1, 2], True, "/chk-1", "/shared")
    assert all(upload.new for upload, _ in first)
    b.release(s for _, s in first)
    b.complete(1, is_savepoint=False)

    changed = tmp_path / "v2-2"
    changed.write_bytes(b"y")
    b.install(2, Version(str(changed), 12, 2))
    second = {u.group: u for u, _ in b.plan(2, [1, 2], True, "/chk-2", "/shared")}

    assert not second[1].new and second[1].path == next(u.path for u, _ in first if u.group == 1)
    assert second[2].new and second[2].path.startswith("/shared/") and second[2].shared


def test_a_full_checkpoint_copies_everything_into_its_own_directory_and_is_no_base(
    tmp_path: Path,
) -> None:
    b = backend(tmp_path)
    b.plan(1, [1, 2], True, "/chk-1", "/shared")
    b.complete(1, is_savepoint=False)
    full = b.plan(2, [1, 2], False, "/chk-2", "/shared")
    assert all(u.new and u.path.startswith("/chk-2/") and not u.shared for u, _ in full)
    b.complete(2, is_savepoint=False)
    after = b.plan(3, [1, 2], True, "/chk-3", "/shared")
    assert all(u.new for u, _ in after), "the shared copies of 1 may be gone: copy again"


def test_a_savepoint_does_not_change_the_incremental_base(tmp_path: Path) -> None:
    b = backend(tmp_path)
    b.plan(1, [1, 2], True, "/chk-1", "/shared")
    b.complete(1, is_savepoint=False)
    b.plan(2, [1, 2], False, "/savepoint", "/shared")
    b.complete(2, is_savepoint=True)
    assert not any(u.new for u, _ in b.plan(3, [1, 2], True, "/chk-3", "/shared"))


def test_an_aborted_checkpoint_confirms_nothing(tmp_path: Path) -> None:
    b = backend(tmp_path)
    b.plan(1, [1, 2], True, "/chk-1", "/shared")
    b.abort(1)
    b.complete(1, is_savepoint=False)  # a late completion of an aborted id has nothing to confirm
    assert all(u.new for u, _ in b.plan(2, [1, 2], True, "/chk-2", "/shared"))


def test_replaced_working_versions_are_deleted_once_no_snapshot_copies_from_them(
    tmp_path: Path,
) -> None:
    b = backend(tmp_path)
    old = tmp_path / "v1-1"
    plan = b.plan(1, [1], True, "/chk-1", "/shared")
    newer = tmp_path / "v2-1"
    newer.write_bytes(b"z")
    b.install(1, Version(str(newer), 1, 2))

    assert b.collect_garbage() == [] and old.exists(), "pinned by the copy in progress"
    b.release(s for _, s in plan)
    assert b.collect_garbage() == [str(old)] and not old.exists()


def test_restored_files_are_never_deleted_by_the_agent_and_shared_ones_are_the_base(
    tmp_path: Path,
) -> None:
    b = StateBackend(str(tmp_path / "state"))
    restored = tmp_path / "shared-1"
    restored.write_bytes(b"r")
    b.restore({1: (str(restored), 1)}, shared=True)
    assert not any(u.new for u, _ in b.plan(5, [1], True, "/chk-5", "/shared"))
    newer = tmp_path / "v1-1"
    newer.write_bytes(b"n")
    b.install(1, Version(str(newer), 1, 1))
    b.collect_garbage()
    assert restored.exists()

    savepoint = StateBackend(str(tmp_path / "state2"))
    savepoint.restore({1: (str(restored), 1)}, shared=False)
    assert all(u.new for u, _ in savepoint.plan(5, [1], True, "/chk-5", "/shared"))


def test_a_linked_copy_keeps_its_bytes_when_the_source_path_is_written_again(
    tmp_path: Path,
) -> None:
    """Snapshots hard-link immutable state files into checkpoints: writing a path again
    replaces the file whole (a new inode), never the bytes a checkpoint links to."""
    source, copy = str(tmp_path / "working" / "kg-1"), str(tmp_path / "chk-1" / "kg-1.arrow")
    write_file(source, b"version 1")
    link_or_copy(source, copy)
    write_file(source, b"version 2, longer")
    link_or_copy(source, str(tmp_path / "chk-2" / "kg-1.arrow"))

    assert read_file(copy) == b"version 1" and read_file(source) == b"version 2, longer"
    assert (tmp_path / "chk-2" / "kg-1.arrow").read_bytes() == b"version 2, longer"
    assert Path(source).stat().st_nlink == 2  # linked, not copied
    assert sorted(p.name for p in (tmp_path / "working").iterdir()) == ["kg-1"]  # no temporaries
