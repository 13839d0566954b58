"""A round's planning of a Kafka source on the driver: what asking every partition's end costs as
the partitions grow. Writes bench/results/planning.json.

Each round plans its reads from each partition's latest offset (Spark's Kafka source asks a
micro-batch's end offsets the same way). Until 2026-11-29 the agent asked one partition per
request (a consumer's ``get_watermark_offsets``, a round trip each, one after another); it now asks
every partition in one ListOffsets request per leader (`partition_offsets`). Here a topic of P
partitions holding ``--records`` records each, on the embedded broker, and the driver's source
reader (`KafkaSourceReader.plan`) timed over ``--plans`` plans, beside the one-by-one lookups it
replaced. On a broker across a network every round trip adds its latency, so the one-by-one
figure grows by P times that; the batched one by about one.
"""

from __future__ import annotations

import argparse
import time
import uuid

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import NewTopic
from recording import percentiles, write_results

from sparkpoint.agent.job import KafkaSource
from sparkpoint.agent.sources.kafka import KafkaSourceReader
from sparkpoint.common.broker import EmbeddedBroker
from sparkpoint.common.kafka import consumer_config, make_admin, make_producer


def fill(bootstrap: str, partitions: int, records: int) -> str:
    topic = f"planning-{partitions}-{uuid.uuid4().hex[:6]}"
    admin = make_admin(bootstrap)
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)
    producer = make_producer(bootstrap)
    for i in range(partitions * records):
        while True:
            try:
                producer.produce(topic, b'{"user": "u1", "amount": 1}', partition=i % partitions)
                break
            except BufferError:
                producer.poll(0.05)
    producer.flush(60)
    return topic


def timed(plans: int, plan: object) -> dict[str, float]:
    samples = []
    for _ in range(plans):
        started = time.perf_counter()
        plan()  # type: ignore[operator]
        samples.append(round((time.perf_counter() - started) * 1000, 3))
    return percentiles(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--partitions", default="4,16,64,256")
    parser.add_argument("--records", type=int, default=200, help="per partition")
    parser.add_argument("--plans", type=int, default=50)
    options = parser.parse_args()
    rows = []
    with EmbeddedBroker() as broker:
        for count in [int(p) for p in options.partitions.split(",")]:
            topic = fill(broker.bootstrap, count, options.records)
            reader = KafkaSourceReader(KafkaSource([topic]), broker.bootstrap, parallelism=2)
            reader.start(None)
            consumer = Consumer(consumer_config(broker.bootstrap, client_id="planning-bench"))

            def one_by_one(
                consumer: Consumer = consumer, reader: KafkaSourceReader = reader
            ) -> None:
                for partition in reader.partitions:
                    consumer.get_watermark_offsets(
                        TopicPartition(*partition), timeout=10, cached=False
                    )

            batched, old = timed(options.plans, reader.plan), timed(options.plans, one_by_one)
            reader.close()
            consumer.close()
            rows.append({"partitions": count, "plan_ms": batched, "one_by_one_ends_ms": old})
            print(
                f"{count:>4} partitions: a round's plan p50 {batched['p50']:.2f} ms "
                f"(p99 {batched['p99']:.2f}); the one-by-one ends alone p50 {old['p50']:.2f} ms"
            )
    results = {
        "benchmark": "planning",
        "method": (__doc__ or "").split("\n\n")[1].replace("\n", " "),
        "settings": {"records_per_partition": options.records, "plans": options.plans},
        "broker": "embedded (tansu), on this machine (no network between driver and broker)",
        "runs": rows,
    }
    print(f"wrote {write_results('planning', results)}")


if __name__ == "__main__":
    main()
