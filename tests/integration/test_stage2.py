"""Stage 2 of a subtask on real files (services/sparkpoint/agent/rounds/ (fetch.py, process.py)): one call of the keyed function
per round over every key group that got records, the state split back per key group. The
output over several rounds and the end of input must equal the plain-Python reference, and each
key group's state file must hold its own keys only (a rescale moves whole key groups)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar

import pandas as pd
import pytest

from sparkpoint.agent.example import PaymentStats, payments, positive, reference_output
from sparkpoint.agent.job import KeyedState, StateDescriptor, ValueState
from sparkpoint.agent.rounds.frames import KEY_GROUP_COLUMN, from_ipc, to_ipc
from sparkpoint.agent.rounds.process import ProcessTask, process_subtask
from sparkpoint.agent.rounds.user_code import UserCodeRaised
from sparkpoint.agent.state.backend import decode_state, read_file, working_path
from sparkpoint.common.keygroups import key_group, key_groups

MAX_PARALLELISM = 128


def segment(directory: Path, name: str, rows: list[dict[str, object]]) -> str:
    frame = positive(pd.DataFrame(rows)).reset_index(drop=True)
    frame[KEY_GROUP_COLUMN] = key_groups(frame["account"].to_numpy(), MAX_PARALLELISM)
    (directory / name).write_bytes(to_ipc(frame))
    return name


def rounds(
    tmp_path: Path, function: object, batches: list[list[dict[str, object]]]
) -> tuple[list[tuple[str, str, int, int]], dict[int, int | str]]:
    """Runs stage 2 of one subtask that owns every key group over ``batches`` (a round each),
    then the end of input; returns the output and the key groups' state versions."""
    channel, state = tmp_path / "channel", tmp_path / "state"
    channel.mkdir()
    versions: dict[int, int | str] = {}
    emitted: list[pd.DataFrame] = []
    for number, rows in enumerate([*batches, []], start=1):
        names = [segment(channel, f"seg-{number}", rows)] if rows else []
        task = ProcessTask(
            0, str(channel), names, dict(versions), str(state), number,
            str(tmp_path / f"out-{number}.arrow"), end_of_input=not rows, key="account",
        )  # fmt: skip
        result = process_subtask(task, function)  # type: ignore[arg-type]
        versions.update(dict.fromkeys(result.new_versions, number))
        if result.output_path:
            emitted.append(from_ipc(result.output_path))
    out = pd.concat(emitted, ignore_index=True)
    rows_out = [(r.kind, r.account, int(r.id), int(r.value)) for r in out.itertuples(index=False)]
    return rows_out, versions


class SortingInPlace(PaymentStats):
    """Reorders its records in place by account (stable: each key's order stays)."""

    def process(self, records: pd.DataFrame, state: KeyedState) -> pd.DataFrame:
        records.sort_values("account", kind="stable", inplace=True)
        return super().process(records, state)


@pytest.mark.parametrize("function", [PaymentStats(), SortingInPlace()], ids=["plain", "sorting"])
def test_rounds_of_many_key_groups_give_the_reference_output_and_state_per_key_group(
    tmp_path: Path, function: PaymentStats
) -> None:
    events = list(payments(6_000, accounts=300))
    batches = [[vars(e) for e in events[i : i + 1_500]] for i in range(0, len(events), 1_500)]

    got, versions = rounds(tmp_path, function, batches)

    assert sorted(got) == sorted(reference_output(events, end_of_input=True))
    assert len(versions) > 64  # the rounds covered most of the 128 key groups
    for group, version in versions.items():
        path = working_path(str(tmp_path / "state"), group, int(version))
        frames = decode_state(read_file(path), PaymentStats.state)
        keys = set(frames["total"].index) | set(frames["windows"].index.get_level_values(0))
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
