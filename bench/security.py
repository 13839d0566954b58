"""What security costs: the same work on a plaintext broker and on a secured one (TLS, a client
certificate, SCRAM-SHA-512), and the REST API over http against https with a bearer token.

- Kafka, raw: a consumer reads N payments from the start (one partition's worth of fetches per
  poll), records/s.
- Kafka, a job: the example job (bounded, local[2], exactly-once Kafka sink, checkpoints every
  second) over the same N payments, records/s, as bench/pipeline.py measures it.
- REST: GET /jobs/{id}/checkpoints, latency p50/p99 over ``--requests`` calls, one client.

On this machine the secured broker is tansu behind sparkpoint's TLS/SASL front, a Python
process relaying every byte (common/broker_front.py): the Kafka figures bound the cost from
above; Apache Kafka terminates TLS in the broker. The plaintext job runs first, on a Spark
session still warming up, so the job ratio flatters the secured run; the consumer's and REST's
figures have no such bias. Prints the figures and writes
bench/results/security.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import ssl
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from confluent_kafka import Consumer, TopicPartition
from pipeline import run_job
from recording import percentiles, start_coordinator, write_results

from sparkpoint.agent.example import generate
from sparkpoint.agent.spark.session import spark_session
from sparkpoint.common.avro import EventCodec
from sparkpoint.common.broker import BrokerSecurity, EmbeddedBroker, free_port
from sparkpoint.common.dev_certs import DevCerts, make_dev_certs
from sparkpoint.common.kafka import consumer_config
from sparkpoint.common.kafka_config import CONFIG_ENV
from sparkpoint.common.rest_security import RestSecurity, token_digest

RECORDS = 300_000
REQUESTS = 500
PASSWORD = f"bench-{uuid.uuid4().hex}"
TOKEN = f"bench-token-{uuid.uuid4().hex}"


def consume_all(bootstrap: str, topic: str, records: int) -> float:
    """Records per second of one consumer reading ``records`` from the start of ``topic``."""
    consumer = Consumer(consumer_config(bootstrap, client_id="bench-reader"))
    partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
    consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
    started, count = time.perf_counter(), 0
    while count < records and time.perf_counter() - started < 120:
        count += sum(1 for m in consumer.consume(10_000, 1.0) if m.error() is None)
    elapsed = time.perf_counter() - started
    consumer.close()
    return round(count / elapsed)


def figures(
    name: str, bootstrap: str, spark: Any, root: Path, args: argparse.Namespace, rest: Rest
) -> dict[str, Any]:
    os.environ["SPARKPOINT_TOPIC_PREFIX"] = f"b{uuid.uuid4().hex[:8]}."
    port = free_port()
    service = start_coordinator(bootstrap, root / name, 6, port, rest.security)
    try:
        generate(bootstrap, "payments", args.records)
        raw = consume_all(bootstrap, "payments", args.records)
        print(f"{name}: a consumer reads {raw:,} records/s")
        agent, job = run_job(
            f"bench-{name}", bootstrap, EventCodec(), spark, root / name, args.records
        )
        url = f"{rest.scheme}://127.0.0.1:{port}"
        latency = rest_latency(url, f"/jobs/{agent.job.id}/checkpoints", args.requests, rest)
        print(f"{name}: GET /jobs/{{id}}/checkpoints over {rest.scheme} p50/p99 {latency} ms")
    finally:
        service.stop()
    return {"consumer_records_per_second": raw, "job": job, "rest_checkpoints_ms": latency}


def secured_broker(files: Path) -> tuple[EmbeddedBroker, Path, DevCerts]:
    certs = make_dev_certs(files, ["127.0.0.1", "localhost"], ["bench"])
    server = str(certs.server)
    broker = EmbeddedBroker(
        security=BrokerSecurity(server, server, str(certs.ca), {"bench": PASSWORD})
    )
    config = files / "client.properties"
    config.write_text(
        "security.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-512\nsasl.username=bench\n"
        f"sasl.password={PASSWORD}\nssl.ca.location={certs.ca}\n"
        f"ssl.certificate.location={certs.client_cert('bench')}\n"
        f"ssl.key.location={certs.client_key('bench')}\n"
    )
    return broker, config, certs


@dataclass
class Rest:
    """How the bench's coordinator serves REST, and how the bench calls it."""

    security: RestSecurity | None = None
    verify: ssl.SSLContext | bool = True
    token: str | None = None

    @property
    def scheme(self) -> str:
        return "https" if self.security is not None else "http"


def secured_rest(certs: DevCerts, files: Path) -> Rest:
    """https with the dev CA's server certificate, and an access list holding one operate
    token (kept as its SHA-256, as an operator would)."""
    access = files / "rest-access.json"
    access.write_text(
        json.dumps(
            {"tokens": [{"principal": "bench", "role": "operate", "sha256": token_digest(TOKEN)}]}
        )
    )
    security = RestSecurity(certs.server, certs.server, None, access)
    return Rest(security, ssl.create_default_context(cafile=str(certs.ca)), TOKEN)


def rest_latency(url: str, path: str, requests: int, rest: Rest) -> dict[str, float]:
    """Latency of ``requests`` GETs of ``path``, one kept-alive client, in ms."""
    times = []
    headers = {"Authorization": f"Bearer {rest.token}"} if rest.token else {}
    with httpx.Client(base_url=url, timeout=10, verify=rest.verify, headers=headers) as http:
        for _ in range(requests):
            started = time.perf_counter()
            answer = http.get(path)
            times.append((time.perf_counter() - started) * 1000)
            answer.raise_for_status()
    return {k: round(v, 2) for k, v in percentiles(times).items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=RECORDS)
    parser.add_argument("--requests", type=int, default=REQUESTS)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="sparkpoint-bench-security-"))
    spark = spark_session("sparkpoint-bench-security", "local[2]")
    results: dict[str, Any] = {"benchmark": "security", "records": args.records}
    try:
        with EmbeddedBroker() as broker:
            results["plaintext"] = figures("plaintext", broker.bootstrap, spark, root, args, Rest())
        secured, config, certs = secured_broker(root / "tls")
        with secured:
            os.environ[CONFIG_ENV] = str(config)
            try:
                results["sasl_ssl"] = figures(
                    "sasl_ssl", secured.bootstrap, spark, root, args, secured_rest(certs, root)
                )
            finally:
                del os.environ[CONFIG_ENV]
    finally:
        spark.stop()  # type: ignore[attr-defined]
        shutil.rmtree(root, ignore_errors=True)
    plain, tls = results["plaintext"], results["sasl_ssl"]
    results["job_ratio"] = round(
        tls["job"]["records_per_second"] / plain["job"]["records_per_second"], 2
    )
    results["consumer_ratio"] = round(
        tls["consumer_records_per_second"] / plain["consumer_records_per_second"], 2
    )
    print(
        f"secured / plaintext: consumer {results['consumer_ratio']}x, job {results['job_ratio']}x"
    )
    print(
        f"REST p50: http {plain['rest_checkpoints_ms']['p50']} ms, https with a token "
        f"{tls['rest_checkpoints_ms']['p50']} ms"
    )
    print(f"wrote {write_results('security', results)}")


if __name__ == "__main__":
    main()
