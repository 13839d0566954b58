"""The bundled example job (``sparkpoint agent example``, what the demo runs) and its generator.

Payment events ``{"id", "account", "amount", "ts"}`` (amount in cents; refunds are negative, and
the job drops them) are keyed by account. For each account the job keeps a running total (value
state) and counts payments per 10-second event-time tumbling window (the window library,
`sparkpoint.agent.time.windows`: map state and an event-time timer per window). It emits:

- ``{"kind": "total", "account", "id": payment id, "value": running total after it}`` per payment;
- ``{"kind": "window", "account", "id": window start, "value": count}`` when a window fires:
  once the watermark (event time from ``ts``, 1 s of out-of-orderness allowed) passes the
  window's end, also for an account that sends nothing more; a bounded input's end (or a
  ``--drain``) fires the rest.

Events of one account are in event-time order (one Kafka partition, generated in order), so no
payment is late and the output does not depend on how records are batched: a plain-Python
reference (`reference_output`) computes exactly what the job must commit.
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import ClassVar

import pandas as pd
from confluent_kafka import Producer

from sparkpoint.agent.job import (
    Job,
    KafkaSink,
    KafkaSource,
    KeyedFunction,
    KeyedState,
    StateDescriptor,
    ValueState,
)
from sparkpoint.agent.time.strategy import WatermarkStrategy
from sparkpoint.agent.time.windows import TumblingEventTimeWindows, WindowAggregate
from sparkpoint.common.kafka import make_admin, producer_config

log = logging.getLogger(__name__)

INPUT_TOPIC = "payments"
OUTPUT_TOPIC = "payment-stats"
WINDOW_MS = 10_000
ACCOUNTS = 1_000
START_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z: generated event times are reproducible
STEP_MS = 7


def positive(frame: pd.DataFrame) -> pd.DataFrame:
    """Stage 1: refunds (amount <= 0) are dropped."""
    return frame[frame["amount"] > 0]


WATERMARKS = WatermarkStrategy.for_bounded_out_of_orderness("1s").with_timestamp_column("ts")
"""Event time from the payments' ``ts``, each partition's in order. No idleness: a partition that
paused longer than an idle timeout would make its next payments late (dropped), and the
reference counts every payment; `WatermarkStrategy.with_idleness` is there for jobs that prefer
windows to fire through a silent partition."""


def payment_windows() -> WindowAggregate:
    """A count of payments per account and 10 s event-time tumbling window."""
    return WindowAggregate(
        TumblingEventTimeWindows.of(WINDOW_MS), {"value": ("*", "count")}, timestamp_column="ts"
    )


class PaymentStats(KeyedFunction):
    """A running total per account (value state), and a count per account and 10 s window, on
    the window library: each window fires once the watermark passes its end."""

    state: ClassVar[Mapping[str, StateDescriptor]] = {
        "total": ValueState("int64"),
        **payment_windows().state,
    }

    @cached_property
    def windows(self) -> WindowAggregate:
        """The function's windows (made on first use, so that a subclass need not call this
        class's ``__init__``)."""
        return payment_windows()

    def process(self, records: pd.DataFrame, state: KeyedState) -> pd.DataFrame:
        account = records["account"]
        base = account.map(state.value("total")).fillna(0).astype("int64")
        totals = base + records.groupby("account", sort=False)["amount"].cumsum().astype("int64")
        state.update_value("total", totals.groupby(account, sort=False).last())
        emitted = pd.DataFrame(
            {"kind": "total", "account": account, "id": records["id"], "value": totals}
        )
        # no payment is late, and without allowed lateness no window fires on a record
        fired = self.windows.process(records, state)
        if not len(fired):
            return emitted
        return pd.concat([emitted, window_records(fired)], ignore_index=True)

    def on_timer(self, timers: pd.DataFrame, state: KeyedState) -> pd.DataFrame:
        return window_records(self.windows.on_timer(timers, state))


def window_records(fired: pd.DataFrame) -> pd.DataFrame:
    """The window library's rows (account, window_start, window_end, value) as the job's."""
    if not len(fired):
        return pd.DataFrame()
    return pd.DataFrame(
        {
            "kind": "window",
            "account": fired["account"].to_numpy(dtype=object),
            "id": fired["window_start"].to_numpy().astype("int64"),
            "value": fired["value"].to_numpy().astype("int64"),
        }
    )


