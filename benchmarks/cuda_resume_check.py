"""Is a resumed run bit-exact on a GPU? (checkpoint/resume exactness, CUDA)

Trains a small conv net with dropout (so the CUDA RNG matters), AdamW and a StepLR schedule on
synthetic data whose order comes from a seeded generator, for ``--steps`` steps:

1. ``reference``: uninterrupted, in one process;
2. ``interrupted``: stops after ``--stop-at`` steps and saves through
   ``slurm_spot.checkpoint.Checkpointer`` (model, optimizer, scheduler, step, every RNG
   state, the data generator), then a *new process* restores it and finishes.

It prints one JSON object: the SHA-256 of the final weights of both runs and whether they are
equal, with the device name. Deterministic algorithms are on (``CUBLAS_WORKSPACE_CONFIG``).

    python benchmarks/cuda_resume_check.py [--device cuda] [--steps 300] [--stop-at 137]
    python benchmarks/cuda_resume_check.py --smoke   # CPU, 6 steps, stop at 3
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch

from slurm_spot.checkpoint import Checkpointer, TrainState


def build(device: str) -> tuple[torch.nn.Module, torch.optim.Optimizer, object, torch.Generator]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.Dropout(0.2),
        torch.nn.Flatten(), torch.nn.Linear(16 * 16 * 16, 64), torch.nn.ReLU(),
        torch.nn.Dropout(0.3), torch.nn.Linear(64, 10),
    ).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=50, gamma=0.5)
    data_order = torch.Generator().manual_seed(1)
    return model, optimizer, scheduler, data_order


def train(device: str, steps: int, stop_at: int | None, ckpt: Path | None) -> str:
    torch.use_deterministic_algorithms(True)
    model, optimizer, scheduler, data_order = build(device)
    images = torch.randn(512, 3, 16, 16, generator=torch.Generator().manual_seed(2))
    labels = torch.randint(0, 10, (512,), generator=torch.Generator().manual_seed(3))
    state = TrainState(model, optimizer, scheduler, generators={"data": data_order})
    checkpointer = Checkpointer(ckpt) if ckpt else None
    if checkpointer is not None:
        checkpointer.restore(state)  # nothing the first time
    while state.step < steps:
        index = torch.randint(0, 512, (32,), generator=data_order)
        x, y = images[index].to(device), labels[index].to(device)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        scheduler.step()
        state.step += 1
        if checkpointer is not None and stop_at is not None and state.step == stop_at:
            checkpointer.save(state)
            return "stopped"
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--stop-at", type=int, default=137)
    parser.add_argument("--phase", choices=["all", "reference", "part"], default="all")
    parser.add_argument("--checkpoint-dir", type=Path)
    parser.add_argument("--smoke", action="store_true", help="CPU, 6 steps, stop at 3")
    args = parser.parse_args()
    if args.smoke:
        args.device, args.steps, args.stop_at = "cpu", 6, 3
    if args.phase == "reference":
        print(train(args.device, args.steps, None, None))
        return 0
    if args.phase == "part":
        print(train(args.device, args.steps, args.stop_at, args.checkpoint_dir))
        return 0
    def run(*extra: str) -> str:
        argv = [sys.executable, __file__, "--device", args.device, "--steps", str(args.steps),
                "--stop-at", str(args.stop_at), *extra]
        return subprocess.run(argv, check=True, capture_output=True,  # noqa: S603 - argv list
                              text=True).stdout.strip()

    with tempfile.TemporaryDirectory() as folder:
        reference = run("--phase", "reference")
        first = run("--phase", "part", "--checkpoint-dir", folder)
        resumed = run("--phase", "part", "--checkpoint-dir", folder)
    result = {
        "device": torch.cuda.get_device_name() if args.device == "cuda" else args.device,
        "torch": torch.__version__, "steps": args.steps, "interrupted_at": args.stop_at,
        "first_part": first, "reference_sha256": reference, "resumed_sha256": resumed,
        "exact_resume": reference == resumed,
    }
    print(json.dumps(result, indent=2))
    return 0 if result["exact_resume"] else 1


if __name__ == "__main__":
    sys.exit(main())
