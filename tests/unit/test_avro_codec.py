"""The single-object codec: round trips, bytes checked against the Avro specification with an
independent implementation (the `avro` package and a CRC-64-AVRO written from the spec), schema
evolution through schemas/history, and bad bytes."""

from __future__ import annotations

import dataclasses
import io
import json
import re
import shutil
import struct
from pathlib import Path
from typing import Any

import avro.io
import avro.schema
import fastavro
import pytest
from avro.compatibility import ReaderWriterCompatibilityChecker, SchemaCompatibilityType
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkpoint.common.avro import (
    HEADER_SIZE,
    MAGIC,
    EventCodec,
    SchemaCatalogue,
    UndecodableEvent,
    schema_dir,
)
from sparkpoint.common.avro_compiled import _write_long, compile_codec
from sparkpoint.common.events import (
    EVENT_TYPES,
    AcknowledgeCheckpoint,
    StateHandle,
    StateHandleKind,
    TriggerCheckpoint,
)
from tests import factories

SCHEMAS = schema_dir()
HISTORY_DIR = SCHEMAS / "history"
HISTORY = sorted(HISTORY_DIR.glob("*.avsc"))


@pytest.fixture(scope="module")
def codec() -> EventCodec:
    return EventCodec()


# --- an independent CRC-64-AVRO, written from the Avro specification ---------------------------

EMPTY = 0xC15D213AA4D7A795


def _table() -> list[int]:
    table = []
    for i in range(256):
        fp = i
        for _ in range(8):
            fp = (fp >> 1) ^ (EMPTY & -(fp & 1))
        table.append(fp & 0xFFFFFFFFFFFFFFFF)
    return table


TABLE = _table()


def spec_fingerprint64(data: bytes) -> int:
    fp = EMPTY
    for byte in data:
        fp = (fp >> 8) ^ TABLE[(fp ^ byte) & 0xFF]
    return fp


def strip_logical_types(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: strip_logical_types(v) for k, v in node.items() if k != "logicalType"}
    if isinstance(node, list):
        return [strip_logical_types(v) for v in node]
    return node


def avro_package_schema(path: Path) -> avro.schema.Schema:
    return avro.schema.parse(path.read_text())


def canonical_form(path: Path) -> bytes:
    """Parsing canonical form by the avro package. The specification strips logicalType ([STRIP])
    and writes annotated primitives in their simple form ([PRIMITIVES]); the avro package keeps
    {"type": "long"} when a logicalType was present, so the annotation is stripped first."""
    stripped = strip_logical_types(json.loads(path.read_text()))
    return str(avro.schema.parse(json.dumps(stripped)).canonical_form).encode()


# --- round trips ------------------------------------------------------------------------------


@pytest.mark.parametrize("event", factories.one_of_each(), ids=lambda e: type(e).__name__)
def test_every_event_round_trips(codec: EventCodec, event: Any) -> None:
    assert codec.decode(codec.encode(event)) == event


def test_every_event_type_has_exactly_one_current_schema(codec: EventCodec) -> None:
    assert sorted(cls.SCHEMA for cls in EVENT_TYPES) == codec.catalogue.names()
    assert {type(e) for e in factories.one_of_each()} == set(EVENT_TYPES)


# --- bytes against the specification ----------------------------------------------------------


@pytest.mark.parametrize("event", factories.one_of_each(), ids=lambda e: type(e).__name__)
def test_header_is_marker_and_little_endian_crc64_of_canonical_form(
    codec: EventCodec, event: Any
) -> None:
    path = SCHEMAS / f"{event.SCHEMA.rsplit('.', 1)[1]}.avsc"
    encoded = codec.encode(event)
    assert encoded[:2] == MAGIC
    assert encoded[2:HEADER_SIZE] == struct.pack("<Q", spec_fingerprint64(canonical_form(path)))


def test_spec_fingerprint_matches_the_reference_vector() -> None:
    # Apache Avro's own tests: CRC-64-AVRO of "int" and its single-object header.
    assert spec_fingerprint64(b'"int"') == 0x7275D51A3F395C8F
    header = MAGIC + struct.pack("<Q", spec_fingerprint64(b'"int"'))
    assert header == bytes.fromhex("c3018f5c393f1ad57572")