def example_job(
    name: str = "payments-example",
    input_topic: str = INPUT_TOPIC,
    output_topic: str = OUTPUT_TOPIC,
    bounded: bool = False,
    parallelism: int = 2,
    settings: dict[str, str] | None = None,
) -> Job:
    return Job(
        name=name,
        source=KafkaSource([input_topic], bounded=bounded, watermark_strategy=WATERMARKS),
        map=positive,
        key="account",
        function=PaymentStats(),
        sink=KafkaSink(output_topic),
        parallelism=parallelism,
        settings={
            "execution.checkpointing.interval": "3s",
            # a cancelled (Ctrl-C, docker stop) job keeps its checkpoints: --restore latest resumes
            "execution.checkpointing.externalized-checkpoint-retention": "RETAIN_ON_CANCELLATION",
            **(settings or {}),
        },
    )


# --- the generator -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Payment:
    id: int
    account: str
    amount: int
    ts: int

    def to_json(self) -> bytes:
        return json.dumps(
            {"id": self.id, "account": self.account, "amount": self.amount, "ts": self.ts}
        ).encode()


def payments(
    count: int | None, start_id: int = 0, seed: int = 7, accounts: int = ACCOUNTS
) -> Iterator[Payment]:
    """Reproducible payments: the same seed and ids give the same events."""
    rng = random.Random(seed * 1_000_003 + start_id)
    i = start_id
    while count is None or i < start_id + count:
        amount = rng.randint(1, 50_000) if rng.random() > 0.05 else -rng.randint(1, 5_000)
        yield Payment(i, f"acct-{rng.randrange(accounts):05d}", amount, START_MS + i * STEP_MS)
        i += 1


def ensure_topic(bootstrap: str, topic: str, partitions: int = 4) -> None:
    from confluent_kafka.admin import NewTopic

    admin = make_admin(bootstrap)
    if topic in admin.list_topics(timeout=10).topics:
        return
    futures = admin.create_topics([NewTopic(topic, partitions, 1)])
    for future in futures.values():
        try:
            future.result(15)
        except Exception as exc:
            if "TOPIC_ALREADY_EXISTS" not in str(exc):
                raise


def generate(
    bootstrap: str,
    topic: str = INPUT_TOPIC,
    count: int | None = None,
    rate: float | None = None,
    start_id: int = 0,
    seed: int = 7,
    progress: bool = False,
    accounts: int = ACCOUNTS,
) -> int:
    """Writes payments keyed by account (acks=all); ``rate`` events per second, or as fast as
    possible; until ``count`` or Ctrl-C. Returns how many were written (all delivered)."""
    ensure_topic(bootstrap, topic)
    config = producer_config(bootstrap, client_id="sparkpoint-generator") | {"linger.ms": 20}
    producer = Producer(config)
    started = time.monotonic()
    written = 0
    try:
        for payment in payments(count, start_id, seed, accounts):
            while True:
                try:
                    producer.produce(topic, value=payment.to_json(), key=payment.account.encode())
                    break
                except BufferError:
                    producer.poll(0.05)
            written += 1
            if rate:
                ahead = written / rate - (time.monotonic() - started)
                if ahead > 0:
                    producer.poll(min(ahead, 0.5))
            if written % 10_000 == 0:
                producer.poll(0)
                if progress:
                    log.info("generated %d payments", written)
    except KeyboardInterrupt:
        log.info("interrupted after %d payments; flushing", written)
    undelivered = producer.flush(60)
    if undelivered:
        raise RuntimeError(f"{undelivered} payments left undelivered")
    return written


def reference_output(
    events: Iterable[Payment], end_of_input: bool, watermark: int | None = None
) -> list[tuple[str, str, int, int]]:
    """What the example job must commit, computed one event at a time in plain Python: every
    payment's total, and the windows that fired: all of them at the end of the input, else
    those whose end the ``watermark`` passed (None: none)."""
    totals: dict[str, int] = {}
    windows: dict[tuple[str, int], int] = {}
    out: list[tuple[str, str, int, int]] = []
    for e in sorted(events, key=lambda p: p.id):
        if e.amount <= 0:
            continue
        totals[e.account] = totals.get(e.account, 0) + e.amount
        out.append(("total", e.account, e.id, totals[e.account]))
        start = e.ts // WINDOW_MS * WINDOW_MS
        windows[e.account, start] = windows.get((e.account, start), 0) + 1
    for (account, start), n in windows.items():
        if end_of_input or (watermark is not None and start + WINDOW_MS - 1 <= watermark):
            out.append(("window", account, start, n))
    return sorted(out)
