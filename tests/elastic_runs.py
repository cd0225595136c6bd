"""What the elastic end-to-end tests share: the example they submit, reading its JSON event
log and sample log, and a ``slurm-spot rendezvous`` service on this machine."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
from collections import defaultdict
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

#: The elastic training example every elastic e2e test submits.
EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "train_elastic.py"


def training_events(path: Path) -> list[dict]:
    """The example's JSON events in its job log (``[]`` while the log does not exist)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]


def last_step(log: Path) -> int:
    """The highest step the example logged so far (0: none)."""
    return max([e["step"] for e in training_events(log) if e["event"] == "step"], default=0)


def fake_squeue(folder: Path, owner_uid: int) -> Path:
    """A ``squeue`` in ``folder`` that says every job is ``owner_uid``'s (``-o %U``), for a
    rendezvous service with no Slurm cluster behind it; returns ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "squeue"
    script.write_text(f"#!/bin/sh\necho {owner_uid}\n")
    script.chmod(0o755)
    return folder


@contextmanager
def rendezvous_service(env: Mapping[str, str], fake_owner: bool = False) -> Iterator[str]:
    """``slurm-spot rendezvous`` on a free port of 127.0.0.1 (the local controller), started
    with ``env``; yields its ``HOST:PORT`` once it listens, and stops it afterwards. With
    ``fake_owner`` (no Slurm cluster), every job is this process's user's."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        bin_dir = ["--slurm-bin-dir", str(fake_squeue(Path(tmp), os.getuid()))] \
            if fake_owner else []
        proc = subprocess.Popen([sys.executable, "-m", "slurm_spot", "rendezvous", "--listen",
                                 "127.0.0.1", "--port", str(port), *bin_dir],
                                stderr=subprocess.PIPE, text=True, env=dict(env))
        try:
            assert proc.stderr is not None
            assert "listening" in proc.stderr.readline()
            yield f"127.0.0.1:{port}"
        finally:
            proc.terminate()
            proc.wait(30)


def check_sample_log(samples: Path, steps: int) -> dict[int, list[int]]:
    """Read the example's ``--sample-log`` and check what holds across any change of world
    size: within an epoch no sample is used twice, every step 1..``steps`` ran exactly once
    (with one world size). Returns the samples used per epoch (for the caller's own checks of
    whole epochs)."""
    per_epoch: dict[int, list[int]] = defaultdict(list)
    steps_seen: dict[int, set[int]] = defaultdict(set)
    for line in samples.read_text().splitlines():
        row = json.loads(line)
        per_epoch[row["epoch"]].extend(row["samples"])
        steps_seen[row["step"]].add(row["world"])
    for epoch, used in per_epoch.items():
        assert len(used) == len(set(used)), f"epoch {epoch}: a sample used twice"
    assert all(len(w) == 1 for w in steps_seen.values())  # no step run twice
    assert sorted(steps_seen) == list(range(1, steps + 1))
    return per_epoch


def job_processes(job: int) -> list[int]:
    """Process ids on this machine (where the local cluster's nodes run) whose environment says
    they belong to Slurm job ``job`` (``SLURM_JOB_ID``): agents, fork servers, workers. Only
    processes in this process's network namespace count: under pytest-xdist every worker runs
    its own cluster in a namespace of its own (tests/netns.py), and each numbers its jobs from
    1, so another worker's job 1 was taken for this one's (CI-like run, session 9)."""
    mark = f"SLURM_JOB_ID={job}".encode()
    own_network = os.readlink("/proc/self/ns/net")
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            network = os.readlink(entry / "ns" / "net")
        except OSError:
            continue
        if mark in environ.split(b"\0") and state != "Z" and network == own_network:
            found.append(int(entry.name))
    return found
