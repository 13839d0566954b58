"""State TTL (services/sparkpoint/agent/time/ttl.py, KeyedState, changelog.without_expired):
a manual clock, the Flink meanings of the update type and visibility, per-element TTL of lists
and maps, and a model of random rounds through change runs, merges and folded bases. Pure: no
files, no Spark."""

from __future__ import annotations

import random
from typing import Any, ClassVar

import numpy as np
import pandas as pd
import pytest

from sparkpoint.agent.job import (
    KeyedFunction,
    KeyedState,
    ListState,
    MapState,
    ValueState,
    declared_state,
    with_ttl_companions,
)
from sparkpoint.agent.state.changelog import (
    Run,
    changes,
    decode_run,
    encode_run,
    lookup,
    materialize,
    merge_runs,
    without_expired,
)
from sparkpoint.agent.time.ttl import StateTtlConfig, ttl_state_name

TTL = StateTtlConfig.new_builder("1s").build()


def at(state: KeyedState, now: int) -> KeyedState:
    state.current_processing_time = now
    return state


def test_a_value_is_gone_once_its_ttl_ran_out_since_it_was_written() -> None:
    state = KeyedState({"total": ValueState("int64", ttl=TTL)}, {}, current_processing_time=0)
    state.update_value("total", pd.Series([1, 2], index=["a", "b"]))
    at(state, 600).update_value("total", pd.Series([3], index=["b"]))  # b written again
    assert at(state, 999).value("total").to_dict() == {"a": 1, "b": 3}
    assert at(state, 1_000).value("total").to_dict() == {"b": 3}  # a: 0 + 1 s <= now
    assert state.value(ttl_state_name("total")).to_dict() == {"b": 600}
    assert {"total", ttl_state_name("total")} <= state.changed  # the expired entry is deleted
    assert at(state, 1_600).value("total").empty


def test_reading_refreshes_only_when_the_ttl_says_so() -> None:
    on_read = TTL.update_ttl_on_read_and_write()
    state = KeyedState(
        {"seen": ValueState("int64", ttl=on_read), "kept": ValueState("int64", ttl=TTL)}, {}
    )
    state.update_value("seen", pd.Series([1], index=["a"]))
    state.update_value("kept", pd.Series([1], index=["a"]))
    at(state, 900).value("seen")
    at(state, 900).value("kept")
    assert at(state, 1_500).value("seen").to_dict() == {"a": 1}
    assert at(state, 1_500).value("kept").empty


def test_an_expired_entry_is_returned_until_cleaned_up_when_asked_for() -> None:
    lenient = TTL.return_expired_if_not_cleaned_up()
    state = KeyedState({"total": ValueState("int64", ttl=lenient)}, {})
    state.update_value("total", pd.Series([1], index=["a"]))
    assert at(state, 5_000).value("total").to_dict() == {"a": 1}


def test_list_elements_and_map_entries_expire_one_by_one() -> None:
    declared = {
        "seen": ListState("int64", ttl=TTL),
        "last": MapState("object", "int64").enable_time_to_live(TTL),
    }
    state = KeyedState(declared, {})
    state.add_to_list("seen", pd.Series([1, 2], index=["a", "a"]))
    entries = pd.MultiIndex.from_tuples([("a", "x"), ("a", "y")], names=["key", "user_key"])
    state.put_in_map("last", pd.Series([10, 20], index=entries))
    at(state, 700).add_to_list("seen", pd.Series([3], index=["a"]))
    state.put_in_map("last", pd.Series([21], index=entries[1:]))
    assert at(state, 1_200).list("seen").tolist() == [3]
    assert state.map("last").to_dict() == {("a", "y"): 21}
    assert state.list(ttl_state_name("seen")).tolist() == [700]


def test_the_ttl_companions_are_declared_state_and_a_bad_ttl_is_refused() -> None:
    class Expiring(KeyedFunction):
        state: ClassVar[dict[str, Any]] = {
            "total": ValueState("float64", ttl=StateTtlConfig.new_builder(60_000))
        }

    declared = declared_state(Expiring())
    assert declared[ttl_state_name("total")] == ValueState("int64")
    with pytest.raises(ValueError, match="positive"):
        StateTtlConfig.new_builder(0)


def test_a_fold_drops_what_expired_and_keeps_the_rest() -> None:
    declared = with_ttl_companions(
        {"total": ValueState("int64", ttl=TTL), "seen": ListState("int64", ttl=TTL)}
    )
    keys = np.array(["k-1", "k-2", "k-3"], dtype=object)
    groups = np.array([1, 1, 1])
    before = lookup([], [], keys, groups, declared)
    state = KeyedState(declared, before, current_processing_time=0)
    state.update_value("total", pd.Series([1, 2, 3], index=keys))
    state.add_to_list("seen", pd.Series([1, 2], index=["k-1", "k-3"]))
    at(state, 800).update_value("total", pd.Series([20], index=["k-2"]))
    state.add_to_list("seen", pd.Series([3], index=["k-1"]))
    run = changes(before, state.frames(), state.changed, keys, groups)
    base = without_expired(materialize([run], 1), declared, now_ms=1_500)
    assert base.rows["total"].column("key").to_pylist() == ["k-2"]
    assert base.rows["seen"].column("value").to_pylist() == [3]
    assert base.rows[ttl_state_name("seen")].column("value").to_pylist() == [800]
    assert without_expired(base, declared, now_ms=10_000).rows["total"].num_rows == 0


