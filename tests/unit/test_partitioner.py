"""Kafka's murmur2 partitioner, against the vectors of Kafka's own UtilsTest."""

from __future__ import annotations

import pytest

from sparkpoint.common.kafka import murmur2, partition_of

KAFKA_VECTORS = [
    (b"21", -973932308),
    (b"foobar", -790332482),
    (b"a-little-bit-long-string", -985981536),
    (b"a-little-bit-longer-string", -1486304829),
    (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
    (b"abc", 479470107),
]


@pytest.mark.parametrize(("data", "signed"), KAFKA_VECTORS)
def test_murmur2_matches_kafka(data: bytes, signed: int) -> None:
    assert murmur2(data) == signed & 0xFFFFFFFF


def test_partition_is_the_positive_hash_modulo_partitions() -> None:
    assert partition_of("foobar", 4) == (-790332482 & 0x7FFFFFFF) % 4
