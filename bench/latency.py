"""End-to-end latency on live input: records written while the job runs, from the moment each is
handed to the producer to the moment its output is visible to a read_committed consumer.
Writes bench/results/latency.json.

Workloads (each input topic and each output topic has 4 partitions):

- ``example``: the bundled example job (``sparkpoint.agent.example``) over payments keyed by
  account (``payments()``); each payment's ``"total"`` output carries its id; the 5% refunds
  are dropped by the job and have no output;
- ``peers``: bench/peers.py's workload, ``{"user": "u<k>", "amount": 1..1000}`` over 10,000
  users keyed by user, a running sum per user, every updated sum ``{"user", "sum"}`` written
  (one output per input; a (user, sum) pair names its input record, sums growing strictly).

Systems, each a process of its own: sparkpoint (``sparkpoint agent bench/latency_job.py:job``,
Spark ``local[2]``, parallelism 2, checkpoints every 1 s with no minimum pause) with the
exactly-once Kafka sink (``sparkpoint-eo``) and with the at-least-once one (``sparkpoint-alo``),
on both workloads; on the peers workload only, quixstreams (exactly-once, commit interval 1 s)
and bytewax (snapshots every 1 s, at-least-once sink), as bench/peers/*_job.py run them with
``--live``.

Protocol of one run (system, workload, rate): fresh input and output topics on the one embedded
broker (tansu) of the whole benchmark, one coordinator process for the whole benchmark. The
feed (bench/latency_feed.py, a process) encodes the records while the system starts; the system
is ready when sparkpoint's job is RUNNING in the coordinator's ``GET /jobs``; then, for every
system, a trickle of warm-up records (50/s, told apart in the output and left out) runs until
the first of them is visible, so that start-up (Spark's Python workers, a consumer group's join)
is not counted. Then the steady feed: ``rate`` records a second for ``--seconds``, paced by wall
clock, each stamped with ``time.time()`` when produced (confluent-kafka, sparkpoint's producer
settings, linger.ms 5). The reader (bench/latency_consumer.py, a process) follows the output
with ``isolation.level=read_committed`` and ``fetch.wait.max.ms`` 5 and stamps each record with
``time.time()`` when it arrives. After the feed the reader waits up to ``DRAIN_S`` for the
outputs still due, then the system is stopped (sparkpoint: SIGTERM, the job ends CANCELED;
the peers: SIGTERM, then SIGKILL).

Figures per run:
- latency (ms) = arrival of the output - production of the input record it comes from, over
  the steady part: records produced from ``--exclude`` (5) s after the feed's start to its end;
  p50 / p90 / p99 / max; an output never seen by the end of the drain counts with the time
  until then (the figures are then lower bounds, marked so);
- records produced, the achieved input rate (and whether it reached 95% of the target), outputs
  seen, duplicates (later copies of an input's output, ignored), outputs not committed
  (exactly-once sparkpoint: records whose ``sparkpoint.transaction`` token no committed
  SinkEpochPublished marker carries: aborted epochs, which the embedded broker shows to
  read_committed readers; excluded), outputs missing at the end;
- kept up: at the end of the feed, the outputs not yet visible are less than the p50 latency
  of the first third of the steady part plus ``BACKLOG_LIMIT_S`` (2) seconds of input (a job
  that keeps up has about its own latency's worth due; the mean over the feed's last
  ``BACKLOG_WINDOW_S`` (3) s: an exactly-once sink releases a checkpoint's worth at a time, and
  the instant the feed ends would otherwise pick a phase of that sawtooth), and the p50 latency
  of the last third of the steady part is at most 1.5 x that of the first third + 500 ms (lag
  not growing), and no output of the steady part is still missing at the end of the drain;
- CPU over the steady feed, in cores: the system (its process and every process it started),
  feed, reader, broker, coordinator, this process, the whole machine, and what the machine
  spent outside this benchmark (other work sharing the 2 cores).

Highest sustained rate (sparkpoint-eo, each workload): the highest rate that kept up with its
input rate reached, from the fixed rates and then up to ``--search-runs`` more runs, the first at
0.8 x the pre-filled throughput when that lies between the highest rate kept up and the lowest
that was not, the next by bisection. Pre-filled throughput: the same job with a bounded source
over a topic filled first (1,000,000 records for peers, 500,000 for example): input records /
seconds from the job's registration (REST ``start-time``) to FINISHED (``end-time``, after the
final checkpoint and sink commit), as bench/pipeline.py and bench/peers.py measure it.

CPU model of the sustained rate: during a live run the feed, the reader and the broker's writes
share the machine's two cores with the job (at the rates near the limit the machine is busy
throughout), during the pre-filled run only the broker's reads do. The pre-filled run samples
the CPU of the agent's processes from RUNNING to its end; the live run at the highest rate kept
up has its ``cpu_cores_during_feed``. Their CPU seconds per million records give the ratio the
job would reach with cores of its own (throughput = cores / CPU per record for both):
``cpu_model`` in each workload's ``sustained`` entry. Beside it, the bound this machine puts on
the sustained rate: the job's cores at the lowest rate not kept up (the machine full), divided
by its pre-filled CPU per record (``rate_those_cores_carry_at_prefilled_cpu``, and over the
pre-filled throughput: ``that_over_prefilled``); below 0.8, no job as efficient live as
pre-filled could meet the goal here.

Goals (printed and recorded, met or not): exactly-once with 1 s checkpoints p99 <= 2,500 ms at
10,000 records/s; at-least-once p50 <= 500 ms and p99 <= 1,500 ms at 10,000 records/s; highest
sustained rate >= 0.8 x the pre-filled throughput of the same job.

``--quick``: 10,000 records/s for 15 s, sparkpoint only, no sustained-rate search. ``--systems``,
``--workloads`` and ``--rates`` choose a subset; a subset's results go to the run's directory,
bench/results/latency.json only gets a full default run. ``LATENCY_BUFFER_TIMEOUT=500ms`` (in the
environment) runs sparkpoint's jobs with that ``execution.buffer-timeout.interval`` (round
pacing, docs/settings.md), for a comparison.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from peers import TOPIC_CONFIG, workload
from recording import CoordinatorProcess, cpu_seconds, write_results

from sparkpoint.common.avro import EventCodec
from sparkpoint.common.broker import EmbeddedBroker
from sparkpoint.common.events import SinkEpochPublished
from sparkpoint.common.kafka import make_admin, replay_topic
from sparkpoint.common.topics import SINK_MARKERS

ROOT = Path(__file__).resolve().parent.parent
BENCH = Path(__file__).resolve().parent
PEERS_PYTHON = ROOT / ".venv-peers" / "bin" / "python"
PARTITIONS = 4
RATES = (1_000, 10_000, 50_000)
SECONDS = 30.0
EXCLUDE_S = 5.0
DRAIN_S = 15.0
"""After the feed, how long the reader waits for the outputs still due."""
BACKLOG_LIMIT_S = 2.0
BACKLOG_WINDOW_S = 3.0
WORKLOADS = ("example", "peers")
SYSTEMS = ("sparkpoint-eo", "sparkpoint-alo", "quixstreams", "bytewax")
PEER_SYSTEMS = ("quixstreams", "bytewax")
PREFILLED = {"example": 500_000, "peers": 1_000_000}
SEARCH_RUNS = 3
SEARCH_GRAIN = 1_000
RATE_REACHED = 0.95
"""A run tests its rate only when the feed reached this share of it."""
STARTUP_TIMEOUT_S = 240.0
WARMUP_TIMEOUT_S = 180.0
SUSTAINED_GOAL = 0.8
GOALS_TEXT = {
    "exactly_once_p99_at_10k": "sparkpoint-eo, 1 s checkpoints, 10,000 records/s: p99 <= 2,500 ms",
    "at_least_once_at_10k": "sparkpoint-alo, 10,000 records/s: p50 <= 500 ms and p99 <= 1,500 ms",
    "sustained_over_prefilled": "sparkpoint-eo: highest sustained rate >= 0.8 x pre-filled "
    "throughput of the same job",
}
SETTINGS = {
    "sparkpoint-eo": {
        "command": "sparkpoint agent bench/latency_job.py:job --master local[2]",
        "parallelism": 2,
        "checkpoint_interval_ms": 1000,
        "checkpoint_min_pause_ms": 0,
        "sink": "KafkaSink, exactly-once (default)",
        "source": "KafkaSource, defaults (max_duration_per_trigger 200ms)",
    },
    "sparkpoint-alo": {
        "command": "sparkpoint agent bench/latency_job.py:job --master local[2]",
        "parallelism": 2,
        "checkpoint_interval_ms": 1000,
        "checkpoint_min_pause_ms": 0,
        "sink": "KafkaSink(delivery_guarantee=AT_LEAST_ONCE)",
        "source": "KafkaSource, defaults (max_duration_per_trigger 200ms)",
    },
    "quixstreams": {
        "command": "bench/peers/quixstreams_job.py --live",
        "processing_guarantee": "exactly-once",
        "commit_interval_s": 1.0,
        "state": "RocksDB with changelog topic",
    },
    "bytewax": {
        "command": "bench/peers/bytewax_job.py --live (tail=True)",
        "recovery": "SQLite, 1 partition",
        "snapshot_interval_s": 1.0,
        "workers": 1,
        "sink": "KafkaSink (at-least-once)",
    },
}


# --- child processes ---------------------------------------------------------------------------

CHILDREN: list[Child] = []
"""Every process this benchmark started and has not stopped yet: killed on the way out."""


class Child:
    """A process of this benchmark, in a session of its own so that its children (Spark's JVM
    and Python workers, bytewax's) are found, measured and stopped with it. With ``pipe``, its standard output is read line by
    line on a thread: ``seen A B`` lines update `seen`, the others queue up for `expect`."""

    def __init__(
        self, command: list[str], log: Path, env: dict[str, str] | None = None, pipe: bool = False
    ) -> None:
        self.log_path = log
        self.log = log.open("w")
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.seen = (0, 0)
        self.process = subprocess.Popen(
            command,
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE if pipe else subprocess.DEVNULL,
            stdout=subprocess.PIPE if pipe else self.log,
            stderr=self.log,
            text=True,
            start_new_session=True,
        )
        CHILDREN.append(self)
        if pipe:
            threading.Thread(target=self._read, daemon=True).start()

    @property
    def pid(self) -> int:
        return self.process.pid

    def _read(self) -> None:
        stdout = self.process.stdout
        assert stdout is not None
        for line in stdout:
            if line.startswith("seen "):
                _, measured, warmup = line.split()
                self.seen = (int(measured), int(warmup))
            else:
                self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def send(self, line: str) -> None:
        stdin = self.process.stdin
        assert stdin is not None
        stdin.write(line + "\n")
        stdin.flush()

    def expect(self, word: str, timeout_s: float) -> str:
        """The rest of the first output line starting with ``word``."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise RuntimeError(
                    f"no {word!r} within {timeout_s:.0f} s: {self.log_path}"
                ) from None
            if line is None:
                raise RuntimeError(
                    f"exited {self.process.wait()} before {word!r}: {self.log_path}\n{self.tail()}"
                )
            if line.startswith(word):
                return line[len(word) :].strip()

    def alive(self) -> bool:
        return self.process.poll() is None

    def tail(self, lines: int = 25) -> str:
        self.log.flush()
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self, sig: int = signal.SIGTERM, grace_s: float = 30.0) -> int | None:
        """``sig`` to the process itself; after ``grace_s`` (or once it exited), SIGKILL to
        whatever is left of its session. Returns its exit code (None: killed)."""
        code: int | None = None
        if self.alive():
            try:
                self.process.send_signal(sig)
                code = self.process.wait(grace_s)
            except subprocess.TimeoutExpired:
                code = None
        else:
            code = self.process.returncode
        for pid in session_members(self.process.pid):
            with suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        self.process.wait()
        self.log.close()
        if self in CHILDREN:
            CHILDREN.remove(self)
        return code


