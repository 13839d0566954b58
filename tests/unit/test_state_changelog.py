"""Keyed state as runs of changes (services/sparkpoint/agent/state/changelog.py), against a
plain-dict model: random rounds of value, list and map state changes over a few key groups,
looked up through change runs and bases, materialized at random moments, encoded and decoded.
Pure: no files, no Spark."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from sparkpoint.agent.job import KeyedState, ListState, MapState, ValueState
from sparkpoint.agent.state.changelog import (
    KH,
    Run,
    _take,
    changes,
    decode_run,
    encode_run,
    lookup,
    materialize,
    materialize_groups,
    merge_runs,
    positions,
)

DECLARED = {
    "total": ValueState("float64"),
    "seen": ListState("int64"),
    "last": MapState("object", "int64"),
}
GROUPS = 8


def group_of(key: str) -> int:
    return int(key.split("-")[1]) % GROUPS


Model = dict[str, dict[str, Any]]
"""state name -> key -> value (total), list (seen) or dict (last)."""


def as_model(found: dict[str, pd.Series]) -> Model:
    total = found["total"]
    seen = found["seen"]
    last = found["last"]
    out: Model = {"total": dict(zip(total.index, total.tolist(), strict=True)), "seen": {}}
    for key, value in zip(seen.index, seen.tolist(), strict=True):
        out["seen"].setdefault(key, []).append(value)
    out["last"] = {}
    for (key, user_key), value in zip(last.index, last.tolist(), strict=True):
        out["last"].setdefault(key, {})[user_key] = value
    return out


def expected(model: Model, keys: list[str]) -> Model:
    return {name: {k: v for k, v in model[name].items() if k in keys} for name in DECLARED}


def a_round(rng: random.Random, model: Model, state: KeyedState, keys: list[str]) -> set[str]:
    """Random changes to the given keys' state, made through KeyedState as a function would,
    mirrored in ``model``; returns the states changed."""
    changed: set[str] = set()
    if rng.random() < 0.8:
        touched = rng.sample(keys, max(1, len(keys) // 2))
        values = pd.Series([rng.random() for _ in touched], index=touched)
        state.update_value("total", values)
        model["total"].update(dict(zip(touched, values.tolist(), strict=True)))
        changed.add("total")
    if rng.random() < 0.3:
        gone = rng.sample(keys, 1)
        state.clear_value("total", gone)
        model["total"].pop(gone[0], None)
        changed.add("total")
    if rng.random() < 0.6:
        appended = [(k, rng.randrange(100)) for k in rng.sample(keys, max(1, len(keys) // 3))]
        appended += appended[:1]  # a key twice: its values in order
        state.add_to_list(
            "seen", pd.Series([v for _, v in appended], index=[k for k, _ in appended])
        )
        for key, value in appended:
            model["seen"].setdefault(key, []).append(value)
        changed.add("seen")
    if rng.random() < 0.5:
        entries = [(k, f"u{rng.randrange(4)}") for k in rng.sample(keys, max(1, len(keys) // 3))]
        index = pd.MultiIndex.from_tuples(entries, names=["key", "user_key"])
        values = pd.Series([rng.randrange(1000) for _ in entries], index=index)
        values = values[~values.index.duplicated(keep="last")]
        state.put_in_map("last", values)
        for (key, user_key), value in zip(values.index, values.tolist(), strict=True):
            model["last"].setdefault(key, {})[user_key] = value
        changed.add("last")
    if rng.random() < 0.2:
        current = state.map("last")
        if len(current):
            drop = current.index[:1]
            state.remove_from_map("last", drop)
            key, user_key = drop[0]
            del model["last"][key][user_key]
            if not model["last"][key]:
                del model["last"][key]
            changed.add("last")
    return changed & state.changed


def first_format(run: Run) -> Run:
    """A change run as the first format wrote it: every key it replaced listed, those it has
    rows of too (the format now lists only the keys replaced by no rows)."""
    replaced = {}
    for name in {*run.rows, *(run.replaced or {})}:
        parts = [
            t.select([KH, "key"]).to_pandas()
            for t in (run.rows.get(name), (run.replaced or {}).get(name))
            if t is not None and t.num_rows
        ]
        if parts:
            listed = pd.concat(parts).drop_duplicates("key").sort_values(KH, kind="stable")
            replaced[name] = pa.Table.from_pandas(listed, preserve_index=False)
    return Run(run.rows, replaced)


@pytest.mark.parametrize("earlier_format", [False, True])
@pytest.mark.parametrize("seed", range(16))
def test_lookups_through_changes_merges_and_bases_match_a_model(
    seed: int, earlier_format: bool
) -> None:
    """Each key group has a base and a chain of runs (newest first), as the backend keeps them;
    runs are shared by key groups; a merge replaces a contiguous newest-first segment of the
    runs still in some chain; a materialization replaces a key group's chain by a base. Runs of
    the earlier format (every replaced key listed) mean the same, merged with either."""
    rng = random.Random(seed)
    universe = [f"k-{i}" for i in range(60)]
    model: Model = {name: {} for name in DECLARED}
    bases: dict[int, Run | None] = dict.fromkeys(range(GROUPS))
    chains: dict[int, list[tuple[int, Run]]] = {g: [] for g in range(GROUPS)}

    def in_use() -> list[tuple[int, Run]]:
        found = {seq: run for chain in chains.values() for seq, run in chain}
        return sorted(found.items(), key=lambda item: -item[0])

    def live(seq: int) -> frozenset[int]:
        return frozenset(g for g, chain in chains.items() if any(s == seq for s, _ in chain))

    def folded_together(wanted: set[int]) -> dict[str, list[dict[str, Any]]]:
        layers: list[tuple[Run, set[int]]] = [(run, live(seq) & wanted) for seq, run in in_use()]
        layers += [(bases[g], {g}) for g in sorted(wanted) if bases[g] is not None]
        base = materialize_groups(layers)
        return {name: table.to_pylist() for name, table in base.rows.items() if table.num_rows}

    def folded_one_by_one(wanted: set[int]) -> dict[str, list[dict[str, Any]]]:
        found: dict[str, list[dict[str, Any]]] = {}
        for group in sorted(wanted):
            chain = [run for _, run in chains[group]]
            base = materialize([*chain, *([bases[group]] if bases[group] else [])], group)
            for name, table in base.rows.items():
                found.setdefault(name, []).extend(table.to_pylist())
        return {name: rows for name, rows in sorted(found.items()) if rows}

    def state_of(keys: list[str]) -> dict[str, pd.Series]:
        return lookup(
            [(run, live(seq)) for seq, run in in_use()],
            [base for base in bases.values() if base is not None],
            np.array(keys, dtype=object),
            np.array([group_of(k) for k in keys]),
            DECLARED,
        )

    for seq in range(60):
        keys = rng.sample(universe, rng.randrange(1, 20))
        before = state_of(keys)
        assert as_model(before) == expected(model, keys)
        state = KeyedState(DECLARED, before)
        changed = a_round(rng, model, state, keys)
        if changed:
            groups = np.array([group_of(k) for k in keys])
            run = changes(before, state.frames(), changed, np.array(keys, dtype=object), groups)
            if earlier_format and rng.random() < 0.5:
                run = first_format(run)
            run = decode_run(encode_run(run))
            for group in run.groups():
                chains[group].insert(0, (seq, run))
        runs = in_use()
        if len(runs) >= 3 and rng.random() < 0.3:  # a contiguous segment merged
            start = rng.randrange(len(runs) - 1)
            segment = runs[start : start + rng.randrange(2, 5)]
            merged = decode_run(encode_run(merge_runs([(r, live(s)) for s, r in segment])))
            members = {s for s, _ in segment}
            newest = segment[0][0]
            for group, chain in chains.items():
                if any(s in members for s, _ in chain):
                    kept = [(s, r) for s, r in chain if s not in members]
                    chains[group] = sorted([*kept, (newest, merged)], key=lambda i: -i[0])
        if rng.random() < 0.3:  # several key groups folded in one call, as stored timers are
            wanted = set(rng.sample(range(GROUPS), rng.randrange(1, GROUPS + 1)))
            assert folded_together(wanted) == folded_one_by_one(wanted)
        if rng.random() < 0.25:  # a key group materialized
            group = rng.randrange(GROUPS)
            base = bases[group]
            chain = [run for _, run in chains[group]]
            bases[group] = decode_run(
                encode_run(materialize([*chain, *([base] if base else [])], group))
            )
            chains[group] = []
    assert as_model(state_of(universe)) == expected(model, universe)


def test_a_key_replaced_by_nothing_is_gone_though_a_base_has_it() -> None:
    declared = {"total": ValueState("int64")}
    keys = np.array(["k-1", "k-2"], dtype=object)
    groups = np.array([1, 1])
    base = materialize(
        [
            changes(
                {"total": pd.Series([], dtype="int64")},
                {"total": pd.Series([1, 2], index=keys)},
                {"total"},
                keys,
                groups,
            )
        ],
        1,
    )
    removed = changes(
        {"total": pd.Series([1, 2], index=keys)},
        {"total": pd.Series([2], index=keys[1:])},
        {"total"},
        keys,
        groups,
    )
    found = lookup([(removed, None)], [base], keys, groups, declared)["total"]
    assert found.to_dict() == {"k-2": 2}


def test_rows_of_another_key_with_the_same_position_are_not_returned() -> None:
    """Two keys whose hashes collide share a position; a search finds both and keeps the one
    asked for."""
    table = pa.table(
        {
            KH: pa.array(np.array([5, 7, 7, 9], dtype=np.uint64)),
            "key": pa.array(["a", "b", "c", "d"]),
            "value": pa.array([1, 2, 3, 4]),
        }
    )
    taken = _take(table, np.array([7], dtype=np.uint64), pa.array(["c"]))
    assert taken.column("value").to_pylist() == [3]


def test_a_function_that_sets_the_state_of_a_key_it_was_not_given_is_named() -> None:
    keys = np.array(["k-1"], dtype=object)
    with pytest.raises(KeyError, match="k-9"):
        changes(
            {"total": pd.Series([], dtype="int64")},
            {"total": pd.Series([1], index=["k-9"])},
            {"total"},
            keys,
            np.array([1]),
        )


def test_positions_put_the_key_group_first_and_are_the_same_for_a_number_and_its_string() -> None:
    kh = positions(np.array([3, 3]), np.array([12, "12"], dtype=object))
    assert kh[0] == kh[1]
    assert int(kh[0]) >> 48 == 3


def test_a_merge_leaves_out_what_a_key_groups_base_already_holds() -> None:
    """Runs A, B, C: A changes k-1 (group 1) and k-2 (group 2); B only k-1, after which group 1
    is materialized (its base holds A and B); C changes k-9 (group 1) and k-2. Merging C and A
    (the runs still in use, A now live for group 2 only) must not bring A's k-1 back above the
    base."""
    declared = {"total": ValueState("int64")}
    nothing = {"total": pd.Series([], dtype="int64")}

    def run(values: dict[str, int]) -> Run:
        keys = np.array(list(values), dtype=object)
        after = {"total": pd.Series(list(values.values()), index=keys)}
        groups = np.array([group_of(k) for k in keys])
        return changes(nothing, after, {"total"}, keys, groups)

    a, b, c = run({"k-1": 10, "k-2": 20}), run({"k-1": 11}), run({"k-9": 30, "k-2": 21})
    base_1 = materialize([b, a], 1)
    merged = merge_runs([(c, {1, 2}), (a, {2})])
    keys = np.array(["k-1", "k-2", "k-9"], dtype=object)
    found = lookup([(merged, {1, 2})], [base_1], keys, np.array([1, 2, 1]), declared)
    assert found["total"].to_dict() == {"k-1": 11, "k-2": 21, "k-9": 30}


def test_merges_and_bases_keep_each_key_of_a_colliding_position_from_its_newest_run() -> None:
    """Keys "b" and "c" share a position (their hashes collide), and so do "x" and "y": a merge
    and a materialization decide per position in one sort, then per key where keys collide.
    The newer run has "b" and replaces "x" by nothing; the older has "c", "b", "x" and "y" (two
    rows of "y", a list kept in order): "c", "y" and the newer "b" survive, "x" is gone."""

    def table(kh: list[int], keys: list[str], values: list[int]) -> pa.Table:
        return pa.table(
            {
                KH: pa.array(np.array(kh, dtype=np.uint64)),
                "key": pa.array(keys),
                "value": pa.array(values, pa.int64()),
            }
        )

    def no_keys() -> pa.Table:
        return pa.table({KH: pa.array([], pa.uint64()), "key": pa.array([], pa.string())})

    newer = Run(
        {"s": table([7], ["b"], [2])},
        {"s": pa.table({KH: pa.array(np.array([9], dtype=np.uint64)), "key": pa.array(["x"])})},
    )
    older = Run(
        {"s": table([7, 7, 9, 9, 9], ["c", "b", "x", "y", "y"], [30, 1, 40, 50, 51])},
        {"s": no_keys()},
    )
    merged = merge_runs([(newer, {0}), (older, {0})])
    rows = merged.rows["s"]
    pairs = zip(rows.column("key").to_pylist(), rows.column("value").to_pylist(), strict=True)
    assert sorted(pairs) == [("b", 2), ("c", 30), ("y", 50), ("y", 51)]
    assert merged.replaced is not None and merged.replaced["s"].column("key").to_pylist() == ["x"]
    base = materialize([newer, older], 0)
    assert base.rows["s"].column("key").to_pylist() == ["b", "c", "y", "y"]
    assert base.rows["s"].column("value").to_pylist() == [2, 30, 50, 51]
