"""Keyed state as runs of changes: what a round writes is what it changed.

A **run** holds rows of every declared state, sorted by one 64-bit column, ``kh``: the key group
in the top 16 bits, a hash of the key below (`positions`). A key's rows are therefore together,
in their list order, and the rows of one key group are one slice. Two kinds of run:

- a **change run**, one per keyed subtask and round: for each state the round changed, the keys
  whose rows it replaced (``replaced``: a key listed with no rows was deleted) and their new
  rows; it covers the key groups of the records the round had;
- a **base run**, one per key group: its whole state at some round (materialized).

The state of a key is in the newest run that replaced it, else in the base, else nowhere. A lookup
of a round's keys (`lookup`) therefore costs a binary search per run in the key's key group and
touches only the rows it returns: the runs can be memory-mapped files far larger than memory.
`materialize` folds a key group's runs into a new base; how often is the backend's choice.

Everything is columnar: no Python call per key or row. Hash collisions are harmless: a search
finds every row of the hash, and the rows are then kept only for the keys asked for.
"""

from __future__ import annotations

import io
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

from sparkpoint.agent.job import StateDescriptor, empty_series
from sparkpoint.agent.state.backend import table_series
from sparkpoint.agent.time.ttl import ttl_state_name

KH = "kh"
"""The sort column: key group << 48 | the key's hash's low 48 bits."""
HASH_BITS = 48
HASH_MASK = np.uint64((1 << HASH_BITS) - 1)