@pytest.mark.parametrize("event", factories.one_of_each(), ids=lambda e: type(e).__name__)
def test_body_is_what_the_avro_package_writes(codec: EventCodec, event: Any) -> None:
    path = SCHEMAS / f"{event.SCHEMA.rsplit('.', 1)[1]}.avsc"
    encoded = codec.encode(event)
    record = fastavro.schemaless_reader(
        io.BytesIO(encoded[HEADER_SIZE:]),
        fastavro.parse_schema(strip_logical_types(json.loads(path.read_text()))),
    )
    schema = avro.schema.parse(json.dumps(strip_logical_types(json.loads(path.read_text()))))
    out = io.BytesIO()
    avro.io.DatumWriter(schema).write(record, avro.io.BinaryEncoder(out))
    assert encoded[HEADER_SIZE:] == out.getvalue()


# --- the schema files themselves --------------------------------------------------------------

SNAKE = re.compile(r"^[a-z][a-z0-9_]*$")


def _fields(node: Any) -> list[dict[str, Any]]:
    """Every field of every record nested anywhere in a schema."""
    found: list[dict[str, Any]] = []
    if isinstance(node, dict):
        for f in node.get("fields", []):
            found.append(f)
            found.extend(_fields(f["type"]))
        for key in ("items", "values"):
            if key in node:
                found.extend(_fields(node[key]))
    elif isinstance(node, list):
        for branch in node:
            found.extend(_fields(branch))
    return found


def _is_timestamp_millis(type_: Any) -> bool:
    if isinstance(type_, list):
        return any(_is_timestamp_millis(t) for t in type_)
    return isinstance(type_, dict) and type_.get("logicalType") == "timestamp-millis"


def _is_long(type_: Any) -> bool:
    if isinstance(type_, list):
        return "long" in type_
    return type_ == "long" or (isinstance(type_, dict) and type_.get("type") == "long")


@pytest.mark.parametrize("path", sorted(SCHEMAS.glob("*.avsc")), ids=lambda p: p.name)
def test_schema_conventions(path: Path) -> None:
    schema = json.loads(path.read_text())
    assert schema["namespace"] == "sparkpoint.events"
    assert path.stem == schema["name"]
    for f in _fields(schema):
        assert SNAKE.match(f["name"]), f"{path.name}: {f['name']} is not snake_case"
        if f["name"].endswith("timestamp") or f["name"].endswith("_at"):
            assert _is_timestamp_millis(f["type"]), (
                f"{path.name}: {f['name']} is not timestamp-millis"
            )
        if f["name"].endswith("_ms") or f["name"].endswith("_bytes"):
            assert _is_long(f["type"]), f"{path.name}: {f['name']} is not a long"


# --- evolution ---------------------------------------------------------------------------------


def test_history_is_not_empty() -> None:
    assert HISTORY, (
        "schemas/history holds the superseded versions; the compatibility tests need them"
    )


@pytest.mark.parametrize("old", HISTORY, ids=lambda p: p.name)
def test_historical_version_is_readable_by_the_current_schema(old: Path) -> None:
    name = old.name.split(".")[0]
    result = ReaderWriterCompatibilityChecker().get_compatibility(
        reader=avro_package_schema(SCHEMAS / f"{name}.avsc"), writer=avro_package_schema(old)
    )
    assert result.compatibility is SchemaCompatibilityType.compatible, result.messages


def _encode_with(path: Path, record: dict[str, Any]) -> bytes:
    definition = json.loads(path.read_text())
    out = io.BytesIO()
    out.write(MAGIC + struct.pack("<Q", spec_fingerprint64(canonical_form(path))))
    fastavro.schemaless_writer(out, fastavro.parse_schema(strip_logical_types(definition)), record)
    return out.getvalue()


def decode_as_written_by(codec: EventCodec, old: Path, event: Any) -> Any:
    """The event, written by a producer that only knows the schema version in ``old``."""
    old_fields = {f["name"] for f in json.loads(old.read_text())["fields"]}
    record = {k: v for k, v in codec_record(codec, event).items() if k in old_fields}
    return codec.decode(_encode_with(old, record))


def test_v1_acknowledge_decodes_with_v2_defaults(codec: EventCodec) -> None:
    current = factories.acknowledge()

    decoded = decode_as_written_by(codec, HISTORY_DIR / "AcknowledgeCheckpoint.v1.avsc", current)

    assert isinstance(decoded, AcknowledgeCheckpoint)
    assert decoded.checkpointed_size_bytes == 0 and decoded.processed_data_bytes == 0
    assert decoded.state_handles == current.state_handles
    assert decoded.async_duration_ms == current.async_duration_ms


