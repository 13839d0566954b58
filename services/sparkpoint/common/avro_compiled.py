"""Avro binary readers and writers compiled per event class: Python source generated from the
current schema and the event's dataclass, run through ``compile`` once per process.

Why not fastavro alone: fastavro decodes to dicts and encodes from dicts, so every event paid
for a dict and a conversion to or from the dataclass on top of fastavro's generic walk over the
schema. A round trip of an acknowledgement with 9 state handles ran at 8,500/s, a third of
json's rate. The compiled reader builds the dataclass straight from the bytes, with nested
records, varints and the event's construction inline: 55,000 decodes and 32,000 round trips a
second, json's 70,000 and 30,000 (bench/codec.py). fastavro stays for what it does
best: reading older schema versions (schema resolution), and as the reference the tests hold
these functions to, byte for byte.

The subset of Avro the sparkpoint schemas use: records (also named and referred to again),
enums, arrays, maps, unions, string, boolean, int and long. Anything else is refused when the
codec starts, not when an event arrives.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, fields, is_dataclass
from typing import Any

Reader = Callable[[bytes, int], tuple[Any, int]]
Writer = Callable[[Any, bytearray], None]

_SMALL = [bytes([((v << 1) ^ (v >> 63)) & 0xFF]) for v in range(-64, 64)]
"""The one-byte zig-zag encodings of -64..63."""


def _write_long(value: int) -> bytes:
    if -64 <= value < 64:
        return _SMALL[value + 64]
    n = (value << 1) ^ (value >> 63)
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


class _Source:
    """Lines of generated Python and the objects they refer to."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.functions: list[str] = []
        """Finished functions (a nested record's is finished before its parent's)."""
        self.env: dict[str, Any] = {
            "_SMALL": _SMALL,
            "_new": object.__new__,
        }
        self._count = 0

    def name(self, prefix: str) -> str:
        self._count += 1
        return f"{prefix}{self._count}"

    def const(self, value: Any, prefix: str) -> str:
        name = self.name(prefix)
        self.env[name] = value
        return name

    def emit(self, indent: int, line: str) -> None:
        self.lines.append("    " * indent + line)