def positions(groups: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """The ``kh`` of each (key group, key). Keys hash as pandas hashes objects (SipHash with a
    fixed key, the same in every process), an integer as its decimal string."""
    hashed = pd.util.hash_array(np.asarray(keys, dtype=object), categorize=False)
    kh: np.ndarray = (groups.astype(np.uint64) << np.uint64(HASH_BITS)) | (hashed & HASH_MASK)
    return kh


def groups_of(kh: np.ndarray) -> np.ndarray:
    """The key group of each ``kh``."""
    groups: np.ndarray = (kh >> np.uint64(HASH_BITS)).astype(np.int64)
    return groups


def group_bounds(group: int) -> tuple[np.uint64, np.uint64]:
    """The ``kh`` range of a key group: [low, high)."""
    return np.uint64(group << HASH_BITS), np.uint64((group + 1) << HASH_BITS)


# --- a run ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    """Rows per state (a table sorted by ``kh``: kh, key, [user_key], value) and, for a change
    run, the keys it replaced by no rows per state (kh, key, sorted by kh: deleted, or a list or
    map emptied); ``replaced is None``: a base. A change run replaces the keys it has rows of and
    the keys in ``replaced``: the keys with rows are not written twice (a run of value state
    changes was about twice its entries' bytes). Runs of the first format list every replaced
    key in ``replaced``, those with rows too, which means the same."""

    rows: Mapping[str, pa.Table]
    replaced: Mapping[str, pa.Table] | None = None

    @property
    def is_base(self) -> bool:
        return self.replaced is None

    def groups(self) -> set[int]:
        """The key groups the run has rows or replaced keys of."""
        found: set[int] = set()
        for table in [*self.rows.values(), *(self.replaced or {}).values()]:
            if table.num_rows:
                found |= set(groups_of(_kh(table)).tolist())
        return found

    def nbytes(self) -> int:
        return sum(t.nbytes for t in [*self.rows.values(), *(self.replaced or {}).values()])


def _kh(table: pa.Table) -> np.ndarray:
    column = table.column(KH)
    found: np.ndarray = (
        column.chunk(0).to_numpy()  # zero copy: no nulls
        if column.num_chunks == 1
        else column.to_numpy()
    )
    return found


def encode_run(run: Run) -> bytes:
    """One Arrow IPC file: a table of (state, part, Arrow IPC stream bytes)."""
    names, parts, payloads = [], [], []
    for part, tables in (("rows", run.rows), ("replaced", run.replaced or {})):
        for name, table in sorted(tables.items()):
            sink = io.BytesIO()
            with ipc.new_stream(sink, table.schema) as writer:
                writer.write_table(table)
            names.append(name)
            parts.append(part)
            payloads.append(sink.getvalue())
    container = pa.table(
        {
            "state": pa.array(names, pa.string()),
            "part": pa.array(parts, pa.string()),
            "ipc": pa.array(payloads, pa.binary()),
        },
        metadata={"kind": "base" if run.is_base else "changes"},
    )
    out = io.BytesIO()
    with ipc.new_file(out, container.schema) as writer:
        writer.write_table(container)
    return out.getvalue()


def decode_run(data: pa.Buffer | bytes) -> Run:
    """A run from `encode_run`'s bytes; its tables share ``data``'s memory (a memory-mapped
    file stays on disk until rows are taken from it)."""
    source = data if isinstance(data, pa.Buffer) else pa.py_buffer(data)
    container = ipc.open_file(pa.BufferReader(source)).read_all()
    metadata = container.schema.metadata or {}
    rows: dict[str, pa.Table] = {}
    replaced: dict[str, pa.Table] = {}
    payloads = container.column("ipc").combine_chunks()
    for i, (name, part) in enumerate(
        zip(
            container.column("state").to_pylist(), container.column("part").to_pylist(), strict=True
        )
    ):
        buffer = payloads[i].as_buffer()  # zero copy
        table = ipc.open_stream(pa.BufferReader(buffer)).read_all()
        (rows if part == "rows" else replaced)[name] = table
    is_base = metadata.get(b"kind") == b"base"
    return Run(rows, None if is_base else replaced)


# --- series <-> tables ----------------------------------------------------------------------------


def to_table(series: pd.Series, groups: np.ndarray) -> pa.Table:
    """A state series as a run's table, sorted by ``kh`` (stable: list order is kept);
    ``groups``: each row's key group."""
    keys = _keys(series)
    every = np.arange(len(keys))
    return _table_at(series, every, positions(groups, keys), pa.array(keys))


def keys_table(keys: np.ndarray, groups: np.ndarray) -> pa.Table:
    """Replaced keys as a run's table, sorted by ``kh``."""
    kh = positions(groups, keys)
    order = np.argsort(kh, kind="stable")
    return pa.table({KH: pa.array(kh[order]), "key": pa.array(np.asarray(keys)[order])})


def to_series(name: str, table: pa.Table | None, descriptor: StateDescriptor) -> pd.Series:
    """A run's table (or the rows taken from runs) as the state series a function sees."""
    if table is None or not table.num_rows:
        return empty_series(descriptor).rename(name)
    return table_series(name, table, descriptor)


# --- lookups ----------------------------------------------------------------------------------------


def _ranges(sorted_kh: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """Row numbers of every row of ``sorted_kh`` whose value is in ``wanted`` (sorted, unique),
    in row order."""
    low = np.searchsorted(sorted_kh, wanted, "left")
    high = np.searchsorted(sorted_kh, wanted, "right")
    lengths = high - low
    hit = lengths > 0
    low, lengths = low[hit], lengths[hit]
    if not len(low):
        return np.empty(0, dtype=np.int64)
    starts = np.repeat(low - np.concatenate(([0], np.cumsum(lengths)[:-1])), lengths)
    return starts + np.arange(int(lengths.sum()))


def _take(table: pa.Table, wanted: np.ndarray, keys: pa.Array) -> pa.Table:
    """The rows of ``table`` whose kh is in ``wanted`` and whose key is in ``keys``."""
    rows = table.take(pa.array(_ranges(_kh(table), wanted)))
    if not rows.num_rows:
        return rows
    return rows.filter(pc.is_in(rows.column("key"), value_set=keys))


def lookup(
    layers: Sequence[tuple[Run, Collection[int] | None]],
    bases: Sequence[Run],
    keys: np.ndarray,
    groups: np.ndarray,
    declared: Mapping[str, StateDescriptor],
) -> dict[str, pd.Series]:
    """The state of ``keys`` (their key groups: ``groups``), one series per declared state:
    each key's rows from the newest of ``layers``, change runs (newest first, each with the key groups it
    is still live for, None: all) that replaced it, else from ``bases`` (key groups' bases:
    their ``kh`` ranges are disjoint)."""
    unique_keys, first = np.unique(np.asarray(keys, dtype=object), return_index=True)
    kh = positions(np.asarray(groups)[first].astype(np.int64), unique_keys)
    order = np.argsort(kh, kind="stable")  # so that any subset of kh is sorted too
    kh, unique_keys = kh[order], unique_keys[order]
    key_groups = groups_of(kh)
    index = pd.Index(unique_keys)
    collisions = len(_distinct(kh)) != len(kh)

    def served(taken: pa.Table) -> np.ndarray:
        """Positions (in ``unique_keys``) of the keys ``taken`` has rows of: found by ``kh``
        (sorted), by the keys themselves where two keys share a ``kh``."""
        if collisions:
            at: np.ndarray = index.get_indexer(taken.column("key").to_numpy(False))
            return at
        return np.searchsorted(kh, _kh(taken))

    found: dict[str, pd.Series] = {}
    for name, descriptor in declared.items():
        pending = np.ones(len(unique_keys), dtype=bool)
        parts: list[pa.Table] = []
        for run, live in layers:
            rows, gone = _nonempty(run.rows.get(name)), _nonempty((run.replaced or {}).get(name))
            if rows is None and gone is None:
                continue
            asked = pending if live is None else pending & np.isin(key_groups, list(live))
            if not asked.any():
                continue
            wanted, wanted_keys = _distinct(kh[asked]), pa.array(unique_keys[asked])
            for table in (rows, gone):  # the run replaced the keys it has rows of, or lists
                taken = _take(table, wanted, wanted_keys) if table is not None else None
                if taken is not None and taken.num_rows:
                    if table is rows:
                        parts.append(taken)
                    pending[served(taken)] = False
            if not pending.any():
                break
        if pending.any():
            wanted, wanted_keys = _distinct(kh[pending]), unique_keys[pending]
            for base in bases:
                rows = base.rows.get(name)
                if rows is None or not rows.num_rows:
                    continue
                low, high = group_bounds(int(_kh(rows)[0] >> np.uint64(HASH_BITS)))
                start, end = np.searchsorted(wanted, [low, high], "left")
                if start < end:
                    parts.append(_take(rows, wanted[start:end], pa.array(wanted_keys[start:end])))
        table = pa.concat_tables(parts, promote_options="permissive") if parts else None
        found[name] = to_series(name, table, descriptor)
    return found


def _nonempty(table: pa.Table | None) -> pa.Table | None:
    return table if table is not None and table.num_rows else None


def _distinct(sorted_kh: np.ndarray) -> np.ndarray:
    """``sorted_kh`` without repeats (two keys whose hashes collide): a repeated position would
    take its rows twice."""
    if len(sorted_kh) > 1 and not (sorted_kh[1:] != sorted_kh[:-1]).all():
        return np.unique(sorted_kh)
    return sorted_kh


# --- a round's changes, and materialization ------------------------------------------------------


def changes(
    before: Mapping[str, pd.Series],
    after: Mapping[str, pd.Series],
    changed: set[str],
    keys: np.ndarray,
    groups: np.ndarray,
) -> Run:
    """The change run of one round. The function was given ``keys`` (their key groups:
    ``groups``) with their state ``before``; for each state in ``changed``, the keys that had
    rows before or have rows ``after`` are replaced by their rows after (none: deleted).
    ``after`` may hold rows of the given keys only: another key raises KeyError naming it.

    The keys are hashed and converted to Arrow once per round, not once per state: each
    state's rows find their key's place among the round's keys by one hash lookup."""
    given = pd.Index(np.asarray(keys, dtype=object))
    first = ~given.duplicated()
    index = given[first]
    kh = positions(np.asarray(groups)[first].astype(np.int64), index.to_numpy())
    arrow_keys = pa.array(index.to_numpy())
    rows: dict[str, pa.Table] = {}
    replaced: dict[str, pa.Table] = {}
    for name in sorted(changed):
        series = after[name]
        row_keys = _keys(series)
        at = index.get_indexer(row_keys)
        if len(at) and (at < 0).any():
            raise KeyError(row_keys[at < 0][0])
        rows[name] = _table_at(series, at, kh, arrow_keys)
        # replaced by no rows: the keys that had rows before and have none after
        had = np.zeros(len(index), dtype=bool)
        earlier = index.get_indexer(_keys(before[name]))
        had[earlier[earlier >= 0]] = True
        had[at] = False
        emptied = np.flatnonzero(had)
        emptied = emptied[np.argsort(kh[emptied], kind="stable")]
        replaced[name] = pa.table({KH: pa.array(kh[emptied]), "key": arrow_keys.take(emptied)})
    return Run(rows, replaced)


def _table_at(series: pd.Series, at: np.ndarray, kh: np.ndarray, keys: pa.Array) -> pa.Table:
    """A state series as a run's table (`to_table`), its rows' keys at ``at`` among keys whose
    ``kh`` and Arrow values are given: a round hashes and converts its keys once for every
    state."""
    row_kh = kh[at]
    order = np.argsort(row_kh, kind="stable")
    columns: dict[str, pa.Array] = {KH: pa.array(row_kh[order]), "key": keys.take(at[order])}
    index = series.index
    if isinstance(index, pd.MultiIndex):
        columns["user_key"] = pa.array(index.get_level_values(1).to_numpy()[order])
    columns["value"] = pa.array(series.to_numpy()[order])
    return pa.table(columns)


def _keys(series: pd.Series) -> np.ndarray:
    index = series.index
    keys = index.get_level_values(0) if isinstance(index, pd.MultiIndex) else index
    return np.asarray(keys, dtype=object)


def materialize(runs: Sequence[Run], group: int, only: str | None = None) -> Run:
    """Key group ``group``'s whole state from its runs (newest first) as one base run
    (``only``: of that one state, the others left out)."""
    ends_at = next((i for i, run in enumerate(runs) if run.is_base), len(runs) - 1)
    return materialize_groups([(run, (group,)) for run in runs[: ends_at + 1]], only)


def materialize_groups(
    layers: Sequence[tuple[Run, Collection[int]]], only: str | None = None
) -> Run:
    """Several key groups' whole state as one base run, in one sort over all of them: each
    layer (newest first) is a run and the key groups it holds for them (the change runs live
    for them, then their bases), each key's rows taken from the newest layer that has it. What
    `materialize` gives per key group, at the cost of one call (key groups' ``kh`` ranges are
    disjoint)."""
    names = {name for run, _ in layers for name in run.rows} | {
        name for run, _ in layers for name in (run.replaced or {})
    }
    if only is not None:
        names &= {only}
    rows: dict[str, pa.Table] = {}
    for name in sorted(names):
        parts: list[pa.Table | None] = []
        for run, groups in layers:
            parts.append(_slices(run.rows.get(name), groups))
            replaced = None if run.replaced is None else run.replaced.get(name)
            parts.append(_slices(replaced, groups))
        kept = _newest(parts)
        found = [p for i, p in enumerate(kept) if i % 2 == 0 and p is not None]
        if found:
            rows[name] = _sorted(pa.concat_tables(found, promote_options="permissive"))
    return Run(rows)


def without_expired(base: Run, declared: Mapping[str, StateDescriptor], now_ms: int) -> Run:
    """A base run without the entries whose TTL ran out by ``now_ms`` (Flink's cleanup while
    the backend compacts; `sparkpoint.agent.time.ttl`): a state's rows and its timestamps' rows
    lie in the same order in a base (both sorted by ``kh``, a key's rows in list order), so one
    comparison over the timestamps drops both. Where they do not line up (a hash collision
    between keys written in different runs), nothing is dropped: reads still never return an
    expired entry."""
    rows = dict(base.rows)
    for name, descriptor in declared.items():
        ttl = descriptor.ttl
        stamps_name = ttl_state_name(name)
        if ttl is None or not ttl.cleanup_on_fold or stamps_name not in rows:
            continue
        stamps, table = rows[stamps_name], rows.get(name)
        if table is None or not _lined_up(table, stamps):
            continue
        live = pc.greater(pc.add(stamps.column("value"), ttl.ttl_ms), now_ms)
        if pc.all(live).as_py():
            continue
        rows[name], rows[stamps_name] = table.filter(live), stamps.filter(live)
    return Run(rows)


def _lined_up(table: pa.Table, stamps: pa.Table) -> bool:
    if table.num_rows != stamps.num_rows:
        return False
    if not np.array_equal(_kh(table), _kh(stamps)):
        return False
    if "user_key" in table.column_names:
        return bool(table.column("user_key").equals(stamps.column("user_key")))
    return True


def _slices(table: pa.Table | None, groups: Collection[int]) -> pa.Table | None:
    """The rows of ``table`` (sorted by ``kh``) in the key groups ``groups``: the table itself
    when they cover every key group it holds, else one filter."""
    if table is None or not groups or not table.num_rows:
        return None
    held = groups_of(_kh(table))
    wanted = np.fromiter(groups, dtype=np.int64, count=len(groups))
    if held[0] == held[-1]:  # one key group (a base, or a run of one)
        return table if held[0] in wanted else None
    mask = np.isin(held, wanted)
    if mask.all():
        return table
    return table.filter(pa.array(mask)) if mask.any() else None


def merge_runs(runs: Sequence[tuple[Run, Collection[int]]]) -> Run:
    """Change runs (newest first, each with the key groups it is live for) as one change run:
    for each key, the newest live run's rows. A run's rows of a key group it is not live for
    (one materialized since) are left out: they may be older than that key group's base."""
    names = sorted({name for run, _ in runs for name in [*run.rows, *(run.replaced or {})]})
    rows: dict[str, pa.Table] = {}
    replaced: dict[str, pa.Table] = {}
    for name in names:
        parts: list[pa.Table | None] = []
        for run, live in runs:
            for table in (run.rows.get(name), (run.replaced or {}).get(name)):
                parts.append(None if table is None else table.filter(_live(table, live)))
        kept = _newest(parts)
        kept_rows = [p for i, p in enumerate(kept) if i % 2 == 0 and p is not None]
        kept_keys = [p for i, p in enumerate(kept) if i % 2 == 1 and p is not None]
        replaced[name] = (
            _sorted(pa.concat_tables(kept_keys, promote_options="permissive"))
            if kept_keys
            else keys_table(np.array([], dtype=object), np.array([], dtype=np.int64))
        )
        if kept_rows:
            rows[name] = _sorted(pa.concat_tables(kept_rows, promote_options="permissive"))
    return Run(rows, replaced)


def _newest(parts: Sequence[pa.Table | None]) -> list[pa.Table | None]:
    """``parts`` (tables with ``kh`` and ``key`` columns, newest first) with each key's rows
    kept in the first part that has it and dropped from the later ones (None: a part left with
    no rows). Decided on the 64-bit ``kh`` in one sort over every part (a key's rows lie
    together in kh order); where two keys share a kh (a hash collision, rare), by the keys."""
    present = [(i, p) for i, p in enumerate(parts) if p is not None and p.num_rows]
    kept: list[pa.Table | None] = [None] * len(parts)
    if len(present) <= 1:
        for i, p in present:
            kept[i] = p
        return kept
    kh = np.concatenate([_kh(p) for _, p in present])
    rank = np.repeat(np.arange(len(present)), [p.num_rows for _, p in present])
    order = np.argsort(kh, kind="stable")  # within a kh, in part order: newest first
    sorted_kh = kh[order]
    begins = np.r_[True, sorted_kh[1:] != sorted_kh[:-1]]  # a row that starts its kh
    first = np.flatnonzero(begins)[np.cumsum(begins) - 1]  # each row's first row of its kh
    keep_sorted = rank[order] == rank[order][first]
    later = np.flatnonzero(first != np.arange(len(order)))
    if len(later):  # rows sharing a kh with an earlier row: the same key, unless a collision
        keys = pa.chunked_array(
            [p.column("key").combine_chunks() for _, p in present]
        ).combine_chunks()
        same = pc.equal(
            keys.take(pa.array(order[later])), keys.take(pa.array(order[first[later]]))
        ).to_numpy(zero_copy_only=False)
        if not same.all():
            _collisions(keys, order, first, rank, keep_sorted, later[~same])
    keep = np.empty(len(order), dtype=bool)
    keep[order] = keep_sorted
    offset = 0
    for i, part in present:
        mask = keep[offset : offset + part.num_rows]
        offset += part.num_rows
        if mask.all():
            kept[i] = part
        elif mask.any():
            kept[i] = part.filter(pa.array(mask))
    return kept


def _collisions(
    keys: pa.Array, order: np.ndarray, first: np.ndarray, rank: np.ndarray,
    keep_sorted: np.ndarray, colliding: np.ndarray,
) -> None:  # fmt: skip
    """For each kh where keys collide: each key kept in the first part that has it."""
    for start in np.unique(first[colliding]):
        end = start + 1
        while end < len(order) and first[end] == start:
            end += 1
        newest: dict[object, int] = {}
        for at in range(start, end):
            key = keys[int(order[at])].as_py()
            newest.setdefault(key, int(rank[order[at]]))
            keep_sorted[at] = newest[key] == rank[order[at]]


def _live(table: pa.Table, live: Collection[int]) -> pa.Array:
    groups = groups_of(_kh(table))
    return pa.array(np.isin(groups, list(live)))


def _sorted(table: pa.Table) -> pa.Table:
    if not table.num_rows:
        return table
    return table.take(pa.array(np.argsort(_kh(table), kind="stable")))


def from_legacy(frames: Mapping[str, pd.Series], group: int) -> Run:
    """A key group's state file of the earlier format (every state of one key group, as
    `backend.decode_state` reads it), as a base run."""
    rows = {
        name: to_table(series, np.full(len(series), group, dtype=np.int64))
        for name, series in frames.items()
        if len(series)
    }
    return Run(rows)
