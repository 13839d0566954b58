"""What every benchmark shares: percentiles of a sample, and writing bench/results/<name>.json
with the machine it ran on and when. Benchmarks run as scripts (``python bench/x.py``), so this
module is imported by its plain name."""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def percentiles(values: list[int]) -> dict[str, float]:
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


def start_coordinator(bootstrap: str, root: Path, partitions: int = 6) -> Any:
    """The sparkpoint topics, and a coordinator service on a thread of this process with its
    storage roots under ``root`` (checkpoints/, savepoints/); returns the running service."""
    import asyncio
    import threading

    from services.common.broker import free_port
    from services.common.kafka import make_admin
    from services.common.settings import CheckpointConfig
    from services.common.topics import create_topics
    from services.coordinator.main import serve
    from services.coordinator.service import CoordinatorService, ServiceSettings

    create_topics(make_admin(bootstrap), partitions=partitions)
    defaults = CheckpointConfig(
        checkpoint_dir=str(root / "checkpoints"), savepoint_dir=str(root / "savepoints")
    )
    service = CoordinatorService(ServiceSettings(bootstrap, defaults))
    threading.Thread(
        target=lambda: asyncio.run(serve(service, "127.0.0.1", free_port())),
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

        from services.common.broker import free_port
        from services.common.kafka import make_admin
        from services.common.topics import create_topics

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
                sys.executable, "-m", "services.cli", "coordinator", "--bootstrap", bootstrap,
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


class Sampler:
    """Where this process's threads spend their time: every ``interval_s`` it reads each
    thread's stack (``sys._current_frames``) and counts the innermost function of this
    repository's code it finds (py-spy cannot attach to a process on this machine). ``top``
    returns (function, share of samples) over every thread that was not waiting."""

    IDLE = ("wait", "select", "poll", "_worker", "get", "sleep", "consume", "flush")

    def __init__(self, interval_s: float = 0.005) -> None:
        import collections
        import threading

        self.interval_s = interval_s
        self.counts: collections.Counter[str] = collections.Counter()
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Sampler:
        self._cpu_at_start = self.thread_cpu()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        end = self.thread_cpu()
        self.cpu_s = {
            name: round(end[name] - self._cpu_at_start.get(name, 0.0), 2)
            for name in sorted(end, key=lambda n: self._cpu_at_start.get(n, 0.0) - end[n])
        }

    @staticmethod
    def thread_cpu() -> dict[str, float]:
        """CPU seconds of this process's threads, by Python thread name (numbers stripped, so a
        pool's threads add up); threads Python did not start (librdkafka's) as ``native``."""
        import re
        import threading

        names = {t.native_id: re.sub(r"[-_]?\d+$", "", t.name) for t in threading.enumerate()}
        tick = os.sysconf("SC_CLK_TCK")
        totals: dict[str, float] = {}
        for tid in os.listdir("/proc/self/task"):
            try:
                fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            name = names.get(int(tid), "native")
            totals[name] = totals.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
        return totals

    def _run(self) -> None:
        import sys
        import threading

        me = threading.get_ident()
        while not self._stop.wait(self.interval_s):
            for ident, frame in sys._current_frames().items():
                if ident == me or frame.f_code.co_name in self.IDLE:
                    continue
                self.samples += 1
                self.counts[self._where(frame)] += 1

    @staticmethod
    def _where(frame: Any) -> str:
        """The innermost frame's function, and the nearest of sparkpoint's own above it."""
        leaf = f"{Path(frame.f_code.co_filename).name}:{frame.f_code.co_name}"
        while frame is not None and "/services/" not in frame.f_code.co_filename:
            frame = frame.f_back
        if frame is None:
            return leaf
        own = f"{Path(frame.f_code.co_filename).stem}.{frame.f_code.co_name}:{frame.f_lineno}"
        return own if own.split(":")[0].endswith(leaf.split(":")[1]) else f"{own} > {leaf}"

    def top(self, n: int = 25) -> list[tuple[str, float]]:
        return [
            (where, round(count / max(1, self.samples), 3))
            for where, count in self.counts.most_common(n)
        ]
