"""Flink JobIDs for sparkpoint jobs.

Every Flink tool (the CLI, REST clients, the Kubernetes operator) names a job by a JobID of 32
hex digits; sparkpoint names it by its job id (``payments-example``). Each job has a JobID
derived from its job id, so it is the same on every coordinator, after every restart and
failover, with nothing to store:

- a job id that is already 32 hex digits is its own JobID (lower case);
- otherwise the first 24 digits are an MD5 of the job id and the last 8 are the job id's Kafka
  key hash (murmur2, positive), the hash that puts the job's events on their partition. A
  coordinator that does not know a JobID can so still tell which partition, and so which
  coordinator instance, owns the job.
"""

from __future__ import annotations

import functools
import hashlib
import re

from sparkpoint.common.kafka import murmur2, partition_of

_FLINK_ID = re.compile(r"[0-9a-fA-F]{32}")


def is_flink_id(text: str) -> bool:
    """Whether ``text`` has the form of a Flink JobID (32 hex digits, either case)."""
    return _FLINK_ID.fullmatch(text) is not None


@functools.lru_cache(maxsize=65_536)
def flink_job_id(job_id: str) -> str:
    """The JobID Flink's tools use for ``job_id`` (computed once per job id, then cached)."""
    if is_flink_id(job_id):
        return job_id.lower()
    digest = hashlib.md5(f"sparkpoint-job/{job_id}".encode(), usedforsecurity=False).hexdigest()
    return f"{digest[:24]}{murmur2(job_id.encode()) & 0x7FFFFFFF:08x}"


def candidate_partitions(flink_id: str, partitions: int) -> list[int]:
    """The partitions a job named by ``flink_id`` may be keyed on: the one its last 8 digits
    name (a derived JobID), then the one of the 32 digits taken, as written, as the job id
    itself (a job id of 32 hex digits is its own JobID)."""
    derived = int(flink_id[24:], 16) % partitions
    literal = partition_of(flink_id, partitions)
    return [derived] if literal == derived else [derived, literal]
