"""bench/latency.py's input: a process of its own that writes one workload's records to the input
topic at a steady rate and records when each was produced (a thread of the measuring process
would share its interpreter lock with the consumer and distort both).

``python bench/latency_feed.py --bootstrap B --topic T --workload example|peers --records N
--rate R --seconds S --out FILE``: encodes the N records first (values and keys, so the paced
loop only calls ``produce``), prints ``ready`` and waits for commands on its standard input:

- ``warmup``: a trickle of warm-up records (``WARMUP_RATE`` a second) that the benchmark can
  tell from the measured ones in the output (example: payment ids from ``WARMUP_BASE``; peers:
  users ``w<k>``), until the next command;
- ``go``: the steady feed. Record i is due at ``start + i / rate`` (wall clock); the loop
  produces every record that is due, then sleeps until the next is (at least ``PACE_S``), and
  stops after S seconds or N records. Each record's production time is ``time.time()`` just
  before its ``produce`` call (a record produced late is stamped late: the latency measured
  starts when the record was handed to the client). At the end it flushes, writes FILE (numpy ``.npz``:
  ``times`` of the records produced, ``expects``: whether the job writes an output for it) and
  prints ``done {json}``: start, end, records produced, the achieved rate, delivery failures.

``--fill``: no pacing, no commands: the N records as fast as possible, for the pre-filled runs.

The producer is sparkpoint's (``producer_config``: acks=all, idempotent, Java's partitioner)
with ``linger.ms`` 5, keyed by account or user.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import sys
import time

import numpy as np
from confluent_kafka import KafkaError, Message, Producer
from peers import workload

from sparkpoint.agent.example import ACCOUNTS, START_MS, Payment, payments
from sparkpoint.common.kafka import producer_config

WARMUP_BASE = 1 << 40
"""Example workload: warm-up payments have ids from here on (measured ids are 0..N-1)."""
WARMUP_RATE = 50.0
LINGER_MS = 5
PACE_S = 0.001
"""The paced loop sleeps at least this long when no record is due: records due meanwhile are
produced together, up to a millisecond after they were due (their stamps say when)."""


class Commands:
    """Lines from standard input without blocking (``select`` on the raw descriptor: Python's
    buffered reader would hide lines it already read from ``select``)."""

    def __init__(self) -> None:
        self.buffer = b""

    def next(self, timeout_s: float | None) -> str | None:
        while b"\n" not in self.buffer:
            ready, _, _ = select.select([0], [], [], timeout_s)
            if not ready:
                return None
            chunk = os.read(0, 4096)
            if not chunk:
                return "quit"
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line.decode().strip()


def encoded(kind: str, records: int) -> tuple[list[bytes], list[bytes], np.ndarray]:
    """Values, keys and whether the job emits an output for each record."""
    if kind == "example":
        values, keys, expects = [], [], np.zeros(records, dtype=bool)
        for payment in payments(records):
            values.append(payment.to_json())
            keys.append(payment.account.encode())
            expects[payment.id] = payment.amount > 0  # the job drops refunds
        return values, keys, expects
    data = workload(records)
    users, amounts = data.users.tolist(), data.amounts.tolist()
    values = [b'{"user": "u%d", "amount": %d}' % pair for pair in zip(users, amounts, strict=True)]
    keys = [b"u%d" % u for u in users]
    return values, keys, np.ones(records, dtype=bool)


def warmup_record(kind: str, k: int) -> tuple[bytes, bytes]:
    if kind == "example":
        payment = Payment(WARMUP_BASE + k, f"acct-{k % ACCOUNTS:05d}", 100, START_MS)
        return payment.to_json(), payment.account.encode()
    return b'{"user": "w%d", "amount": 1}' % (k % 64), b"w%d" % (k % 64)


class Feed:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.failed = 0
        config = producer_config(args.bootstrap, client_id="latency-feed", linger_ms=LINGER_MS)
        self.producer = Producer(config | {"on_delivery": self.delivered})

    def delivered(self, error: KafkaError | None, _message: Message) -> None:
        if error is not None:
            self.failed += 1

    def produce(self, value: bytes, key: bytes) -> None:
        while True:
            try:
                self.producer.produce(self.args.topic, value, key)
                return
            except BufferError:
                self.producer.poll(0.005)

    def warmup(self, commands: Commands) -> str:
        """Warm-up records until the next command, which it returns."""
        k = 0
        while True:
            value, key = warmup_record(self.args.workload, k)
            self.produce(value, key)
            k += 1
            self.producer.poll(0)
            command = commands.next(1 / WARMUP_RATE)
            if command is not None:
                self.producer.flush(30)
                return command

    def steady(self, values: list[bytes], keys: list[bytes]) -> dict[str, float | int]:
        """Paced by wall clock; returns the figures of the feed, ``times`` filled."""
        rate, n = self.args.rate, len(values)
        self.times = np.zeros(n)
        times = self.times
        produce, poll, now, sleep = (
            self.producer.produce,
            self.producer.poll,
            time.time,
            time.sleep,
        )
        topic = self.args.topic
        start = now()
        deadline = start + self.args.seconds
        i = 0
        while i < n:
            current = now()
            if current >= deadline:
                break
            due = min(n, int((current - start) * rate) + 1)
            if i >= due:
                # sleep at least PACE_S: a loop spinning for the next record would take a core
                # from the system under test at every rate above a few hundred a second
                poll(0)
                sleep(min(0.005, max(PACE_S, start + i / rate - current)))
                continue
            while i < due:
                stamp = now()
                try:
                    produce(topic, values[i], keys[i])
                except BufferError:
                    poll(0.005)
                    continue
                times[i] = stamp
                i += 1
                if i % 2000 == 0:
                    poll(0)
            poll(0)
        end = now()
        undelivered = self.producer.flush(60)
        return {
            "start": start,
            "end": end,
            "produced": i,
            "rate": round(i / (end - start), 1),
            "flushed_at": now(),
            "undelivered": undelivered,
            "failed": self.failed,
        }

    def fill(self, values: list[bytes], keys: list[bytes]) -> dict[str, float | int]:
        start = time.time()
        for i, (value, key) in enumerate(zip(values, keys, strict=True)):
            self.produce(value, key)
            if i % 10_000 == 0:
                self.producer.poll(0)
        undelivered = self.producer.flush(120)
        end = time.time()
        return {
            "start": start,
            "end": end,
            "produced": len(values),
            "rate": round(len(values) / (end - start), 1),
            "undelivered": undelivered,
            "failed": self.failed,
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--workload", choices=["example", "peers"], required=True)
    parser.add_argument("--records", type=int, required=True)
    parser.add_argument("--rate", type=float, default=0.0)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--out", help="the .npz of production times (steady feed)")
    parser.add_argument("--fill", action="store_true", help="unpaced, no commands")
    args = parser.parse_args()

    values, keys, expects = encoded(args.workload, args.records)
    feed = Feed(args)
    if args.fill:
        print("done " + json.dumps(feed.fill(values, keys)), flush=True)
        return
    print("ready", flush=True)
    commands = Commands()
    command = commands.next(None)
    if command == "warmup":
        command = feed.warmup(commands)
    if command != "go":
        return
    figures = feed.steady(values, keys)
    produced = int(figures["produced"])
    np.savez(args.out, times=feed.times[:produced], expects=expects[:produced])
    figures["expected_outputs"] = int(expects[:produced].sum())
    print("done " + json.dumps(figures), flush=True)


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        sys.exit(130)
