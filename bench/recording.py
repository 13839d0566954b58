"""What every benchmark shares: percentiles of a sample, and writing bench/results/<name>.json
with the machine it ran on and when. Benchmarks run as scripts (``python bench/x.py``), so this
module is imported by its plain name."""

from __future__ import annotations

import json
import os
import platform
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def percentiles(values: list[float] | list[int]) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)

    def at(p: float) -> float:
        return float(ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))])

    return {
        "count": len(values),
        "p50": at(50),
        "p90": at(90),
        "p99": at(99),
        "max": float(ordered[-1]),
        "mean": round(statistics.fmean(values), 2),
    }


def write_results(name: str, results: dict[str, Any]) -> Path:
    """Adds the machine and the time, writes ``bench/results/<name>.json``, returns its path."""
    results = {
        **results,
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
        },
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    path = RESULTS_DIR / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2) + "\n")
    return path


def storage_dir(explicit: str | None = None) -> Path:
    """Where a coordinator benchmark keeps its checkpoint roots: ``explicit``, else memory
    (/dev/shm) where the machine has it, else the temporary directory.

    The fleet agent writes no state files, so the coordinator creates a directory and a
    ``_metadata`` per checkpoint and retention deletes them a second later. This machine's disk
    is ext4 without a journal, where allocating an inode first skips every inode freed in the
    last few seconds (``recently_deleted``, one inode-table lookup each): at 1,000 checkpoints a
    second over 1,000 job directories that costs up to a few hundred microseconds of kernel time
    per checkpoint, most of the coordinator's file work (`file_system_cost` measures it). Agents on
    real deployments create their checkpoint directories themselves, on a shared file system or
    an object store; memory keeps the benchmark about the coordinator."""
    if explicit:
        return Path(explicit)
    if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
        return Path("/dev/shm")
    return Path(tempfile.gettempdir())


def file_system_cost(directory: Path, jobs: int = 1000, rounds: int = 10) -> float:
    """CPU microseconds (user + kernel) one checkpoint's file work takes in ``directory`` at
    ``jobs`` checkpoints a second spread over ``jobs`` job directories: a directory, a file
    written and renamed into it, and the previous checkpoint's file and directory deleted, as
    the coordinator does on a 1 s interval with one checkpoint retained. Measured over the last
    half of ``rounds`` seconds, once the deletes of the first have piled up."""
    root = Path(tempfile.mkdtemp(prefix="sparkpoint-fs-", dir=directory))
    try:
        for j in range(jobs):
            (root / f"job-{j}").mkdir()
        started = 0.0
        for round_ in range(1, rounds + 1):
            if round_ == rounds // 2 + 1:
                started = time.process_time()
            tick = time.monotonic()
            for j in range(jobs):
                checkpoint = f"{root}/job-{j}/chk-{round_}"
                os.mkdir(checkpoint)
                fd = os.open(f"{checkpoint}/.m", os.O_WRONLY | os.O_CREAT | os.O_EXCL)
                os.write(fd, b"x" * 1500)
                os.close(fd)
                os.replace(f"{checkpoint}/.m", f"{checkpoint}/_metadata")
                if round_ > 1:
                    previous = f"{root}/job-{j}/chk-{round_ - 1}"
                    os.unlink(f"{previous}/_metadata")
                    os.rmdir(previous)
            time.sleep(max(0.0, 1.0 - (time.monotonic() - tick)))
        measured = rounds - rounds // 2
        return round(1e6 * (time.process_time() - started) / (jobs * measured), 1)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def start_coordinator(
    bootstrap: str,
    root: Path | str,
    partitions: int = 6,
    port: int | None = None,
    security: Any = None,
) -> Any:
    """The sparkpoint topics, and a coordinator service on a thread of this process with its
    storage roots under ``root`` (checkpoints/, savepoints/; a path or a URL), its REST API on
    ``port`` (default: a free one) with ``security`` (a RestSecurity; default: none); returns the
    running service."""
    import asyncio
    import threading

    from sparkpoint.common.broker import free_port
    from sparkpoint.common.kafka import make_admin
    from sparkpoint.common.settings import CheckpointConfig
    from sparkpoint.common.topics import create_topics
    from sparkpoint.coordinator.main import serve
    from sparkpoint.coordinator.service.instance import CoordinatorService, ServiceSettings

    create_topics(make_admin(bootstrap), partitions=partitions)
    defaults = CheckpointConfig(
        checkpoint_dir=f"{root}/checkpoints", savepoint_dir=f"{root}/savepoints"
    )
    service = CoordinatorService(ServiceSettings(bootstrap, defaults))
    threading.Thread(
        target=lambda: asyncio.run(
            serve(service, "127.0.0.1", port or free_port(), None, security)
        ),
        name="sparkpoint-loop",
        daemon=True,
    ).start()
    if not service.ready.wait(30):
        raise RuntimeError("the coordinator did not come up within 30 s")
    return service