def test_v1_trigger_decodes_as_canonical_savepoint_format(codec: EventCodec) -> None:
    current = factories.savepoint_trigger()

    decoded = decode_as_written_by(codec, HISTORY_DIR / "TriggerCheckpoint.v1.avsc", current)

    assert isinstance(decoded, TriggerCheckpoint)
    assert decoded.savepoint_format.name == "CANONICAL"
    assert decoded.target_location == current.target_location


def codec_record(codec: EventCodec, event: Any) -> dict[str, Any]:
    """The Avro record the codec writes for an event (read back with the current schema)."""
    version = codec.catalogue.current(event.SCHEMA)
    record = fastavro.schemaless_reader(
        io.BytesIO(codec.encode(event)[HEADER_SIZE:]), version.parsed
    )
    assert isinstance(record, dict)
    return record


def test_a_schema_that_disagrees_with_its_event_class_is_refused(tmp_path: Path) -> None:
    shutil.copytree(SCHEMAS, tmp_path / "schemas")
    path = tmp_path / "schemas" / "DeclineCheckpoint.avsc"
    schema = json.loads(path.read_text())
    schema["fields"] = [f for f in schema["fields"] if f["name"] != "message"]
    path.write_text(json.dumps(schema))
    with pytest.raises(ValueError, match="DeclineCheckpoint"):
        EventCodec(SchemaCatalogue.load(tmp_path / "schemas"))


# --- bad bytes ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "shorter than the 10-byte header"),
        (b"\xc3\x01\x00", "shorter than the 10-byte header"),
        (b'{"job_id": "x"}', "no single-object marker"),
        (MAGIC + b"\x00" * 8 + b"\x02", "unknown schema fingerprint 0000000000000000"),
    ],
)
def test_garbage_is_undecodable_with_a_reason(codec: EventCodec, data: bytes, reason: str) -> None:
    with pytest.raises(UndecodableEvent, match=reason):
        codec.decode(data)


def test_truncated_body_is_undecodable(codec: EventCodec) -> None:
    encoded = codec.encode(factories.acknowledge())
    for cut in range(HEADER_SIZE, len(encoded)):
        with pytest.raises(UndecodableEvent):
            codec.decode(encoded[:cut])


def test_trailing_bytes_are_undecodable(codec: EventCodec) -> None:
    with pytest.raises(UndecodableEvent, match="bytes after the body"):
        codec.decode(codec.encode(factories.notify_complete()) + b"\x00")


@settings(max_examples=400, deadline=None)
@given(body=st.binary(max_size=200), which=st.integers(min_value=0, max_value=len(EVENT_TYPES) - 1))
def test_random_bodies_decode_or_raise_undecodable(
    codec: EventCodec, body: bytes, which: int
) -> None:
    header = MAGIC + codec.catalogue.current(EVENT_TYPES[which].SCHEMA).fingerprint
    try:
        event = codec.decode(header + body)
    except UndecodableEvent as exc:
        assert exc.reason
    else:
        assert isinstance(event, EVENT_TYPES[which])


# --- the compiled readers and writers against fastavro -------------------------------------------


def fastavro_decode(codec: EventCodec, data: bytes) -> Any:
    """What fastavro makes of a current-schema event: the reference the compiled reader is held
    to (it raises on bad bytes where the compiled reader raises UndecodableEvent)."""
    version = codec.catalogue.by_fingerprint(data[2:HEADER_SIZE])
    assert version is not None
    body = io.BytesIO(data[HEADER_SIZE:])
    record = fastavro.schemaless_reader(body, version.parsed)
    if body.tell() != len(data) - HEADER_SIZE:
        raise ValueError("bytes after the body")
    return codec._by_name[version.full_name].from_avro(record)


@settings(max_examples=400, deadline=None)
@given(body=st.binary(max_size=200), which=st.integers(min_value=0, max_value=len(EVENT_TYPES) - 1))
def test_the_compiled_reader_agrees_with_fastavro_on_any_bytes(
    codec: EventCodec, body: bytes, which: int
) -> None:
    data = MAGIC + codec.catalogue.current(EVENT_TYPES[which].SCHEMA).fingerprint + body
    try:
        expected = fastavro_decode(codec, data)
    except Exception:
        expected = None
    try:
        decoded = codec.decode(data)
    except UndecodableEvent:
        decoded = None
    assert decoded == expected