def kill_all() -> None:
    for child in list(CHILDREN):
        child.stop(signal.SIGKILL, 5)


def session_members(sid: int) -> list[int]:
    """The live processes of a session: a child started in a session of its own and everything
    it started (pyspark's worker daemon makes a process group of its own, not a session)."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid:
            members.append(int(entry))
    return members


def session_cpu(sid: int) -> float:
    """CPU seconds of a session: its live processes' own, and those of the children they
    reaped (a Python worker of Spark's that ended counts in its parent's)."""
    total = 0.0
    for pid in session_members(sid):
        with suppress(OSError, ValueError, IndexError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")
    return total


def process_cpu(pid: int | None) -> float:
    if pid is None:
        return 0.0
    try:
        return cpu_seconds(Path(f"/proc/{pid}/stat"))
    except OSError:
        return 0.0


# --- the bench's shared parts ------------------------------------------------------------------


@dataclass
class Context:
    bootstrap: str
    root: Path
    coordinator: CoordinatorProcess
    broker_pid: int | None
    seconds: float
    exclude_s: float
    codec: EventCodec = field(default_factory=EventCodec)

    def cpu(self, system: Child, feed: Child, reader: Child) -> dict[str, float]:
        return {
            "system": session_cpu(system.pid),
            "feed": process_cpu(feed.pid),
            "reader": process_cpu(reader.pid),
            "broker": process_cpu(self.broker_pid),
            "coordinator": process_cpu(self.coordinator.process.pid),
            "benchmark": process_cpu(os.getpid()),
            "machine": machine_busy(),
        }


def machine_busy() -> float:
    """CPU seconds the whole machine spent busy (every core), from /proc/stat."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(f) for f in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def cores(before: dict[str, float], after: dict[str, float], seconds: float) -> dict[str, float]:
    """Cores each part used over ``seconds``; ``outside_benchmark``: the machine's busy time
    that none of this benchmark's processes account for (other work on the machine)."""
    used = {k: (after[k] - before[k]) / seconds for k in before}
    used["outside_benchmark"] = used["machine"] - sum(v for k, v in used.items() if k != "machine")
    return {k: round(v, 2) for k, v in used.items()}