class _Compiler:
    """Generates one reader and one writer per record type, named records once."""

    def __init__(self) -> None:
        self.src = _Source()
        self.records: dict[str, _Record] = {}
        """Avro full name -> the record's schema, class and function names."""
        self._open: set[str] = set()
        """Records whose fields are being generated (in their function or inline): a reference
        to one of them from inside itself (a recursive schema) calls its function; any other
        reference is inlined."""

    def record(self, schema: dict[str, Any], cls: type, namespace: str) -> _Record:
        """The reader and writer functions of a record type, generated on first sight."""
        full = _full_name(schema["name"], schema.get("namespace", namespace))
        if full in self.records:
            return self.records[full]
        space = schema.get("namespace", namespace)
        if sorted(f.name for f in fields(cls)) != sorted(f["name"] for f in schema["fields"]):
            raise ValueError(f"{cls.__name__} and schema {full} have different fields")
        found = _Record(
            full,
            schema,
            cls,
            space,
            typing.get_type_hints(cls),
            self.src.const(_twin(cls), "twin_"),
            self.src.const(cls, "cls_"),
            self.src.name("read_"),
            self.src.name("write_"),
        )
        self.records[full] = found
        saved = self.src.lines
        self.src.lines = [f"def {found.reader}(data, pos):"]
        self._read_fields(found, "obj", 1)
        self.src.emit(1, "return obj, pos")
        self.src.lines.append(f"def {found.writer}(obj, out):")
        self._write_fields(found, "obj", 1)
        self.src.emit(1, "return None")
        self.src.functions.append("\n".join(self.src.lines))
        self.src.lines = saved
        return found

    def _read_fields(self, record: _Record, target: str, indent: int) -> None:
        """The record's fields in schema order, then the event built from them: without its
        __init__ (a frozen dataclass's sets each field through object.__setattr__), as an
        instance of a plain slotted twin of the class whose slots are set directly and whose
        class is then switched (same slots, same layout), a third of the cost."""
        local = {f["name"]: self.src.name("f") for f in record.schema["fields"]}
        self._open.add(record.full)
        for f in record.schema["fields"]:
            hint = record.hints[f["name"]]
            self._read(f["type"], hint, local[f["name"]], indent, record.namespace)
        self._open.discard(record.full)
        self.src.emit(indent, f"{target} = _new({record.twin})")
        for f in fields(record.cls):
            self.src.emit(indent, f"{target}.{f.name} = {local[f.name]}")
        self.src.emit(indent, f"{target}.__class__ = {record.cls_name}")

    def _write_fields(self, record: _Record, value: str, indent: int) -> None:
        self._open.add(record.full)
        for f in record.schema["fields"]:
            hint = record.hints[f["name"]]
            self._write(f["type"], hint, f"{value}.{f['name']}", indent, record.namespace)
        self._open.discard(record.full)

    # --- reading --------------------------------------------------------------------------------

    def _emit_read_long(self, target: str, indent: int) -> None:
        """A zig-zag varint, inline: one byte (-64..63, the common case) without a loop, longer
        ones byte by byte, at most 10."""
        emit = self.src.emit
        emit(indent, "b = data[pos]; pos += 1")
        emit(indent, "if b < 128:")
        emit(indent + 1, f"{target} = (b >> 1) ^ -(b & 1)")
        emit(indent, "else:")
        emit(indent + 1, "z = b & 127; shift = 7")
        emit(indent + 1, "while True:")
        emit(indent + 2, "b = data[pos]; pos += 1")
        emit(indent + 2, "z |= (b & 127) << shift")
        emit(indent + 2, "if b < 128:")
        emit(indent + 3, "break")
        emit(indent + 2, "shift += 7")
        emit(indent + 2, "if shift > 63:")
        emit(indent + 3, "raise ValueError('varint longer than 10 bytes')")
        emit(indent + 1, f"{target} = (z >> 1) ^ -(z & 1)")

    def _emit_write_long(self, value: str, indent: int, zigzag: str | None = None) -> None:
        """Append the zig-zag varint of the integer in local ``value``: one byte from a table,
        longer ones byte by byte. ``zigzag`` is an expression of its zig-zag form when that is
        cheaper (a length, never negative: twice itself)."""
        emit = self.src.emit
        emit(indent, f"if -64 <= {value} < 64:")
        emit(indent + 1, f"out += _SMALL[{value} + 64]")
        emit(indent, "else:")
        emit(indent + 1, f"z = {zigzag or f'({value} << 1) ^ ({value} >> 63)'}")
        emit(indent + 1, "while z > 127:")
        emit(indent + 2, "out.append((z & 127) | 128); z >>= 7")
        emit(indent + 1, "out.append(z)")

    def _read(self, schema: Any, hint: Any, target: str, indent: int, namespace: str) -> None:
        emit = self.src.emit
        kind = _kind(schema, namespace, self.records)
        if kind == "union":
            inner = optional_inner(hint)
            emit(indent, "b = data[pos]; pos += 1")
            for i, branch in enumerate(schema):
                emit(indent, f"{'if' if i == 0 else 'elif'} b == {i * 2}:")
                if branch == "null":
                    emit(indent + 1, f"{target} = None")
                else:
                    self._read(branch, inner, target, indent + 1, namespace)
            emit(indent, "else:")
            emit(indent + 1, "raise ValueError(f'union branch {b} out of range')")
        elif kind == "null":
            emit(indent, f"{target} = None")
        elif kind == "boolean":
            emit(indent, "b = data[pos]; pos += 1")
            emit(indent, "if b > 1:")
            emit(indent + 1, "raise ValueError(f'boolean byte {b}')")
            emit(indent, f"{target} = b == 1")
        elif kind in ("int", "long"):
            self._emit_read_long(target, indent)
        elif kind == "string":
            self._emit_read_long("n", indent)
            # A length past the end is not checked here: it leaves an offset past the end,
            # which the caller refuses (every reader's result is checked against the length).
            emit(indent, "if n < 0:")
            emit(indent + 1, "raise ValueError(f'string of {n} bytes at {pos}')")
            emit(indent, "end = pos + n")
            emit(indent, f"{target} = data[pos:end].decode(); pos = end")
        elif kind == "enum":
            members = self.src.const(tuple(hint[s] for s in schema["symbols"]), "enum_")
            self._emit_read_long("n", indent)
            emit(indent, "if n < 0:")
            emit(indent + 1, "raise ValueError(f'enum index {n}')")
            emit(indent, f"{target} = {members}[n]")
        elif kind in ("array", "map"):
            is_map = kind == "map"
            item_hint = typing.get_args(hint)[-1]
            items = self.src.name("items")
            emit(indent, f"{items} = {{}}" if is_map else f"{items} = []")
            emit(indent, "while True:")
            self._emit_read_long("count", indent + 1)
            emit(indent + 1, "if count == 0:")
            emit(indent + 2, "break")
            emit(indent + 1, "if count < 0:")
            emit(indent + 2, "count = -count")
            self._emit_read_long("size", indent + 2)
            loop = self.src.name("i")
            emit(indent + 1, f"for {loop} in range(count):")
            if is_map:
                key = self.src.name("key")  # its own name: a map's values may be maps
                self._read("string", str, key, indent + 2, namespace)
            item = self.src.name("item")
            self._read(
                schema["items" if not is_map else "values"], item_hint, item, indent + 2, namespace
            )
            emit(indent + 2, f"{items}[{key}] = {item}" if is_map else f"{items}.append({item})")
            emit(indent, f"{target} = {items}")
        elif kind in ("record", "named"):
            record = self._nested(schema, hint, namespace, kind)
            if record.full in self._open:  # inside itself: a recursive record
                emit(indent, f"{target}, pos = {record.reader}(data, pos)")
            else:
                self._read_fields(record, target, indent)
        else:
            raise ValueError(f"Avro type {schema!r} is not supported by the compiled codec")

    def _nested(self, schema: Any, hint: Any, namespace: str, kind: str) -> _Record:
        """A record met inside another, its definition or a reference to it: its functions are
        generated on first sight (they serve a recursive reference; every other is inlined)."""
        if kind == "record":
            return self.record(schema, hint, namespace)
        return self.records[_full_name(schema, namespace)]

    # --- writing --------------------------------------------------------------------------------

    def _write(self, schema: Any, hint: Any, value: str, indent: int, namespace: str) -> None:
        emit = self.src.emit
        kind = _kind(schema, namespace, self.records)
        if kind == "union":
            inner = optional_inner(hint)
            null_at = schema.index("null")
            (other_at,) = [i for i in range(len(schema)) if i != null_at]
            local = self.src.name("u")
            emit(indent, f"{local} = {value}")
            emit(indent, f"if {local} is None:")
            emit(indent + 1, f"out.append({null_at * 2})")
            emit(indent, "else:")
            emit(indent + 1, f"out.append({other_at * 2})")
            self._write(schema[other_at], inner, local, indent + 1, namespace)
        elif kind == "null":
            pass
        elif kind == "boolean":
            emit(indent, f"out.append(1 if {value} else 0)")
        elif kind in ("int", "long"):
            local = self.src.name("n")
            emit(indent, f"{local} = {value}")
            self._emit_write_long(local, indent)
        elif kind == "string":
            local, size = self.src.name("s"), self.src.name("n")
            emit(indent, f"{local} = {value}.encode(); {size} = len({local})")
            self._emit_write_long(size, indent, zigzag=f"{size} << 1")
            emit(indent, f"out += {local}")
        elif kind == "enum":
            # by the member's name (an enum member's own hash is a Python-level call)
            index = self.src.const(
                {hint[s]._name_: _write_long(i) for i, s in enumerate(schema["symbols"])}, "index_"
            )
            emit(indent, f"out += {index}[{value}._name_]")
        elif kind in ("array", "map"):
            is_map = kind == "map"
            item_hint = typing.get_args(hint)[-1]
            local, item = self.src.name("c"), self.src.name("item")
            emit(indent, f"{local} = {value}")
            emit(indent, f"if {local}:")
            count = self.src.name("n")
            emit(indent + 1, f"{count} = len({local})")
            self._emit_write_long(count, indent + 1, zigzag=f"{count} << 1")
            if is_map:
                key = self.src.name("key")
                emit(indent + 1, f"for {key}, {item} in {local}.items():")
                self._write("string", str, key, indent + 2, namespace)
            else:
                emit(indent + 1, f"for {item} in {local}:")
            self._write(
                schema["values" if is_map else "items"], item_hint, item, indent + 2, namespace
            )
            emit(indent, "out.append(0)")
        elif kind in ("record", "named"):
            record = self._nested(schema, hint, namespace, kind)
            if record.full in self._open:  # inside itself: a recursive record
                emit(indent, f"{record.writer}({value}, out)")
            else:
                local = self.src.name("r")
                emit(indent, f"{local} = {value}")
                self._write_fields(record, local, indent)
        else:
            raise ValueError(f"Avro type {schema!r} is not supported by the compiled codec")

    def build(self) -> dict[str, Any]:
        namespace = dict(self.src.env)
        exec(
            compile("\n".join(self.src.functions), "<sparkpoint avro codec>", "exec"), namespace
        )  # our own generated source
        return namespace


