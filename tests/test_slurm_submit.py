"""What ``slurm-spot sbatch`` asks of Slurm, through SlurmClient (slurm/ is the only package that
runs Slurm commands): submitting a batch script, whether a partition exists, where slurmctld
runs. Against stand-ins of sbatch and scontrol in a bin directory, run as real programs."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_spot.errors import SlurmCommandError
from slurm_spot.slurm.client import SlurmClient


def _tool(bin_dir: Path, name: str, body: str) -> None:
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / name).write_text("#!/bin/sh\n" + body)
    (bin_dir / name).chmod(0o755)


def test_submit_batch_hands_sbatch_the_script_with_options_and_arguments(tmp_path: Path) -> None:
    seen = tmp_path / "seen"
    # The stand-in keeps its argv and the script sbatch was given, as sbatch copies it.
    _tool(tmp_path / "bin", "sbatch", f'echo "$@" > {seen}.argv\n'
          f'for a; do case "$a" in *batch.sh) cp "$a" {seen}.script;; esac; done\n'
          'echo "Submitted batch job 42"\n')
    result = SlurmClient(tmp_path / "bin").submit_batch(
        "#!/bin/bash\n#SBATCH --requeue\ntrain\n", ["-p", "spot", "--time=5"], ["--lr", "1"])
    assert result.stdout.strip() == "Submitted batch job 42"
    assert Path(f"{seen}.script").read_text() == "#!/bin/bash\n#SBATCH --requeue\ntrain\n"
    words = Path(f"{seen}.argv").read_text().split()
    assert words[:3] == ["-p", "spot", "--time=5"] and words[4:] == ["--lr", "1"]
    assert result.argv[0] == str(tmp_path / "bin" / "sbatch") and result.argv[1:] == \
        ["-p", "spot", "--time=5", words[3], "--lr", "1"]
    assert not Path(words[3]).exists()  # the temporary script goes once sbatch returned


def test_a_refused_submission_raises_with_sbatchs_message(tmp_path: Path) -> None:
    _tool(tmp_path / "bin", "sbatch",
          'echo "sbatch: error: invalid partition specified: nope" >&2\nexit 1\n')
    with pytest.raises(SlurmCommandError, match="invalid partition specified: nope"):
        SlurmClient(tmp_path / "bin").submit_batch("#!/bin/bash\n", ["-p", "nope"], [])


@pytest.mark.parametrize(("config", "host"), [
    ("SlurmctldHost[0]       = ctl(10.0.0.5)\n", "10.0.0.5"),
    ("ClusterName = c\nSlurmctldHost[0] = headnode\n", "headnode"),
    ("ClusterName = c\n", None),
])
def test_controller_host_reads_slurmctldhost_address_else_name(
        tmp_path: Path, config: str, host: str | None) -> None:
    _tool(tmp_path / "bin", "scontrol", f"cat <<'EOF'\n{config}EOF\n")
    assert SlurmClient(tmp_path / "bin").controller_host() == host


def test_partition_exists_only_for_the_whole_name(tmp_path: Path) -> None:
    # A record of another partition than the one asked for is no answer for it.
    _tool(tmp_path / "bin", "scontrol",
          'case "$4" in coo*) echo "PartitionName=coord AllowGroups=ALL"; exit 0;; esac\n'
          'echo "partition $4 not found" >&2; exit 1\n')
    slurm = SlurmClient(tmp_path / "bin")
    assert slurm.has_command("scontrol") and not slurm.has_command("sbatch")
    assert slurm.partition_exists("coord")
    assert not slurm.partition_exists("coo")
    assert not slurm.partition_exists("nope")
