"""slurm-spot sbatch: directives read as sbatch reads them (tests/data/sbatch-directives.sh)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from slurm_spot.cli import cli
from slurm_spot.contract.directives import option_values, read_directives
from slurm_spot.errors import BadInputError
from slurm_spot.jobs.submit.sbatch import plan_submission, split_command_line
from slurm_spot.jsonenvelope import read_envelope

DATA = Path(__file__).parent / "data"
CASE = (DATA / "sbatch-directives.sh").read_text()


def test_field_case_active_and_ignored_directives() -> None:
    found = read_directives(CASE)
    assert found.options() == ["--job-name=ft-7b", "--gres=gpu:8"]
    assert [(d.line, d.options) for d in found.ignored] == [
        (9, ("--time=24:00:00",)), (10, ("--signal=USR2@180",))]


def test_plan_adds_directives_after_shebang_and_warns_with_line_numbers() -> None:
    plan = plan_submission(CASE, "train.sh", ["-p", "gpu"], ["--lr", "3e-4"], "USR2", 90)
    lines = plan.script.splitlines()
    assert lines[0] == "#!/bin/bash"
    added = [line for line in lines[2:6]]
    assert added == ["#SBATCH --requeue", "#SBATCH --open-mode=append",
                     "#SBATCH --signal=USR2@90", "#SBATCH --nodes=1"]
    # The user's own job name stays; the original script follows unchanged.
    assert "--job-name=train.sh" not in plan.script
    assert plan.script.endswith(CASE.split("\n", 1)[1])
    assert plan.warnings == [
        "train.sh:9: '#SBATCH --time=24:00:00' comes after the first command; sbatch ignores it",
        "train.sh:10: '#SBATCH --signal=USR2@180' comes after the first command; sbatch ignores it",
    ]
    assert plan.argv("/tmp/x.sh") == ["sbatch", "-p", "gpu", "/tmp/x.sh", "--lr", "3e-4"]


def test_user_choices_are_kept() -> None:
    script = "#!/bin/sh\n#SBATCH -N 4\nsrun true\n"
    plan = plan_submission(script, "a.sh", ["--signal=SIGUSR2@300", "-J", "mine"], [], "USR2", 90)
    assert "--nodes=1" not in plan.script and "--signal=USR2@90" not in plan.script
    assert "--job-name" not in plan.script


@pytest.mark.parametrize(("options", "message"), [
    (["--no-requeue"], "requeueable"),
])
def test_conflicting_options_are_refused(options: list[str], message: str) -> None:
    with pytest.raises(BadInputError, match=message):
        plan_submission("#!/bin/sh\nsrun true\n", "a.sh", options, [], "USR2", 90)


@pytest.mark.parametrize("value", ["USR1@60", "B:USR2@60", "TERM@120"])
def test_the_jobs_own_signal_is_kept(value: str) -> None:
    """A job written for another framework (Lightning's SIGUSR1, a batch shell trapping with
    'B:', a SIGTERM-only stack) is submitted with its own --signal, never ours as well."""
    plan = plan_submission(f"#!/bin/sh\n#SBATCH --signal={value}\nsrun true\n", "a.sh", [], [],
                           "USR2", 90)
    assert "--signal=USR2@90" not in plan.script
    assert f"#SBATCH --signal={value}" in plan.script
    if not value.startswith("B:"):
        assert any("listens for SIGUSR2" in w for w in plan.warnings)


def test_script_without_shebang_is_refused() -> None:
    with pytest.raises(BadInputError, match="#!"):
        plan_submission("srun true\n", "a.sh", [], [], "USR2", 90)


def test_split_command_line_knows_which_options_take_values() -> None:
    options, script, args = split_command_line(
        ["-N", "2", "--wait", "-p", "spot", "--mem=4G", "-H", "job.sh", "-N", "9"])
    assert options == ["-N", "2", "--wait", "-p", "spot", "--mem=4G", "-H"]
    assert script == "job.sh" and args == ["-N", "9"]
    assert option_values(options, "--nodes", "-N") == ["2"]
    with pytest.raises(BadInputError, match="needs a value"):
        split_command_line(["-p"])


def test_torchrun_dry_run_prints_agent_per_node(tmp_path: Path) -> None:
    config = tmp_path / "spot.yaml"
    config.write_text(yaml.safe_dump({
        "cluster": "c", "node_sets": [{"name": "spot", "provider": "local", "count": 2}],
        "partitions": [{"name": "spot", "node_sets": ["spot"]}],
        "preemption": {"signal": "SIGUSR2", "lead_s": 120}}))
    train = tmp_path / "train.py"
    train.write_text("print('hi')\n")
    result = CliRunner().invoke(cli, ["--config", str(config), "sbatch", "--torchrun",
                                      "--dry-run", "--json", "-N", "2", str(train), "--lr", "1"])
    assert result.exit_code == 0, result.output
    out = read_envelope(result.output)
    script = out["script"]
    assert "#SBATCH --signal=USR2@120" in script and "#SBATCH --requeue" in script
    assert "srun --nodes=\"${SLURM_JOB_NUM_NODES}\" --ntasks-per-node=1" in script
    assert f"-m slurm_spot.jobs.injob.torchrun_agent --nproc-per-node=1 -- \\\n  {train} --lr 1" in script
    assert out["argv"][-1] == "<script>" and "-N" in out["argv"]


def test_missing_script_exits_2(tmp_path: Path) -> None:
    config = tmp_path / "spot.yaml"
    config.write_text(yaml.safe_dump({
        "cluster": "c", "node_sets": [{"name": "spot", "provider": "local", "count": 2}],
        "partitions": [{"name": "spot", "node_sets": ["spot"]}]}))
    result = CliRunner().invoke(cli, ["--config", str(config), "sbatch", "-p", "x", "nope.sh"])
    assert result.exit_code == 2
    assert "nope.sh: no such file" in result.output


@pytest.mark.parametrize(("options", "env"), [
    (["--no-req"], {}),
    ([], {"SBATCH_NO_REQUEUE": "1"}),
])
def test_requeue_cannot_be_turned_off_by_abbreviation_or_env(options: list[str], env: dict) -> None:
    with pytest.raises(BadInputError, match="requeueable"):
        plan_submission("#!/bin/sh\nsrun true\n", "a.sh", options, [], "USR2", 90, env=env)


def test_signal_is_seen_through_abbreviations_env_and_only_column_0_directives() -> None:
    # The job's own signal, however given, is seen (and kept: ours is not added on top).
    plan = plan_submission("#!/bin/sh\nsrun true\n", "a.sh", ["--sig=USR1@60"], [], "USR2", 90)
    assert "--signal=USR2" not in plan.script and "SIGUSR1" in plan.warnings[0]
    plan = plan_submission("#!/bin/sh\nsrun true\n", "a.sh", [], [], "USR2", 90,
                           env={"SBATCH_SIGNAL": "USR1@30"})
    assert "--signal=USR2" not in plan.script and "SIGUSR1" in plan.warnings[0]
    # sbatch ignores an indented #SBATCH, so slurm-spot must still add its own --signal.
    plan = plan_submission("#!/bin/sh\n   #SBATCH --signal=USR2@1\nsrun true\n", "a.sh", [],
                           [], "USR2", 90)
    assert "#SBATCH --signal=USR2@90" in plan.script


def test_job_name_from_an_odd_file_name_is_one_safe_word() -> None:
    plan = plan_submission("#!/bin/sh\nsrun true\n", "my job\nx.sh", [], [], "USR2", 90)
    assert "#SBATCH --job-name=my_job_x.sh\n" in plan.script
    options, script, _ = split_command_line(["--mail-type", "END", "job.sh"])
    assert script == "job.sh" and options == ["--mail-type", "END"]


def test_per_job_checkpoint_root_is_checked_before_submitting(tmp_path: Path) -> None:
    config = tmp_path / "spot.yaml"
    config.write_text(yaml.safe_dump({
        "cluster": "c", "node_sets": [{"name": "spot", "provider": "local", "count": 1}],
        "partitions": [{"name": "spot", "node_sets": ["spot"]}]}))
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\necho hi\n")
    for bad, what in ((["--checkpoint-root", "/tmp/mine"], "expected s3://bucket/prefix"),
                      (["--s3-addressing-style=sideways"], "expected auto, path or virtual"),
                      (["--s3-endpoint-url", "ftp://x"], "expected an http(s):// URL")):
        result = CliRunner().invoke(cli, ["--config", str(config), "sbatch", *bad, "--dry-run",
                                          str(script)])
        assert result.exit_code == 2, result.output
        assert what in result.output
    result = CliRunner().invoke(cli, ["--config", str(config), "sbatch", "--checkpoint-root",
                                      "s3://b-1/x y", "--dry-run", str(script)])
    assert result.exit_code == 0, result.output


# -- the command line, as people type it (issue 16) -------------------------------------------
def _job(tmp_path: Path, **config: object) -> tuple[Path, Path]:
    path = tmp_path / "spot.yaml"
    path.write_text(yaml.safe_dump({
        "cluster": "c", "node_sets": [{"name": "spot", "provider": "local", "count": 2}],
        "partitions": [{"name": "spot", "node_sets": ["spot"]}], **config}))
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\nsrun hostname\n")
    return path, script


def _dry(path: Path, *words: str) -> dict:
    result = CliRunner().invoke(cli, ["--config", str(path), "sbatch", *words])
    assert result.exit_code == 0, result.output
    return read_envelope(result.stdout)


@pytest.mark.parametrize("order", [
    ["-p", "spot", "--dry-run", "--json", "{job}"],
    ["--json", "-p", "spot", "--dry-run", "{job}"],
    ["-p", "spot", "--dry", "--js", "--", "{job}"],  # abbreviations of slurm-spot's own too
])
def test_own_options_anywhere_before_the_script(tmp_path: Path, order: list[str]) -> None:
    path, script = _job(tmp_path)
    out = _dry(path, *[w.replace("{job}", str(script)) for w in order])
    assert out["argv"][1:] == ["-p", "spot", "<script>"]
    assert "#SBATCH --requeue\n" in out["script"] and "#SBATCH --signal=USR2@" in out["script"]


def test_words_after_the_script_are_the_scripts(tmp_path: Path) -> None:
    path, script = _job(tmp_path)
    out = _dry(path, "--dry-run", "--json", "-Hp", "spot", "-N2", str(script), "--dry-run", "-x")
    assert out["argv"][1:] == ["-Hp", "spot", "-N2", "<script>", "--dry-run", "-x"]
    assert "#SBATCH --nodes" not in out["script"]  # -N2 (attached, in a cluster) was seen


@pytest.mark.parametrize("torchrun", [False, True])
def test_a_double_dash_among_the_scripts_words_reaches_the_script(tmp_path: Path,
                                                                   torchrun: bool) -> None:
    """``train.py --cfg a -- --override b``: click drops the first ``--`` of a command's words;
    the script's own ``--`` must not be the one lost."""
    path, script = _job(tmp_path)
    words = ["--torchrun"] if torchrun else []
    out = _dry(path, *words, "--dry-run", "--json", str(script), "a", "--", "b")
    if torchrun:
        assert f"{script} a -- b" in out["script"]
    else:
        assert out["argv"][1:] == ["<script>", "a", "--", "b"]


