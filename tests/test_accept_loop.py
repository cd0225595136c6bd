"""The services' accept loop (slurm_spot/jobs/services/accept_loop.py) when the process has no
file descriptor left: it waits for one instead of spinning a core, and serves again once a
connection ends. Run in a child process whose RLIMIT_NOFILE is lowered (not this one's)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import resource, socket, threading, time
from slurm_spot.jobs.services.accept_loop import AcceptLoop

class Counting(socket.socket):
    accepts = 0
    def accept(self):
        Counting.accepts += 1
        return super().accept()

class Holding(AcceptLoop):
    def __init__(self, sock):
        super().__init__(sock)
        self.release = threading.Event()
        self.served = 0
    def serve_connection(self, conn, peer):
        with conn:
            self.served += 1
            conn.sendall(b"hi")
            self.release.wait()

sock = Counting(socket.AF_INET, socket.SOCK_STREAM)
sock.bind(("127.0.0.1", 0)); sock.listen(64)
port = sock.getsockname()[1]
loop = Holding(sock)
threading.Thread(target=loop.serve_forever, daemon=True).start()
clients = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(5)]
for _ in range(500):  # served before the descriptors run out
    if loop.served == 5:
        break
    time.sleep(0.01)
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
try:
    while True:  # each held connection costs 2 descriptors here (client and server end)
        clients.append(socket.create_connection(("127.0.0.1", port), timeout=5))
except OSError:
    pass
time.sleep(0.5)
before = Counting.accepts
time.sleep(1.0)
spun = Counting.accepts - before
for c in clients[:10]:
    c.close()
served = loop.served
loop.release.set()
time.sleep(0.5)
with socket.create_connection(("127.0.0.1", port), timeout=5) as late:
    late.settimeout(5)
    got = late.recv(2)
print(spun, served, got.decode())
"""


def test_out_of_descriptors_the_loop_waits_and_serves_again() -> None:
    proc = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                          timeout=60, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    spun, served, got = proc.stdout.split()
    assert int(served) >= 5  # it served until the descriptors ran out
    assert int(spun) <= 20, f"{spun} accept calls in 1 s: the loop spins on EMFILE"
    assert got == "hi"  # and serves again once connections end
