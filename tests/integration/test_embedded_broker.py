"""The embedded broker's Python API: start on a free port, answer, stop."""

from __future__ import annotations

import socket

import pytest

from sparkpoint.common.broker import BrokerError, EmbeddedBroker
from sparkpoint.common.kafka import make_admin


def port_open(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def test_starts_on_a_free_port_answers_and_stops() -> None:
    with EmbeddedBroker() as broker:
        assert broker.port is not None
        assert broker.running
        assert make_admin(broker.bootstrap).list_topics(timeout=5).brokers
        port = broker.port
    assert not broker.running
    assert not port_open(port)


def test_two_brokers_run_side_by_side() -> None:
    with EmbeddedBroker() as first, EmbeddedBroker() as second:
        assert first.port != second.port
        assert make_admin(second.bootstrap).list_topics(timeout=5).brokers


def test_a_taken_port_is_a_clear_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(BrokerError, match=str(port)):
            EmbeddedBroker(port=port).start()
