"""The elastic agent's warm worker start (slurm_spot.jobs.injob.warm_worker): what the fork server
preloads for a script, and the ``--no-preload`` way out, with a real torchrun agent on CPU."""

from __future__ import annotations

import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from slurm_spot.jobs.injob.warm_worker import BASE_PRELOAD, preload_modules, script_imports
from tests.elastic_runs import rendezvous_service

SCRIPT = """
from __future__ import annotations
import os, json.decoder as jd
import torch.distributed
from sklearn.datasets import load_digits
from . import sibling
from helpers import thing
import localpkg.sub
from typing import TYPE_CHECKING
if TYPE_CHECKING:
    import numpy
try:
    import yaml
except ImportError:
    yaml = None

def main():
    import click
"""


def test_preload_list_is_the_scripts_top_level_absolute_imports(tmp_path: Path) -> None:
    """Module-level ``import``/``from ... import`` only, in order: no relative import, no
    module next to the script (helpers.py, localpkg/), nothing conditional or in a function,
    no ``__future__``; torch and the agent's own modules come first."""
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    (tmp_path / "helpers.py").write_text("thing = 1\n")
    (tmp_path / "localpkg").mkdir()
    assert script_imports(script) == ["os", "json.decoder", "torch.distributed",
                                      "sklearn.datasets", "sklearn.datasets.load_digits",
                                      "typing", "typing.TYPE_CHECKING"]
    modules = preload_modules(script)
    assert modules[:len(BASE_PRELOAD)] == list(BASE_PRELOAD)
    assert modules.count("torch.distributed") == 1 and "sklearn.datasets" in modules


def test_preload_list_of_an_unreadable_script_is_torch_only(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = tmp_path / "broken.py"
    script.write_text("import torch\ndef (:\n")
    assert script_imports(script) == [] and script_imports(tmp_path / "missing.py") == []
    monkeypatch.setitem(sys.modules, "__main__", types.ModuleType("__main__"))  # as python -c
    assert preload_modules(script) == list(BASE_PRELOAD)


def test_preload_list_has_the_agents_imports_not_the_agent(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker re-runs the agent's ``__main__`` module (``python -m
    slurm_spot.jobs.injob.torchrun_agent``) as ``__mp_main__``: its imports are preloaded, the
    module itself is not (runpy would warn in every worker)."""
    import slurm_spot.jobs.injob.torchrun_agent as agent

    main = types.ModuleType("__main__")
    main.__file__ = agent.__file__
    monkeypatch.setitem(sys.modules, "__main__", main)
    script = tmp_path / "train.py"
    script.write_text("import sklearn.datasets\n")
    modules = preload_modules(script)
    assert "slurm_spot.slurm.client" in modules and "slurm_spot.contract.jobenv" in modules
    assert "slurm_spot.jobs.injob.torchrun_agent" not in modules
    assert modules[-1] == "sklearn.datasets"


def test_preload_skips_names_that_are_no_modules_silently(
        capsys: pytest.CaptureFixture[str]) -> None:
    """``from json import dumps`` gives ``json.dumps``, which is no module: skipped without a
    word."""
    from slurm_spot.jobs.injob.warm_worker import preload

    assert preload(["json", "json.dumps"]) == ["json.dumps"]
    assert capsys.readouterr().err == ""


#: A module that reads the worker's rank at import time (as some libraries read RANK or
#: CUDA_VISIBLE_DEVICES), and one that refuses to be imported outside a worker.
RANK_AT_IMPORT = "import os\nRANK = os.environ.get('RANK')\n"
WORKER_ONLY = ("import os\nif 'RANK' not in os.environ:\n"
               "    raise RuntimeError('imported outside a worker')\n")
TRAIN = """
import rank_at_import, worker_only
print("rank seen at import:", rank_at_import.RANK, flush=True)
"""

AGENT = """
import sys
from slurm_spot.jobs.injob import torchrun_agent as a
a.node_addr = lambda client, node: "127.0.0.1"  # no Slurm here: this node's address
a.leave(a.main(sys.argv[1:]))
"""


def _run_agent(tmp_path: Path, endpoint: str, job: str, *options: str) -> subprocess.CompletedProcess[str]:
    modules = tmp_path / "modules"
    modules.mkdir(exist_ok=True)
    (modules / "rank_at_import.py").write_text(RANK_AT_IMPORT)
    (modules / "worker_only.py").write_text(WORKER_ONLY)
    train = tmp_path / "train.py"
    train.write_text(TRAIN)
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "SLURM_JOB_ID": job,
           "SLURM_RESTART_COUNT": "0", "SLURMD_NODENAME": "localhost",
           "SLURM_JOB_NODELIST": "localhost",
           "PYTHONPATH": os.pathsep.join([str(modules), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [sys.executable, "-c", AGENT, "--elastic=1:1", f"--rendezvous={endpoint}",
         "--join-timeout=60", *options, "--", str(train)],
        env=env, capture_output=True, text=True, timeout=240, check=False)


def test_warm_start_and_no_preload_through_the_agents_command_line(tmp_path: Path) -> None:
    """``torchrun_agent --elastic``: by default the fork server preloads the script's imports
    in the agent's environment: a module reading RANK at import sees none (the trade-off the
    docstring states), and one that fails there is skipped with a line on stderr and imported
    by the worker itself, which then trains. ``--no-preload``: each worker is a new
    ``python -u SCRIPT`` and its imports see its own environment (RANK=0)."""
    with rendezvous_service(os.environ, fake_owner=True) as endpoint:
        warm = _run_agent(tmp_path, endpoint, "71")
        cold = _run_agent(tmp_path, endpoint, "72", "--no-preload")
    assert warm.returncode == 0, warm.stderr[-3000:]
    assert "warm worker start: fork server" in warm.stderr
    assert "preloading worker_only failed (RuntimeError: imported outside a worker)" in (
        warm.stderr)
    assert "rank seen at import: None" in warm.stdout
    assert cold.returncode == 0, cold.stderr[-3000:]
    assert "fork server" not in cold.stderr and "preloading" not in cold.stderr
    assert "rank seen at import: 0" in cold.stdout


#: ``run_torchrun`` with one worker; argv: warm|cold, the script, its arguments.
RUN = """
import signal, sys
from slurm_spot.jobs.injob.torchrun_agent import leave, run_torchrun
if __name__ == "__main__":
    warm = [int(signal.SIGUSR2), 15] if sys.argv[1] == "warm" else None
    leave(run_torchrun(["--nnodes=1", "--nproc-per-node=1", "--rdzv-backend=c10d",
                        "--rdzv-endpoint=127.0.0.1:0", "--max-restarts=0", *sys.argv[2:]],
                       85, elastic=True, warm_signals=warm))
