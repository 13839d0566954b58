"""The small version of the chaos campaign (bench/chaos.py, ``make chaos`` runs the large one):
two jobs as agent processes (exactly-once Kafka sink, file sink), two coordinator processes,
the embedded broker; an agent SIGKILL, a coordinator SIGKILL and a broker pause past the session
timeout, each recovered from, then both jobs to their end and a restart of each finished job.
The committed output must equal the reference, with no checkpoint id used twice."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.campaign]

BENCH = Path(__file__).resolve().parents[2] / "bench"


def load_chaos() -> Any:
    sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location("chaos", BENCH / "chaos.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["chaos"] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


def test_exactly_once_and_unique_ids_through_a_few_kill_points(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    chaos = load_chaos()
    monkeypatch.setenv("SPARKPOINT_TOPIC_PREFIX", "unused.")  # the campaign sets its own
    plan = [chaos.Kind.AGENT_KILL, chaos.Kind.COORDINATOR_KILL, chaos.Kind.BROKER_PAUSE]
    result = chaos.run_kill_points(0, records=12_000, max_records=60, seed=7, plan=plan)
    assert result["problems"] == []
    assert result["rows_lost"] == 0 and result["rows_duplicated"] == 0, result["jobs"]
    assert result["checkpoint_ids_reused"] == 0
    assert result["kill_points"] >= 5  # the plan, and a restart of each finished job
    assert result["unrecovered"] == 0
