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
        target=lambda: asyncio.run(serve(service, "127.0.0.1", free_port())), daemon=True
    ).start()
    if not service.ready.wait(30):
        raise RuntimeError("the coordinator did not come up within 30 s")
    return service
