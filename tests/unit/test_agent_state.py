"""Typed state through KeyedState, the earlier format of a key group's Arrow file (restores of
older checkpoints read it), and immutable state files linked into checkpoints. The books of
state files: test_state_books.py; runs of changes: test_state_changelog.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sparkpoint.agent.job import (
    TIMERS,
    KeyedState,
    ListState,
    MapState,
    ValueState,
    concat_entries,
    entry_index,
)
from sparkpoint.agent.state.backend import (
    decode_state,
    encode_state,
    link_or_copy,
    read_file,
    write_file,
)
from sparkpoint.agent.time.ttl import StateTtlConfig, ttl_state_name

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


def test_decoded_map_state_has_the_pairs_of_from_arrays_unsorted_and_empty_states_are_separate() -> (
    None
):
    keys = ["b", "a", "b", "c"]
    user_keys = [10_000, 0, 0, 5]
    windows = pd.Series([1, 2, 3, 4], index=pd.MultiIndex.from_arrays([keys, user_keys]))
    state = KeyedState(DECLARED, {})
    state.put_in_map("windows", windows)

    decoded = decode_state(encode_state(state.frames()), DECLARED)["windows"]
    expected = pd.MultiIndex.from_arrays([keys, user_keys], names=["key", "user_key"])

    assert decoded.index.equals(expected) and decoded.index.names == ["key", "user_key"]
    assert decoded.loc[("b", 0)] == 3 and decoded.index.is_unique
    # its levels are not sorted (sorting keys is the slow part of building it), and it says so:
    # a range .loc raises instead of slicing by the order of the levels
    with pytest.raises(pd.errors.UnsortedIndexError):
        decoded.loc["a":"b"]
    assert decoded.sort_index().loc["a":"b"].tolist() == [2, 3, 1]
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


def test_pop_from_map_reads_and_removes_in_one_lookup_and_timers_pop_when_due() -> None:
    declared = {"windows": MapState("int64", "int64", ttl=StateTtlConfig.new_builder("1s").build())}
    state = KeyedState(
        declared | {TIMERS: MapState("int64", "bool")}, {}, current_processing_time=5
    )
    entries = pd.MultiIndex.from_tuples([("a", 0), ("a", 10), ("b", 0)])
    state.put_in_map("windows", pd.Series([1, 2, 3], index=entries))
    asked = pd.MultiIndex.from_tuples([("b", 0), ("c", 0), ("a", 0)])
    popped = state.pop_from_map("windows", asked)
    assert popped.index.equals(asked)
    assert popped.iloc[0] == 3 and pd.isna(popped.iloc[1]) and popped.iloc[2] == 1
    assert state.map("windows").index.tolist() == [("a", 10)] and state.map("windows").tolist() == [
        2
    ]
    stamps = state.frames()[ttl_state_name("windows")]  # the TTL stamps follow, entry for entry
    assert stamps.index.tolist() == [("a", 10)]
    assert state.pop_from_map("windows", pd.MultiIndex.from_tuples([("z", 1)])).isna().all()

    state.register_event_time_timers(pd.Series([5, 9, 7], index=["a", "a", "b"]))
    due = state.pop_due_timers(TIMERS, 7)
    assert sorted(zip(due.index, due, strict=True)) == [("a", 5), ("b", 7)]
    assert state.event_time_timers().to_dict() == {"a": 9}
    assert state.pop_due_timers(TIMERS, 8).empty and TIMERS in state.changed


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


def test_concatenated_map_state_has_the_entries_and_order_pandas_gives() -> None:
    rng = np.random.default_rng(3)
    parts = []
    for size in (0, 7, 0, 40, 1):
        keys = np.array([f"k{k}" for k in rng.integers(0, 9, size)], dtype=object)
        index = entry_index(keys, rng.integers(0, 5, size))
        parts.append(pd.Series(rng.normal(size=size), index=index, name="m"))
    got = concat_entries(parts)
    expected = pd.concat(parts)
    assert got.name == "m" and list(got.index.names) == ["key", "user_key"]
    assert got.index.tolist() == expected.index.tolist()
    assert got.to_numpy().tolist() == expected.to_numpy().tolist()
    value = pd.Series([1, 2], index=pd.Index(["a", "b"], dtype=object))
    assert concat_entries([value, value]).index.tolist() == ["a", "b", "a", "b"]
