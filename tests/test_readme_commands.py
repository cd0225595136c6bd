"""Every command the README shows for the local cluster, run exactly as written (issue 16).

Each shell block of README.md carries a marker on the line before its fence:
``<!-- readme-test: local-cluster -->`` (run here) or ``<!-- readme-test: exempt: WHY -->``
(needs a cloud account or real hosts; the README says so in words too). A block without a
marker fails the first test, so a new block cannot slip past.

The local-cluster blocks run in one bash session on one cluster, as root, with the venv's
``bin`` on PATH (what ``source .venv/bin/activate`` gives): the local block up to its last line
(``slurm-spot local down``), then the "Using it" block (which needs a running cluster), then
that last line. Copy-pasting writes ``/etc/slurm`` and ``/var/lib/slurm-spot`` (the defaults),
so the session runs in a private mount namespace where scratch directories are bind-mounted
over those paths: the machine's own stay as they were. ``train.py`` and ``job.sh``, which the
README takes as the reader's, are small files of this test in the working directory.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cluster import acquire_cluster_lock

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
BLOCK = re.compile(r"^(?:<!-- readme-test: (?P<mark>[^>]*?) -->\n)?```(?P<lang>bash|sh|console)\n"
                   r"(?P<body>.*?)^```", re.S | re.M)
MOUNTS = ("/etc/slurm", "/var/lib/slurm-spot", "/var/log/slurm-spot")
TRAIN_PY = """import os, socket
print("train.py on", socket.gethostname(), "rank", os.environ.get("RANK"), flush=True)
"""
JOB_SH = """#!/bin/bash
hostname
"""


def shell_blocks(text: str) -> list[tuple[str, str]]:
    """(marker, body) of every bash/sh/console block; marker '' when the line before has none."""
    return [(m.group("mark") or "", m.group("body")) for m in BLOCK.finditer(text)]


def commands(body: str) -> list[str]:
    """The command lines of a block: comment-only lines dropped, ``\\`` continuations joined."""
    out: list[str] = []
    pending = ""
    for line in body.splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1]
            continue
        out.append(pending + line)
        pending = ""
    return out


def test_every_shell_block_is_run_or_says_why_not() -> None:
    blocks = shell_blocks(README.read_text())
    assert len(blocks) >= 5
    for mark, body in blocks:
        assert mark == "local-cluster" or mark.startswith("exempt: "), (
            f"README block without a readme-test marker:\n{body}")
    assert sum(mark == "local-cluster" for mark, _ in blocks) == 2


def test_make_demo_is_the_demo_command() -> None:
    """The top block: `make test` is what CI runs; `make demo` runs `slurm-spot demo` (after the
    set-up), which tests/test_jobs_e2e.py runs end to end."""
    (top_mark, top), *_ = shell_blocks(README.read_text())
    assert top_mark.startswith("exempt: ") and commands(top)[0].startswith("make demo")
    proc = subprocess.run(["make", "-n", "-s", "demo"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, check=True)
    assert proc.stdout.strip().splitlines()[-1] == ".venv/bin/slurm-spot demo"


def session_script(local: list[str], using: list[str], workdir: Path) -> str:
    """One bash script: every command as written, each followed by a line with its exit code;
    `slurm-spot local down` again on exit whatever happened (it stops only what it started)."""
    assert local[0].startswith("slurm-spot local up") and local[-1].startswith("slurm-spot local down")
    ordered = [*local[:-1], *using, local[-1]]
    lines = ["exec 2>&1", "set +e", "trap 'slurm-spot local down >/dev/null 2>&1' EXIT", f"cd {workdir}"]
    for i, command in enumerate(ordered):
        lines += [f"echo '=== {i} start'", command, f"echo \"=== {i} rc=$?\""]
    return "\n".join(lines) + "\n"


@pytest.mark.e2e
@pytest.mark.timeout(1500)
def test_local_cluster_commands_work_as_written(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.fail("the README's local cluster runs as root (make test runs as root)")
    if shutil.which("unshare") is None:
        pytest.fail("unshare (util-linux) is needed to keep /etc/slurm untouched")
    blocks = [commands(body) for mark, body in shell_blocks(README.read_text())
              if mark == "local-cluster"]
    using = next(b for b in blocks if not b[0].startswith("slurm-spot local up"))
    local = next(b for b in blocks if b[0].startswith("slurm-spot local up"))
    work = tmp_path / "work"
    work.mkdir()
    (work / "train.py").write_text(TRAIN_PY)
    (work / "job.sh").write_text(JOB_SH)
    scratch = {}
    for path in MOUNTS:
        scratch[path] = tmp_path / "root" / path.strip("/")
        scratch[path].mkdir(parents=True)
    # a fresh Debian host's /etc/slurm (slurm-wlm ships plugstack.conf)
    if Path("/etc/slurm/plugstack.conf").exists():
        shutil.copy2("/etc/slurm/plugstack.conf", scratch["/etc/slurm"] / "plugstack.conf")
    etc = Path("/etc/slurm")
    etc_before = sorted(p.name for p in etc.iterdir()) if etc.exists() else []
    created = [p for p in MOUNTS if not Path(p).exists()]
    for path in created:  # a mount point must exist; removed again below (it stays empty)
        Path(path).mkdir(parents=True)
    script = tmp_path / "session.sh"
    script.write_text(session_script(local, using, work))
    mounts = " && ".join(f"mount --bind {scratch[p]} {p}" for p in MOUNTS)
    bindir = Path(sys.executable).parent
    env = {"PATH": f"{bindir}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
           "VIRTUAL_ENV": str(bindir.parent), "HOME": str(tmp_path), "LANG": "C.UTF-8",
           "TERM": "dumb"}
    try:
        with acquire_cluster_lock():
            proc = subprocess.run(
                ["unshare", "--mount", "--propagation", "private", "--", "bash", "-c",
                 f"{mounts} && exec bash {script}"],
                env=env, capture_output=True, text=True, timeout=1400, check=False)
    finally:
        for path in created:
            Path(path).rmdir()
    output = proc.stdout + proc.stderr
    printed: dict[str, str] = {}
    for i, command in enumerate([*local[:-1], *using, local[-1]]):
        part = output.split(f"=== {i} start\n", 1)[-1].split(f"=== {i} rc=", 1)
        assert len(part) == 2, f"{command!r} did not finish:\n{output[-6000:]}"
        rc = part[1].split("\n", 1)[0]
        assert rc == "0", f"README command failed (exit {rc}): {command}\n{part[0][-4000:]}"
        printed[command.split("#")[0].strip()] = part[0]
    # what the comments promise
    assert sorted((work / "hostnames.out").read_text().split()) == ["spot-1", "spot-2"]
    assert all(f"spot-{n}" in printed["slurm-spot status"] for n in range(1, 5))
    assert "notice" in printed["slurm-spot events --since 1h"]
    assert (scratch["/etc/slurm"] / "slurm-spot.conf").exists()  # render --output-dir /etc/slurm
    # and the machine's own /etc/slurm was not touched
    assert (sorted(p.name for p in etc.iterdir()) if etc.exists() else []) == etc_before