Model = dict[str, dict[Any, list[tuple[int, int]]]]
"""state -> entry (a key, or (key, user key)) -> [(value, last access)]; a list state's
entry is its key, its elements in order."""

USER = {
    "total": ValueState("int64", ttl=TTL.update_ttl_on_read_and_write()),
    "seen": ListState("int64", ttl=TTL),
    "last": MapState("object", "int64", ttl=TTL),
}
DECLARED = with_ttl_companions(USER)


def live(model: Model, now: int) -> dict[str, dict[Any, list[int]]]:
    found: dict[str, dict[Any, list[int]]] = {}
    for name, entries in model.items():
        ttl = USER[name].ttl
        assert ttl is not None
        found[name] = {}
        for entry, elements in entries.items():
            kept = [v for v, stamp in elements if stamp + ttl.ttl_ms > now]
            if kept:
                found[name][entry] = kept
    return found


def seen_by_function(state: KeyedState) -> dict[str, dict[Any, list[int]]]:
    found: dict[str, dict[Any, list[int]]] = {}
    for name, read in (("total", state.value), ("seen", state.list), ("last", state.map)):
        found[name] = {}
        for entry, value in zip(read(name).index, read(name).tolist(), strict=True):
            found[name].setdefault(entry, []).append(value)
    return found


def of_keys(model: Model, keys: list[str]) -> dict[str, dict[Any, list[int]]]:
    def key_of(entry: Any) -> Any:
        return entry[0] if isinstance(entry, tuple) else entry

    return {
        name: {e: [v for v, _ in el] for e, el in entries.items() if key_of(e) in keys}
        for name, entries in model.items()
    }


def expire(model: Model, keys: list[str], now: int) -> None:
    """What a read of ``keys`` does to the model: expired entries gone; refreshed on read."""
    for name, entries in model.items():
        ttl = USER[name].ttl
        assert ttl is not None
        for entry in list(entries):
            key = entry[0] if isinstance(entry, tuple) else entry
            if key not in keys:
                continue
            kept = [(v, s) for v, s in entries[entry] if s + ttl.ttl_ms > now]
            if ttl.refreshed_on_read:
                kept = [(v, now) for v, _ in kept]
            if kept:
                entries[entry] = kept
            else:
                del entries[entry]


@pytest.mark.parametrize("seed", range(5))
def test_random_rounds_through_runs_merges_and_folds_never_show_an_expired_entry(
    seed: int,
) -> None:
    rng = random.Random(seed)
    universe = [f"k-{i}" for i in range(30)]
    model: Model = {name: {} for name in USER}
    runs: list[Run] = []
    base: Run | None = None
    now = 0
    for _ in range(40):
        now += rng.randrange(0, 400)
        keys = sorted(rng.sample(universe, rng.randrange(1, 10)))
        array, groups = np.array(keys, dtype=object), np.zeros(len(keys), dtype=np.int64)
        before = lookup([(r, None) for r in runs], [base] if base else [], array, groups, DECLARED)
        state = KeyedState(DECLARED, before, current_processing_time=now)
        expire(model, keys, now)
        assert seen_by_function(state) == of_keys(model, keys)
        written = rng.sample(keys, max(1, len(keys) // 2))
        values = [rng.randrange(100) for _ in written]
        state.update_value("total", pd.Series(values, index=written))
        for key, value in zip(written, values, strict=True):
            model["total"][key] = [(value, now)]
        appended = rng.sample(keys, 1)
        state.add_to_list("seen", pd.Series([now], index=appended))
        model["seen"].setdefault(appended[0], []).append((now, now))
        entry = (rng.choice(keys), f"u{rng.randrange(3)}")
        state.put_in_map("last", pd.Series([now], index=pd.MultiIndex.from_tuples([entry])))
        model["last"][entry] = [(now, now)]
        run = changes(before, state.frames(), state.changed, array, groups)
        runs.insert(0, decode_run(encode_run(run)))
        if len(runs) >= 3 and rng.random() < 0.3:
            runs = [decode_run(encode_run(merge_runs([(r, {0}) for r in runs])))]
        if rng.random() < 0.3:
            folded = materialize([*runs, *([base] if base else [])], 0)
            base = decode_run(encode_run(without_expired(folded, DECLARED, now)))
            runs = []
            for name in USER:  # nothing expired is kept in a base
                stamps = base.rows.get(ttl_state_name(name))
                oldest = min(stamps.column("value").to_pylist()) if stamps else now
                assert oldest + 1_000 > now
    everyone = np.array(universe, dtype=object)
    groups = np.zeros(len(universe), dtype=np.int64)
    final = lookup([(r, None) for r in runs], [base] if base else [], everyone, groups, DECLARED)
    assert seen_by_function(KeyedState(DECLARED, final, current_processing_time=now)) == live(
        model, now
    )
