"""sparkpoint: Flink-grade checkpointing for Spark pipelines, coordinated over Kafka.

What a pipeline's author imports is here::

    from sparkpoint import Job, KafkaSource, KafkaSink, KeyedFunction, KeyedState, ValueState

The parts, each a package of its own (``sparkpoint.agent``, ``sparkpoint.coordinator``,
``sparkpoint.overrides``, ``sparkpoint.history``, ``sparkpoint.common``), say what they are
in their own docstrings. The names below are loaded when first used: ``import sparkpoint`` is
cheap, and the command line does not load pandas for a ``--help``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "Job": "sparkpoint.agent.job",
    "KafkaSource": "sparkpoint.agent.job",
    "FileSource": "sparkpoint.agent.job",
    "KafkaSink": "sparkpoint.agent.job",
    "FileSink": "sparkpoint.agent.job",
    "DeliveryGuarantee": "sparkpoint.agent.job",
    "KeyedFunction": "sparkpoint.agent.job",
    "KeyedState": "sparkpoint.agent.job",
    "ValueState": "sparkpoint.agent.job",
    "ListState": "sparkpoint.agent.job",
    "MapState": "sparkpoint.agent.job",
    "StateDescriptor": "sparkpoint.agent.job",
    "load_job": "sparkpoint.agent.job",
    "JsonValues": "sparkpoint.agent.formats",
    "AvroValues": "sparkpoint.agent.formats",
    "ConfluentAvroValues": "sparkpoint.agent.formats",
    "RawValues": "sparkpoint.agent.formats",
    "StringValues": "sparkpoint.agent.formats",
    "WatermarkStrategy": "sparkpoint.agent.time.strategy",
    "MIN_WATERMARK": "sparkpoint.agent.time.strategy",
    "MAX_WATERMARK": "sparkpoint.agent.time.strategy",
    "StateTtlConfig": "sparkpoint.agent.time.ttl",
}

__all__ = [
    "MAX_WATERMARK",
    "MIN_WATERMARK",
    "AvroValues",
    "ConfluentAvroValues",
    "DeliveryGuarantee",
    "FileSink",
    "FileSource",
    "Job",
    "JsonValues",
    "KafkaSink",
    "KafkaSource",
    "KeyedFunction",
    "KeyedState",
    "ListState",
    "MapState",
    "RawValues",
    "StateDescriptor",
    "StateTtlConfig",
    "StringValues",
    "ValueState",
    "WatermarkStrategy",
    "load_job",
]

if TYPE_CHECKING:
    from sparkpoint.agent.formats import (
        AvroValues,
        ConfluentAvroValues,
        JsonValues,
        RawValues,
        StringValues,
    )
    from sparkpoint.agent.job import (
        DeliveryGuarantee,
        FileSink,
        FileSource,
        Job,
        KafkaSink,
        KafkaSource,
        KeyedFunction,
        KeyedState,
        ListState,
        MapState,
        StateDescriptor,
        ValueState,
        load_job,
    )
    from sparkpoint.agent.time.strategy import MAX_WATERMARK, MIN_WATERMARK, WatermarkStrategy
    from sparkpoint.agent.time.ttl import StateTtlConfig


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'sparkpoint' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