"""

#: A script kept in ``proj/`` next to the module it imports, started through a symlink in
#: ``bin/`` and by a relative path; it prints what ``python SCRIPT`` would give it.
LINKED = """
import sys, mymodel
print("script:", mymodel.VALUE, __file__, sys.argv, flush=True)
"""


def _run(tmp_path: Path, how: str, *command: str,
         pythonpath: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``run_torchrun`` started from ``tmp_path`` (its working directory, and first on its
    ``sys.path`` as the agent's under ``python -m``)."""
    runner = tmp_path / "run_agent.py"
    runner.write_text(RUN)
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo"}
    if pythonpath is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(pythonpath), os.environ.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, str(runner), how, *command], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=240, check=False)


@pytest.mark.parametrize("how", ["cold", "warm"])
def test_symlinked_script_imports_next_to_its_target_as_python_does(
        tmp_path: Path, how: str) -> None:
    """``python bin/train.py`` where bin/train.py links to proj/train.py: sys.path[0] is
    proj/ (CPython resolves the link), so ``import mymodel`` finds proj/mymodel.py; __file__
    is the absolute path as typed, sys.argv[0] the path as typed. Warm workers match the
    subprocess start."""
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "train.py").write_text(LINKED)
    (tmp_path / "proj" / "mymodel.py").write_text("VALUE = 'model next to the target'\n")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "train.py").symlink_to("../proj/train.py")
    proc = _run(tmp_path, how, "bin/train.py", "a b", "--", "é")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (f"script: model next to the target {tmp_path}/bin/train.py "
            "['bin/train.py', 'a b', '--', 'é']") in proc.stdout


@pytest.mark.parametrize("how", ["cold", "warm"])
def test_keyboard_interrupt_in_the_script_fails_the_worker(tmp_path: Path, how: str) -> None:
    """A script that ends by an uncaught KeyboardInterrupt: the interpreter prints it and dies
    of SIGINT (torch: exitcode -2), so the agent reports a failed worker (1), never success."""
    (tmp_path / "train.py").write_text("print('started', flush=True)\nraise KeyboardInterrupt\n")
    proc = _run(tmp_path, how, "train.py")
    assert proc.returncode == 1, proc.stdout + proc.stderr[-3000:]
    assert "started" in proc.stdout and "KeyboardInterrupt" in proc.stderr
    assert "exitcode: -2" in proc.stderr, proc.stderr[-3000:]


#: What training scripts do under ``if __name__ == "__main__":``: choose the start method,
#: use a pool of processes running a function of the script.
START_METHOD = """
import multiprocessing as mp
def square(x):
    return x * x
if __name__ == "__main__":
    print("chosen before:", mp.get_start_method(allow_none=True), flush=True)
    mp.set_start_method("spawn")
    with mp.Pool(2) as pool:
        print("pool:", pool.map(square, [1, 2, 3]), type(__builtins__).__name__, flush=True)
"""


@pytest.mark.parametrize("how", ["cold", "warm"])
def test_script_may_choose_its_multiprocessing_start_method(tmp_path: Path, how: str) -> None:
    """A new interpreter has no start method chosen, so the script's own
    ``set_start_method("spawn")`` works; a warm worker (a fork server's child, which inherits
    the server's) must not fail with "context has already been set"."""
    (tmp_path / "train.py").write_text(START_METHOD)
    proc = _run(tmp_path, how, "train.py")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "chosen before: None" in proc.stdout and "pool: [1, 4, 9] module" in proc.stdout


@pytest.mark.parametrize("how", ["cold", "warm"])
def test_agents_working_directory_does_not_shadow_the_scripts_imports(
        tmp_path: Path, how: str) -> None:
    """``shadowme`` is installed (on PYTHONPATH) and also a file in the agent's working
    directory: ``python proj/train.py`` imports the installed one (the working directory is
    not on its path), and so must the fork server that preloads the script's imports."""
    (tmp_path / "shadowme.py").write_text("VALUE = 'the working directory copy'\n")
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "shadowme.py").write_text("VALUE = 'installed'\n")
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "train.py").write_text(
        "import shadowme\nprint('shadowme:', shadowme.VALUE, flush=True)\n")
    proc = _run(tmp_path, how, "proj/train.py", pythonpath=tmp_path / "lib")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "shadowme: installed" in proc.stdout, proc.stdout
    assert ("preloads" in proc.stderr and "shadowme" in proc.stderr) == (how == "warm")
