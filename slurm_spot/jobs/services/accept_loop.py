"""The accept loop of slurm-spot's TCP services: the rendezvous store
(:mod:`.rendezvous_store`), the torchft lighthouse's front door (:mod:`.ft_front_door`) and
the replicas' relay to it (:mod:`slurm_spot.jobs.injob.lighthouse_relay`)."""

from __future__ import annotations

import socket
import threading

#: How long the loop waits after a failed ``accept`` (no file descriptor left) before trying
#: again (seconds).
ACCEPT_RETRY_S = 0.1


class AcceptLoop:
    """Accepts connections on ``sock`` until :meth:`close`, each served in a daemon thread of
    its own by :meth:`serve_connection` (which subclasses define).

    Args:
        sock: a bound, listening TCP socket.
        max_connections: at most this many connections served at once; one beyond is closed
            at once, refused rather than queued (:meth:`refuse_busy` is told). None: no bound.
    """

    def __init__(self, sock: socket.socket, max_connections: int | None = None) -> None:
        self.sock = sock
        self._slots = (threading.BoundedSemaphore(max_connections)
                       if max_connections is not None else None)
        self._closed = threading.Event()

    def serve_connection(self, conn: socket.socket, peer: object) -> None:
        """Serve one accepted connection (in its own thread); ``peer`` is its address."""
        raise NotImplementedError

    def refuse_busy(self, peer: object) -> None:
        """Told of a connection from ``peer`` closed because ``max_connections`` are open."""

    def serve_forever(self) -> None:
        """Accept connections until :meth:`close`, each served in a thread of its own."""
        while not self._closed.is_set():
            try:
                conn, peer = self.sock.accept()
            except OSError:
                if self._closed.is_set():
                    return
                # Out of file descriptors (EMFILE/ENFILE: the connection stays queued, so
                # accept fails again at once) or memory: wait a little rather than spin a
                # core until a connection ends.
                self._closed.wait(ACCEPT_RETRY_S)
                continue
            if self._slots is not None and not self._slots.acquire(blocking=False):
                self.refuse_busy(peer)
                conn.close()
                continue
            threading.Thread(target=self._serve, args=(conn, peer), daemon=True).start()

    def close(self) -> None:
        """Stop accepting (connections being served go on until they end)."""
        self._closed.set()
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()

    def _serve(self, conn: socket.socket, peer: object) -> None:
        try:
            self.serve_connection(conn, peer)
        finally:
            if self._slots is not None:
                self._slots.release()
