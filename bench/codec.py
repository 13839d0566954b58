"""Codec throughput: encode + decode of the acknowledge event, and decode alone, per second,
against plain json of the same dict in the same run. Writes bench/results/codec.json.

Three ways, each a full round trip on one core:
- sparkpoint: event dataclass -> single-object Avro bytes -> event dataclass (what services do);
- fastavro-dict: the same Avro record as a dict -> Avro body -> dict (the codec without the
  dataclass conversion and the header);
- json: the same dict -> json bytes -> dict.
"""

from __future__ import annotations

import io
import json
import time
from collections.abc import Callable
from typing import Any

import fastavro
from recording import write_results

from sparkpoint.common.avro import HEADER_SIZE, EventCodec
from sparkpoint.common.events import AcknowledgeCheckpoint, StateHandle, StateHandleKind

ROUNDS = 5
ITERATIONS = 20_000


def acknowledge(handles: int) -> AcknowledgeCheckpoint:
    """A subtask of a job with max parallelism 128 at parallelism 16: 8 key groups, one state file
    each, plus its source positions."""
    return AcknowledgeCheckpoint(
        job_id="payments-2f1c9a",
        checkpoint_id=123_456,
        subtask_id="keyed-3",
        attempt=2,
        ack_timestamp=1_790_000_123_456,
        state_handles=[
            StateHandle(
                f"s3://bucket/checkpoints/payments-2f1c9a/shared/kg-{kg}-v{1000 + kg}.arrow",
                StateHandleKind.KEYED_STATE,
                1_048_576 + kg,
                kg,
                kg,
                True,
            )
            for kg in range(24, 24 + handles)
        ]
        + [
            StateHandle(
                "s3://bucket/checkpoints/payments-2f1c9a/chk-123456/source-3",
                StateHandleKind.SOURCE_POSITIONS,
                212,
            )
        ],
        state_size_bytes=8_388_820,
        alignment_duration_ms=4,
        sync_duration_ms=1,
        async_duration_ms=180,
        persisted_data_bytes=0,
        unaligned=False,
        checkpointed_size_bytes=1_048_788,
        processed_data_bytes=65_536,
    )


def rate(round_trip: Callable[[], Any]) -> float:
    """Best of ROUNDS runs of ITERATIONS round trips, in round trips per second."""
    best = float("inf")
    for _ in range(ROUNDS):
        start = time.perf_counter()
        for _ in range(ITERATIONS):
            round_trip()
        best = min(best, time.perf_counter() - start)
    return ITERATIONS / best


def main() -> None:
    codec = EventCodec()
    event = acknowledge(handles=8)
    encoded = codec.encode(event)
    schema = codec.catalogue.current(event.SCHEMA).parsed
    record = fastavro.schemaless_reader(io.BytesIO(encoded[HEADER_SIZE:]), schema)
    as_json = json.dumps(record).encode()
    assert codec.decode(encoded) == event and json.loads(as_json) == record

    def sparkpoint() -> Any:
        return codec.decode(codec.encode(event))

    def fastavro_dict() -> Any:
        out = io.BytesIO()
        fastavro.schemaless_writer(out, schema, record)
        out.seek(0)
        return fastavro.schemaless_reader(out, schema)

    def plain_json() -> Any:
        return json.loads(json.dumps(record).encode())

    rates = {
        "sparkpoint": rate(sparkpoint),
        "fastavro-dict": rate(fastavro_dict),
        "json": rate(plain_json),
    }
    as_text = json.dumps(record).encode()
    decodes = {
        "sparkpoint": rate(lambda: codec.decode(encoded)),
        "fastavro-dict": rate(
            lambda: fastavro.schemaless_reader(io.BytesIO(encoded[HEADER_SIZE:]), schema)
        ),
        "json": rate(lambda: json.loads(as_text)),
    }
    sizes = {
        "sparkpoint": len(encoded),
        "fastavro-dict": len(encoded) - HEADER_SIZE,
        "json": len(as_json),
    }
    results = {
        "benchmark": "codec",
        "event": "AcknowledgeCheckpoint with 9 state handles",
        "unit": f"encode+decode round trips per second, one core, best of {ROUNDS} x {ITERATIONS}",
        "results": {
            name: {
                "round_trips_per_s": round(rates[name]),
                "decodes_per_s": round(decodes[name]),
                "bytes": sizes[name],
            }
            for name in rates
        },
        "sparkpoint_vs_json": round(rates["sparkpoint"] / rates["json"], 2),
        "how": "sparkpoint encodes and decodes with readers and writers compiled per event class "
        "(services/sparkpoint/common/avro_compiled.py); older schema versions are read through fastavro",
    }
    path = write_results("codec", results)
    width = max(map(len, rates))
    print(f"codec: {results['event']}, {results['unit']}; decodes alone")
    for name in rates:
        print(
            f"  {name:<{width}}  {rates[name]:>10,.0f} /s  decode {decodes[name]:>10,.0f} /s"
            f"  {sizes[name]:>5} bytes"
        )
    print(f"  sparkpoint / json = {results['sparkpoint_vs_json']}")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
