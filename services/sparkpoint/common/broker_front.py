"""A TLS and SASL front for the embedded broker, so secured Kafka can be tried on one machine.

tansu 0.6.0 (the embedded broker) takes ``--cert`` and ``--key`` but serves plain TCP whatever
they say (it builds a TLS acceptor and never uses it, and its argument parser refuses the two
options together); with ``--authentication`` it accepts any password for PLAIN and, its storage
being memory, no SCRAM user can be created (before authentication it answers only ApiVersions
and the SASL requests). This front stands in the broker's place on the advertised address and
does what a secured Apache Kafka listener does, then relays bytes to tansu unchanged:

- ``SSL``: TLS with the broker's certificate; with a client CA, a client certificate is
  required and verified (mutual TLS, Kafka's ``ssl.client.auth=required``);
- ``SASL_SSL`` and ``SASL_PLAINTEXT``: after TLS (or without), the client must authenticate
  with PLAIN or SCRAM-SHA-256/512 against the users file before anything but ApiVersions is
  relayed. SaslHandshake v1 and SaslAuthenticate v0-v2 are answered here, as Kafka answers
  them: an unknown mechanism gets UNSUPPORTED_SASL_MECHANISM, refused credentials
  SASL_AUTHENTICATION_FAILED with Kafka's message, and the connection is closed.

Apache Kafka (docker-compose.secure.yml) is the reference; this front is for tests, the demo and
development. Run as ``python -m sparkpoint.common.broker_front SETTINGS.json``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import ssl
import struct
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from scramp import ScramException, ScramMechanism

log = logging.getLogger(__name__)

API_VERSIONS = 18
SASL_HANDSHAKE = 17
SASL_AUTHENTICATE = 36

NONE = 0
UNSUPPORTED_SASL_MECHANISM = 33
ILLEGAL_SASL_STATE = 34
UNSUPPORTED_VERSION = 35
SASL_AUTHENTICATION_FAILED = 58

MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")

MAX_AUTH_FRAME = 524_288
"""Kafka's ``sasl.server.max.receive.size``: a larger frame before authentication is hostile and
ends the connection."""

SCRAM_ITERATIONS = 4096
"""Kafka's minimum for SCRAM credentials."""

RELAY_CHUNK = 262_144

TLS_HANDSHAKE_S = 10.0
"""A client that opens a connection and never completes its TLS handshake is dropped then."""

AUTHENTICATION_S = 30.0
"""A connection that has not authenticated this long after it opened is closed (Kafka's
``connections.max.reauth.ms`` aside, a broker closes idle unauthenticated connections too)."""


@dataclass(frozen=True)
class FrontSettings:
    listen_host: str
    listen_port: int
    upstream_host: str
    upstream_port: int
    certfile: str | None = None
    keyfile: str | None = None
    client_ca: str | None = None
    users: dict[str, str] = field(default_factory=dict)
    """SASL users and their passwords; none: no SASL."""

    @property
    def protocol(self) -> str:
        if self.users:
            return "SASL_SSL" if self.certfile else "SASL_PLAINTEXT"
        return "SSL" if self.certfile else "PLAINTEXT"

    def save(self, path: Path) -> None:
        path.touch(mode=0o600)
        path.write_text(json.dumps(asdict(self)))

    @classmethod
    def load(cls, path: Path) -> FrontSettings:
        return cls(**json.loads(path.read_text()))


def server_context(settings: FrontSettings) -> ssl.SSLContext | None:
    if settings.certfile is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(settings.certfile, settings.keyfile)
    if settings.client_ca is not None:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(settings.client_ca)
    return context


# --- the wire --------------------------------------------------------------------------------


async def read_frame(reader: asyncio.StreamReader, limit: int | None = None) -> bytes:
    (size,) = struct.unpack(">i", await reader.readexactly(4))
    if size < 0 or (limit is not None and size > limit):
        raise ProtocolViolation(f"a frame of {size} bytes before authentication")
    return await reader.readexactly(size)


