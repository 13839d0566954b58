"""A Spark standalone cluster on this machine, started from the pyspark package itself
(``bin/spark-class`` with the Master and Worker classes; nothing downloaded): one master and
``workers`` workers on 127.0.0.1, for trying a ``spark://`` master, for tests and benchmarks.

    with StandaloneCluster(workers=2, cores=1) as cluster:
        sparkpoint agent example --master cluster.master_url

Each worker has a directory of its own for its executors' files; `kill_worker` stops one the
hard way (as a lost machine), `StandaloneCluster.close` stops them all.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from types import TracebackType

from sparkpoint.common.broker import free_port

log = logging.getLogger(__name__)

START_TIMEOUT_S = 60.0


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


class StandaloneCluster:
    def __init__(self, workers: int = 2, cores: int = 1, memory: str = "1g") -> None:
        self.workers_wanted = workers
        self.cores = cores
        self.memory = memory
        self.root = Path(tempfile.mkdtemp(prefix="sparkpoint-standalone-"))
        self.port = free_port()
        self.ui_port = free_port()
        self.master: subprocess.Popen[bytes] | None = None
        self.workers: list[subprocess.Popen[bytes]] = []

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def _spawn(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        home = spark_home()
        env = dict(os.environ)
        env |= {
            "SPARK_HOME": str(home),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_LOG_DIR": str(self.root / "logs"),
            "SPARK_NO_DAEMONIZE": "1",
        }
        log_file = open(self.root / f"{name}.log", "wb")  # noqa: SIM115 (the process keeps it)
        return subprocess.Popen(
            [str(home / "bin" / "spark-class"), *args],
            env=env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def start(self) -> StandaloneCluster:
        self.master = self._spawn(
            "master", "org.apache.spark.deploy.master.Master",
            "--host", "127.0.0.1", "--port", str(self.port), "--webui-port", str(self.ui_port),
        )  # fmt: skip
        for _ in range(self.workers_wanted):
            self.add_worker()
        self.wait_for_workers(self.workers_wanted)
        log.info("standalone cluster %s: %d workers", self.master_url, self.workers_wanted)
        return self

    def add_worker(self) -> None:
        i = len(self.workers)
        work_dir = self.root / f"worker-{i}"
        work_dir.mkdir(parents=True, exist_ok=True)
        worker = self._spawn(
            f"worker-{i}", "org.apache.spark.deploy.worker.Worker",
            "--host", "127.0.0.1", "--cores", str(self.cores), "--memory", self.memory,
            "--webui-port", str(free_port()), "--work-dir", str(work_dir), self.master_url,
        )  # fmt: skip
        self.workers.append(worker)

    def alive_workers(self) -> int:
        """Workers the master counts as alive (its JSON status page); -1 while it cannot tell
        (starting, its web UI may answer ``/json/`` with an HTML page before the JSON one is
        attached: seen once in a suite run)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=2) as r:
                status = json.load(r)
        except (OSError, ValueError):
            return -1
        return sum(1 for w in status.get("workers", []) if w.get("state") == "ALIVE")

    def wait_for_workers(self, count: int, timeout_s: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while self.alive_workers() != count:
            if self.master is not None and self.master.poll() is not None:
                raise RuntimeError(f"the Spark master exited: see {self.root / 'master.log'}")
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{self.alive_workers()} of {count} Spark workers alive after {timeout_s} s "
                    f"(logs in {self.root})"
                )
            time.sleep(0.2)

    def kill_worker(self, i: int) -> None:
        """SIGKILLs worker ``i`` and its executors (its whole process group)."""
        os.killpg(self.workers[i].pid, signal.SIGKILL)
        self.workers[i].wait(10)

    def close(self) -> None:
        for process in [*self.workers, self.master]:
            if process is not None and process.poll() is None:
                try:
                    os.killpg(process.pid, signal.SIGTERM)
                    process.wait(10)
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    os.killpg(process.pid, signal.SIGKILL)
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> StandaloneCluster:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
