"""The per-audience pages (issue 16): linked from the README, and everything they name exists:
files, slurm-spot commands and their options, the checkpoint API, metric names."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import pytest

from slurm_spot.cli import cli
from slurm_spot.reconcile.metrics import METRIC_NAMES

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "docs" / "admin.md", ROOT / "docs" / "ml-engineer.md"]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
REPO_PATH = re.compile(r"`((?:examples|tests|slurm_spot|ansible|docs|templates|benchmarks)/[^`\s]+)`")


def command_lines(text: str) -> list[list[str]]:
    """argv of each ``slurm-spot ...`` line in the page's bash blocks (comments dropped)."""
    out = []
    for lang, body in FENCE.findall(text):
        if lang not in ("bash", "sh", "console"):
            continue
        for line in body.splitlines():
            words = shlex.split(line, comments=True)
            if words and words[0] == "slurm-spot":
                out.append(words[1:])
    return out


def resolve(argv: list[str]) -> tuple[click.Command, list[str]]:
    """The click command an argv names (through groups), and the words after it."""
    ctx = click.Context(cli)
    command: click.Command = cli
    words = list(argv)
    while isinstance(command, click.Group) and words and not words[0].startswith("-"):
        sub = command.get_command(ctx, words[0])
        assert sub is not None, f"no command {words[0]!r} in 'slurm-spot {' '.join(argv)}'"
        command, words = sub, words[1:]
    return command, words


def test_readme_links_both_pages() -> None:
    readme = (ROOT / "README.md").read_text()
    for page in PAGES:
        assert f"]({page.relative_to(ROOT)})" in readme
        assert page.exists()


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_file_and_link_a_page_names_exists(page: Path) -> None:
    text = page.read_text()
    for link in re.findall(r"\]\(([^)#]+)\)", text):
        assert (page.parent / link).exists(), link
    for path in REPO_PATH.findall(text):
        assert (ROOT / path.rstrip(".,")).exists(), path


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_command_and_option_a_page_shows_exists(page: Path) -> None:
    lines = command_lines(page.read_text())
    assert lines
    for argv in lines:
        command, words = resolve(argv)
        if "--" in words:  # what follows is the command it runs (lighthouse-relay -- CMD)
            words = words[:words.index("--")]
        options = {o for p in command.params for o in (*p.opts, *p.secondary_opts)}
        if command.name == "sbatch":  # its own options; the rest go to sbatch
            options |= {"--torchrun", "--nproc-per-node", "--dry-run", "--json", "--python",
                        "--checkpoint-root", "--s3-endpoint-url", "--s3-addressing-style",
                        "--elastic", "--rendezvous", "--join-timeout"}
            words = [w for w in words if w in options or not w.startswith("--")
                     or w.split("=")[0] in options]
        for word in words:
            if word.startswith("--"):
                assert word.split("=")[0] in options, f"slurm-spot {' '.join(argv)}: {word}"


def test_the_checkpoint_example_uses_the_real_api() -> None:
    text = (ROOT / "docs" / "ml-engineer.md").read_text()
    (code,) = [body for lang, body in FENCE.findall(text)
               if lang == "python" and "slurm_spot.checkpoint" in body]
    compile(code, "ml-engineer.md", "exec")
    import slurm_spot.checkpoint as ckpt

    imported = re.search(r"from slurm_spot\.checkpoint import (.+)", code)
    assert imported is not None
    for name in imported.group(1).split(", "):
        assert hasattr(ckpt, name), name
    for owner, attribute in (("PreemptionHandler", "install"), ("PreemptionHandler", "should_stop"),
                             ("PreemptionHandler", "exit_for_requeue"),
                             ("PreemptionHandler", "worker_init_fn"), ("SkipSampler", "skip"),
                             ("Checkpointer", "restore"), ("Checkpointer", "save"),
                             ("Checkpointer", "save_async")):
        assert hasattr(getattr(ckpt, owner), attribute), f"{owner}.{attribute}"
        assert f".{attribute}(" in text or f"={attribute}" in text or f".{attribute}" in text


def test_the_fault_tolerant_example_uses_torchfts_real_api() -> None:
    """The torchft loop of docs/ml-engineer.md compiles and names what torchft 0.2.0 has (the
    ``ft`` extra)."""
    import torchft
    import torchft.optim

    text = (ROOT / "docs" / "ml-engineer.md").read_text()
    (code,) = [body for lang, body in FENCE.findall(text)
               if lang == "python" and "torchft" in body]
    compile(code, "ml-engineer.md", "exec")
    assert hasattr(torchft, "Manager") and hasattr(torchft, "ProcessGroupGloo")
    assert hasattr(torchft.optim, "OptimizerWrapper")
    for attribute in ("allreduce", "current_step", "participating_rank", "num_participants"):
        assert hasattr(torchft.Manager, attribute), attribute
        assert f"manager.{attribute}(" in code, attribute


def test_the_admin_page_names_only_exported_metrics() -> None:
    named = set(re.findall(r"\bslurm_spot_[a-z_]+\b", (ROOT / "docs" / "admin.md").read_text()))
    metrics = {n for n in named if not n.startswith(("slurm_spot_reconcile_metrics",
                                                     "slurm_spot_credentials"))}
    assert metrics <= set(METRIC_NAMES), sorted(metrics - set(METRIC_NAMES))
    assert set(METRIC_NAMES) <= metrics  # and every one is explained


def test_the_admin_pages_regions_and_clouds_example_passes_config_check(tmp_path: Path) -> None:
    """docs/admin.md, "Node sets on several regions and clouds": the spot.yaml it shows is one
    ``slurm-spot config check`` accepts, and it is what the text says: a partition over two AWS
    regions and one over AWS and GCP (issue 24, part 4)."""
    import textwrap

    from click.testing import CliRunner

    from slurm_spot.config import load_config

    text = (ROOT / "docs" / "admin.md").read_text()
    section = text.split("**Node sets on several regions and clouds.**", 1)[1]
    found = re.search(r"^( *)```yaml\n(.*?)^\1```", section, re.S | re.M)
    assert found, "no yaml block in the section"
    path = tmp_path / "spot.yaml"
    path.write_text(textwrap.dedent(found.group(2)))
    result = CliRunner().invoke(cli, ["--config", str(path), "config", "check"])
    assert result.exit_code == 0, result.output
    assert "OK (24 nodes in 3 node set(s), partitions: gpu, anycloud)" in result.output
    config = load_config(path)

    def where(partition: str) -> set[tuple[str, str]]:
        (part,) = [p for p in config.partitions if p.name == partition]
        found = set()
        for name in part.node_sets:
            settings = config.providers[config.node_set(name).provider]
            found.add((settings.type, getattr(settings, "region", "")))
        return found

    assert where("gpu") == {("aws", "us-east-1"), ("aws", "us-west-2")}
    assert {kind for kind, _ in where("anycloud")} == {"aws", "gcp"}
