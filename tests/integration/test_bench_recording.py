"""The benchmarks' CPU sampler (bench/recording.py, `TreeCpu`): a process's CPU stays with the
role its command line gave it, also once it ended and is not yet reaped (a zombie shows no
command line). The peers benchmark reported negative CPU for Spark's Python workers when their
seconds moved to the job process that way."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[2] / "bench"))

from recording import TreeCpu

BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.4: pass\n"


def role(_: int, command: str) -> str:
    return "burner" if "--burner" in command else "other"


def test_an_ended_process_not_yet_reaped_keeps_its_role_and_its_cpu() -> None:
    cpu = TreeCpu(0, role, interval_s=3600)  # sampled by hand below
    burner = subprocess.Popen([sys.executable, "-c", BURN, "--burner"])
    try:
        cpu.root = burner.pid
        cpu.sample()
        assert cpu.roles().get("burner") is not None, "seen while it runs"
        deadline = time.monotonic() + 30
        while Path(f"/proc/{burner.pid}/stat").read_text().split(") ")[1][0] != "Z":
            assert time.monotonic() < deadline, "the burner did not end"
            time.sleep(0.02)

        cpu.sample()  # a zombie: no command line, its CPU still in /proc

        roles = cpu.roles()
        assert roles["burner"] >= 0.3, roles
        assert roles.get("other", 0.0) == 0.0, "its CPU moved to another role"
    finally:
        burner.wait()
        cpu.stop()
