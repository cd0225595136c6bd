"""Clients that misbehave slowly, for the services' tests (the rendezvous store, the
lighthouse's front door)."""

from __future__ import annotations

import socket
import struct
import time

from slurm_spot.jobs.rendezvous_wire import recv_frame


def drip_until_closed(port: int, every_s: float = 0.2, drips: int = 25) -> int:
    """Read the server's hello, then send a frame that promises 200 bytes one byte every
    ``every_s`` seconds; returns how many bytes went before the server closed the connection
    (``drips`` if it never did)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        recv_frame(sock)
        sock.sendall(struct.pack(">I", 200))
        sock.setblocking(False)
        for sent in range(drips):
            try:
                if sock.recv(1) == b"":
                    return sent
            except BlockingIOError:
                pass
            except OSError:
                return sent
            try:
                sock.sendall(b" ")
            except OSError:
                return sent
            time.sleep(every_s)
    return drips

