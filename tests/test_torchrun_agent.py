"""The torchrun agent wrapper ends fast but completely: atexit handlers run, output is flushed,
and the exit status is the one it chose (the batch script and RequeueExit read it)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

PROGRAM = """
import atexit, sys
from slurm_spot.jobs.injob.torchrun_agent import leave
atexit.register(lambda: print("atexit handler ran", flush=True))
print("unflushed stdout", end="")
sys.stderr.write("unflushed stderr")
leave({code})
print("never reached")
"""


@pytest.mark.parametrize("code", [0, 1, 85])
def test_leave_runs_atexit_flushes_and_keeps_the_exit_code(code: int) -> None:
    proc = subprocess.run([sys.executable, "-c", PROGRAM.format(code=code)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == code, proc.stderr
    assert proc.stdout == "unflushed stdoutatexit handler ran\n"
    assert proc.stderr == "unflushed stderr"


WORKER = """
import os, signal, sys, time
stop = []
signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
print("worker ready", os.getpid(), flush=True)
if sys.argv[1] == "requeue":  # saved its checkpoint: leaves with the requeue code
    time.sleep(0.5)
    sys.exit(85)
if sys.argv[1] in ("rejoin", "crash"):  # stops for a new rendezvous round / crashes
    time.sleep(0.5)
    sys.exit(86 if sys.argv[1] == "rejoin" else 3)
if sys.argv[1] == "os_exit_85":  # as examples/train_elastic.py leaves: no teardown
    print("left without teardown", end="")
    os._exit(85)
if sys.argv[1] == "os_exit_0":
    os._exit(0)
if sys.argv[1] == "sys_exit":  # sys.exit() without a code: success
    sys.exit()
if sys.argv[1] == "raise":
    raise RuntimeError("the worker's own error")
deadline = time.time() + 120
while not stop and time.time() < deadline:
    time.sleep(0.05)
"""

#: ``warm``: the elastic agent's warm start (slurm_spot.jobs.injob.warm_worker), ignoring in the fork
#: server the signals the agent's main() gives it (SIGHUP, SIGUSR2, SIGTERM).
AGENT = """
import signal, sys
from slurm_spot.jobs.injob.torchrun_agent import _leave_on_signal, leave, run_torchrun
if sys.argv[3] == "elastic":  # as main() does in elastic mode: the signal means "leave"
    signal.signal(signal.SIGUSR2, _leave_on_signal)
warm = [1, int(signal.SIGUSR2), 15] if sys.argv[4] == "warm" else None
leave(run_torchrun(["--nnodes=1", "--nproc-per-node=" + sys.argv[5], "--rdzv-backend=c10d",
                    "--rdzv-endpoint=127.0.0.1:0", "--max-restarts=0", sys.argv[1],
                    sys.argv[2]], 85, elastic=sys.argv[3] == "elastic", warm_signals=warm))
