"""The peers benchmark's workload on sparkpoint (run by bench/peers.py in .venv, against the
coordinator bench/peers.py runs): the job of sparkpoint_running_sum.py, started as
``sparkpoint agent`` starts a job: the Spark driver's JVM is launched first (`launch_driver`),
and the agent, the job and their libraries are imported while it starts.
"""

from __future__ import annotations

from common import arguments

from sparkpoint.agent.spark.session import launch_driver


def main() -> None:
    args = arguments(__doc__ or "")
    launch_driver("local[2]")
    from sparkpoint_running_sum import idle, run

    if args.idle_seconds:
        idle(args)
    else:
        run(args)


if __name__ == "__main__":
    main()
