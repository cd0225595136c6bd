"""The scale-lr batch policy of elastic training (a fixed per-rank batch, the learning rate
scaled linearly with the world size, the epoch position in samples): the pure data-order
functions, and the example script run for real (torch on CPU, gloo) across a change of world
size and from a checkpoint written before the position in samples existed."""

from __future__ import annotations

import importlib.util
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from slurm_spot.checkpoint.checkpointer import Checkpointer, TrainState
from slurm_spot.checkpoint.elastic import (
    SAMPLES_KEY,
    batches_done,
    epoch_order,
    micro_batches,
    next_samples,
    rank_share,
    samples_done,
    scaled_lr,
)
from tests.elastic_runs import EXAMPLE, check_sample_log

SAMPLES = 1797  # scikit-learn's digits


def test_lr_follows_the_world_linearly_from_the_reference() -> None:
    assert scaled_lr(0.05, 2, 1) == pytest.approx(0.1)
    assert scaled_lr(0.05, 1, 2) == pytest.approx(0.025)
    assert scaled_lr(0.3, 4, 4) == pytest.approx(0.3)
    for bad in ((0.05, 0, 1), (0.05, 1, 0), (0.0, 1, 1), (-1.0, 1, 1), (float("inf"), 1, 1),
                (float("nan"), 1, 1)):
        with pytest.raises(ValueError):
            scaled_lr(*bad)


def test_every_sample_once_per_epoch_when_the_world_changes_mid_epoch() -> None:
    """Worlds drawn at random between steps, the position saved and read back in samples
    (as a checkpoint holds it) at each change: every epoch uses each sample exactly once,
    full steps give each rank exactly the per-rank batch."""
    rng = random.Random(3)
    per_rank = 32
    for epoch in range(3):
        order = epoch_order(SAMPLES, epoch, seed=5)
        used: list[int] = []
        extra: dict[str, int] = {}
        world = 2
        while samples_done(extra, 0, 96) < SAMPLES:
            if rng.random() < 0.3:  # a node leaves or joins: resume from the saved position
                world = rng.choice([1, 2, 3, 5, 19])
            done = samples_done(extra, 0, 96)
            batch = next_samples(order, done, per_rank, world)
            shares = [rank_share(batch, r, world) for r in range(world)]
            if done + per_rank * world <= SAMPLES:
                assert [len(s) for s in shares] == [per_rank] * world
            for share in shares:
                for part in micro_batches(share, 10):
                    used.extend(part)
            extra[SAMPLES_KEY] = done + len(batch)
        assert sorted(used) == list(range(SAMPLES)), f"epoch {epoch}"
        assert extra[SAMPLES_KEY] == SAMPLES


def test_position_of_a_checkpoint_without_samples_is_its_global_batches() -> None:
    assert samples_done({}, 7, 96) == 672  # written by keep-global before the key existed
    assert samples_done({SAMPLES_KEY: 100, "other": 1}, 7, 96) == 100
    for bad in (-1, 1.5, "3", True):
        with pytest.raises(ValueError, match=SAMPLES_KEY):
            samples_done({SAMPLES_KEY: bad}, 0, 96)
    order = epoch_order(SAMPLES, 0, 0)
    assert next_samples(order, 1790, 4, 3) == order[1790:]  # the epoch's tail: what is left
    for done in (-1, SAMPLES):
        with pytest.raises(ValueError, match="position"):
            next_samples(order, done, 4, 3)
    with pytest.raises(ValueError, match="per-rank batch 0"):
        next_samples(order, 0, 0, 3)


def test_scale_lr_position_back_to_keep_global_only_on_a_global_batch_boundary() -> None:
    assert batches_done(192, 96, SAMPLES) == 2
    assert batches_done(SAMPLES, 96, SAMPLES) == SAMPLES // 96  # the epoch is over
    with pytest.raises(ValueError, match="not a whole number of global batches of 96"):
        batches_done(100, 96, SAMPLES)