"""


def _agent(tmp_path: Path, mode: str, elastic: bool = False, warm: bool = False,
           nproc: int = 1, sigint_ignored: bool = False) -> subprocess.Popen[str]:
    """The agent, with SIGINT at its default action, or ignored as a job started in the
    background of a shell (``cmd &``) has it: set here, not inherited from whoever runs
    the tests."""
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo"}
    sigint = signal.SIG_IGN if sigint_ignored else signal.SIG_DFL
    return subprocess.Popen([sys.executable, "-c", AGENT, str(worker), mode,
                             "elastic" if elastic else "plain", "warm" if warm else "cold",
                             str(nproc)], env=env,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, sigint),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _wait_ready(agent: subprocess.Popen[str]) -> list[str]:
    assert agent.stdout is not None
    lines = []
    for line in agent.stdout:
        lines.append(line)
        if "worker ready" in line:
            return lines
    raise AssertionError("".join(lines))


@pytest.mark.parametrize("warm", [False, True], ids=["subprocess", "warm"])
@pytest.mark.parametrize(("mode", "code", "said"), [
    ("requeue", 85, "workers stopped for a requeue (exit 85)"),
    ("term", 143, "torchrun agent stopped by SIGTERM"),
])
def test_agent_exit_status(tmp_path: Path, mode: str, code: int, said: str,
                           warm: bool) -> None:
    """A worker that leaves with the requeue code: the agent passes the code on (for the
    batch script and RequeueExit). SIGTERM to the agent (what Slurm sends when the job
    requeued itself or is cancelled): torchrun stops the worker and the agent reports the
    signal (128 + 15). Neither prints a traceback. The same with the elastic agent's warm
    worker start."""
    agent = _agent(tmp_path, mode, elastic=warm, warm=warm)
    try:
        lines = _wait_ready(agent)
        if mode == "term":
            agent.send_signal(signal.SIGTERM)
        rest, _ = agent.communicate(timeout=120)
    finally:
        agent.kill()
    output = "".join(lines) + rest
    assert agent.returncode == code, output
    assert said in output and "Traceback" not in output, output


@pytest.mark.parametrize(("mode", "elastic", "code", "warm"), [
    ("rejoin", True, 85, False), ("crash", True, 1, False), ("rejoin", False, 1, False),
    ("rejoin", True, 85, True), ("crash", True, 1, True)])
def test_elastic_agent_with_its_restart_budget_spent(tmp_path: Path, mode: str, elastic: bool,
                                                     code: int, warm: bool) -> None:
    """An elastic agent whose workers last stopped for a new rendezvous round (exit 86) when
    torchrun's --max-restarts were spent (0 here) falls back to requeue (85): interruptions
    never end an elastic job FAILED. A crash stays a failure (1), and outside elastic mode
    86 means nothing to the agent. The same with the warm worker start."""
    agent = _agent(tmp_path, mode, elastic, warm)
    try:
        rest, _ = agent.communicate(timeout=120)
    finally:
        agent.kill()
    assert agent.returncode == code, rest
    assert ("restart budget (--max-restarts) is spent on interruptions" in rest) == (code == 85)


@pytest.mark.parametrize(("mode", "code", "said"), [
    ("os_exit_85", 85, "left without teardown"),  # examples/train_elastic.py's way out
    ("os_exit_0", 0, ""),  # no return value reaches the agent: still a success, no hang
    ("sys_exit", 0, ""),  # sys.exit(): SystemExit(None) is success, as for python SCRIPT
    ("raise", 1, "RuntimeError: the worker's own error"),  # and its traceback is shown
])
def test_warm_workers_exit_codes_are_a_new_interpreters(tmp_path: Path, mode: str, code: int,
                                                        said: str) -> None:
    """Warm workers (forks of the fork server) end as ``python -u SCRIPT`` would: the exit
    code of os._exit or sys.exit reaches the agent, text written before os._exit is not lost,
    an exception's traceback is printed. Two workers per node."""
    agent = _agent(tmp_path, mode, elastic=True, warm=True, nproc=2)
    try:
        out, _ = agent.communicate(timeout=180)
    finally:
        agent.kill()
    assert agent.returncode == code, out
    assert out.count("worker ready") == 2 and "warm worker start: fork server" in out, out
    assert said in out
    assert ("Traceback" in out) == (mode == "raise"), out


def _descendants(pid: int) -> set[int]:
    """Process ids of every descendant of ``pid`` (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parent = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(parent, []).append(int(entry.name))
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def _alive(pid: int) -> bool:
    """Running (not a zombie waiting for its parent)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _all_ended(pids: set[int], within_s: float) -> set[int]:
    """The ``pids`` still running after ``within_s`` seconds."""
    import time

    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.1)
    return {p for p in pids if _alive(p)}


@pytest.mark.parametrize("how", ["step-signal", "agent-killed", "agent-killed-sigint-ignored"])
def test_no_warm_worker_or_fork_server_outlives_the_agent(tmp_path: Path, how: str) -> None:
    """``step-signal``: the preemption signal (SIGUSR2) to every process of the agent's tree,
    as ``scancel -s`` a job step sends it (slurm_spot.slurm.actions.signal_step): the fork
    server ignores it and outlives its workers; the agent stops them and exits 128 + 12, and
    then nothing it started runs. ``agent-killed`` (SIGKILL, where Slurm's KillWait ends):
    the fork server sees the agent gone and exits, its workers get SIGINT (their parent-death
    signal) and end too; also when the job was started with SIGINT ignored (CI, stop 32: the
    workers ran on, their parent-death SIGINT ignored)."""
    agent = _agent(tmp_path, "wait", elastic=True, warm=True, nproc=2,
                   sigint_ignored=how.endswith("sigint-ignored"))
    try:
        assert agent.stdout is not None
        lines = []
        for line in agent.stdout:  # two workers' lines can come glued: count the words
            lines.append(line)
            if "".join(lines).count("worker ready") == 2:
                break
        tree = _descendants(agent.pid)
        workers = {int(pid) for pid in re.findall(r"worker ready (\d+)", "".join(lines))}
        assert workers < tree and len(tree) >= 3, (tree, workers)  # + server (+ tracker)
        if how == "step-signal":
            for pid in {agent.pid, *tree}:  # as Slurm signals a step: what still runs
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGUSR2)
            rest, _ = agent.communicate(timeout=120)
            assert agent.returncode == 128 + signal.SIGUSR2, "".join(lines) + rest
        else:
            agent.kill()
            agent.wait(timeout=30)
        assert _all_ended(tree, 30) == set(), "".join(lines)
    finally:
        agent.kill()


