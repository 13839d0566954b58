"""Stage 2 of a subtask on real files (services/sparkpoint/agent/rounds/process.py and
agent/state/): one call of the keyed function per round with the state of its records' keys,
one change run per round, runs merged and key groups folded into bases as the books ask. The
output over many rounds and the end of input must equal the plain-Python reference, and each key
group's state must hold its own keys only (a rescale moves whole key groups)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar

import numpy as np
import pandas as pd
import pytest

from sparkpoint.agent.example import PaymentStats, payments, positive, reference_output
from sparkpoint.agent.job import (
    KeyedFunction,
    KeyedState,
    StateDescriptor,
    ValueState,
    declared_state,
)
from sparkpoint.agent.rounds.frames import KEY_GROUP_COLUMN, from_ipc, to_ipc
from sparkpoint.agent.rounds.process import ProcessTask, has_end_of_input_hook, process_subtask
from sparkpoint.agent.rounds.user_code import UserCodeRaised
from sparkpoint.agent.state.backend import encode_state
from sparkpoint.agent.state.books import StateBackend, restored_file
from sparkpoint.agent.state.runs import StateView
from sparkpoint.agent.time.strategy import MAX_WATERMARK, MIN_WATERMARK
from sparkpoint.agent.time.ttl import StateTtlConfig, ttl_state_name
from sparkpoint.common.keygroups import KeyGroupRange, key_group, key_groups

MAX_PARALLELISM = 128
EVERY_GROUP = KeyGroupRange(0, MAX_PARALLELISM - 1)


def segment(directory: Path, name: str, rows: list[dict[str, object]]) -> str:
    frame = positive(pd.DataFrame(rows)).reset_index(drop=True)
    frame[KEY_GROUP_COLUMN] = key_groups(frame["account"].to_numpy(), MAX_PARALLELISM)
    (directory / name).write_bytes(to_ipc(frame))
    return name


def rounds(
    tmp_path: Path, function: object, batches: list[list[dict[str, object]]],
    materialize_interval_s: float = 600.0,
) -> tuple[list[tuple[str, str, int, int]], StateBackend]:  # fmt: skip
    """Runs stage 2 of one subtask that owns every key group over ``batches`` (a round each),
    then the end of input, the driver's books told what each round wrote (a clock that moves a
    second a round); returns the output and the books."""
    channel = tmp_path / "channel"
    channel.mkdir()
    books = StateBackend(str(tmp_path / "state"), materialize_interval_s=materialize_interval_s)
    emitted: list[pd.DataFrame] = []
    watermark = MIN_WATERMARK
    for number, rows in enumerate([*batches, []], start=1):
        names = [segment(channel, f"seg-{number}", rows)] if rows else []
        seq = books.seq(number)
        asked = books.subtask_state(EVERY_GROUP, seq, 0, float(number))
        # the watermark a 1 s bounded out-of-orderness allows after the round (the final one at
        # the end); any key group may hold a due timer
        after = max(int(r["ts"]) for r in rows) - 1_001 if rows else MAX_WATERMARK  # type: ignore[call-overload]
        task = ProcessTask(
            0, str(channel), names, asked, books.run_path(seq, 0),
            str(tmp_path / f"out-{number}.arrow"), end_of_input=not rows, key="account",
            watermark=watermark, watermark_after=max(watermark, after),
            timer_groups=list(range(MAX_PARALLELISM)),
        )  # fmt: skip
        watermark = max(watermark, after)
        result = process_subtask(task, function)  # type: ignore[arg-type]
        books.install(asked, result.written, seq, float(number))
        if result.output_path:
            emitted.append(from_ipc(result.output_path))
    out = pd.concat(emitted, ignore_index=True)
    rows_out = [(r.kind, r.account, int(r.id), int(r.value)) for r in out.itertuples(index=False)]
    return rows_out, books


class SortingInPlace(PaymentStats):
    """Reorders its records in place by account (stable: each key's order stays)."""

    def process(self, records: pd.DataFrame, state: KeyedState) -> pd.DataFrame:
        records.sort_values("account", kind="stable", inplace=True)
        return super().process(records, state)


@pytest.mark.parametrize("materialize_interval_s", [1e9, 0.0], ids=["runs", "bases"])
@pytest.mark.parametrize("function", [PaymentStats(), SortingInPlace()], ids=["plain", "sorting"])
def test_rounds_of_many_key_groups_give_the_reference_output_and_state_per_key_group(
    tmp_path: Path, function: PaymentStats, materialize_interval_s: float
) -> None:
    """Enough rounds for runs to merge; with a zero interval, key groups also fold into bases
    (a share each round)."""
    events = list(payments(6_000, accounts=300))
    batches = [[vars(e) for e in events[i : i + 400]] for i in range(0, len(events), 400)]

    got, books = rounds(tmp_path, function, batches, materialize_interval_s)

    assert sorted(got) == sorted(reference_output(events, end_of_input=True))
    assert len(books.chains) > 64  # the rounds covered most of the 128 key groups
    assert any(r.level > 0 for c in books.chains.values() for r in c.runs), "runs merged"
    based = [g for g, c in books.chains.items() if c.base is not None]
    assert bool(based) == (materialize_interval_s == 0.0)
    view = StateView(books.subtask_state(EVERY_GROUP, 99, 0, 0.0), PaymentStats.state)
    for group in books.chains:
        folded = view.folded(group)
        keys = {k for table in folded.rows.values() for k in table.column("key").to_pylist()}
        assert keys and {key_group(k, MAX_PARALLELISM) for k in keys} == {group}


class StateOfAStranger(PaymentStats):
    """Sets state for a key it was not given."""

    state: ClassVar[Mapping[str, StateDescriptor]] = {"total": ValueState("int64")}

    def process(self, records: pd.DataFrame, state: KeyedState) -> pd.DataFrame:
        state.update_value("total", pd.Series([1], index=["nobody-sent-this"]))
        return pd.DataFrame()


def test_state_set_for_a_key_the_function_was_not_given_is_the_functions_error(
    tmp_path: Path,
) -> None:
    events = [vars(e) for e in payments(100)]
    with pytest.raises(UserCodeRaised, match="nobody-sent-this"):
        rounds(tmp_path, StateOfAStranger(), [events])


def test_a_key_groups_file_of_the_earlier_format_is_read_as_its_base(tmp_path: Path) -> None:
    """A checkpoint taken before state was kept as runs holds one file per key group; restored,
    each is that key group's base, and the next round continues from its state."""
    events = [vars(e) for e in payments(400, accounts=20)]
    account = events[0]["account"]
    mine = [e for e in events if e["account"] == account]
    group = key_group(account, MAX_PARALLELISM)
    legacy = tmp_path / "shared" / f"kg-{group:05d}-0123abcd.arrow"
    legacy.parent.mkdir()
    total = pd.Series([1_000_000], index=pd.Index([account], name="key"), dtype="int64")
    legacy.write_bytes(encode_state({"total": total}))
    books = StateBackend(str(tmp_path / "state"), materialize_interval_s=1e9)
    books.restore([restored_file(str(legacy), legacy.stat().st_size, group, group)], shared=True)
    (tmp_path / "channel").mkdir()
    seq = books.seq(1)
    asked = books.subtask_state(EVERY_GROUP, seq, 0, 0.0)
    task = ProcessTask(
        0, str(tmp_path / "channel"), [segment(tmp_path / "channel", "seg-1", mine)], asked,
        books.run_path(seq, 0), str(tmp_path / "out.arrow"), key="account",
    )  # fmt: skip
    books.install(asked, process_subtask(task, PaymentStats()).written, seq, 0.0)

    view = StateView(books.subtask_state(EVERY_GROUP, seq + 1, 0, 0.0), PaymentStats.state)
    found = view.lookup(np.array([account], dtype=object), np.array([group]))
    positive_amounts = sum(int(e["amount"]) for e in mine if int(e["amount"]) > 0)
    assert found["total"].to_dict() == {account: 1_000_000 + positive_amounts}


def test_only_a_function_with_an_end_of_input_hook_reads_all_its_state_at_the_end() -> None:
    class NoHook(KeyedFunction):
        pass

    class Hook(KeyedFunction):
        def on_end_of_input(self, state: KeyedState) -> pd.DataFrame:
            return pd.DataFrame()

    assert has_end_of_input_hook(Hook()) and not has_end_of_input_hook(NoHook())
    assert not has_end_of_input_hook(PaymentStats())  # its windows fire on the final watermark


class CountsThatExpire(KeyedFunction):
    """Records per account, forgotten a second after an account's last record."""

    state: ClassVar[Mapping[str, StateDescriptor]] = {
        "count": ValueState("int64", ttl=StateTtlConfig.new_builder("1s").build())
    }

    def process(self, records: pd.DataFrame, state: KeyedState) -> pd.DataFrame:
        counts = records.groupby("account", sort=False).size()
        total = state.value("count").reindex(counts.index).fillna(0).astype("int64") + counts
        state.update_value("count", total)
        return pd.DataFrame({"account": total.index, "count": total.to_numpy()})


def test_state_ttl_forgets_an_idle_key_on_read_and_its_fold_drops_what_nobody_read(
    tmp_path: Path,
) -> None:
    """Rounds at processing times 0, 0.6 s and 1.5 s of real files and books: an account idle
    for 1 s starts again from nothing; one never read again is gone from the base its key group
    is folded into, its timestamp too, while a live one stays."""
    (tmp_path / "channel").mkdir()
    books = StateBackend(str(tmp_path / "state"), materialize_interval_s=1e9)
    function = CountsThatExpire()
    base_ms = 1_000_000
    got: list[dict[str, int]] = []
    plan = [(0, ["a", "b", "c"]), (600, ["b"]), (1_500, ["a", "b"])]
    for number, (at_ms, accounts) in enumerate(plan, start=1):
        rows = [{"id": i, "account": a, "amount": 5, "ts": 0} for i, a in enumerate(accounts)]
        seq = books.seq(number)
        asked = books.subtask_state(EVERY_GROUP, seq, 0, float(number))
        task = ProcessTask(
            0, str(tmp_path / "channel"), [segment(tmp_path / "channel", f"s-{number}", rows)],
            asked, books.run_path(seq, 0), str(tmp_path / f"out-{number}.arrow"), key="account",
            processing_time=base_ms + at_ms,
        )  # fmt: skip
        result = process_subtask(task, function)
        books.install(asked, result.written, seq, float(number))
        out = from_ipc(result.output_path) if result.output_path else pd.DataFrame()
        got.append(dict(zip(out["account"], out["count"].astype(int), strict=True)))
    assert got == [{"a": 1, "b": 1, "c": 1}, {"b": 2}, {"a": 1, "b": 3}]

    view = StateView(books.subtask_state(EVERY_GROUP, 99, 0, 0.0), declared_state(function))

    def kept(account: str, at_ms: int) -> dict[str, list[str]]:
        base = view.folded(key_group(account, MAX_PARALLELISM), expire_at=base_ms + at_ms)
        return {name: table.column("key").to_pylist() for name, table in base.rows.items()}

    assert kept("c", 900) == {"count": ["c"], ttl_state_name("count"): ["c"]}
    assert "c" not in kept("c", 1_500)["count"] + kept("c", 1_500)[ttl_state_name("count")]
    assert kept("b", 1_500)["count"].count("b") == 1
