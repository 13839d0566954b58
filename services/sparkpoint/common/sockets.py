"""Reading a stream socket by exact sizes (the agent's local sockets: the sink's fork server,
resident tasks)."""

from __future__ import annotations

import socket


def receive_exactly(sock: socket.socket, size: int) -> bytes:
    """``size`` bytes from ``sock``; fewer only when the other end closed first (what came)."""
    data = bytearray()
    while len(data) < size:
        chunk = sock.recv(min(size - len(data), 1 << 20))
        if not chunk:
            break
        data += chunk
    return bytes(data)
