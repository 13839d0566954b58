"""The embedded broker's TLS/SASL front (services/sparkpoint/common/broker_front.py), its pure
parts: the Kafka wire format of the SASL requests and answers it handles itself, and the PLAIN
and SCRAM exchanges (a SCRAM client from scramp plays the client)."""

from __future__ import annotations

import struct

import pytest
from scramp import ScramClient

from sparkpoint.common.broker_front import (
    SASL_AUTHENTICATE,
    SASL_AUTHENTICATION_FAILED,
    SASL_HANDSHAKE,
    Exchange,
    ProtocolViolation,
    Refused,
    Request,
    authenticate_response,
    handshake_response,
    scram_credentials,
)

USERS = {"alice": "correct-horse", "bob": "battery-staple"}
SCRAM = scram_credentials(USERS)


def header(api_key: int, version: int, correlation: int, client: bytes = b"rdkafka") -> bytes:
    return struct.pack(">hhih", api_key, version, correlation, len(client)) + client


def test_a_handshake_request_names_its_mechanism_and_is_answered_with_every_mechanism() -> None:
    request = Request.parse(header(SASL_HANDSHAKE, 1, 7) + struct.pack(">h", 13) + b"SCRAM-SHA-512")
    assert (request.api_key, request.api_version, request.correlation_id) == (17, 1, 7)
    assert request.string() == "SCRAM-SHA-512"

    answer = handshake_response(7, 0)
    size, correlation, error, count = struct.unpack_from(">iihi", answer)
    assert (size, correlation, error, count) == (len(answer) - 4, 7, 0, 3)
    assert b"PLAIN" in answer and b"SCRAM-SHA-256" in answer


def test_a_flexible_authenticate_request_skips_its_tagged_fields() -> None:
    tags = b"\x01" + b"\x05" + b"\x02" + b"xy"  # one tagged field (tag 5, two bytes)
    body = bytes([len(b"token") + 1]) + b"token" + b"\x00"
    request = Request.parse(header(SASL_AUTHENTICATE, 2, 9) + tags + body)
    assert request.auth_bytes() == b"token"
    legacy = Request.parse(header(SASL_AUTHENTICATE, 1, 9) + struct.pack(">i", 5) + b"token")
    assert legacy.auth_bytes() == b"token"


def test_a_request_shorter_than_its_header_is_a_protocol_violation() -> None:
    with pytest.raises(ProtocolViolation):
        Request.parse(b"\x00\x11\x00")


def decode_answer(answer: bytes, version: int) -> tuple[int, int, str | None, bytes]:
    """(correlation id, error code, error message, auth bytes) of an authenticate answer."""
    at = 4
    (correlation,) = struct.unpack_from(">i", answer, at)
    at += 4
    if version >= 2:
        assert answer[at] == 0  # no tagged fields in the header
        at += 1
    (error,) = struct.unpack_from(">h", answer, at)
    at += 2
    message: str | None
    if version >= 2:
        size = answer[at] - 1
        at += 1
        message = None if size < 0 else answer[at : at + size].decode()
        at += max(size, 0)
        length = answer[at] - 1
        at += 1
    else:
        (size,) = struct.unpack_from(">h", answer, at)
        at += 2
        message = None if size < 0 else answer[at : at + size].decode()
        at += max(size, 0)
        (length,) = struct.unpack_from(">i", answer, at)
        at += 4
    data = answer[at : at + length]
    at += length
    if version >= 1:
        (lifetime,) = struct.unpack_from(">q", answer, at)
        assert lifetime == 0
        at += 8
    assert at + (1 if version >= 2 else 0) == len(answer)
    return correlation, error, message, data


@pytest.mark.parametrize("version", [0, 1, 2])
def test_authenticate_answers_in_each_version(version: int) -> None:
    request = Request(SASL_AUTHENTICATE, version, 11, b"", 0)
    ok = authenticate_response(request, 0, None, b"server-first")
    assert decode_answer(ok, version) == (11, 0, None, b"server-first")
    refused = authenticate_response(request, SASL_AUTHENTICATION_FAILED, "no", b"")
    assert decode_answer(refused, version) == (11, 58, "no", b"")


def test_plain_takes_the_right_password_only() -> None:
    assert Exchange("PLAIN", USERS, SCRAM).step(b"\x00alice\x00correct-horse") == (b"", True)
    for message in (
        b"\x00alice\x00battery-staple",
        b"\x00carol\x00x",
        b"bob\x00alice\x00correct-horse",
        b"alice",
    ):
        with pytest.raises(Refused, match="invalid credentials with SASL mechanism PLAIN"):
            Exchange("PLAIN", USERS, SCRAM).step(message)


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_scram_authenticates_a_client_that_knows_the_password(mechanism: str) -> None:
    client = ScramClient([mechanism], "bob", "battery-staple")
    exchange = Exchange(mechanism, USERS, SCRAM)
    server_first, done = exchange.step(client.get_client_first().encode())
    assert not done and exchange.principal == "bob"
    client.set_server_first(server_first.decode())
    server_final, done = exchange.step(client.get_client_final().encode())
    assert done
    client.set_server_final(server_final.decode())  # the client verifies the server too


def test_scram_refuses_a_wrong_password_and_an_unknown_user() -> None:
    client = ScramClient(["SCRAM-SHA-512"], "alice", "not-her-password")
    exchange = Exchange("SCRAM-SHA-512", USERS, SCRAM)
    server_first, _ = exchange.step(client.get_client_first().encode())
    client.set_server_first(server_first.decode())
    with pytest.raises(Refused, match="SCRAM-SHA-512"):
        exchange.step(client.get_client_final().encode())
    stranger = ScramClient(["SCRAM-SHA-512"], "mallory", "x")
    with pytest.raises(Refused):
        Exchange("SCRAM-SHA-512", USERS, SCRAM).step(stranger.get_client_first().encode())