def create_topics(bootstrap: str, *topics: str) -> None:
    from confluent_kafka.admin import NewTopic

    admin = make_admin(bootstrap)
    new = [NewTopic(t, PARTITIONS, 1, config=TOPIC_CONFIG) for t in topics]
    for future in admin.create_topics(new).values():
        future.result(15)


def drop_topics(bootstrap: str, *topics: str) -> None:
    """Frees the broker's memory (tansu keeps every record in memory); a broker that cannot
    delete topics keeps them."""
    admin = make_admin(bootstrap)
    try:
        for future in admin.delete_topics(list(topics)).values():
            future.result(15)
    except Exception as exc:  # only memory is at stake
        print(f"  (topics not deleted: {exc})")


def sparkpoint_env(
    name: str, workload_name: str, source: str, output: str, guarantee: str, bounded: bool
) -> dict[str, str]:
    return dict(os.environ) | {
        "LATENCY_NAME": name,
        "LATENCY_WORKLOAD": workload_name,
        "LATENCY_INPUT": source,
        "LATENCY_OUTPUT": output,
        "LATENCY_GUARANTEE": guarantee,
        "LATENCY_BOUNDED": "1" if bounded else "0",
    }


def sparkpoint_command(ctx: Context) -> list[str]:
    return [
        sys.executable, "-m", "sparkpoint.cli", "-v", "agent", f"{BENCH / 'latency_job.py'}:job",
        "--bootstrap", ctx.bootstrap, "--checkpoint-dir", str(ctx.root / "checkpoints"),
        "--master", "local[2]",
    ]  # fmt: skip


def job_entry(ctx: Context, name: str, path: str = "/jobs") -> dict[str, Any] | None:
    try:
        answer = httpx.get(f"{ctx.coordinator.url}{path}", timeout=5).json()
    except (httpx.HTTPError, ValueError):
        return None
    for entry in answer.get("jobs", []):
        if entry.get("id") == name or entry.get("sparkpoint", {}).get("job_id") == name:
            return dict(entry)
    return None


