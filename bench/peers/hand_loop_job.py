"""The peers benchmark's workload as a hand-written confluent-kafka loop: the floor of cost a
stream processor is measured against (run by bench/peers.py in .venv).

One process, one thread: a ``read_committed`` consumer assigned every input partition, ``json``
per record, the running sums in a dict, every updated sum produced keyed by user, and one Kafka
transaction a second holding that second's output and the consumer's positions (exactly-once
from input to output, as the systems' sinks). There is no state checkpoint: a restart would
lose the sums, which is what the frameworks pay for and this loop does not. The checkpoint
figure is one transaction's commit (``send_offsets_to_transaction`` and
``commit_transaction``).
"""

from __future__ import annotations

import importlib.metadata
import json
import time

from common import EMBEDDED_BROKER_CONSUMER, Clock, arguments, report
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Producer, TopicPartition

COMMIT_INTERVAL_S = 1.0
BATCH = 10_000


def main() -> None:
    args = arguments(__doc__ or "")
    clock = Clock()
    consumer = Consumer(
        {
            "bootstrap.servers": args.bootstrap,
            "group.id": args.name,
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            **EMBEDDED_BROKER_CONSUMER,
        }
    )
    partitions = consumer.list_topics(args.input, timeout=30).topics[args.input].partitions
    consumer.assign([TopicPartition(args.input, p, OFFSET_BEGINNING) for p in partitions])
    producer = Producer(
        {
            "bootstrap.servers": args.bootstrap,
            "transactional.id": args.name,
            "linger.ms": 5,
            "queue.buffering.max.messages": 1_000_000,
        }
    )
    producer.init_transactions(30)
    producer.begin_transaction()
    sums: dict[str, int] = {}
    positions: dict[int, int] = {}
    commits: list[float] = []
    consumed = 0
    next_commit = time.monotonic() + COMMIT_INTERVAL_S

    def commit() -> None:
        began = time.monotonic()
        offsets = [TopicPartition(args.input, p, o) for p, o in positions.items()]
        producer.send_offsets_to_transaction(offsets, consumer.consumer_group_metadata(), 30)
        producer.commit_transaction(30)
        commits.append((time.monotonic() - began) * 1000)

    while consumed < args.records:
        messages = consumer.consume(BATCH, 0.1)
        for message in messages:
            if message.error() is not None:
                raise KafkaException(message.error())
            clock.record_seen()
            row = json.loads(message.value())
            user = row["user"]
            total = sums.get(user, 0) + row["amount"]
            sums[user] = total
            value = json.dumps({"user": user, "sum": total}).encode()
            while True:
                try:
                    producer.produce(args.output, value, message.key())
                    break
                except BufferError:
                    producer.poll(0.01)
            positions[message.partition()] = message.offset() + 1
        consumed += len(messages)
        producer.poll(0)
        if time.monotonic() >= next_commit and positions:
            commit()
            producer.begin_transaction()
            next_commit = time.monotonic() + COMMIT_INTERVAL_S
    commit()
    clock.done = time.monotonic()
    consumer.close()
    report(
        {
            "first_record": clock.first_record,
            "done": clock.done,
            "checkpoint_durations_ms": commits,
            "versions": {"confluent-kafka": importlib.metadata.version("confluent-kafka")},
        }
    )


if __name__ == "__main__":
    main()