#: The real agent's main() (as ``python -m slurm_spot.jobs.injob.torchrun_agent`` runs it in
#: the batch script's job step), with this node's address given: no scontrol here.
MAIN = """
import sys
from slurm_spot.jobs.injob import torchrun_agent as a
a.node_addr = lambda client, node: "127.0.0.1"
a.leave(a.main(sys.argv[1:]))
"""

#: A worker that reports what it was started with: environment, argv, signal dispositions,
#: sys.path[0], __file__, stdin.
REPORT = """
import json, os, signal, sys
def disposition(number):
    handler = signal.getsignal(number)
    return {signal.SIG_IGN: "ignored", signal.SIG_DFL: "default"}.get(handler, "handled")
# One write per line (print writes the newline apart): the two workers share the pipe.
sys.stdout.write("report " + json.dumps({
    "env": dict(os.environ), "argv": sys.argv, "path0": sys.path[0], "file": __file__,
    "signals": {s.name: disposition(s) for s in
                (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGHUP, signal.SIGINT)},
}) + "\\n")
sys.stdout.flush()
# A failing rank waits for every rank's report: torch stops the others once one fails.
import time
mark = os.path.join(os.path.dirname(__file__), "reported-" + os.environ["MASTER_PORT"] + "-")
open(mark + os.environ["RANK"], "w").close()
deadline = time.time() + 60
while sys.argv[1] != "0" and time.time() < deadline and not all(
        os.path.exists(mark + str(r)) for r in range(int(os.environ["WORLD_SIZE"]))):
    time.sleep(0.05)
sys.exit(int(sys.argv[1]))
"""


