"""The example job's keyed function, run batch by batch through the keyed-function harness (the
agent's stage-2 code, no Spark), against the plain-Python reference: the output must not depend
on how records are cut into batches, and a window fires once the watermark passes its end."""

from __future__ import annotations

import pandas as pd
import pytest

from sparkpoint.agent.example import WINDOW_MS, PaymentStats, payments, positive, reference_output
from sparkpoint.testing import KeyedFunctionHarness


def rows(frame: pd.DataFrame) -> list[tuple[str, str, int, int]]:
    if not len(frame):
        return []
    return sorted(
        (k, a, int(i), int(v))
        for k, a, i, v in zip(
            frame["kind"], frame["account"], frame["id"], frame["value"], strict=True
        )
    )


@pytest.mark.parametrize("batch_size", [60, 700, 5_000])
def test_any_batching_gives_the_reference_output(batch_size: int) -> None:
    """Each batch a round followed by the watermark its records allow (1 s out of order); the
    windows fired before the end are those the last watermark passed, the rest at the end."""
    events = list(payments(1_500, accounts=40))
    frame = pd.DataFrame([e.__dict__ for e in events])
    with KeyedFunctionHarness(PaymentStats(), "account", parallelism=2, map=positive) as harness:
        watermark = None
        for start in range(0, len(frame), batch_size):
            batch = frame.iloc[start : start + batch_size]
            harness.process(batch)
            watermark = int(batch["ts"].max()) - 1_000 - 1
            harness.process_watermark(watermark)
        before_end = rows(harness.output)
        assert before_end == reference_output(events, end_of_input=False, watermark=watermark)
        harness.end_input()
        assert rows(harness.output) == reference_output(events, end_of_input=True)


def test_refunds_are_dropped_and_a_window_fires_when_the_watermark_passes_its_end() -> None:
    events = list(payments(2_000, accounts=3))
    frame = pd.DataFrame([e.__dict__ for e in events])
    first = int(frame["ts"].min()) // WINDOW_MS * WINDOW_MS
    with KeyedFunctionHarness(PaymentStats(), "account", parallelism=1, map=positive) as harness:
        out = rows(harness.process(frame))
        assert [o for o in out if o[0] == "window"] == []
        assert len(out) == sum(e.amount > 0 for e in events)  # a total per payment, no refund
        assert rows(harness.process_watermark(first + WINDOW_MS - 2)) == []
        fired = rows(harness.process_watermark(first + WINDOW_MS - 1))
    assert {o[2] for o in fired} == {first} and len(fired) == 3  # the first window, each account
    assert fired == [
        o for o in reference_output(events, False, first + WINDOW_MS - 1) if o[0] == "window"
    ]