def wait_running(ctx: Context, name: str, agent: Child, timeout_s: float) -> float:
    """Seconds until the job is RUNNING in the coordinator's REST API."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if not agent.alive():
            raise RuntimeError(f"the agent exited {agent.process.returncode}:\n{agent.tail()}")
        entry = job_entry(ctx, name)
        if entry is not None and entry.get("status") == "RUNNING":
            return time.monotonic() - started
        time.sleep(0.1)
    raise RuntimeError(f"job {name} not RUNNING within {timeout_s:.0f} s:\n{agent.tail()}")


def committed_tokens(ctx: Context, name: str) -> set[str]:
    return {
        r.event.transaction
        for r in replay_topic(ctx.bootstrap, ctx.codec, SINK_MARKERS, read_committed=True)
        if isinstance(r.event, SinkEpochPublished)
        and r.event.job_id == name
        and r.event.transaction
    }


# --- one live run ------------------------------------------------------------------------------


@contextmanager
def run_dir(ctx: Context, name: str) -> Iterator[Path]:
    directory = ctx.root / name
    directory.mkdir(parents=True)
    try:
        yield directory
    finally:
        for data in directory.glob("*.npz"):
            data.unlink()


def start_system(
    ctx: Context, system: str, workload_name: str, name: str, topics: tuple[str, str], work: Path
) -> Child:
    source, output = topics
    log = work / f"{system}.log"
    if system.startswith("sparkpoint"):
        guarantee = "EXACTLY_ONCE" if system == "sparkpoint-eo" else "AT_LEAST_ONCE"
        env = sparkpoint_env(name, workload_name, source, output, guarantee, bounded=False)
        return Child(sparkpoint_command(ctx), log, env)
    if not PEERS_PYTHON.exists():
        raise RuntimeError(f"{PEERS_PYTHON} is missing: make .venv-peers/.installed")
    command = [
        str(PEERS_PYTHON), str(BENCH / "peers" / f"{system}_job.py"), "--bootstrap",
        ctx.bootstrap, "--input", source, "--output", output, "--records", "0",
        "--work-dir", str(work / "state"), "--name", name, "--live",
    ]  # fmt: skip
    return Child(command, log)


def live_run(ctx: Context, system: str, workload_name: str, rate: int) -> dict[str, Any]:
    name = f"lat-{system}-{workload_name}-{rate}-{uuid.uuid4().hex[:6]}"
    topics = (f"{name}-in", f"{name}-out")
    create_topics(ctx.bootstrap, *topics)
    records = int(rate * ctx.seconds)
    python = sys.executable
    with run_dir(ctx, name) as work:
        feed = Child(
            [
                python, str(BENCH / "latency_feed.py"), "--bootstrap", ctx.bootstrap,
                "--topic", topics[0], "--workload", workload_name, "--records", str(records),
                "--rate", str(rate), "--seconds", str(ctx.seconds),
                "--out", str(work / "feed.npz"),
            ],
            work / "feed.log", pipe=True,
        )  # fmt: skip
        reader = Child(
            [
                python, str(BENCH / "latency_consumer.py"), "--bootstrap", ctx.bootstrap,
                "--topic", topics[1], "--workload", workload_name,
                "--partitions", str(PARTITIONS), "--out", str(work / "reader.npz"),
            ],
            work / "reader.log", pipe=True,
        )  # fmt: skip
        launched = time.monotonic()
        system_process = start_system(ctx, system, workload_name, name, topics, work)
        try:
            reader.expect("ready", 60)
            running_s = None
            if system.startswith("sparkpoint"):
                running_s = wait_running(ctx, name, system_process, STARTUP_TIMEOUT_S)
            feed.expect("ready", 300)
            feed.send("warmup")
            warmup_started = time.monotonic()
            while reader.seen[1] == 0:
                if not system_process.alive():
                    raise RuntimeError(f"{system} exited:\n{system_process.tail()}")
                if time.monotonic() - warmup_started > WARMUP_TIMEOUT_S:
                    raise RuntimeError(f"no warm-up output within {WARMUP_TIMEOUT_S:.0f} s")
                time.sleep(0.05)
            ready_s = time.monotonic() - launched
            before = ctx.cpu(system_process, feed, reader)
            feed.send("go")
            fed = json.loads(feed.expect("done", ctx.seconds + 120))
            after = ctx.cpu(system_process, feed, reader)
            drain_deadline = time.monotonic() + DRAIN_S
            while reader.seen[0] < fed["expected_outputs"] and time.monotonic() < drain_deadline:
                time.sleep(0.1)
            reader.send("stop")
            read = json.loads(reader.expect("done", 120))
            stopped_at = time.time()
            alive_at_end = system_process.alive()
        finally:
            code = system_process.stop(signal.SIGTERM, 60 if system.startswith("spark") else 15)
            feed.stop()
            reader.stop()
        status = restarts = None
        if system.startswith("sparkpoint"):
            entry = job_entry(ctx, name)
            status = entry.get("status") if entry else None
            restarts = entry.get("restarts") if entry else None
        committed = committed_tokens(ctx, name) if system == "sparkpoint-eo" else None
        with np.load(work / "feed.npz") as f, np.load(work / "reader.npz") as r:
            figures = analyze(
                workload_name, rate, records, fed, dict(f), dict(r), committed, stopped_at,
                ctx.exclude_s,
            )  # fmt: skip
    seconds = fed["end"] - fed["start"]
    drop_topics(ctx.bootstrap, *topics)
    return {
        "system": system,
        "workload": workload_name,
        "rate": rate,
        "job": name,
        **figures,
        "job_restarts": restarts,
        "outputs_seen_by_reader": read,
        "startup_s": {
            "to_running": None if running_s is None else round(running_s, 1),
            "to_first_warmup_output": round(ready_s, 1),
        },
        "cpu_cores_during_feed": cores(before, after, seconds),
        "stop": {
            "alive_at_end_of_run": alive_at_end,
            "exit_code": code,
            "job_status": status,
        },
    }


# --- analysis ----------------------------------------------------------------------------------


def stats(values_ms: np.ndarray) -> dict[str, float]:
    """recording.percentiles' figures, with numpy (a run has up to millions of values)."""
    if not len(values_ms):
        return {}
    ordered = np.sort(values_ms)

    def at(p: float) -> float:
        return round(float(ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]), 1)

    return {
        "count": len(ordered),
        "p50": at(50),
        "p90": at(90),
        "p99": at(99),
        "max": round(float(ordered[-1]), 1),
        "mean": round(float(ordered.mean()), 1),
    }


def input_index(workload_name: str, records: int, keys: np.ndarray) -> np.ndarray:
    """For each output's key, the input record it comes from (-1: none)."""
    if workload_name == "example":
        return np.where((keys >= 0) & (keys < records), keys, -1)
    expected = workload(records).prefix_sums()
    order = np.argsort(expected)
    ordered = expected[order]
    position = np.minimum(np.searchsorted(ordered, keys), len(ordered) - 1)
    return np.where(ordered[position] == keys, order[position], -1)