def test_an_abbreviation_sbatch_resolves_keeps_requeue_and_signal(tmp_path: Path) -> None:
    """'--pars' is sbatch's --parsable: passed on as typed, and the value-less option does not
    swallow the script name (before, everything shifted and the --requeue/--signal were lost)."""
    path, script = _job(tmp_path)
    out = _dry(path, "--pars", "--dry-run", "--json", str(script))
    assert out["argv"][1:] == ["--pars", "<script>"]
    assert "#SBATCH --requeue\n" in out["script"] and "#SBATCH --signal=USR2@" in out["script"]
    assert _dry(path, "--no-k", "--dry-run", "--json", str(script))["argv"][1] == "--no-k"


@pytest.mark.parametrize(("words", "message"), [
    (["--par", "spot"], "--par is ambiguous: it abbreviates --parsable, --partition"),
    (["--frobnicate"], "--frobnicate: not an option of sbatch"),
    (["-P", "spot"], "-P (in '-P'): not an option of sbatch"),
    (["--parsable=yes"], "--parsable takes no value"),
    (["--nproc-per-node", "0"], "--nproc-per-node=0: expected a positive integer"),
    (["--no-"], "--no- is ambiguous: it abbreviates --no-kill, --no-preload, "
                "--no-replacements, --no-requeue"),
    (["--no-re"], "--no-re is ambiguous: it abbreviates --no-replacements, --no-requeue"),
    (["--no-req"], "--no-requeue (or SBATCH_NO_REQUEUE): jobs on spot nodes must be"),
])
def test_options_it_cannot_resolve_exit_2_naming_them(tmp_path: Path, words: list[str],
                                                      message: str) -> None:
    path, script = _job(tmp_path)
    result = CliRunner().invoke(cli, ["--config", str(path), "sbatch", "--dry-run", *words,
                                      str(script)])
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_missing_sbatch_is_a_clear_exit_2(tmp_path: Path) -> None:
    """Run as a user would (a subprocess): one error line naming the path, no traceback."""
    import subprocess
    import sys

    path, script = _job(tmp_path, slurm_bin_dir=str(tmp_path / "no-slurm"))
    proc = subprocess.run([sys.executable, "-m", "slurm_spot", "--config", str(path), "sbatch",
                           "-p", "spot", str(script)], capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 2, proc.stderr
    assert f"{tmp_path / 'no-slurm' / 'sbatch'}: no sbatch to submit with" in proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""


def test_a_script_with_bytes_that_are_not_utf8_is_submitted_byte_for_byte(tmp_path: Path) -> None:
    """sbatch takes any bytes (an old script's Latin-1 comment '# caf\\xe9'); `slurm-spot
    sbatch` refused it as 'not a text file (UTF-8)', exit 2. Now its directives are read and
    sbatch gets the script's own bytes back, with slurm-spot's lines added."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    seen = tmp_path / "seen.sh"
    (bin_dir / "sbatch").write_text(
        "#!/bin/sh\n"
        f'for a; do case "$a" in *batch.sh) cp "$a" {seen};; esac; done\n'
        'echo "Submitted batch job 42"\n')
    (bin_dir / "sbatch").chmod(0o755)
    path, script = _job(tmp_path, slurm_bin_dir=str(bin_dir))
    body = b"#SBATCH --signal=B:USR1@60\n# caf\xe9 \xff\nsrun echo \xe9t\xe9\n"
    script.write_bytes(b"#!/bin/bash\n" + body)
    result = CliRunner().invoke(cli, ["--config", str(path), "sbatch", str(script)])
    assert result.exit_code == 0, result.output
    assert "Submitted batch job 42" in result.output
    sent = seen.read_bytes()
    assert sent.startswith(b"#!/bin/bash\n# added by slurm-spot sbatch:\n#SBATCH --requeue")
    assert sent.endswith(body) and b"#SBATCH --signal=USR2" not in sent  # its own --signal
    dry = _dry(path, "--dry-run", "--json", str(script))
    assert "# caf\\xe9 \\xff" in dry["script"]  # shown escaped, valid JSON


@pytest.mark.parametrize(("cli", "env", "script_signal", "expected"), [
    (["--signal=USR1@60"], {}, "", "USR1"),
    (["-p", "spot", "--sig", "B:TERM@30"], {}, "#SBATCH --signal=USR2@90\n", "TERM"),
    ([], {"SBATCH_SIGNAL": "USR1@45"}, "#SBATCH --signal=URG@90\n", "USR1"),
    ([], {}, "#SBATCH --signal=USR1@60\n", "USR1"),
])
def test_the_watcher_reads_the_signal_sbatch_will_use(cli: list[str], env: dict,
                                                      script_signal: str, expected: str) -> None:
    """sbatch takes --signal from its command line first, then SBATCH_SIGNAL, then the script;
    the watcher reads only the script. A job submitted with `slurm-spot sbatch
    --signal=USR1@60` whose processes catch USR1 and USR2 (a framework's own handler) got
    spot.yaml's USR2 on a notice; the script now carries the signal sbatch uses, last."""
    from slurm_spot.jobs.interruption.signal_choice import ProcInfo, plan_signal

    script = "#!/bin/bash\n" + script_signal + "#SBATCH -t 10\nsrun python train.py\n"
    plan = plan_submission(script, "job.sh", cli, [], "USR2", 90, env=env)
    both = [ProcInfo(20, "0", "python", frozenset({10, 12, 15}), frozenset())]
    chosen = plan_signal(7, plan.script, both, "USR2")
    assert chosen.signal == expected, plan.script
    assert plan.script.endswith("srun python train.py\n")  # the body is untouched
    assert plan.options == cli  # sbatch still gets the user's options as typed


FAKE_SRUN = """#!/bin/bash
# records how the batch script runs its job step, one word a line; exits as the agent would
printf '%s\\n' "$@" > "$SRUN_ARGV"
exit "${SRUN_EXIT:-0}"
"""


@pytest.mark.parametrize("preload", [True, False], ids=["warm", "no-preload"])
@pytest.mark.parametrize("agent_exit", [0, 85])
def test_torchrun_script_runs_one_agent_per_node_warm_unless_no_preload(
        tmp_path: Path, preload: bool, agent_exit: int) -> None:
    """The generated batch script of a plain --torchrun job, run by bash with a recording
    srun: one task per node, the agent with --no-preload only when asked (warm worker start
    by default), the training script's path and arguments word for word; the batch script
    exits with the agent's status (the requeue code is said, for RequeueExit) and its first
    line has the time it started (the demo's start-up breakdown reads it)."""
    import subprocess

    config = tmp_path / "spot.yaml"
    config.write_text(yaml.safe_dump({
        "cluster": "c", "node_sets": [{"name": "spot", "provider": "local", "count": 2}],
        "partitions": [{"name": "spot", "node_sets": ["spot"]}],
        "preemption": {"signal": "SIGUSR2", "lead_s": 120}}))
    train = tmp_path / "train.py"
    train.write_text("print('hi')\n")
    words = ["--config", str(config), "sbatch", "--torchrun", "--dry-run", "--json", "-N", "2",
             *([] if preload else ["--no-preload"]), str(train), "--lr", "1 2"]
    result = CliRunner().invoke(cli, words)
    assert result.exit_code == 0, result.output
    script = tmp_path / "batch.sh"
    script.write_text(read_envelope(result.output)["script"])
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(FAKE_SRUN)
    (bin_dir / "srun").chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "SRUN_ARGV": str(tmp_path / "argv"),
           "SRUN_EXIT": str(agent_exit), "SLURM_JOB_ID": "42", "SLURM_RESTART_COUNT": "3",
           "SLURM_JOB_NODELIST": "spot-[1-2]", "SLURM_JOB_NUM_NODES": "2"}
    proc = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True,
                          timeout=30, check=False)
    assert proc.returncode == agent_exit, proc.stderr
    first = proc.stdout.splitlines()[0]
    assert first.startswith("slurm-spot: job 42 restart 3 on spot-[1-2] at ")
    assert abs(float(first.rsplit(" ", 1)[1]) - time.time()) < 30
    assert ("exiting 85 for requeue" in proc.stdout) == (agent_exit == 85)
    argv = (tmp_path / "argv").read_text().splitlines()
    agent = argv.index("slurm_spot.jobs.injob.torchrun_agent")
    assert argv[:3] == ["--nodes=2", "--ntasks-per-node=1", "--kill-on-bad-exit=0"]
    assert argv[agent + 1:] == ["--nproc-per-node=1", *([] if preload else ["--no-preload"]),
                                "--", str(train), "--lr", "1 2"]
