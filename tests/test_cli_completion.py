"""Shell completion through click's own protocol, as bash runs it: node names from sinfo,
job ids from squeue and the events file, silence when Slurm does not answer (issue 16)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from slurm_spot.events import Event, emit
from tests.test_reconcile_daemon import write_config


def _fake(bin_dir: Path, name: str, expected_args: str, output: str) -> None:
    """A stand-in for a Slurm command that answers only the exact query slurm-spot must ask
    (Slurm is not running in unit tests); anything else fails as sbatch/sinfo do."""
    bin_dir.mkdir(exist_ok=True)
    path = bin_dir / name
    path.write_text(f'#!/bin/sh\nif [ "$*" = "{expected_args}" ]; then printf "{output}"; '
                    f'exit 0; fi\necho "{name}: error: unexpected $*" >&2\nexit 1\n')
    path.chmod(0o755)


def _complete(words: str, bin_dir: Path, *extra_env: tuple[str, str]) -> list[str]:
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}",
           "_SLURM_SPOT_COMPLETE": "bash_complete", "COMP_WORDS": words,
           "COMP_CWORD": str(len(words.split()) - (0 if words.endswith(" ") else 1)),
           **dict(extra_env)}
    proc = subprocess.run([sys.executable, "-m", "slurm_spot"], env=env, capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    return [line for line in proc.stdout.splitlines() if line]


def test_node_names_come_from_sinfo(tmp_path: Path) -> None:
    # sinfo -N lists a node once per partition it is in.
    _fake(tmp_path / "bin", "sinfo", "-h -N -o %N", "spot-1\\nspot-2\\nspot-1\\ngpu-1\\n")
    assert _complete("slurm-spot events --node sp", tmp_path / "bin") == [
        "plain,spot-1", "plain,spot-2"]
    assert _complete("slurm-spot local preempt ", tmp_path / "bin") == [
        "plain,gpu-1", "plain,spot-1", "plain,spot-2"]
    assert _complete("slurm-spot watch --node g", tmp_path / "bin") == ["plain,gpu-1"]


def test_job_ids_come_from_squeue_and_the_events(tmp_path: Path) -> None:
    path = write_config(tmp_path)
    emit(tmp_path / "log", Event("requeued", "watch", node="spot-1", job_ids=(42,)))
    _fake(tmp_path / "bin", "squeue", "-h -o %A", "12\\n7\\n12\\n")
    assert _complete(f"slurm-spot --config {path} cost --job ", tmp_path / "bin") == [
        "plain,7", "plain,12", "plain,42"]
    assert _complete(f"slurm-spot --config {path} cost --job 4", tmp_path / "bin") == [
        "plain,42"]


def test_no_answer_from_slurm_completes_nothing_silently(tmp_path: Path) -> None:
    _fake(tmp_path / "bin", "sinfo", "never", "")
    _fake(tmp_path / "bin", "squeue", "never", "")
    assert _complete("slurm-spot events --node ", tmp_path / "bin") == []
    assert _complete("slurm-spot cost --job ", tmp_path / "bin",
                     ("SLURM_SPOT_CONFIG", str(tmp_path / "absent.yaml"))) == []


def test_the_readme_line_sets_up_bash_completion() -> None:
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    (line,) = [ln for ln in readme.splitlines() if ln.startswith('eval "$(_SLURM_SPOT_COMPLETE=')]
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    proc = subprocess.run(["bash", "-c", f"{line}\ncomplete -p slurm-spot"], env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "-F _slurm_spot_completion slurm-spot" in proc.stdout
