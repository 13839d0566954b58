"""The example job's keyed function, run batch by batch without Spark, against the plain-Python
reference: the output must not depend on how records are cut into batches."""

from __future__ import annotations

import pandas as pd
import pytest

from sparkpoint.agent.example import PaymentStats, payments, positive, reference_output
from sparkpoint.agent.job import KeyedState
from sparkpoint.common.keygroups import key_groups


def run(batches: list[pd.DataFrame], end_of_input: bool) -> list[tuple[str, str, int, int]]:
    function = PaymentStats()
    states: dict[int, KeyedState] = {}
    out = []
    for batch in batches:
        batch = positive(batch)
        groups = key_groups(batch["account"].to_numpy(), 128)
        for group, records in batch.groupby(groups):
            state = states.setdefault(int(group), KeyedState(function.state, {}))
            out.append(function.process(records.reset_index(drop=True), state))
    if end_of_input:
        out += [function.on_end_of_input(state) for state in states.values()]
    frame = pd.concat(out, ignore_index=True)
    return sorted(zip(frame["kind"], frame["account"], frame["id"], frame["value"], strict=True))


@pytest.mark.parametrize("batch_size", [60, 700, 5_000])
def test_any_batching_gives_the_reference_output(batch_size: int) -> None:
    events = list(payments(1_500, accounts=40))
    frame = pd.DataFrame([e.__dict__ for e in events])
    batches = [frame.iloc[i : i + batch_size] for i in range(0, len(frame), batch_size)]

    assert run(batches, end_of_input=True) == reference_output(events, end_of_input=True)
    assert run(batches, end_of_input=False) == reference_output(events, end_of_input=False)


def test_refunds_are_dropped_and_windows_close_when_a_later_one_starts() -> None:
    events = list(payments(2_000, accounts=3))
    output = reference_output(events, end_of_input=False)
    assert len([o for o in output if o[0] == "total"]) == sum(e.amount > 0 for e in events)
    assert any(o[0] == "window" for o in output)
