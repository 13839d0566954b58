"""Where a job spec points: ``module:attribute``, a file (``path.py`` or ``path.py:attribute``),
or the reserved name ``example``. Read without importing the job or the agent, so that
`sparkpoint agent` checks the spec before it starts Spark (`job.load_job` then loads it)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

EXAMPLE = "sparkpoint.agent.example:example_job"
"""The bundled example job, loaded by name as any other job is."""


@dataclass(frozen=True)
class JobSpec:
    target: str
    """A module name, or a file's path."""
    attribute: str
    """The `Job`, or a function returning one (``job`` when the spec names none)."""
    in_file: bool


def parse_job_spec(spec: str) -> JobSpec:
    target, _, attribute = (EXAMPLE if spec == "example" else spec).partition(":")
    return JobSpec(target, attribute or "job", target.endswith(".py") or Path(target).is_file())