def test_keep_global_position_past_the_last_full_global_batch_is_the_epochs_end() -> None:
    """No full global batch is left after the position (keep-global drops such a tail): the
    epoch is over, whether the position is a whole number of batches or not. A keep-global
    checkpoint written at the end of an epoch (18 x 96 = 1728 samples) resumed with
    --global-batch 100 (17 per epoch), or scale-lr stopped 1750 samples in."""
    assert batches_done(1728, 100, SAMPLES) == 17
    assert batches_done(1750, 96, SAMPLES) == 18
    assert batches_done(1700, 100, SAMPLES) == 17
    with pytest.raises(ValueError, match="not a whole number of global batches of 100"):
        batches_done(1650, 100, SAMPLES)


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("SLURM", "TORCHELASTIC")) and k not in (
                "WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}


def _run(ranks: int, ckdir: Path, *words: str) -> tuple[int, list[dict], str]:
    """The example on ``ranks`` processes (torchrun --standalone, gloo), or as one plain
    process when ``ranks`` is 0. Returns (exit code, rank 0's events, stderr)."""
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone",
              "--nproc-per-node", str(ranks)] if ranks else [sys.executable]
    proc = subprocess.run([*launch, str(EXAMPLE), "--checkpoint-dir", str(ckdir), *words],
                          capture_output=True, text=True, timeout=600, env=_env())
    events = [json.loads(ln) for ln in proc.stdout.splitlines() if ln.startswith("{")]
    return proc.returncode, events, proc.stderr


def test_example_scale_lr_resumed_with_another_world_rescales_lr_and_uses_each_sample_once(
        tmp_path: Path) -> None:
    """World 2 for 10 steps of 2 x 32 samples (lr 2 x 0.05), its checkpoint resumed with
    world 1 (steps of 32, lr 0.05) past the end of epoch 0: the resumed run starts at sample
    640, the epoch's samples are each used exactly once, no step runs twice."""
    ck, log = tmp_path / "ck", tmp_path / "samples.jsonl"
    common = ["--batch-policy", "scale-lr", "--batch-per-rank", "32", "--lr", "0.05",
              "--reference-world", "1", "--checkpoint-every", "5", "--log-every", "1",
              "--sample-log", str(log)]
    rc, first, err = _run(2, ck, *common, "--steps", "10")
    assert rc == 0, err[-3000:]
    assert first[0]["event"] == "start" and first[0]["world_size"] == 2
    assert first[0]["lr"] == pytest.approx(0.1) and first[0]["global_batch"] == 64
    assert {e["lr"] for e in first if e["event"] == "step"} == {0.1}
    # 1797 - 640 = 1157 samples left in epoch 0: 36 steps of 32 and one of 5; then 3 more
    rc, second, err = _run(1, ck, *common, "--steps", "50")
    assert rc == 0, err[-3000:]
    resume = second[0]
    assert resume["event"] == "resume" and resume["step"] == 10 and resume["world_size"] == 1
    assert resume["samples_in_epoch"] == 640 and resume["lr"] == pytest.approx(0.05)
    assert {e["lr"] for e in second if e["event"] == "step"} == {0.05}
    assert second[-1]["event"] == "done" and second[-1]["step"] == 50
    per_epoch = check_sample_log(log, 50)
    assert sorted(per_epoch[0]) == list(range(SAMPLES))  # every sample once in epoch 0
    assert len(per_epoch[1]) == 3 * 32
    rows = [json.loads(ln) for ln in log.read_text().splitlines()]
    assert {(r["world"], r["lr"]) for r in rows if r["step"] <= 10} == {(2, 0.1)}
    assert {(r["world"], r["lr"]) for r in rows if r["step"] > 10} == {(1, 0.05)}


