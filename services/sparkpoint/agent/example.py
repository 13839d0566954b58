"""The bundled example job (``sparkpoint agent example``, what the demo runs) and its generator.

Payment events ``{"id", "account", "amount", "ts"}`` (amount in cents; refunds are negative, and
the job drops them) are keyed by account. For each account the job keeps a running total (value
state) and counts payments per 10-second event-time tumbling window (map state: window start ->
count). It emits:

- ``{"kind": "total", "account", "id": payment id, "value": running total after it}`` per payment;
- ``{"kind": "window", "account", "id": window start, "value": count}`` when a window closes: a
  later window of the same account started, or the input ended (bounded runs).

Events of one account are in event-time order (one Kafka partition, generated in order), so the
output does not depend on how records are batched: a plain-Python reference (`reference_output`)
computes exactly what the job must commit.
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import pandas as pd
from confluent_kafka import Producer

from sparkpoint.agent.job import (
    Job,
    KafkaSink,
    KafkaSource,
    KeyedFunction,
    KeyedState,
    MapState,
    StateDescriptor,
    ValueState,
)
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


class PaymentStats(KeyedFunction):
    state: ClassVar[Mapping[str, StateDescriptor]] = {
        "total": ValueState("int64"),
        "latest_window": ValueState("int64"),
        "windows": MapState("int64", "int64"),
    }

    def process(self, records: pd.DataFrame, state: KeyedState) -> pd.DataFrame:
        account = records["account"]
        base = account.map(state.value("total")).fillna(0).astype("int64")
        totals = base + records.groupby("account", sort=False)["amount"].cumsum().astype("int64")
        state.update_value("total", totals.groupby(account, sort=False).last())
        emitted = [
            pd.DataFrame(
                {"kind": "total", "account": account, "id": records["id"], "value": totals}
            )
        ]

        window = (records["ts"] // WINDOW_MS * WINDOW_MS).astype("int64")
        counts = window.groupby([account, window]).size().astype("int64")
        counts.index = counts.index.set_names(["key", "user_key"])
        known = state.map("windows")
        counts = counts.add(known.reindex(counts.index).fillna(0).astype("int64"))
        state.put_in_map("windows", counts)
        latest = window.groupby(account).max()
        previous = state.value("latest_window").reindex(latest.index).astype("float64")
        latest = pd.Series(
            np.fmax(latest.to_numpy("float64"), previous.to_numpy()), index=latest.index
        )
        state.update_value("latest_window", latest)

        windows = state.map("windows")
        keys = windows.index.get_level_values(0)
        starts = windows.index.get_level_values(1)
        closed = windows[starts < keys.map(state.value("latest_window")).to_numpy()]
        if len(closed):
            emitted.append(window_records(closed))
            state.remove_from_map("windows", closed.index)
        return pd.concat(emitted, ignore_index=True)

    def on_end_of_input(self, state: KeyedState) -> pd.DataFrame:
        """The final watermark: every open window fires."""
        windows = state.map("windows")
        if not len(windows):
            return pd.DataFrame()
        state.remove_from_map("windows", windows.index)
        return window_records(windows)


def window_records(windows: pd.Series) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "kind": "window",
            "account": windows.index.get_level_values(0),
            "id": windows.index.get_level_values(1).astype("int64"),
            "value": windows.to_numpy().astype("int64"),
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
        source=KafkaSource([input_topic], bounded=bounded),
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
    events: Iterable[Payment], end_of_input: bool
) -> list[tuple[str, str, int, int]]:
    """What the example job must commit, computed one event at a time in plain Python."""
    totals: dict[str, int] = {}
    windows: dict[str, dict[int, int]] = {}
    latest: dict[str, int] = {}
    out: list[tuple[str, str, int, int]] = []
    for e in sorted(events, key=lambda p: p.id):
        if e.amount <= 0:
            continue
        totals[e.account] = totals.get(e.account, 0) + e.amount
        out.append(("total", e.account, e.id, totals[e.account]))
        start = e.ts // WINDOW_MS * WINDOW_MS
        open_windows = windows.setdefault(e.account, {})
        open_windows[start] = open_windows.get(start, 0) + 1
        latest[e.account] = max(latest.get(e.account, start), start)
        for w in [w for w in open_windows if w < latest[e.account]]:
            out.append(("window", e.account, w, open_windows.pop(w)))
    if end_of_input:
        for account, open_windows in windows.items():
            for w, n in open_windows.items():
                out.append(("window", account, w, n))
    return sorted(out)
