"""What answering Flink's tools costs: REST latency by job id and by Flink JobID, on the instance
that owns the job and through the other one (forwarded for Flink's clients, redirected for
others). Writes bench/results/flink_rest.json.

Two ``sparkpoint coordinator`` processes share 12 partitions on the embedded broker; one fleet
agent process registers 1,000 jobs (4 subtasks, a checkpoint a minute, so the instances are
mostly idle) and acknowledges at once. For each way of asking, 400 ``GET .../checkpoints``
requests, one at a time, each for a random job owned by the instance that is asked or by the
other one:

- ``owner, job id``: ``/jobs/{job id}/checkpoints`` on the owner;
- ``owner, JobID``: ``/v1/jobs/{JobID}/checkpoints`` on the owner (the JobID is resolved among
  the instance's jobs);
- ``other, JobID, forwarded``: the same on the other instance, which forwards it to the owner
  (Flink's CLI cannot follow a redirect);
- ``other, job id, redirected``: ``/jobs/{job id}/checkpoints`` on the other instance, a 307
  followed to the owner (what curl -L and the sparkpoint command do).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import tempfile
import time
import uuid
from pathlib import Path

import httpx
from coordinator_latency import fleet_agent
from recording import CoordinatorProcess, percentiles, write_results

PARTITIONS = 12
REQUESTS = 400


def owned(url: str) -> list[str]:
    return [job["id"] for job in httpx.get(f"{url}/jobs", timeout=30).json()["jobs"]]


def timed(client: httpx.Client, url: str, follow: bool = False) -> float:
    started = time.perf_counter()
    answer = client.get(url, follow_redirects=follow)
    elapsed = (time.perf_counter() - started) * 1000
    assert answer.status_code == 200, (url, answer.status_code, answer.text[:300])
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--requests", type=int, default=REQUESTS)
    args = parser.parse_args()
    from sparkpoint.common.broker import EmbeddedBroker
    from sparkpoint.common.flink_ids import flink_job_id

    prefix = f"f{uuid.uuid4().hex[:8]}."
    os.environ["SPARKPOINT_TOPIC_PREFIX"] = prefix
    root = Path(tempfile.mkdtemp(prefix="sparkpoint-flink-rest-"))
    print(f"REST for Flink's tools: 2 coordinator instances, {args.jobs} jobs, embedded broker")
    with EmbeddedBroker() as broker:
        coordinators = []
        for i in range(2):
            (root / f"c{i}").mkdir()
            coordinators.append(CoordinatorProcess(broker.bootstrap, root / f"c{i}", PARTITIONS))
        time.sleep(8)  # the group settles (a join takes ~3 s on this broker)
        job_ids = [f"flink-{uuid.uuid4().hex[:6]}-{j}" for j in range(args.jobs)]
        context = multiprocessing.get_context("spawn")
        stop = context.Event()
        receive, send = context.Pipe(duplex=False)
        agent = context.Process(
            target=fleet_agent,
            args=(broker.bootstrap, prefix, job_ids, 4, "60s", stop, send, PARTITIONS),
        )
        agent.start()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if sum(len(owned(c.url)) for c in coordinators) >= args.jobs:
                break
            time.sleep(0.5)
        shares = [owned(c.url) for c in coordinators]
        rng = random.Random(7)
        ways: dict[str, list[float]] = {
            "owner, job id": [],
            "owner, JobID": [],
            "other, JobID, forwarded": [],
            "other, job id, redirected": [],
        }
        with httpx.Client(timeout=30) as client:
            for _ in range(args.requests):
                asked = rng.randrange(2)
                here = coordinators[asked].url
                mine = rng.choice(shares[asked])
                theirs = rng.choice(shares[1 - asked])
                ways["owner, job id"].append(timed(client, f"{here}/jobs/{mine}/checkpoints"))
                ways["owner, JobID"].append(
                    timed(client, f"{here}/v1/jobs/{flink_job_id(mine)}/checkpoints")
                )
                ways["other, JobID, forwarded"].append(
                    timed(client, f"{here}/v1/jobs/{flink_job_id(theirs)}/checkpoints")
                )
                ways["other, job id, redirected"].append(
                    timed(client, f"{here}/jobs/{theirs}/checkpoints", follow=True)
                )
        stop.set()
        receive.recv()
        agent.join(30)
        for coordinator in coordinators:
            coordinator.stop()
    figures = {way: percentiles([round(ms, 2) for ms in samples]) for way, samples in ways.items()}
    for way, figure in figures.items():
        print(f"  {way:<28} p50 {figure['p50']:6.2f} ms   p99 {figure['p99']:6.2f} ms")
    path = write_results(
        "flink_rest",
        {
            "benchmark": "flink_rest",
            "instances": 2,
            "jobs": args.jobs,
            "jobs_per_instance": [len(s) for s in shares],
            "requests_per_way": args.requests,
            "latency_ms": figures,
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
