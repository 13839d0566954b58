"""Value formats of Kafka sources and sinks: JSON objects, Avro (single-object encoding with a
schema from an ``.avsc`` file, or the Confluent wire format with schemas from a registry), raw
bytes and UTF-8 strings.

Sources decode a whole fetch at once into a pandas DataFrame (through Arrow for JSON, through
one fastavro block read per schema for Avro), never one record at a time in Python; a value that
does not decode is skipped and reported with its offset (the fetch falls back to one record at a
time only to find it). Sinks encode a DataFrame's rows.

- ``JsonValues()``: one JSON object per record (the default).
- ``AvroValues(schema)``: Avro single-object encoding (``C3 01``, the 8-byte CRC-64-AVRO
  fingerprint of the writer schema, the Avro body), read and written with the schema in the
  ``.avsc`` file ``schema``.
- ``ConfluentAvroValues(registry=URL)`` or ``ConfluentAvroValues(schemas={id: path})``: the
  Confluent wire format (a zero byte, the 4-byte schema id, the Avro body); schemas by id from a
  schema registry (confluent-kafka's SchemaRegistryClient) or from a local id -> ``.avsc``
  mapping. A sink writes with ``schema`` under ``schema_id`` (registered under ``subject`` when a
  registry is given).
- ``RawValues()``: the value as bytes in column ``value``; ``StringValues()``: as text. Both add
  the record key (text) in column ``key``.
"""

from __future__ import annotations

import dataclasses
import io
import json
import re
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Any, Protocol, cast

import fastavro
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson

from sparkpoint.common.kafka_config import Frozen, frozen, schema_registry_properties

Malformed = list[tuple[int, str]]


class ValueFormat(Protocol):
    def decode(
        self, values: list[bytes], keys: list[bytes | None], offsets: list[int]
    ) -> tuple[pd.DataFrame, Malformed]:
        """The records of one fetch as a frame, and the (offset, reason) of those skipped."""
        ...

    def encode(self, frame: pd.DataFrame) -> list[bytes]:
        """One value per row."""
        ...


# --- JSON --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class JsonValues:
    def decode(
        self, values: list[bytes], keys: list[bytes | None], offsets: list[int]
    ) -> tuple[pd.DataFrame, Malformed]:
        """JSON objects parsed in bulk by Arrow; on a bad record, one at a time so the bad ones
        are reported (by offset) and skipped and the good ones kept."""
        if not values:
            return pd.DataFrame(), []
        try:
            return pajson.read_json(io.BytesIO(b"\n".join(values))).to_pandas(), []
        except (pa.ArrowInvalid, ValueError):
            rows, bad = [], []
            for value, offset in zip(values, offsets, strict=True):
                try:
                    row = json.loads(value)
                    if not isinstance(row, dict):
                        raise ValueError("not a JSON object")
                    rows.append(row)
                except ValueError as exc:
                    bad.append((offset, str(exc)[:200]))
            return pd.DataFrame(rows), bad

    def encode(self, frame: pd.DataFrame) -> list[bytes]:
        if not len(frame):
            return []
        plain = plain_json_lines(frame)
        if plain is not None:
            return plain
        # one encode, one split: a JSON line holds no raw newline (strings escape it)
        text: str = frame.to_json(orient="records", lines=True)
        return text.rstrip("\n").encode().split(b"\n")


_NEEDS_ESCAPE = r'[^\x20-\x7e]|["\\/]'
"""What pandas' JSON writer escapes in a string (quotes, backslashes, slashes, control
characters and, as ``ensure_ascii`` does, everything beyond ASCII)."""