def framed(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


class ProtocolViolation(Exception):
    """The client sent what a Kafka listener would close the connection for."""


@dataclass(frozen=True)
class Request:
    api_key: int
    api_version: int
    correlation_id: int
    payload: bytes
    body: int
    """Where the request's body starts in ``payload``."""

    @classmethod
    def parse(cls, payload: bytes) -> Request:
        if len(payload) < 10:
            raise ProtocolViolation("a request shorter than its header")
        api_key, api_version, correlation_id, client_id = struct.unpack_from(">hhih", payload)
        body = 10 + max(client_id, 0)
        if api_key == SASL_AUTHENTICATE and api_version >= 2:  # flexible: tagged fields
            body = _skip_tags(payload, body)
        return cls(api_key, api_version, correlation_id, payload, body)

    def string(self) -> str:
        (size,) = struct.unpack_from(">h", self.payload, self.body)
        return self.payload[self.body + 2 : self.body + 2 + size].decode()

    def auth_bytes(self) -> bytes:
        if self.api_version >= 2:
            size, at = _uvarint(self.payload, self.body)
            return self.payload[at : at + size - 1]
        (size,) = struct.unpack_from(">i", self.payload, self.body)
        return self.payload[self.body + 4 : self.body + 4 + size]


def _uvarint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(data):
            raise ProtocolViolation("a truncated varint")
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, at
        shift += 7


def _skip_tags(data: bytes, at: int) -> int:
    count, at = _uvarint(data, at)
    for _ in range(count):
        _, at = _uvarint(data, at)
        size, at = _uvarint(data, at)
        at += size
    return at


def _to_uvarint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def handshake_response(correlation_id: int, error: int) -> bytes:
    mechanisms = b"".join(struct.pack(">h", len(m)) + m.encode() for m in MECHANISMS)
    return framed(struct.pack(">ihi", correlation_id, error, len(MECHANISMS)) + mechanisms)


def authenticate_response(
    request: Request, error: int, message: str | None, auth_bytes: bytes
) -> bytes:
    text = None if message is None else message.encode()
    if request.api_version >= 2:
        header = struct.pack(">i", request.correlation_id) + b"\x00"
        body = (
            struct.pack(">h", error)
            + (b"\x00" if text is None else _to_uvarint(len(text) + 1) + text)
            + _to_uvarint(len(auth_bytes) + 1)
            + auth_bytes
            + struct.pack(">q", 0)
            + b"\x00"
        )
        return framed(header + body)
    body = (
        struct.pack(">h", error)
        + (struct.pack(">h", -1) if text is None else struct.pack(">h", len(text)) + text)
        + struct.pack(">i", len(auth_bytes))
        + auth_bytes
        + (struct.pack(">q", 0) if request.api_version >= 1 else b"")
    )
    return framed(struct.pack(">i", request.correlation_id) + body)


# --- SASL ------------------------------------------------------------------------------------


class Refused(Exception):
    """The credentials were wrong; the message is Kafka's."""


class Exchange:
    """One client's SASL exchange with the chosen mechanism; `step` answers each message."""

    def __init__(self, mechanism: str, users: dict[str, str], scram: dict[str, object]) -> None:
        self.mechanism = mechanism
        self.users = users
        self.scram = scram
        self.round = 0
        self.principal: str | None = None
        self.server = (
            ScramMechanism(mechanism).make_server(self._stored)
            if mechanism.startswith("SCRAM-")
            else None
        )

    def _stored(self, user: str) -> object:
        self.principal = user
        info = self.scram.get(f"{self.mechanism}/{user}")
        if info is None:
            raise KeyError(user)
        return info

    def step(self, message: bytes) -> tuple[bytes, bool]:
        """The answer, and whether the client is now authenticated."""
        self.round += 1
        if self.server is None:
            return self._plain(message), True
        try:
            if self.round == 1:
                self.server.set_client_first(message.decode())
                return self.server.get_server_first().encode(), False
            self.server.set_client_final(message.decode())
            return self.server.get_server_final().encode(), True
        except (ScramException, UnicodeDecodeError, KeyError) as exc:
            raise Refused(self._refusal()) from exc

    def _plain(self, message: bytes) -> bytes:
        parts = message.split(b"\x00")
        if len(parts) != 3:
            raise Refused(self._refusal())
        authorization, user, password = (p.decode(errors="replace") for p in parts)
        known = self.users.get(user)
        if known is None or not hmac.compare_digest(known.encode(), password.encode()):
            raise Refused(self._refusal())
        if authorization not in ("", user):
            raise Refused(self._refusal())
        self.principal = user
        return b""

    def _refusal(self) -> str:
        return (
            "Authentication failed during authentication due to invalid credentials with SASL "
            f"mechanism {self.mechanism}"
        )


def scram_credentials(users: dict[str, str]) -> dict[str, object]:
    """Each user's stored SCRAM credential for each SCRAM mechanism (what Kafka keeps)."""
    return {
        f"{mechanism}/{user}": ScramMechanism(mechanism).make_auth_info(
            password, iteration_count=SCRAM_ITERATIONS
        )
        for mechanism in MECHANISMS
        if mechanism.startswith("SCRAM-")
        for user, password in users.items()
    }


# --- the front -------------------------------------------------------------------------------


class Front:
    """Accepts clients on the listener, authenticates them, relays them to tansu."""

    def __init__(self, settings: FrontSettings) -> None:
        self.settings = settings
        self.context = server_context(settings)
        self.scram = scram_credentials(settings.users)
        self.server: asyncio.Server | None = None

    async def start(self) -> None:
        where = (self.settings.listen_host, self.settings.listen_port)
        if self.context is None:
            self.server = await asyncio.start_server(self.serve, *where)
        else:
            self.server = await asyncio.start_server(
                self.serve, *where, ssl=self.context, ssl_handshake_timeout=TLS_HANDSHAKE_S
            )

    async def serve_forever(self) -> None:
        await self.start()
        assert self.server is not None
        log.info(
            "%s listener on %s:%d in front of %s:%d", self.settings.protocol,
            self.settings.listen_host, self.settings.listen_port,
            self.settings.upstream_host, self.settings.upstream_port,
        )  # fmt: skip
        async with self.server:
            await self.server.serve_forever()

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(
                self.settings.upstream_host, self.settings.upstream_port
            )
        except OSError as exc:
            log.warning("%s: the broker behind the front is unreachable: %s", peer, exc)
            writer.close()
            return
        try:
            if self.settings.users and not await asyncio.wait_for(
                self.authenticate(reader, writer, upstream_reader, upstream_writer, peer),
                AUTHENTICATION_S,
            ):
                return
            await asyncio.gather(_relay(reader, upstream_writer), _relay(upstream_reader, writer))
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            pass  # the client or the broker went away
        except TimeoutError:
            log.warning("%s: closed: not authenticated within %.0f s", peer, AUTHENTICATION_S)
        except (ProtocolViolation, UnicodeDecodeError, struct.error) as exc:
            log.warning("%s: closed: %s", peer, exc)
        finally:
            for end in (writer, upstream_writer):
                end.close()

    async def authenticate(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        upstream_reader: asyncio.StreamReader,
        upstream_writer: asyncio.StreamWriter,
        peer: object,
    ) -> bool:
        exchange: Exchange | None = None
        while True:
            request = Request.parse(await read_frame(reader, MAX_AUTH_FRAME))
            if request.api_key == API_VERSIONS:
                upstream_writer.write(framed(request.payload))
                writer.write(framed(await read_frame(upstream_reader)))
            elif request.api_key == SASL_HANDSHAKE:
                mechanism = request.string()
                if request.api_version < 1:
                    writer.write(handshake_response(request.correlation_id, UNSUPPORTED_VERSION))
                    await writer.drain()
                    return False
                if mechanism not in MECHANISMS:
                    writer.write(
                        handshake_response(request.correlation_id, UNSUPPORTED_SASL_MECHANISM)
                    )
                    await writer.drain()
                    log.warning("%s: unsupported SASL mechanism %r", peer, mechanism)
                    return False
                exchange = Exchange(mechanism, self.settings.users, self.scram)
                writer.write(handshake_response(request.correlation_id, NONE))
            elif request.api_key == SASL_AUTHENTICATE and exchange is not None:
                try:
                    answer, done = exchange.step(request.auth_bytes())
                except Refused as refused:
                    writer.write(
                        authenticate_response(
                            request, SASL_AUTHENTICATION_FAILED, str(refused), b""
                        )
                    )
                    await writer.drain()
                    log.warning("%s: %s (user %r)", peer, refused, exchange.principal)
                    return False
                writer.write(authenticate_response(request, NONE, None, answer))
                if done:
                    await writer.drain()
                    return True
            else:
                raise ProtocolViolation(
                    f"request {request.api_key} v{request.api_version} before authentication"
                )
            await writer.drain()


async def _relay(source: asyncio.StreamReader, target: asyncio.StreamWriter) -> None:
    try:
        while data := await source.read(RELAY_CHUNK):
            target.write(data)
            await target.drain()
    finally:
        with contextlib.suppress(Exception):
            target.close()


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s front: %(message)s")
    settings = FrontSettings.load(Path(args[0]))
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(Front(settings).serve_forever())


if __name__ == "__main__":
    main()