def analyze(
    workload_name: str,
    rate: int,
    records: int,
    fed: dict[str, Any],
    feed: dict[str, np.ndarray],
    read: dict[str, np.ndarray],
    committed: set[str] | None,
    stopped_at: float,
    exclude_s: float,
) -> dict[str, Any]:
    times, expects = feed["times"], feed["expects"]
    produced = len(times)
    start, end = fed["start"], fed["end"]
    keys, arrivals, tokens = read["keys"], read["arrivals"], read["tokens"]
    names = read["token_names"]

    not_committed = 0
    if committed is not None and len(keys):
        known = np.array([str(n) in committed for n in names] + [True], dtype=bool)
        ok = known[tokens]  # token -1 (no header) takes the last entry: not transactional
        not_committed = int((~ok).sum())
        keys, arrivals = keys[ok], arrivals[ok]
    index = input_index(workload_name, records, keys)
    unknown = int(((index < 0) | (index >= produced)).sum())
    valid = (index >= 0) & (index < produced)
    index, arrivals = index[valid], arrivals[valid]
    firsts, first_at = np.unique(index, return_index=True)  # outputs are in arrival order
    duplicates = len(index) - len(firsts)
    arrival = np.full(produced, np.nan)
    arrival[firsts] = arrivals[first_at]

    latency = (arrival - times) * 1000
    seen = ~np.isnan(arrival)
    bounded = np.where(seen, latency, (stopped_at - times) * 1000)
    steady = expects & (times >= start + exclude_s)
    missing = int((expects & ~seen).sum())
    steady_missing = int((steady & ~seen).sum())

    span = end - (start + exclude_s)
    first_third = steady & (times < start + exclude_s + span / 3)
    last_third = steady & (times >= end - span / 3)
    p50_first = float(np.median(bounded[first_third])) if first_third.any() else math.nan
    p50_last = float(np.median(bounded[last_third])) if last_third.any() else math.nan
    outputs_per_s = expects.sum() / max(end - start, 1e-9)
    # outputs still due at instants of the feed's last BACKLOG_WINDOW_S: an exactly-once sink
    # makes them a sawtooth (each commit releases a checkpoint's worth), so the mean over the
    # window is taken, not the phase the feed happened to end in
    produced_at = np.sort(times[expects])
    output_at = np.sort(arrival[expects & seen])
    instants = np.linspace(end - BACKLOG_WINDOW_S, end, 61)
    due = np.searchsorted(produced_at, instants, "right") - np.searchsorted(
        output_at, instants, "right"
    )
    backlog_s = float(due.mean()) / max(outputs_per_s, 1e-9)
    backlog_end_s = float(due[-1]) / max(outputs_per_s, 1e-9)
    growing = not p50_last <= 1.5 * p50_first + 500
    achieved = produced / max(end - start, 1e-9)
    steady_inputs = int((times >= start + exclude_s).sum())
    return {
        "records_produced": produced,
        "input_rate": round(achieved),
        "steady_input_rate": round(steady_inputs / max(span, 1e-9)),
        "input_rate_reached": bool(achieved >= RATE_REACHED * rate),
        "feed_seconds": round(end - start, 2),
        "feed_failed_deliveries": fed["failed"] + fed["undelivered"],
        "outputs_expected": int(expects.sum()),
        "outputs_seen": int(seen.sum()),
        "outputs_missing_at_end": missing,
        "duplicates_ignored": duplicates,
        "not_committed_excluded": not_committed,
        "outputs_unmatched": unknown,
        "latency_ms": stats(bounded[steady]),
        "latency_is_lower_bound": steady_missing > 0,
        "steady_outputs_missing": steady_missing,
        "missing_examples": [
            {"input": int(i), "produced_after_feed_start_s": round(float(times[i] - start), 3)}
            for i in np.flatnonzero(expects & ~seen)[:20]
        ],
        "p50_first_third_ms": round(p50_first, 1),
        "p50_last_third_ms": round(p50_last, 1),
        "backlog_at_feed_end_s": round(backlog_s, 2),
        "backlog_at_last_record_s": round(backlog_end_s, 2),
        # the backlog of a job that keeps up is about its own latency: an exactly-once job's
        # outputs come a checkpoint after their input, so the limit is counted from its p50
        # and a job that keeps up delivers every output by the end of the drain: one that fell
        # behind from the start has a first third as slow as its last, and its latencies, cut
        # at the drain's end, stop growing (quixstreams at 50,000/s once passed with a third of
        # its outputs never seen)
        "kept_up": bool(
            backlog_s < BACKLOG_LIMIT_S + p50_first / 1000 and not growing and not steady_missing
        ),
    }


# --- pre-filled throughput and the sustained rate -------------------------------------------------


def prefilled(ctx: Context, workload_name: str, records: int) -> dict[str, Any]:
    """The exactly-once job over a filled topic, bounded: records / seconds from its
    registration to FINISHED."""
    name = f"lat-prefilled-{workload_name}-{uuid.uuid4().hex[:6]}"
    topics = (f"{name}-in", f"{name}-out")
    create_topics(ctx.bootstrap, *topics)
    with run_dir(ctx, name) as work:
        fill = Child(
            [
                sys.executable, str(BENCH / "latency_feed.py"), "--bootstrap", ctx.bootstrap,
                "--topic", topics[0], "--workload", workload_name, "--records", str(records),
                "--fill",
            ],
            work / "fill.log", pipe=True,
        )  # fmt: skip
        filled = json.loads(fill.expect("done", 900))
        fill.stop()
        env = sparkpoint_env(name, workload_name, *topics, "EXACTLY_ONCE", bounded=True)
        agent = Child(sparkpoint_command(ctx), work / "sparkpoint-eo.log", env)
        try:
            cpu = running_cpu(ctx, name, agent, 1800)
            code = agent.process.wait(60)
        finally:
            agent.stop()
        entry = job_entry(ctx, name, "/jobs/overview")
    drop_topics(ctx.bootstrap, *topics)
    if code != 0 or entry is None or entry.get("state") != "FINISHED":
        raise RuntimeError(f"pre-filled {workload_name}: agent exited {code}, job {entry}")
    seconds = (entry["end-time"] - entry["start-time"]) / 1000
    return {
        "records": records,
        "fill_rate": filled["rate"],
        "seconds_registration_to_finished": round(seconds, 2),
        "records_per_second": round(records / seconds),
        "job_restarts": entry.get("restarts"),
        "job": name,
        "cpu_while_running": {
            "seconds": round(cpu["seconds"], 2),
            "system_cores": round(cpu["system"] / cpu["seconds"], 2),
            "machine_cores": round(cpu["machine"] / cpu["seconds"], 2),
            "system_cpu_s_per_million": round(cpu["system"] / records * 1e6, 1),
        },
    }


