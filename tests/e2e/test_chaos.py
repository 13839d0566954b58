"""The small version of the chaos campaign (bench/chaos.py): the example job with its exactly-once
Kafka sink as an agent process, two coordinator processes, the embedded broker; an agent SIGKILL,
a coordinator SIGKILL and a broker pause past the session timeout, each recovered from, then the
job to its end and a restart of the finished job. The committed output must equal the reference,
with no checkpoint id used twice.

Marked ``chaos``: ``make chaos`` runs it before the large campaign (with a file-sink job beside),
``make test`` leaves it out (about 100 s of its 25 minutes). Agent SIGKILLs and coordinator
SIGKILLs have tests of their own in the suite (tests/integration/test_agent.py,
tests/e2e/test_coordinator_failover.py); a broker paused under a running job is only exercised
here and in the campaign."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.chaos]

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
    # No crash points armed in restarted agents (each would cost another restart, ~20 s): the
    # agent's own crash points are each tested in tests/integration/test_agent.py.
    monkeypatch.setattr(chaos, "CRASH_ARMED", 0.0)
    plan = [chaos.Kind.AGENT_KILL, chaos.Kind.COORDINATOR_KILL, chaos.Kind.BROKER_PAUSE]
    result = chaos.run_kill_points(
        0, records=6_000, max_records=40, seed=7, plan=plan, jobs=("kafka",)
    )
    assert result["problems"] == []
    assert result["rows_lost"] == 0 and result["rows_duplicated"] == 0, result["jobs"]
    assert result["checkpoint_ids_reused"] == 0
    assert result["kill_points"] >= 4  # the plan, and a restart of the finished job
    assert result["unrecovered"] == 0
