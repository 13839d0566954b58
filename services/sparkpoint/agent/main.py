"""``sparkpoint agent JOB``: load the job, start Spark, run the agent until the job ends."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable

from sparkpoint.agent.control.membership import RegistrationRefused, Superseded
from sparkpoint.agent.job import Job, load_job
from sparkpoint.agent.runtime import SETUP, Agent, AgentOptions
from sparkpoint.common.avro import EventCodec
from sparkpoint.common.events import JobStatus

log = logging.getLogger(__name__)


class AgentFailed(RuntimeError):
    """The job could not start or failed; the message says why."""


def run(spec: str, options: AgentOptions, say: Callable[[str], None] = print) -> JobStatus:
    try:
        job = load_job(spec)
    except (ImportError, ValueError, AttributeError) as exc:
        raise AgentFailed(f"cannot load job {spec!r}: {exc}") from None
    _pickle_by_value(job)
    agent = Agent(job, options, EventCodec())
    agent.handle_signals = True
    say(
        f"agent {agent.agent_id}: job {job.id} ({job.name}), parallelism {agent.parallelism}, "
        f"max parallelism {agent.max_parallelism}, checkpoints under {agent.checkpoint_dir}"
    )
    try:
        status = agent.run()
    except (*SETUP, RegistrationRefused, Superseded) as exc:
        raise AgentFailed(str(exc)) from None
    say(f"job {job.id}: {status.name}")
    return status


def _pickle_by_value(job: Job) -> None:
    """A job defined in a file (not an importable module) travels to executors by value."""
    module_name = type(job.function).__module__
    if module_name.startswith("sparkpoint_job_"):
        from pyspark import cloudpickle

        cloudpickle.register_pickle_by_value(sys.modules[module_name])  # type: ignore[no-untyped-call]
