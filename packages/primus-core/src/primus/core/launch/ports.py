"""Ports for a run's rendezvous on one node: picked free, and held until the workers bind."""

from __future__ import annotations

import contextlib
import random
import socket
from pathlib import Path


def free_port() -> int:
    """A port free now, drawn below the kernel's ephemeral range: the ports that outgoing
    connections (gloo's between ranks, say) and binds to port 0 get are drawn from that
    range, so one of them cannot take this port before the run binds it. Drawn with the
    system's randomness, not `random`'s, which a seeded run would make the same each time."""
    low = _ephemeral_low()
    draw = random.SystemRandom()
    for _ in range(64):
        port = draw.randrange(max(1024, low - 12288), max(1025, low))
        with socket.socket() as sock, contextlib.suppress(OSError):
            sock.bind(("127.0.0.1", port))
            return port
    with socket.socket() as sock:  # below the range, no port free: any free one
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _ephemeral_low() -> int:
    """The first port of Linux's ephemeral range (32768 where it cannot be read)."""
    with contextlib.suppress(OSError, ValueError):
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    return 32768


def reserve_port() -> socket.socket:
    """A socket bound to a free port with SO_REUSEPORT, for the launcher to hold while its
    workers run: a process that does not share ports cannot take it (EADDRINUSE), while the
    workers' own server binds it beside this socket (JAX's gRPC coordinator sets
    SO_REUSEPORT). Nothing listens on it, so every connection reaches the workers' server."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(("127.0.0.1", 0))
    return sock