def plain_json_lines(frame: pd.DataFrame) -> list[bytes] | None:
    """``frame``'s rows as the JSON objects pandas' ``to_json(orient="records")`` writes, put
    together by Arrow's string kernels when every column is integers, booleans or strings that
    need no escape and holds no null (a running sum's output, say: 0.17 against 0.52 us a
    record); None for any other frame, which pandas then writes."""
    names = [str(name) for name in frame.columns]
    if len(set(names)) != len(names) or any(re.search(_NEEDS_ESCAPE, n) for n in names):
        return None
    parts: list[Any] = []
    for i, (name, column) in enumerate(zip(names, frame.columns, strict=True)):
        try:
            values = pa.array(frame[column], from_pandas=True)
        except (pa.ArrowException, TypeError, ValueError, OverflowError):
            return None
        if values.null_count:
            return None
        lead = ("{" if i == 0 else ",") + f'"{name}":'
        if pa.types.is_string(values.type) or pa.types.is_large_string(values.type):
            if pc.any(pc.match_substring_regex(values, _NEEDS_ESCAPE)).as_py():
                return None
            parts += [lead + '"', values, '"']
        elif pa.types.is_integer(values.type) or pa.types.is_boolean(values.type):
            parts += [lead, pc.cast(values, pa.string())]
        else:
            return None
    joined = pc.binary_join_element_wise(*parts, "}", "")
    return cast(list[bytes], joined.cast(pa.binary()).to_pylist())


# --- Avro --------------------------------------------------------------------------------------

SINGLE_OBJECT = b"\xc3\x01"
SYNC = b"\x00" * 16
CONFLUENT = b"\x00"


@cache
def _parsed(schema_file: str) -> tuple[Any, bytes]:
    """A schema file parsed, and its single-object header (marker and fingerprint)."""
    with open(schema_file) as source:
        definition = json.load(source)
    parsed = fastavro.parse_schema(definition)
    canonical = fastavro.schema.to_parsing_canonical_form(parsed)
    fingerprint = bytes.fromhex(fastavro.schema.fingerprint(canonical, "CRC-64-AVRO"))
    return parsed, SINGLE_OBJECT + fingerprint


END = b"\x9e\x5a\x1d\x47\xc2\x08\xf3\x61"
"""Written after every body of a block (see `_block_decode`)."""

_FRAMED: dict[int, tuple[Any, bytes]] = {}


def _framed_header(parsed: Any) -> bytes:
    """The header of an Avro container file whose records are the schema's record followed by
    an 8-byte fixed: the parsed schemas come from caches, so they live as long as this one."""
    found = _FRAMED.get(id(parsed))
    if found is None:
        framed = {
            "type": "record",
            "name": "sparkpoint.Framed",
            "fields": [
                {"name": "value", "type": parsed},
                {"name": "end", "type": {"type": "fixed", "name": "sparkpoint.End", "size": 8}},
            ],
        }
        header = io.BytesIO()
        fastavro.writer(header, fastavro.parse_schema(framed), [], sync_marker=SYNC)
        found = _FRAMED[id(parsed)] = (parsed, header.getvalue())
    return found[1]


def _block_decode(parsed: Any, bodies: list[bytes]) -> list[Any]:
    """Avro bodies of one schema decoded in one pass: they are framed as one block of an Avro
    object container file and read by fastavro's reader (its compiled loop, not ours). Each
    body is followed by the `END` bytes, read back as a fixed field: a body longer or shorter
    than its record shifts what is read there, so no bad body can pass as a good one."""
    payload = END.join(bodies) + END
    block = _zigzag(len(bodies)) + _zigzag(len(payload)) + payload + SYNC
    records: list[Any] = list(fastavro.reader(io.BytesIO(_framed_header(parsed) + block)))
    if len(records) != len(bodies) or any(r["end"] != END for r in records):
        raise ValueError("a body does not match its schema")
    return [r["value"] for r in records]


def _zigzag(n: int) -> bytes:
    """An Avro long: zig-zag, then variable length."""
    value = (n << 1) ^ (n >> 63)
    out = bytearray()
    while value & ~0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _encoded(frame: pd.DataFrame, parsed: Any, header: bytes) -> list[bytes]:
    """Each row of ``frame`` as ``header`` followed by its Avro body."""
    out = []
    for record in frame.to_dict(orient="records"):
        buffer = io.BytesIO()
        buffer.write(header)
        fastavro.schemaless_writer(buffer, parsed, record)
        out.append(buffer.getvalue())
    return out