def running_cpu(ctx: Context, name: str, agent: Child, timeout_s: float) -> dict[str, float]:
    """The CPU seconds the agent's processes (its session: Spark's JVM and Python workers) and
    the whole machine spent from the job's RUNNING to the agent's last moment, sampled every
    0.2 s (a process's own and its reaped children's time; what the last sample misses is the
    agent's exit). Start-up (the JVM, the first Python workers) is left out, as the
    registration-to-FINISHED throughput leaves it out."""
    wait_running(ctx, name, agent, 300)
    began = time.monotonic()
    first_system, first_machine = session_cpu(agent.pid), machine_busy()
    last_system, last_machine, last_at = first_system, first_machine, began
    while agent.alive() and time.monotonic() - began < timeout_s:
        time.sleep(0.2)
        system, machine = session_cpu(agent.pid), machine_busy()
        if system >= last_system:  # a sample taken as the processes exit reads low
            last_system, last_machine, last_at = system, machine, time.monotonic()
    return {
        "seconds": max(1e-3, last_at - began),
        "system": last_system - first_system,
        "machine": last_machine - first_machine,
    }


def cpu_model(
    base: dict[str, Any], tried: dict[int, dict[str, Any]], highest: int
) -> dict[str, Any] | None:
    """What the sustained-rate goal would be on a machine where the job's cores are its own:
    here the feed, the reader and the broker's writes share the two cores with the job during
    live runs, and not (the feed, the reader) during the pre-filled one. The job's CPU seconds
    per million records, live at the highest rate kept up and pre-filled; with equal cores,
    throughput is cores / CPU per record, so their ratio is the live-over-pre-filled ratio the
    job would reach. Also how busy the machine was at the lowest rate not kept up, and what
    the job's share of the cores then would carry at its pre-filled CPU per record (a bound on
    the sustained rate on this machine, however efficient the job is live)."""
    run = tried.get(highest)
    if not highest or run is None or not run.get("cpu_cores_during_feed"):
        return None
    live = run["cpu_cores_during_feed"]["system"] / run["input_rate"] * 1e6
    prefilled_cpu = base["cpu_while_running"]["system_cpu_s_per_million"]
    above = sorted(r for r, t in tried.items() if r > highest and t.get("cpu_cores_during_feed"))
    full = tried[above[0]]["cpu_cores_during_feed"] if above else None
    share = (full or run["cpu_cores_during_feed"])["system"]
    carried = share / prefilled_cpu * 1e6
    return {
        "live_cpu_s_per_million": round(live, 1),
        "live_system_cores": run["cpu_cores_during_feed"]["system"],
        "prefilled_cpu_s_per_million": prefilled_cpu,
        "prefilled_over_live_cpu_per_record": round(prefilled_cpu / live, 2),
        "first_rate_not_kept_up": above[0] if above else None,
        "its_cores": full,
        "job_cores_when_full": share,
        "rate_those_cores_carry_at_prefilled_cpu": round(carried),
        "that_over_prefilled": round(carried / base["records_per_second"], 2),
    }


def sustains(run: dict[str, Any]) -> bool:
    return bool(run.get("kept_up") and run.get("input_rate_reached"))


