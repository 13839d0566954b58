"""Key groups computed inside Spark executors (vectorized, over Arrow batches) are the ones the
driver computes: the workers run this interpreter and this package."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pandas as pd
import pytest

from sparkpoint.agent.spark.jobs import RECOVERY_POOL, ROUNDS_POOL, SINK_POOL
from sparkpoint.common.keygroups import key_group, key_group_range, key_groups, operator_index

pytestmark = pytest.mark.spark


def with_key_groups(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
    for batch in batches:
        yield batch.assign(
            key_group=key_groups(batch["customer"].to_numpy(), 128),
            long_group=key_groups(batch["account"].to_numpy(), 128),
        )


def test_executors_assign_the_key_groups_the_driver_assigns(spark: Any) -> None:
    rows = pd.DataFrame(
        {
            "customer": [f"customer-{i % 211}" for i in range(20_000)],
            "account": [i * 7919 - 10**9 for i in range(20_000)],
        }
    )
    frame = spark.createDataFrame(rows).repartition(4)
    schema = "customer string, account long, key_group int, long_group int"

    result = frame.mapInPandas(with_key_groups, schema=schema).toPandas()

    assert len(result) == 20_000
    assert all(result["key_group"] == [key_group(c, 128) for c in result["customer"]])
    assert all(result["long_group"] == [key_group(int(a), 128) for a in result["account"]])


def test_partitioning_by_subtask_puts_each_key_group_in_its_owners_range(spark: Any) -> None:
    rows = pd.DataFrame({"customer": [f"c{i}" for i in range(5000)], "account": list(range(5000))})
    grouped = (
        spark.createDataFrame(rows)
        .mapInPandas(
            with_key_groups, schema="customer string, account long, key_group int, long_group int"
        )
        .toPandas()
    )
    parallelism = 3
    for group, subtask in zip(
        grouped["key_group"],
        (operator_index(128, parallelism, g) for g in grouped["key_group"]),
        strict=True,
    ):
        assert group in key_group_range(128, parallelism, subtask)


def test_the_agents_session_shares_the_cores_between_rounds_recovery_and_the_sink(
    spark: Any,
) -> None:
    """The session's FAIR pools come from services/sparkpoint/agent/spark/spark_pools.xml: the
    rounds' (``stage2``), recovery's and the sink's minimum shares exceed any cluster, so FAIR
    gives the next core to the pool running fewer tasks; between pools running as many, Spark
    takes the name that sorts first, and the sink's must sort before the rounds' (a completed
    epoch's task takes the core a round frees before the next round's tasks do)."""
    context = spark.sparkContext._jsc.sc()
    pools = [context.getPoolForName(n) for n in (ROUNDS_POOL, RECOVERY_POOL, SINK_POOL)]
    assert all(p.isDefined() for p in pools)
    assert all(p.get().minShare() >= 10_000 for p in pools)
    assert SINK_POOL < ROUNDS_POOL, "FAIR's tie-break: the sink's pool first"
    assert str(context.getSchedulingMode()) == "FAIR"