def _records_frame(records: list[dict[str, Any]]) -> pd.DataFrame:
    return pa.Table.from_pylist(records).to_pandas() if records else pd.DataFrame()


def _decode_groups(
    groups: Mapping[Any, list[tuple[int, bytes]]], parser: Any
) -> tuple[list[dict[str, Any]], Malformed]:
    """Decodes bodies grouped by schema; a group that fails is decoded one by one to find and
    skip its bad values."""
    records: list[tuple[int, Any]] = []
    bad: Malformed = []
    for schema_key, items in groups.items():
        try:
            parsed = parser(schema_key)
        except Exception as exc:
            bad += [(offset, f"schema {schema_key}: {exc}"[:200]) for offset, _ in items]
            continue
        try:
            decoded = _block_decode(parsed, [body for _, body in items])
            records += [(offset, r) for (offset, _), r in zip(items, decoded, strict=True)]
        except Exception:
            for offset, body in items:
                try:
                    stream = io.BytesIO(body)
                    record = fastavro.schemaless_reader(stream, parsed, None)
                    if stream.tell() != len(body):
                        raise ValueError(f"{len(body) - stream.tell()} bytes after the record")
                    records.append((offset, record))
                except Exception as exc:
                    bad.append((offset, f"not an Avro record of its schema: {exc!r}"[:200]))
    records.sort(key=lambda item: item[0])  # source order
    return [r for _, r in records], bad


@dataclass(frozen=True)
class AvroValues:
    schema: str
    """The ``.avsc`` file: the schema values are written with."""

    def decode(
        self, values: list[bytes], keys: list[bytes | None], offsets: list[int]
    ) -> tuple[pd.DataFrame, Malformed]:
        parsed, header = _parsed(self.schema)
        good: list[tuple[int, bytes]] = []
        bad: Malformed = []
        for value, offset in zip(values, offsets, strict=True):
            if value[:10] == header:
                good.append((offset, value[10:]))
            elif value[:2] == SINGLE_OBJECT:
                bad.append((offset, f"unknown schema fingerprint {value[2:10].hex()}"))
            else:
                bad.append((offset, "no Avro single-object marker C3 01"))
        records, more = _decode_groups({self.schema: good}, lambda _: parsed)
        return _records_frame(records), sorted(bad + more)

    def encode(self, frame: pd.DataFrame) -> list[bytes]:
        parsed, header = _parsed(self.schema)
        return _encoded(frame, parsed, header)


@dataclass(frozen=True)
class ConfluentAvroValues:
    registry: str | None = None
    """A schema registry URL (confluent-kafka's SchemaRegistryClient)."""
    schemas: Mapping[int, str] = field(default_factory=dict)
    """Or: schema id -> ``.avsc`` file, where no registry runs."""
    schema: str | None = None
    """A sink's schema file, written under ``schema_id`` (registered under ``subject``)."""
    schema_id: int | None = None
    subject: str | None = None
    registry_properties: Mapping[str, str] = field(default_factory=dict)
    """The Schema Registry client's settings (confluent-kafka's SchemaRegistryClient:
    ``basic.auth.user.info``, ``bearer.auth.token``, ``ssl.ca.location``...) over those of the
    agent's Kafka client configuration (its ``schema.registry.*`` keys)."""

    def _schema(self, schema_id: int) -> Any:
        if schema_id in self.schemas:
            return _parsed(self.schemas[schema_id])[0]
        if self.registry is None:
            raise KeyError(f"no schema with id {schema_id}")
        return _registry_schema(self.registry, frozen(self.registry_properties), schema_id)

    def decode(
        self, values: list[bytes], keys: list[bytes | None], offsets: list[int]
    ) -> tuple[pd.DataFrame, Malformed]:
        groups: dict[int, list[tuple[int, bytes]]] = {}
        bad: Malformed = []
        for value, offset in zip(values, offsets, strict=True):
            if len(value) < 5 or value[:1] != CONFLUENT:
                bad.append((offset, "not the Confluent wire format (magic byte 0, schema id)"))
                continue
            (schema_id,) = struct.unpack(">I", value[1:5])
            groups.setdefault(schema_id, []).append((offset, value[5:]))
        records, more = _decode_groups(groups, self._schema)
        return _records_frame(records), sorted(bad + more)

    def encode(self, frame: pd.DataFrame) -> list[bytes]:
        if self.schema is None:
            raise ValueError("a Confluent Avro sink needs schema (an .avsc file)")
        parsed = _parsed(self.schema)[0]
        schema_id = self.schema_id
        if schema_id is None:
            if self.registry is None:
                raise ValueError("a Confluent Avro sink needs schema_id or a registry")
            schema_id = _register(
                self.registry,
                frozen(self.registry_properties),
                self.subject or "sparkpoint-value",
                self.schema,
            )
        return _encoded(frame, parsed, CONFLUENT + struct.pack(">I", schema_id))