@dataclass(frozen=True)
class _Record:
    """A record type met in a schema: its definition, its event class, and the names the
    generated code knows them by."""

    full: str
    schema: dict[str, Any]
    cls: type
    namespace: str
    hints: dict[str, Any]
    """The class's field types, resolved once."""
    twin: str
    """The plain slotted class instances are built as (see ``_read_fields``)."""
    cls_name: str
    reader: str
    writer: str


def _twin(cls: type) -> type:
    """A plain class with ``cls``'s slots and nothing else: its instances' fields can be set
    without the frozen dataclass's ``__setattr__``, and their class switched to ``cls`` after
    (CPython allows that between classes of the same slots and base)."""
    slots = cls.__dict__.get("__slots__")
    if slots is None or cls.__bases__ != (object,):
        raise TypeError(f"{cls.__name__} is not a slotted dataclass without a base class")
    return type(f"{cls.__name__}Twin", (), {"__slots__": tuple(slots)})


def _kind(schema: Any, namespace: str, records: dict[str, _Record]) -> str:
    """What a schema node is: a primitive's name, ``record``, ``enum``, ``array``, ``map``,
    ``union`` (a list), or ``named`` (a reference to a record defined before)."""
    if isinstance(schema, list):
        return "union"
    if isinstance(schema, dict):
        return str(schema.get("type"))
    if schema not in PRIMITIVES and _full_name(schema, namespace) in records:
        return "named"
    return str(schema)


PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})


def _full_name(name: str, namespace: str) -> str:
    return name if "." in name or not namespace else f"{namespace}.{name}"


def optional_inner(hint: Any) -> Any:
    """``X`` for a type hint ``X | None``; any other hint as it is."""
    if typing.get_origin(hint) in (types.UnionType, typing.Union):
        (inner,) = [a for a in typing.get_args(hint) if a is not type(None)]
        return inner
    return hint


def compile_codec(schema: dict[str, Any], cls: type) -> tuple[Reader, Writer]:
    """(read, write) for one event class and its current schema (without logical types):
    ``read(body, 0)`` -> (event, offset after it), ``write(event, out)`` appends the body.
    A body is whole only when that offset is its length: a truncated one may read to an offset
    past it."""
    if not is_dataclass(cls):
        raise TypeError(f"{cls.__name__} is not a dataclass")
    compiler = _Compiler()
    found = compiler.record(schema, cls, schema.get("namespace", ""))
    built = compiler.build()
    return built[found.reader], built[found.writer]
