"""The jobs of the chaos campaign (bench/chaos.py), configured by environment so that an agent
process started as a user would (``sparkpoint agent bench/chaos_job.py:job``) runs them: the
bundled example job on ``CHAOS_INPUT``, with a Kafka sink (topic ``CHAOS_OUTPUT``) or a file sink
(directory ``CHAOS_OUTPUT``) as ``CHAOS_SINK`` says, ``CHAOS_MAX_RECORDS`` records per partition
and round, and ``CHAOS_RETENTION`` as its externalized-checkpoint retention."""

from __future__ import annotations

import os
from dataclasses import replace

from sparkpoint.agent.example import example_job
from sparkpoint.agent.job import FileSink, Job, KafkaSink, KafkaSource

SETTINGS = {
    "execution.checkpointing.interval": "1s",
    "execution.checkpointing.min-pause": "0ms",
    "execution.checkpointing.timeout": "60s",
    "execution.checkpointing.tolerable-failed-checkpoints": "10",
}


def job() -> Job:
    env = os.environ
    settings = dict(SETTINGS)
    if env.get("CHAOS_RETENTION"):
        settings["execution.checkpointing.externalized-checkpoint-retention"] = env[
            "CHAOS_RETENTION"
        ]
    base = example_job(
        env["CHAOS_JOB_NAME"], env["CHAOS_INPUT"], env["CHAOS_OUTPUT"], True, 2, settings
    )
    sink = (
        FileSink(env["CHAOS_OUTPUT"])
        if env.get("CHAOS_SINK") == "files"
        else KafkaSink(env["CHAOS_OUTPUT"])
    )
    source = KafkaSource(
        [env["CHAOS_INPUT"]], bounded=True, max_records_per_partition=int(env["CHAOS_MAX_RECORDS"])
    )
    return replace(base, source=source, sink=sink)