def next_rate(tried: dict[int, dict[str, Any]], target: int | None) -> int | None:
    """The next rate to try, or None when the search is done: between the highest rate kept up
    and the lowest that was not (or that the feed could not reach)."""
    low = max((r for r, run in tried.items() if sustains(run)), default=0)
    above = [r for r, run in tried.items() if r > low and not sustains(run)]
    high = min(above) if above else None
    if high is None:
        candidate = target if target is not None and target > low else low + 10_000
    elif high - low <= max(2 * SEARCH_GRAIN, low // 10):
        return None
    elif target is not None and low < target < high and target not in tried:
        candidate = target
    else:
        candidate = (low + high) // 2
    candidate = round(candidate / SEARCH_GRAIN) * SEARCH_GRAIN
    return None if candidate in tried or candidate <= 0 else candidate


def sustained(
    ctx: Context, workload_name: str, fixed: dict[int, dict[str, Any]], search_runs: int
) -> dict[str, Any]:
    print(f"pre-filled throughput, {workload_name}: filling {PREFILLED[workload_name]:,} records")
    base = prefilled(ctx, workload_name, PREFILLED[workload_name])
    print(
        f"  {base['records_per_second']:,} records/s "
        f"({base['seconds_registration_to_finished']} s registration to FINISHED, "
        f"job restarts {base['job_restarts']})"
    )
    target = math.ceil(SUSTAINED_GOAL * base["records_per_second"] / SEARCH_GRAIN) * SEARCH_GRAIN
    tried = dict(fixed)
    searched: list[dict[str, Any]] = []
    for _ in range(search_runs):
        rate = next_rate(tried, target)
        if rate is None:
            break
        print(f"sustained-rate search, sparkpoint-eo {workload_name} at {rate:,}/s")
        run = guarded(ctx, "sparkpoint-eo", workload_name, rate)
        print_run(run)
        tried[rate] = run
        searched.append(run)
    highest = max((r for r, run in tried.items() if sustains(run)), default=0)
    limited = sorted(r for r, run in tried.items() if not run.get("input_rate_reached"))
    ratio = highest / base["records_per_second"]
    return {
        "prefilled": base,
        "highest_sustained_rate": highest,
        "cpu_model": cpu_model(base, tried, highest),
        "rates_tried": {
            str(r): {
                "kept_up": run.get("kept_up"),
                "input_rate": run.get("input_rate"),
                "input_rate_reached": run.get("input_rate_reached"),
                "backlog_at_feed_end_s": run.get("backlog_at_feed_end_s"),
                "p50_first_third_ms": run.get("p50_first_third_ms"),
                "p50_last_third_ms": run.get("p50_last_third_ms"),
                "error": run.get("error"),
            }
            for r, run in sorted(tried.items())
        },
        "feed_could_not_reach": limited,
        "search_runs": searched,
        "highest_over_prefilled": round(ratio, 2),
        "goal": SUSTAINED_GOAL,
        "met": ratio >= SUSTAINED_GOAL,
    }


# --- reporting -----------------------------------------------------------------------------------


def guarded(ctx: Context, system: str, workload_name: str, rate: int) -> dict[str, Any]:
    """One run; a failure is recorded with its message instead of ending the benchmark."""
    try:
        return live_run(ctx, system, workload_name, rate)
    except Exception as exc:  # reported in the results, the others still run
        print(f"  FAILED: {exc}")
        return {"system": system, "workload": workload_name, "rate": rate, "error": str(exc)}


def print_run(run: dict[str, Any]) -> None:
    if "error" in run:
        return
    latency = run["latency_ms"]
    print(
        f"  input {run['input_rate']:,}/s, p50 {latency.get('p50')} ms, p99 {latency.get('p99')} "
        f"ms, max {latency.get('max')} ms, outputs {run['outputs_seen']:,}/"
        f"{run['outputs_expected']:,}, backlog at end {run['backlog_at_feed_end_s']} s, "
        f"kept up {run['kept_up']}, job restarts {run['job_restarts']}"
    )


def table(runs: list[dict[str, Any]]) -> str:
    lines = [
        f"{'system':<15} {'workload':<8} {'rate/s':>7} {'input/s':>8} {'p50 ms':>8} "
        f"{'p99 ms':>8} {'max ms':>8} {'produced':>9} {'outputs':>9} {'backlog s':>9} "
        f"{'restarts':>8} {'other':>5}  kept up"
    ]
    for run in runs:
        head = f"{run['system']:<15} {run['workload']:<8} {run['rate']:>7,}"
        if "error" in run:
            lines.append(f"{head}  FAILED: {run['error'].splitlines()[0][:80]}")
            continue
        latency = run["latency_ms"]
        mark = ">=" if run["latency_is_lower_bound"] else ""

        def ms(key: str, latency: dict[str, float] = latency, mark: str = mark) -> str:
            value = latency.get(key)
            return "-" if value is None else f"{mark}{value:,.0f}"

        lines.append(
            f"{head} {run['input_rate']:>8,} {ms('p50'):>8} {ms('p99'):>8} {ms('max'):>8} "
            f"{run['records_produced']:>9,} {run['outputs_seen']:>9,} "
            f"{run['backlog_at_feed_end_s']:>9} "
            f"{'-' if run['job_restarts'] is None else run['job_restarts']:>8} "
            f"{run['cpu_cores_during_feed']['outside_benchmark']:>5}  "
            f"{'yes' if run['kept_up'] else 'NO'}"
            f"{'' if run['input_rate_reached'] else ' (input short)'}"
        )
    lines.append(
        "p50/p99/max: latency over the steady part, >= when outputs were still missing at the "
        "end; backlog s: outputs due at the feed's end, in seconds of input; other: cores busy "
        "outside this benchmark during the feed"
    )
    return "\n".join(lines)


def find(runs: list[dict[str, Any]], system: str, workload_name: str, rate: int) -> Any:
    for run in runs:
        if (run["system"], run["workload"], run["rate"]) == (system, workload_name, rate):
            return run
    return None


def goals(runs: list[dict[str, Any]], sustained_by: dict[str, dict[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for workload_name in WORKLOADS:
        eo = find(runs, "sparkpoint-eo", workload_name, 10_000)
        if eo is not None and "error" not in eo:
            p99 = eo["latency_ms"].get("p99")
            result[f"exactly_once_p99_at_10k_{workload_name}"] = {
                "goal": GOALS_TEXT["exactly_once_p99_at_10k"],
                "measured_p99_ms": p99,
                "met": p99 is not None and p99 <= 2500 and not eo["latency_is_lower_bound"],
            }
        alo = find(runs, "sparkpoint-alo", workload_name, 10_000)
        if alo is not None and "error" not in alo:
            p50, p99 = alo["latency_ms"].get("p50"), alo["latency_ms"].get("p99")
            result[f"at_least_once_at_10k_{workload_name}"] = {
                "goal": GOALS_TEXT["at_least_once_at_10k"],
                "measured_p50_ms": p50,
                "measured_p99_ms": p99,
                "met": p50 is not None
                and p99 is not None
                and p50 <= 500
                and p99 <= 1500
                and not alo["latency_is_lower_bound"],
            }
        found = sustained_by.get(workload_name)
        if found is not None and "error" not in found:
            result[f"sustained_over_prefilled_{workload_name}"] = {
                "goal": GOALS_TEXT["sustained_over_prefilled"],
                "highest_sustained_rate": found["highest_sustained_rate"],
                "prefilled_records_per_second": found["prefilled"]["records_per_second"],
                "measured": found["highest_over_prefilled"],
                "met": found["met"],
            }
    return result


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rates", help=f"comma-separated records/s (default {RATES})")
    parser.add_argument("--seconds", type=float, help=f"steady feed per run (default {SECONDS})")
    parser.add_argument("--exclude", type=float, default=EXCLUDE_S, help="s left out at the start")
    parser.add_argument("--systems", help=f"comma-separated subset of {', '.join(SYSTEMS)}")
    parser.add_argument("--workloads", help=f"comma-separated subset of {', '.join(WORKLOADS)}")
    parser.add_argument("--search-runs", type=int, default=SEARCH_RUNS)
    parser.add_argument(
        "--no-sustained", action="store_true", help="no pre-filled run, no sustained-rate search"
    )
    parser.add_argument(
        "--quick", action="store_true", help="10,000/s for 15 s, sparkpoint only, no search"
    )
    parser.add_argument("--keep", action="store_true", help="keep the run directory (logs)")
    args = parser.parse_args()
    full = not (args.quick or args.rates or args.seconds or args.systems or args.workloads)
    args.full = full and not args.no_sustained and args.exclude == EXCLUDE_S
    default_systems = "sparkpoint-eo,sparkpoint-alo" if args.quick else ",".join(SYSTEMS)
    args.systems = [s for s in (args.systems or default_systems).split(",") if s]
    args.workloads = [w for w in (args.workloads or ",".join(WORKLOADS)).split(",") if w]
    args.rates = [int(float(r)) for r in (args.rates or ("10000" if args.quick else "")).split(",") if r] or list(RATES)  # fmt: skip
    args.seconds = args.seconds or (15.0 if args.quick else SECONDS)
    args.sustained = not (args.quick or args.no_sustained)
    if unknown := set(args.systems) - set(SYSTEMS):
        parser.error(f"unknown systems {sorted(unknown)}; known: {', '.join(SYSTEMS)}")
    if unknown := set(args.workloads) - set(WORKLOADS):
        parser.error(f"unknown workloads {sorted(unknown)}; known: {', '.join(WORKLOADS)}")
    if args.seconds <= args.exclude:
        parser.error("--seconds must exceed --exclude")
    return args


def main() -> None:
    args = arguments()
    began = time.monotonic()
    root = Path(tempfile.mkdtemp(prefix="sparkpoint-bench-latency-"))
    os.environ["SPARKPOINT_TOPIC_PREFIX"] = f"b{uuid.uuid4().hex[:8]}."
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    runs: list[dict[str, Any]] = []
    sustained_by: dict[str, dict[str, Any]] = {}
    try:
        with EmbeddedBroker(log_file=root / "broker.log") as broker:
            coordinator = CoordinatorProcess(broker.bootstrap, root)
            process = getattr(broker, "_process", None)
            ctx = Context(
                broker.bootstrap, root, coordinator, process.pid if process else None,
                args.seconds, args.exclude,
            )  # fmt: skip
            try:
                for workload_name in args.workloads:
                    for system in args.systems:
                        if system in PEER_SYSTEMS and workload_name != "peers":
                            continue
                        for rate in args.rates:
                            print(f"{system} {workload_name} at {rate:,} records/s")
                            run = guarded(ctx, system, workload_name, rate)
                            print_run(run)
                            runs.append(run)
                if args.sustained and "sparkpoint-eo" in args.systems:
                    for workload_name in args.workloads:
                        fixed = {
                            r["rate"]: r
                            for r in runs
                            if r["system"] == "sparkpoint-eo" and r["workload"] == workload_name
                        }
                        try:
                            sustained_by[workload_name] = sustained(
                                ctx, workload_name, fixed, args.search_runs
                            )
                        except RuntimeError as exc:
                            print(f"  FAILED: {exc}")
                            sustained_by[workload_name] = {"error": str(exc)}
            finally:
                kill_all()
                coordinator.stop()
    finally:
        kill_all()
    elapsed = time.monotonic() - began
    print()
    print(table(runs))
    for workload_name, found in sustained_by.items():
        if "error" in found:
            print(f"sustained {workload_name}: FAILED {found['error'].splitlines()[0]}")
            continue
        print(
            f"sustained {workload_name}: highest {found['highest_sustained_rate']:,}/s, pre-filled "
            f"{found['prefilled']['records_per_second']:,}/s, ratio "
            f"{found['highest_over_prefilled']} (goal {SUSTAINED_GOAL}: "
            f"{'met' if found['met'] else 'not met'})"
        )
        if model := found.get("cpu_model"):
            print(
                f"  CPU per million records: live at {found['highest_sustained_rate']:,}/s "
                f"{model['live_cpu_s_per_million']} s ({model['live_system_cores']} cores), "
                f"pre-filled {model['prefilled_cpu_s_per_million']} s: with cores of its own the "
                f"job would sustain {model['prefilled_over_live_cpu_per_record']}x its pre-filled "
                f"throughput; cores at {model['first_rate_not_kept_up']}/s: {model['its_cores']}"
            )
            print(
                f"  the job's {model['job_cores_when_full']} cores with the machine full carry "
                f"{model['rate_those_cores_carry_at_prefilled_cpu']:,}/s at its pre-filled CPU "
                f"per record: {model['that_over_prefilled']}x the pre-filled throughput at most"
            )
    reached = goals(runs, sustained_by)
    for key, goal in reached.items():
        print(f"goal {key}: {'met' if goal['met'] else 'NOT met'} ({goal['goal']})")
    print(f"whole run: {elapsed / 60:.1f} min")
    summary = {
        "benchmark": "latency",
        "settings": {
            "rates": args.rates,
            "seconds_per_run": args.seconds,
            "excluded_first_seconds": args.exclude,
            "drain_seconds": DRAIN_S,
            "backlog_limit_seconds": BACKLOG_LIMIT_S,
            "partitions": PARTITIONS,
            "prefilled_records": PREFILLED,
            "systems": {s: SETTINGS[s] for s in args.systems},
            "feed": "bench/latency_feed.py: one process, confluent-kafka with sparkpoint's "
            "producer settings (acks=all, idempotent) and linger.ms 5, paced by wall clock",
            "reader": "bench/latency_consumer.py: one process, read_committed, "
            "fetch.wait.max.ms 5, partitions assigned",
            "broker": "embedded (tansu), one for the whole benchmark; one coordinator process",
        },
        "method": (__doc__ or "").split("\n\n", 1)[1],
        "machine_note": f"{os.cpu_count()} cores shared by the broker, the coordinator, the "
        "system under test (Spark local[2] for sparkpoint), the feed and the reader",
        "runs": runs,
        "sustained": sustained_by,
        "goals": reached,
        "elapsed_minutes": round(elapsed / 60, 1),
    }
    if args.full:
        print(f"wrote {write_results('latency', summary)}")
    else:
        partial = root / "latency.json"
        partial.write_text(json.dumps(summary, indent=2) + "\n")
        print(f"not the full default run: bench/results/latency.json left as it was; {partial}")
    if args.keep or not args.full:
        print(f"logs: {root}")
    else:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
