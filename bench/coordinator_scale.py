"""How the coordinator scales with jobs and instances, on the embedded broker. Writes
bench/results/coordinator_scale.json.

For 1 and 2 coordinator instances, each ``sparkpoint coordinator`` in a process of its own (as
deployed), and 250, 500 and 1,000 jobs of 4 subtasks checkpointing every second, one fleet agent
process acknowledges every trigger at once (`coordinator_latency.fleet_agent`). Per run it
prints completions per second, trigger -> completed p50/p99 (the completion's timestamp minus
the trigger's, both the owning coordinator's clock), each instance's CPU seconds per 1,000
checkpoints it completed, and the share of the jobs each instance owns.

On this machine every process shares 2 cores with the broker and the fleet agent: a second
instance adds no core, so what two instances show here is how the work splits, not a speed-up.

The checkpoint roots live in memory (/dev/shm) unless ``--storage-dir`` names another place:
this machine's disk charges each new inode for every inode deleted in the last seconds
(`recording.storage_dir`). ``file_system_cost_us`` in the results gives one checkpoint's file
work on both, and ``--disk-run`` adds the 1,000-job case with the roots on the disk.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import shutil
import tempfile
import time
import uuid
from pathlib import Path

import httpx
from coordinator_latency import WARMUP_S, fleet_agent
from recording import (
    CoordinatorProcess,
    cpu_seconds,
    file_system_cost,
    percentiles,
    storage_dir,
    write_results,
)

PARTITIONS = 12
"""Partitions of every sparkpoint topic: enough for two instances to split the jobs evenly."""


def cpu_s(pid: int) -> float:
    return cpu_seconds(Path(f"/proc/{pid}/stat"))


def owned_jobs(url: str) -> int:
    return len(httpx.get(f"{url}/jobs/overview", timeout=10).json()["jobs"])


def run(
    bootstrap: str, instances: int, jobs: int, seconds: float, storage: Path
) -> dict[str, object]:
    root = Path(tempfile.mkdtemp(prefix="sparkpoint-scale-", dir=storage))
    try:
        return measure(bootstrap, instances, jobs, seconds, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)  # in memory, or gigabytes of disk over a bench


def measure(
    bootstrap: str, instances: int, jobs: int, seconds: float, root: Path
) -> dict[str, object]:
    prefix = f"s{uuid.uuid4().hex[:8]}."
    os.environ["SPARKPOINT_TOPIC_PREFIX"] = prefix
    coordinators = []
    for i in range(instances):
        (root / f"c{i}").mkdir()
        coordinators.append(CoordinatorProcess(bootstrap, root / f"c{i}", PARTITIONS))
    time.sleep(8 if instances > 1 else 1)  # the group settles (a join takes ~3 s on this broker)
    job_ids = [f"scale-{uuid.uuid4().hex[:6]}-{j}" for j in range(jobs)]
    context = multiprocessing.get_context("spawn")
    stop = context.Event()
    receive, send = context.Pipe(duplex=False)
    agent = context.Process(
        target=fleet_agent, args=(bootstrap, prefix, job_ids, 4, "1s", stop, send, PARTITIONS)
    )
    agent.start()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if sum(owned_jobs(c.url) for c in coordinators) >= jobs:
            break
        time.sleep(0.5)
    time.sleep(WARMUP_S)
    shares = [owned_jobs(c.url) for c in coordinators]
    started_ms = time.time() * 1000
    cpu_before = [cpu_s(c.process.pid) for c in coordinators]
    time.sleep(seconds)
    cpu_after = [cpu_s(c.process.pid) for c in coordinators]
    ended_ms = time.time() * 1000
    stop.set()
    marks, _ = receive.recv()
    agent.join(30)
    for coordinator in coordinators:
        coordinator.stop()
    lost = sum(
        (root / f"c{i}" / "coordinator.log").read_text().count("not ours any more")
        + (root / f"c{i}" / "coordinator.log").read_text().count("fenced")
        for i in range(instances)
    )
    done = [
        m
        for m in marks.values()
        if "completed_timestamp" in m
        and "trigger_timestamp" in m
        and started_ms <= m["trigger_timestamp"] < ended_ms
    ]
    latency = [int(m["completed_timestamp"] - m["trigger_timestamp"]) for m in done]
    per_instance = [
        {
            "jobs_owned": shares[i],
            "share": round(shares[i] / max(1, sum(shares)), 3),
            "cpu_s": round(cpu_after[i] - cpu_before[i], 2),
            # its jobs' share of the completions (every job checkpoints at the same interval)
            "cpu_s_per_1000_checkpoints": round(
                1000 * (cpu_after[i] - cpu_before[i]) / max(1, len(done) * shares[i] / jobs), 2
            ),
        }
        for i in range(instances)
    ]
    result = {
        "instances": instances,
        "jobs": jobs,
        "storage": str(root.parent),
        "measured_seconds": seconds,
        "completions_per_s": round(len(done) / seconds, 1),
        "demanded_per_s": jobs,
        "trigger_to_completed_ms": percentiles(latency),
        "per_instance": per_instance,
        "ownership_lost_messages": lost,
    }
    figures = percentiles(latency)
    print(
        f"  {instances} instance(s), {jobs} jobs, roots in {root.parent}: "
        f"{result['completions_per_s']} completions/s of "
        f"{jobs}; trigger->completed p50 {figures.get('p50')} p99 {figures.get('p99')} ms; "
        + "; ".join(
            f"instance {i}: {p['jobs_owned']} jobs ({p['share']:.0%}), "
            f"{p['cpu_s_per_1000_checkpoints']} CPU s / 1,000 checkpoints"
            for i, p in enumerate(per_instance)
        )
        + f"; {lost} ownership-lost messages"
    )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, nargs="+", default=[250, 500, 1000])
    parser.add_argument("--instances", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument(
        "--storage-dir", help="where the checkpoint roots go (default: /dev/shm where it exists)"
    )
    parser.add_argument(
        "--disk-run",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also run 1 instance with the most jobs with the roots in the temporary directory",
    )
    args = parser.parse_args()
    from sparkpoint.common.broker import EmbeddedBroker

    storage = storage_dir(args.storage_dir)
    disk = Path(tempfile.gettempdir())
    costs = {str(place): file_system_cost(place) for place in dict.fromkeys([storage, disk])}
    print(
        "one checkpoint's file work at 1,000 a second over 1,000 job directories: "
        + ", ".join(f"{us} CPU µs in {place}" for place, us in costs.items())
    )
    print("coordinator scale on the embedded broker, agents acknowledging at once")
    runs = []
    with EmbeddedBroker() as broker:
        for instances in args.instances:
            for jobs in args.jobs:
                runs.append(run(broker.bootstrap, instances, jobs, args.seconds, storage))
        if args.disk_run and disk != storage:
            runs.append(run(broker.bootstrap, 1, max(args.jobs), args.seconds, disk))
    path = write_results(
        "coordinator_scale",
        {"benchmark": "coordinator_scale", "file_system_cost_us": costs, "runs": runs},
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
