"""bench/latency.py's reader of the output: a process of its own that notes when each output
record becomes visible.

``python bench/latency_consumer.py --bootstrap B --topic T --workload example|peers --out FILE``
reads every partition of the output topic from its start with ``isolation.level=read_committed``
and ``fetch.wait.max.ms`` 5 (sparkpoint's CONTROL consumer profile; no consumer group, the
partitions are assigned). A record's arrival is ``time.time()`` when the ``poll`` that brought
its fetch returned. Each output record is reduced to the input record it comes from:

- example: the payment ``id`` of a ``"total"`` record (``"window"`` records, which no single
  payment causes, are counted and left out);
- peers: ``user << 40 | sum`` (bench/peers.py's encoding; a user's running sums grow strictly,
  so the pair names one input record);

warm-up records (example: ids from ``latency_feed.WARMUP_BASE``; peers: users ``w<k>``) are
counted apart. The ``sparkpoint.transaction`` header of each record (exactly-once sink) is kept
as an index into a list of tokens, so the benchmark can drop records of aborted transactions:
the embedded broker shows them to read_committed readers.

It prints ``ready``, then ``seen <measured> <warm-up>`` every 0.1 s, and on ``stop`` (or the
end of its standard input) writes FILE (``.npz``: ``keys``, ``arrivals``, ``tokens``, and the
token strings as ``token_names``) and prints ``done {json}``.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections.abc import Callable

import numpy as np
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from sparkpoint.common.kafka import ConsumerProfile, consumer_config

WARMUP_BASE = 1 << 40
"""As latency_feed.WARMUP_BASE."""
SUM_BITS = 40
TRANSACTION_HEADER = "sparkpoint.transaction"
"""sparkpoint.agent.sinks.kafka.TRANSACTION_HEADER (not imported: that module brings Spark's
and pandas' import time to a process that only reads)."""
WARMUP = -1
OTHER = -2


def decoder(workload: str) -> Callable[[bytes], int]:
    """The input record an output value comes from, WARMUP or OTHER."""
    loads = json.loads
    if workload == "example":

        def example(value: bytes) -> int:
            row = loads(value)
            if row["kind"] != "total":
                return OTHER
            payment = int(row["id"])
            return WARMUP if payment >= WARMUP_BASE else payment

        return example

    def peers(value: bytes) -> int:
        row = loads(value)
        user = row["user"]
        if user[0] == "w":
            return WARMUP
        return (int(user[1:]) << SUM_BITS) | int(row["sum"])

    return peers


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--workload", choices=["example", "peers"], required=True)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    stop = threading.Event()

    def commands() -> None:
        for line in sys.stdin:
            if line.strip() == "stop":
                break
        stop.set()

    threading.Thread(target=commands, daemon=True).start()
    config = consumer_config(
        args.bootstrap,
        client_id="latency-reader",
        profile=ConsumerProfile.CONTROL,
        read_committed=True,
    )
    consumer = Consumer(config)
    consumer.assign(
        [TopicPartition(args.topic, p, OFFSET_BEGINNING) for p in range(args.partitions)]
    )
    decode = decoder(args.workload)
    keys: list[int] = []
    arrivals: list[float] = []
    tokens: list[int] = []
    token_index: dict[bytes | None, int] = {None: -1}
    warmups = others = errors = undecodable = 0
    print("ready", flush=True)
    reported = 0.0
    while not stop.is_set():
        first = consumer.poll(0.05)
        now = time.time()
        if first is not None:
            for message in [first, *consumer.consume(10_000, 0)]:
                if message.error() is not None:
                    errors += 1
                    continue
                try:
                    key = decode(message.value() or b"")
                except (ValueError, KeyError, TypeError, IndexError):
                    undecodable += 1
                    continue
                if key == WARMUP:
                    warmups += 1
                    continue
                if key == OTHER:
                    others += 1
                    continue
                headers = message.headers() or []  # a consumed message's: a list of pairs
                pairs = headers.items() if isinstance(headers, dict) else headers
                token: bytes | None = None
                for name, header in pairs:
                    if name == TRANSACTION_HEADER and isinstance(header, bytes):
                        token = header
                index = token_index.get(token)
                if index is None:
                    index = token_index[token] = len(token_index) - 1
                keys.append(key)
                arrivals.append(now)
                tokens.append(index)
        if now - reported >= 0.1:
            print(f"seen {len(keys)} {warmups}", flush=True)
            reported = now
    consumer.close()
    names = [t.decode() for t in sorted(token_index, key=token_index.__getitem__) if t]
    np.savez(
        args.out,
        keys=np.array(keys, dtype=np.int64),
        arrivals=np.array(arrivals, dtype=np.float64),
        tokens=np.array(tokens, dtype=np.int32),
        token_names=np.array(names, dtype=str),
    )
    figures = {
        "outputs": len(keys),
        "warmup_outputs": warmups,
        "other_outputs": others,
        "errors": errors,
        "undecodable": undecodable,
    }
    print("done " + json.dumps(figures), flush=True)


if __name__ == "__main__":
    main()