def _run_main(tmp_path: Path, preload: bool, port: int, code: int) -> tuple[int, str, list[dict]]:
    """The real agent (not elastic, 2 workers) of job 7 on one node, ``--no-preload`` or not;
    returns its exit status, its output and the workers' reports (by RANK)."""
    import json

    worker = tmp_path / "report.py"
    worker.write_text(REPORT)
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "SLURM_JOB_ID": "7",
           "SLURM_RESTART_COUNT": "1", "SLURMD_NODENAME": "localhost",
           "SLURM_JOB_NODELIST": "localhost", "SLURM_JOB_NUM_NODES": "1",
           "SLURM_SPOT_PREEMPT_SIGNAL": "USR2"}
    words = ["--nproc-per-node=2", f"--port={port}", *([] if preload else ["--no-preload"]),
             "--", str(worker), str(code), "--flag", "x y"]
    # The agent starts with SIGINT at its default action, as slurmstepd starts a task (a test
    # run in the background of a non-interactive shell inherits it ignored).
    proc = subprocess.run([sys.executable, "-c", MAIN, *words], env=env, cwd=tmp_path,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=240, check=False,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    reports = [json.loads(line.split(" ", 1)[1]) for line in proc.stdout.splitlines()
               if line.startswith("report ")]
    return proc.returncode, proc.stdout, sorted(reports, key=lambda r: int(r["env"]["RANK"]))


#: Worker variables whose values differ between any two runs: the workers' store port (a free
#: port torch picks) and torch's per-run error file.
_PER_RUN = ("MASTER_PORT", "TORCHELASTIC_ERROR_FILE")


@pytest.mark.parametrize("code", [0, 85, 3])
def test_plain_agent_warm_workers_see_what_stock_workers_see(tmp_path: Path, code: int) -> None:
    """The plain (not elastic) agent starts its workers warm by default: they are forks of
    the fork server (the agent says so), and they see exactly what ``--no-preload`` workers
    (``python -u SCRIPT``, torchrun's own start) see: every environment variable (RANK,
    LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, TORCHELASTIC_*, ...) with the same values, the same
    argv, sys.path[0] and __file__, the preemption signal still ignored (as the agent ignores
    it), SIGTERM and SIGHUP at their default action. The agent's exit status is the same
    too: 0, the requeue code (85) passed on, 1 for a crash."""
    results = {}
    for preload, port in ((False, 29611 + code), (True, 29711 + code)):
        results[preload] = _run_main(tmp_path, preload, port, code)
    expected = {0: 0, 85: 85, 3: 1}[code]
    for preload, (status, out, reports) in results.items():
        assert status == expected, out
        assert len(reports) == 2, out
        assert ("warm worker start: fork server" in out) == preload, out
        assert "slurm-spot: agent started at " in out
    stock, warm = results[False][2], results[True][2]
    for cold, hot in zip(stock, warm, strict=True):
        assert sorted(hot["env"]) == sorted(cold["env"]), (
            set(hot["env"]) ^ set(cold["env"]))
        assert {k: v for k, v in hot["env"].items() if k not in _PER_RUN} == {
            k: v for k, v in cold["env"].items() if k not in _PER_RUN}
        assert hot["argv"] == cold["argv"] and hot["argv"][1:] == [str(code), "--flag", "x y"]
        assert hot["path0"] == cold["path0"] and hot["file"] == cold["file"]
        assert hot["signals"] == cold["signals"] == {
            "SIGUSR1": "ignored", "SIGUSR2": "ignored", "SIGTERM": "default",
            "SIGHUP": "default", "SIGINT": "handled"}
    assert [r["env"]["RANK"] for r in warm] == ["0", "1"]
    assert {r["env"]["LOCAL_RANK"] for r in warm} == {"0", "1"}
    assert {r["env"]["WORLD_SIZE"] for r in warm} == {"2"}
    assert {r["env"]["TORCHELASTIC_RUN_ID"] for r in warm} == {"7"}
    assert {r["env"]["MASTER_ADDR"] for r in warm} == {"127.0.0.1"}  # the node's --local-addr
    assert len({r["env"]["MASTER_PORT"] for r in warm}) == 1


#: A worker written for Lightning's auto-requeue (``#SBATCH --signal=USR1@90``): its USR1
#: handler saves and the worker ends at its next step; a rank without a handler of its own
#: (rank 1: Lightning handles the signal on rank 0 only) must not die of it either.
LIGHTNING_STYLE = """
import os, signal, sys, time
rank = int(os.environ["RANK"])
saved = []
if rank == 0:
    signal.signal(signal.SIGUSR1, lambda *_: saved.append(time.time()))
print(f"worker ready {rank}", flush=True)
deadline = time.time() + 120
while time.time() < deadline:
    if saved or os.path.exists(os.path.join(os.path.dirname(__file__), "done")):
        break
    time.sleep(0.05)
if saved:
    print("rank 0 saved on USR1", flush=True)
    open(os.path.join(os.path.dirname(__file__), "done"), "w").close()
print(f"worker {rank} ends", flush=True)
"""


@pytest.mark.parametrize("preload", [False, True], ids=["no-preload", "warm"])
def test_a_jobs_own_usr1_reaches_its_workers_and_does_not_end_the_agent(
        tmp_path: Path, preload: bool) -> None:
    """``#SBATCH --signal=USR1@90`` (Lightning) with spot.yaml's USR2 as the preemption
    signal: Slurm sends USR1 to every process of the step, as here. The agent used to die of
    it (USR1's default action) and the step ended under the workers; now rank 0's handler
    saves, rank 1 (no handler) lives on, and the agent exits 0 once both have ended."""
    worker = tmp_path / "lightning_style.py"
    worker.write_text(LIGHTNING_STYLE)
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "SLURM_JOB_ID": "7",
           "SLURM_RESTART_COUNT": "0", "SLURMD_NODENAME": "localhost",
           "SLURM_JOB_NODELIST": "localhost", "SLURM_JOB_NUM_NODES": "1",
           "SLURM_SPOT_PREEMPT_SIGNAL": "USR2"}
    port = 29811 if preload else 29821
    agent = subprocess.Popen(
        [sys.executable, "-c", MAIN, "--nproc-per-node=2", f"--port={port}",
         *([] if preload else ["--no-preload"]), "--", str(worker)],
        env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert agent.stdout is not None
        lines = []
        for line in agent.stdout:
            lines.append(line)
            # Both workers write to the same pipe: their lines can come glued ("worker ready
            # 1worker ready 0"), as in one CI run, so count the words, not the lines.
            if "".join(lines).count("worker ready") == 2:
                break
        for pid in {agent.pid, *_descendants(agent.pid)}:
            os.kill(pid, signal.SIGUSR1)
        rest, _ = agent.communicate(timeout=120)
    finally:
        agent.kill()
    output = "".join(lines) + rest
    assert agent.returncode == 0, output
    assert "rank 0 saved on USR1" in output, output
    assert "worker 1 ends" in output and "worker 0 ends" in output, output


#: A worker that reports its process chain (itself, its parent, its grandparent: pid, parent,
#: start time in clock ticks, executable, command line); ``probe`` (on PYTHONPATH) records the
#: process that imported it; torch, as a training script imports it.
CHAIN = """
import json, os, sys
import probe
import torch
def proc(pid):
    stat = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return {"pid": pid, "ppid": int(stat[1]), "start": int(stat[19]),
            "exe": os.readlink(f"/proc/{pid}/exe"),
            "cmdline": open(f"/proc/{pid}/cmdline").read()}
me = proc(os.getpid())
server = proc(me["ppid"])
os.write(1, ("chain " + json.dumps([me, server, proc(server["ppid"])]) + "\\n").encode())
"""

PROBE = """
import os
import re
with open(os.environ["PROBE_LOG"], "a") as log:
    log.write(f"{os.getpid()}\\n")
"""

#: Found first on the path by every interpreter the agent starts (PYTHONPATH): records the
#: process id of each process that imports torch itself (a fork of one that has it imported
#: finds it in ``sys.modules`` and asks no finder).
SITECUSTOMIZE = """
import os, sys
class _TorchImports:
    def find_spec(self, name, path=None, target=None):
        if name == "torch":
            with open(os.environ["TORCH_IMPORT_LOG"], "a") as log:
                log.write(f"{os.getpid()}\\n")
        return None
sys.meta_path.insert(0, _TorchImports())
"""


def _run_chain(tmp_path: Path, program: str, *options: str
               ) -> tuple[int, str, list[list[dict]], list[int], list[int]]:
    """The real agent (``program``: :data:`MAIN` or a variant) with 2 workers running
    :data:`CHAIN`; returns the agent's exit status, its output, the workers' chains, the
    processes that imported the script's module ``probe`` and those that imported torch
    (:data:`SITECUSTOMIZE`), in order."""
    import json

    (tmp_path / "lib").mkdir(exist_ok=True)
    (tmp_path / "lib" / "probe.py").write_text(PROBE)
    (tmp_path / "lib" / "sitecustomize.py").write_text(SITECUSTOMIZE)
    worker = tmp_path / "chain.py"
    worker.write_text(CHAIN)
    log, torch_log = tmp_path / "probe.log", tmp_path / "torch.log"
    log.unlink(missing_ok=True)
    torch_log.unlink(missing_ok=True)
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "SLURM_JOB_ID": "8",
           "SLURM_RESTART_COUNT": "0", "SLURMD_NODENAME": "localhost",
           "SLURM_JOB_NODELIST": "localhost", "SLURM_JOB_NUM_NODES": "1",
           "SLURM_SPOT_PREEMPT_SIGNAL": "USR2", "PROBE_LOG": str(log),
           "TORCH_IMPORT_LOG": str(torch_log),
           "PYTHONPATH": os.pathsep.join([str(tmp_path / "lib"), *sys.path])}
    proc = subprocess.Popen([sys.executable, "-c", program, "--nproc-per-node=2", *options,
                             "--", str(worker)], env=env, cwd=tmp_path, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        out, _ = proc.communicate(timeout=240)
    finally:
        proc.kill()
    chains = [json.loads(line.split(" ", 1)[1]) for line in out.splitlines()
              if line.startswith("chain ")]
    assert len(chains) == 2, out
    assert all(proc.pid in (chain[1]["pid"], chain[2]["pid"]) for chain in chains), (
        proc.pid, chains)

    def pids(path: Path) -> list[int]:
        return [int(p) for p in path.read_text().split()] if path.exists() else []

    return proc.returncode, out, chains, pids(log), pids(torch_log)


def test_warm_workers_fork_from_a_fork_of_the_agent_and_torch_is_imported_once(
        tmp_path: Path) -> None:
    """One Python start per node: the fork server is a fork of the agent itself (its parent
    is the agent, it started after the agent, and it runs the agent's executable and command
    line: no new interpreter was exec'd), each worker is a fork of that server, and torch is
    imported once on the node, by the agent. The script's own import (``probe``) happens once,
    in the server only: not in the agent, not in the workers. ``--no-preload``, for
    comparison: the agent and each of the 2 workers import torch (3 imports)."""
    code, out, chains, probes, torches = _run_chain(tmp_path, MAIN, "--port=29811")
    assert code == 0, out
    assert "fork server" in out and "(forked from the agent)" in out, out
    servers = {chain[1]["pid"] for chain in chains}
    assert len(servers) == 1, chains
    for worker, server, agent in chains:
        assert worker["ppid"] == server["pid"] and server["ppid"] == agent["pid"]
        assert server["exe"] == agent["exe"] and server["cmdline"] == agent["cmdline"]
        assert "multiprocessing.forkserver" not in server["cmdline"]
        assert agent["start"] <= server["start"] <= worker["start"]
    assert torches == [chains[0][2]["pid"]], (torches, chains)
    assert probes == list(servers), (probes, chains)

    code, out, chains, probes, torches = _run_chain(tmp_path, MAIN, "--port=29812",
                                                    "--no-preload")
    assert code == 0, out
    agent = chains[0][1]["pid"]
    assert all(c[1]["pid"] == agent for c in chains), chains  # workers: the agent's children
    assert sorted(torches) == sorted([agent, *(c[0]["pid"] for c in chains)]), torches
    assert sorted(probes) == sorted(c[0]["pid"] for c in chains)


#: :data:`MAIN` with a Python thread running in the agent before torchrun starts (a plugin
#: or sitecustomize might start one): forking it would be unsafe.
MAIN_WITH_THREAD = MAIN.replace("a.leave(", """import threading, time
threading.Thread(target=time.sleep, args=(300,), daemon=True, name="busy").start()
a.leave(""")


def test_agent_with_a_python_thread_starts_the_fork_server_as_a_new_interpreter(
        tmp_path: Path) -> None:
    """Where forking the agent is unsafe (another Python thread runs in it), the fork server
    is started as before, a new interpreter (``python -c 'from multiprocessing.forkserver
    import main...'``) that imports torch and the script's imports itself, the agent says why,
    and the workers still start warm from it: torch imported twice on the node."""
    code, out, chains, probes, torches = _run_chain(tmp_path, MAIN_WITH_THREAD, "--port=29813")
    assert code == 0, out
    assert "cannot fork it from the agent, other Python threads run: busy" in out, out
    for _worker, server, agent in chains:
        assert server["ppid"] == agent["pid"]
        assert "multiprocessing.forkserver" in server["cmdline"]
    server, agent = chains[0][1]["pid"], chains[0][2]["pid"]
    assert sorted(torches) == sorted([agent, server]), (torches, chains)
    assert probes == [server], (probes, chains)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


RANKS_SCRIPT = """
import os, torch.distributed as dist
dist.init_process_group("gloo")
print("rank", os.environ["GROUP_RANK"], dist.get_rank(), "of", dist.get_world_size(), flush=True)
dist.destroy_process_group()
"""

TWO_NODE_AGENT = """
import os, sys
from slurm_spot.jobs.injob.torchrun_agent import leave, run_torchrun, torchrun_args
targs = torchrun_args(os.environ, "127.0.0.1", 1, int(sys.argv[1]), [sys.argv[2]])
print("args", " ".join(targs[:6]), flush=True)
leave(run_torchrun(targs, 85, warm_signals=[1, 15] if sys.argv[3] == "warm" else None))
"""


@pytest.mark.parametrize("warm", [False, True], ids=["subprocess", "warm"])
def test_a_two_node_job_forms_its_static_rendezvous_in_node_list_order(
        tmp_path: Path, warm: bool) -> None:
    """Two agents as ``slurm-spot sbatch --torchrun`` starts them on a 2-node job (one per
    node, SLURM_JOB_NODELIST=spot-[3,7]): torchrun's static rendezvous on the first node's
    address, each node's rank its place in the node list, whichever agent starts first (here
    the second node's, half a second ahead of the node that hosts the store)."""
    script = tmp_path / "ranks.py"
    script.write_text(RANKS_SCRIPT)
    port = _free_port()
    base = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "SLURM_JOB_ID": "4242",
            "SLURM_JOB_NODELIST": "spot-[3,7]", "SLURM_JOB_NUM_NODES": "2"}
    agents = {}
    try:
        for node in ("spot-7", "spot-3"):
            agents[node] = subprocess.Popen(
                [sys.executable, "-c", TWO_NODE_AGENT, str(port), str(script),
                 "warm" if warm else "cold"], env={**base, "SLURMD_NODENAME": node},
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            time.sleep(0.5)
        outputs = {node: agent.communicate(timeout=180)[0] for node, agent in agents.items()}
    finally:
        for agent in agents.values():
            agent.kill()
    for node, rank in (("spot-3", 0), ("spot-7", 1)):
        out = outputs[node]
        assert agents[node].returncode == 0, out
        assert f"--rdzv-backend=static --master-addr=127.0.0.1 --master-port={port}" in out
        assert f"rank {rank} {rank} of 2" in out, out


def test_an_agent_on_a_node_outside_the_jobs_node_list_exits_2_and_says_why() -> None:
    env = {**os.environ, "SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "spot-[3,7]",
           "SLURM_JOB_NUM_NODES": "2", "SLURMD_NODENAME": "spot-9"}
    proc = subprocess.run([sys.executable, "-m", "slurm_spot.jobs.injob.torchrun_agent",
                           "--port", "29999", "--", "train.py"], env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == 2, proc.stderr
    assert "SLURMD_NODENAME='spot-9' is not a node of this job step (spot-3,spot-7)" \
        in proc.stderr
    assert "Traceback" not in proc.stderr


def test_ranks_follow_the_job_steps_node_list_and_an_unknown_node_is_refused() -> None:
    """Every agent of the step reads the same list (the step's, else the job's), so they
    agree on the master and the ranks; an agent that cannot tell its node is refused rather
    than taking rank 0 beside the real one."""
    from slurm_spot.contract import jobenv
    from slurm_spot.jobs.injob.torchrun_agent import node_rank, torchrun_args

    job = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "spot-[1-4]", "SLURM_JOB_NUM_NODES": "4"}
    step = {**job, "SLURM_STEP_NODELIST": "spot-[2,4]", "SLURMD_NODENAME": "spot-4"}
    assert node_rank(step) == 1
    args = torchrun_args(step, "10.0.0.2", 8, 29407, ["train.py"])
    assert args[:6] == ["--nnodes=2", "--nproc-per-node=8", "--rdzv-backend=static",
                        "--master-addr=10.0.0.2", "--master-port=29407", "--node-rank=1"]
    assert node_rank({**job, "SLURMD_NODENAME": "spot-3"}) == 2
    with pytest.raises(jobenv.JobEnvError, match="SLURMD_NODENAME is not set"):
        node_rank(job)
    assert node_rank({"SLURM_JOB_NODELIST": "spot-1"}) == 0
    assert node_rank({}) == 0


def test_a_taken_rendezvous_port_ends_the_agent_with_one_line_not_a_traceback(
        tmp_path: Path) -> None:
    """Another job's store already listens on the port of this job's static rendezvous
    (29400 + job id % 1000 on the same first node): the agent says so in one line and exits
    1 instead of printing torch's DistNetworkError traceback."""
    script = tmp_path / "ranks.py"
    script.write_text(RANKS_SCRIPT)
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "SLURM_JOB_ID": "4242",
               "SLURM_JOB_NODELIST": "spot-3", "SLURM_JOB_NUM_NODES": "1",
               "SLURMD_NODENAME": "spot-3"}
        proc = subprocess.run([sys.executable, "-c", TWO_NODE_AGENT, str(port), str(script),
                               "cold"], env=env, capture_output=True, text=True, timeout=120,
                              check=False)
    assert proc.returncode == 1, proc.stderr
    assert f"slurm-spot: the job's rendezvous store on port {port} failed" in proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