def with_registry_settings(value_format: ValueFormat) -> ValueFormat:
    """``value_format`` with this process's Schema Registry settings under its own: the Spark
    tasks that decode and encode run where the agent's configuration file may not be."""
    if not isinstance(value_format, ConfluentAvroValues):
        return value_format
    settings = schema_registry_properties() | dict(value_format.registry_properties)
    return dataclasses.replace(value_format, registry_properties=settings)


def _registry(url: str, properties: Frozen) -> Any:
    from confluent_kafka.schema_registry import SchemaRegistryClient

    return SchemaRegistryClient({**dict(properties), "url": url})


@cache
def _registry_schema(url: str, properties: Frozen, schema_id: int) -> Any:
    schema = _registry(url, properties).get_schema(schema_id)
    if schema.schema_str is None or schema.schema_type not in (None, "AVRO"):
        raise ValueError(f"schema {schema_id} in {url} is not an Avro schema")
    return fastavro.parse_schema(json.loads(schema.schema_str))


@cache
def _register(url: str, properties: Frozen, subject: str, schema_file: str) -> int:
    from confluent_kafka.schema_registry import Schema

    with open(schema_file) as source:
        text = source.read()
    return int(
        _registry(url, properties).register_schema(subject, Schema(text, schema_type="AVRO"))
    )


# --- raw ---------------------------------------------------------------------------------------


def _keys(keys: list[bytes | None]) -> list[str | None]:
    return [None if k is None else k.decode("utf-8", "replace") for k in keys]


@dataclass(frozen=True)
class RawValues:
    def decode(
        self, values: list[bytes], keys: list[bytes | None], offsets: list[int]
    ) -> tuple[pd.DataFrame, Malformed]:
        return pd.DataFrame({"key": _keys(keys), "value": values}), []

    def encode(self, frame: pd.DataFrame) -> list[bytes]:
        return [bytes(v) for v in frame["value"]]


@dataclass(frozen=True)
class StringValues:
    def decode(
        self, values: list[bytes], keys: list[bytes | None], offsets: list[int]
    ) -> tuple[pd.DataFrame, Malformed]:
        texts: list[str] = []
        kept_keys: list[bytes | None] = []
        bad: Malformed = []
        for value, key, offset in zip(values, keys, offsets, strict=True):
            try:
                texts.append(value.decode("utf-8"))
                kept_keys.append(key)
            except UnicodeDecodeError as exc:
                bad.append((offset, f"not UTF-8: {exc}"[:200]))
        return pd.DataFrame({"key": _keys(kept_keys), "value": texts}), bad

    def encode(self, frame: pd.DataFrame) -> list[bytes]:
        return [str(v).encode() for v in frame["value"]]