def _old_checkpoint(directory: Path, batches: int) -> None:
    """A checkpoint as the example wrote it before the position in samples existed: keep-
    global, ``batches`` global batches into epoch 0, ``extra`` empty."""
    spec = importlib.util.spec_from_file_location("train_elastic_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    model = example.make_model()
    state = TrainState(model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                       step=batches, batch_in_epoch=batches)
    Checkpointer(directory, keep=2).save(state)


@pytest.mark.parametrize("policy,expect", [("keep-global", slice(672, 768)),
                                           ("scale-lr", slice(672, 704))])
def test_example_resumes_a_checkpoint_written_before_the_sample_position(
        tmp_path: Path, policy: str, expect: slice) -> None:
    _old_checkpoint(tmp_path / "ck", batches=7)
    log = tmp_path / "samples.jsonl"
    rc, events, err = _run(0, tmp_path / "ck", "--batch-policy", policy, "--steps", "8",
                           "--sample-log", str(log))
    assert rc == 0, err[-3000:]
    assert events[0]["event"] == "resume" and events[0]["samples_in_epoch"] == 672
    (row,) = [json.loads(ln) for ln in log.read_text().splitlines()]
    assert row["step"] == 8 and row["samples"] == epoch_order(SAMPLES, 0, 0)[expect]


def test_example_refuses_keep_global_in_the_middle_of_a_global_batch(tmp_path: Path) -> None:
    """scale-lr stopped 64 samples into the epoch; keep-global's global batch 0 is samples
    0..95 of the order: resuming there would use 64 of them twice, so exit 2 saying why."""
    rc, _, err = _run(0, tmp_path / "ck", "--batch-policy", "scale-lr", "--steps", "2",
                      "--checkpoint-every", "2")
    assert rc == 0, err[-3000:]
    rc, events, err = _run(0, tmp_path / "ck", "--steps", "4")
    assert rc == 2 and events == []
    assert "64 samples into its epoch, not a whole number of global batches of 96" in err
    rc, events, err = _run(0, tmp_path / "ck", "--steps", "4", "--global-batch", "32")
    assert rc == 0 and events[0]["event"] == "resume", err[-3000:]  # 64 = 2 x 32: fine


@pytest.mark.parametrize("words", [["--batch-per-rank", "0"], ["--batch-per-rank", "1798"],
                                   ["--reference-world", "0"], ["--lr", "0"], ["--lr", "nan"],
                                   ["--batch-policy", "scale"], ["--step-sleep", "-1"],
                                   ["--step-sleep", "nan"], ["--pg-timeout", "0"],
                                   ["--pg-timeout", "nan"]])
def test_example_refuses_bad_scale_lr_options_with_a_usage_error(tmp_path: Path,
                                                                 words: list[str]) -> None:
    proc = subprocess.run([sys.executable, str(EXAMPLE), "--checkpoint-dir", str(tmp_path),
                           *words], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert f"argument {words[0]}" in proc.stderr and "Traceback" not in proc.stderr
    assert not any(tmp_path.iterdir())  # nothing started, nothing written


def test_example_keep_global_resumed_with_another_global_batch_uses_each_sample_once(
        tmp_path: Path) -> None:
    """keep-global with --global-batch 96 for 2 steps (192 samples), resumed with
    --global-batch 32: the resumed run goes on at sample 192 (global batch 6 of 32), not at
    its global batch 2 (samples 64..95, already used)."""
    ck, log = tmp_path / "ck", tmp_path / "samples.jsonl"
    rc, _, err = _run(0, ck, "--steps", "2", "--checkpoint-every", "2", "--sample-log", str(log))
    assert rc == 0, err[-3000:]
    rc, events, err = _run(0, ck, "--steps", "4", "--global-batch", "32",
                           "--sample-log", str(log))
    assert rc == 0, err[-3000:]
    assert events[0]["event"] == "resume" and events[0]["samples_in_epoch"] == 192
    check_sample_log(log, 4)
    rows = [json.loads(ln) for ln in log.read_text().splitlines()]
    assert [r["samples"] for r in rows if r["step"] == 3] == [epoch_order(SAMPLES, 0, 0)[192:224]]