class CoordinatorProcess:
    """A coordinator as ``make run`` deploys it: ``sparkpoint coordinator`` in a process of its
    own (a coordinator on a thread of the benchmark's process shares the agent's interpreter
    lock and adds its own work to every latency measured in the agent), storage roots under
    ``root``. The environment (``SPARKPOINT_TOPIC_PREFIX``) is the caller's."""

    def __init__(self, bootstrap: str, root: Path, partitions: int = 6) -> None:
        import subprocess
        import sys

        import httpx

        from sparkpoint.common.broker import free_port
        from sparkpoint.common.kafka import make_admin
        from sparkpoint.common.topics import create_topics

        create_topics(make_admin(bootstrap), partitions=partitions)
        config = root / "coordinator.yaml"
        config.write_text(
            f"execution.checkpointing.dir: {root / 'checkpoints'}\n"
            f"execution.checkpointing.savepoint-dir: {root / 'savepoints'}\n"
        )
        self.url = f"http://127.0.0.1:{free_port()}"
        self.log = open(root / "coordinator.log", "wb")  # noqa: SIM115  # closed by stop()
        self.process = subprocess.Popen(
            [
                sys.executable, "-m", "sparkpoint.cli", "coordinator", "--bootstrap", bootstrap,
                "--rest-port", self.url.rsplit(":", 1)[1], "--config", str(config),
            ],
            stdout=self.log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the coordinator exited {self.process.returncode}: {root}")
            try:
                if httpx.get(f"{self.url}/jobs/overview", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError("the coordinator did not answer within 60 s")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(30)
        except Exception:
            self.process.kill()
        self.log.close()


def cpu_seconds(stat: Path) -> float:
    """User + system CPU seconds from a ``/proc/.../stat`` file (a process or a thread)."""
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def thread_cpu() -> dict[str, float]:
    """CPU seconds of this process's threads, by Python thread name (numbers stripped, so a
    pool's threads add up); threads Python did not start (librdkafka's) as ``native``."""
    import re
    import threading

    names = {t.native_id: re.sub(r"[-_]?\d+$", "", t.name) for t in threading.enumerate()}
    totals: dict[str, float] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            seconds = cpu_seconds(Path(f"/proc/self/task/{tid}/stat"))
        except OSError:
            continue
        name = names.get(int(tid), "native")
        totals[name] = totals.get(name, 0.0) + seconds
    return totals


def cpu_since(before: dict[str, float]) -> dict[str, float]:
    """Each thread's CPU seconds since ``before`` (a `thread_cpu`), the busiest first."""
    now = thread_cpu()
    spent = {name: round(now[name] - before.get(name, 0.0), 2) for name in now}
    return dict(sorted(spent.items(), key=lambda item: -item[1]))


def process_tree(root: int | None = None) -> list[int]:
    """A process (this one by default) and its descendants, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
                parent = int(stat.rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry))
    found, queue = [], [os.getpid() if root is None else root]
    while queue:
        pid = queue.pop()
        found.append(pid)
        queue.extend(children.get(pid, []))
    return found


def resident_bytes(pids: list[int]) -> int:
    """The resident sets of ``pids``, summed (processes gone meanwhile count 0)."""
    page = os.sysconf("SC_PAGE_SIZE")
    total = 0
    for pid in pids:
        try:
            total += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * page
        except (OSError, IndexError, ValueError):
            continue
    return total


class TreeCpu:
    """CPU seconds of a process and its descendants, from /proc every ``interval_s`` in a
    thread of its own (about 1 ms of CPU a sample for ten processes).

    Each process counts its own user + system time as last seen (a process that ends between
    two samples loses at most one interval of it; `finish` takes the exact total from the
    kernel when the caller reaps the root). ``role`` names each process by its command line; a
    process that ended and is not yet reaped shows none and keeps the role it had (its CPU
    would otherwise move to another role: the Spark workers' 1.5 s to the job process's, on
    2026-11-30). The threads of a process whose role is in ``split_threads`` are counted apart
    by ``thread_role`` of their names (a Spark JVM in local mode is driver and executor at
    once).
    ``timeline`` holds (monotonic time, seconds by role so far) per sample, so a caller can
    leave out a start-up (`at`, `roles_at`)."""

    def __init__(
        self,
        root: int,
        role: Any,
        interval_s: float = 0.25,
        split_threads: tuple[str, ...] = (),
        thread_role: Any = None,
    ) -> None:
        import threading

        self.root = root
        self.role = role
        self.split_threads = split_threads
        self.thread_role = thread_role
        self.interval_s = interval_s
        self.processes: dict[int, tuple[str, float]] = {}
        self.threads: dict[tuple[int, int], tuple[str, float]] = {}
        self.timeline: list[tuple[float, dict[str, float]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tree-cpu", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def sample(self) -> None:
        for pid in process_tree(self.root):
            try:
                command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
                seconds = cpu_seconds(Path(f"/proc/{pid}/stat"))
            except OSError:
                continue
            known = self.processes.get(pid)
            if known is not None and not command.strip():
                role = known[0]  # ended and not yet reaped: no command line, its CPU still there
            else:
                role = self.role(pid, command.decode(errors="replace"))
            self.processes[pid] = (role, seconds)
            if role in self.split_threads:
                self._sample_threads(pid, role)
        self.timeline.append((time.monotonic(), self.roles()))

    def _sample_threads(self, pid: int, role: str) -> None:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            return
        for tid in tids:
            try:
                name = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
                seconds = cpu_seconds(Path(f"/proc/{pid}/task/{tid}/stat"))
            except OSError:
                continue
            key = (pid, int(tid))
            # a pooled thread renamed for its next task keeps its first role: its time so far
            # was spent under that name, and roles are kept by prefix (executor or driver)
            first = self.threads.get(key, (self.thread_role(role, name), 0.0))[0]
            self.threads[key] = (first, seconds)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def total(self) -> float:
        return sum(seconds for _, seconds in self.processes.values())

    def at(self, moment: float) -> float:
        """The total at a monotonic moment, interpolated between the samples around it."""
        totals = [(t, sum(roles.values())) for t, roles in self.timeline]
        before = [(t, s) for t, s in totals if t <= moment]
        after = [(t, s) for t, s in totals if t > moment]
        if not before:
            return 0.0
        if not after:
            return before[-1][1]
        (t0, s0), (t1, s1) = before[-1], after[0]
        return s0 + (s1 - s0) * (moment - t0) / (t1 - t0)

    def roles_at(self, moment: float) -> dict[str, float]:
        """Seconds by role at a monotonic moment, each interpolated between the samples around
        it as `at` does (the last sample before it would count up to an interval of start-up as
        work after it: a process busy starting counts 0.25 s more)."""
        before = [(t, roles) for t, roles in self.timeline if t <= moment]
        after = [(t, roles) for t, roles in self.timeline if t > moment]
        if not before:
            return {}
        (t0, r0) = before[-1]
        if not after:
            return r0
        (t1, r1) = after[0]
        share = (moment - t0) / (t1 - t0)
        return {role: s + (r1.get(role, s) - s) * share for role, s in r0.items()}

    def by_role(self) -> dict[str, float]:
        """CPU seconds by role, rounded (see `roles`)."""
        return {role: round(seconds, 2) for role, seconds in sorted(self.roles().items())}

    def roles(self) -> dict[str, float]:
        """CPU seconds by role; a split process's threads by their thread roles instead (its
        time in threads that ended between samples as ``<role>-ended-threads``)."""
        roles: dict[str, float] = {}
        for pid, (role, seconds) in list(self.processes.items()):
            if role in self.split_threads:
                counted = 0.0
                for (owner, _), (thread_role, spent) in list(self.threads.items()):
                    if owner == pid:
                        roles[thread_role] = roles.get(thread_role, 0.0) + spent
                        counted += spent
                rest = max(0.0, seconds - counted)
                roles[f"{role}-ended-threads"] = roles.get(f"{role}-ended-threads", 0.0) + rest
            else:
                roles[role] = roles.get(role, 0.0) + seconds
        return roles
