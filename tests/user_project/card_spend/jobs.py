"""Spend per card: each payment's running total of its card, written for every payment."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, ClassVar

import pandas as pd

from sparkpoint import (
    Job,
    KafkaSink,
    KafkaSource,
    KeyedFunction,
    KeyedState,
    StateDescriptor,
    ValueState,
)

# checkpoints every 200 ms: in the tests a kill after the second lands before the input ends
# (at 1 s a fast machine ran the 3,000 records through on the final checkpoint alone)
SETTINGS = {"execution.checkpointing.interval": "200ms", "execution.checkpointing.min-pause": "0ms"}


class SpendPerCard(KeyedFunction):
    state: ClassVar[Mapping[str, StateDescriptor]] = {"spent": ValueState("int64")}

    def process(self, records: pd.DataFrame, state: KeyedState) -> pd.DataFrame:
        card = records["card"]
        before = card.map(state.value("spent")).fillna(0).astype("int64")
        spent = before + records.groupby("card", sort=False)["amount"].cumsum().astype("int64")
        state.update_value("spent", spent.groupby(card, sort=False).last())
        return pd.DataFrame({"card": card, "tx": records["tx"], "spent": spent})


def job(bounded: bool = True) -> Job:
    return Job(
        name="card-spend",
        source=KafkaSource(["card-payments"], bounded=bounded, max_records_per_partition=100),
        key="card",
        function=SpendPerCard(),
        sink=KafkaSink("card-spend"),
        parallelism=2,
        settings=SETTINGS,
    )


def payments(count: int, cards: int = 50) -> list[dict[str, Any]]:
    return [{"tx": i, "card": f"card-{i * 7 % cards}", "amount": i % 90 + 1} for i in range(count)]


def reference(records: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """What the job must write, one payment at a time in plain Python."""
    spent: dict[str, int] = {}
    out = []
    for r in records:
        spent[r["card"]] = spent.get(r["card"], 0) + r["amount"]
        out.append({"card": r["card"], "tx": r["tx"], "spent": spent[r["card"]]})
    return out