longs = st.integers(min_value=-(2**63), max_value=2**63 - 1)
ints = st.integers(min_value=-(2**31), max_value=2**31 - 1)


@settings(max_examples=300, deadline=None)
@given(
    job_id=st.text(max_size=40),
    checkpoint_id=longs,
    attempt=ints,
    handles=st.lists(
        st.tuples(st.text(max_size=60), longs, st.none() | ints, st.none() | ints, st.booleans()),
        max_size=12,
    ),
    agent_id=st.none() | st.text(max_size=10),
)
def test_the_compiled_writer_writes_what_fastavro_writes(
    codec: EventCodec,
    job_id: str,
    checkpoint_id: int,
    attempt: int,
    handles: list[tuple[str, int, int | None, int | None, bool]],
    agent_id: str | None,
) -> None:
    event = dataclasses.replace(
        factories.acknowledge(),
        job_id=job_id,
        checkpoint_id=checkpoint_id,
        attempt=attempt,
        state_handles=[
            StateHandle(path, StateHandleKind.CHANNEL_STATE, size, start, end, shared)
            for path, size, start, end, shared in handles
        ],
        agent_id=agent_id,
    )
    version = codec.catalogue.current(event.SCHEMA)
    reference = io.BytesIO()
    fastavro.schemaless_writer(
        reference, version.parsed, codec._by_name[version.full_name].to_avro(event)
    )
    encoded = codec.encode(event)
    assert encoded[HEADER_SIZE:] == reference.getvalue()
    assert codec.decode(encoded) == event


def test_a_negative_length_is_refused_before_it_moves_the_reader_back(codec: EventCodec) -> None:
    """A string of length -1 would move the reader back onto bytes it already read (inside an
    array of a billion items, round and round): it is refused where it stands."""
    event = factories.acknowledge()
    encoded = codec.encode(event)
    job_id = event.job_id.encode()
    after_job_id = HEADER_SIZE + len(_write_long(len(job_id))) + len(job_id)
    hostile = encoded[:HEADER_SIZE] + _write_long(-1) + encoded[after_job_id:]
    with pytest.raises(UndecodableEvent, match="string of -1 bytes"):
        codec.decode(hostile)


@dataclasses.dataclass(frozen=True, slots=True)
class Node:
    """A record that refers to itself: not in any event, but the compiled codec must not inline
    a record into itself for ever."""

    name: str
    weight: int
    children: list[Node]
    parent_name: str | None


NODE_SCHEMA = {
    "type": "record",
    "name": "Node",
    "namespace": "test",
    "fields": [
        {"name": "name", "type": "string"},
        {"name": "weight", "type": "long"},
        {"name": "children", "type": {"type": "array", "items": "Node"}},
        {"name": "parent_name", "type": ["null", "string"]},
    ],
}


def test_a_recursive_record_is_read_and_written_through_its_own_function() -> None:
    tree = Node(
        "root",
        -(2**40),
        [Node("a" * 200, 300, [Node("leaf", 1, [], "a" * 200)], "root"), Node("b", 0, [], "root")],
        None,
    )
    read, write = compile_codec(NODE_SCHEMA, Node)
    out = bytearray()
    write(tree, out)
    reference = io.BytesIO()
    fastavro.schemaless_writer(
        reference, fastavro.parse_schema(NODE_SCHEMA), dataclasses.asdict(tree)
    )
    assert bytes(out) == reference.getvalue()
    decoded, end = read(bytes(out), 0)
    assert (decoded, end) == (tree, len(out))
    assert type(decoded.children[0].children[0]) is Node


@dataclasses.dataclass(frozen=True, slots=True)
class Tree:
    root: Node
    size: int


def test_a_recursive_record_inside_another_is_inlined_once_then_called() -> None:
    schema = {
        "type": "record",
        "name": "Tree",
        "namespace": "test",
        "fields": [{"name": "root", "type": NODE_SCHEMA}, {"name": "size", "type": "long"}],
    }
    tree = Tree(Node("root", 1, [Node("leaf", 2, [], "root")], None), 2)
    read, write = compile_codec(schema, Tree)
    out = bytearray()
    write(tree, out)
    reference = io.BytesIO()
    fastavro.schemaless_writer(reference, fastavro.parse_schema(schema), dataclasses.asdict(tree))
    assert bytes(out) == reference.getvalue()
    assert read(bytes(out), 0) == (tree, len(out))
