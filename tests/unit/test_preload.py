"""The warm-up's imports (`sparkpoint.agent.spark.preload`): a fresh interpreter, as a new Spark
Python worker is, has none of the modules the agent's tasks need until `preload` imports them,
and a second call imports nothing."""

from __future__ import annotations

import json
import subprocess
import sys

from sparkpoint.agent.spark.preload import TASK_MODULES

PROBE = """
import json, sys
from sparkpoint.agent.spark.preload import TASK_MODULES, preload
needed = (*TASK_MODULES, "pandas", "pyarrow", "confluent_kafka")
before = [name for name in needed if name in sys.modules]
first, second = preload(), preload()
after = [name for name in needed if name in sys.modules]
print(json.dumps({"before": before, "first": first, "second": second, "after": after}))
"""


def test_a_fresh_worker_has_the_task_modules_only_after_preload() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, timeout=120
    )
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["before"] == []  # importing the preload module itself loads none of them
    assert seen["first"] > 100  # pandas, pyarrow, the agent's modules
    assert seen["second"] == 0
    assert seen["after"] == [*TASK_MODULES, "pandas", "pyarrow", "confluent_kafka"]
