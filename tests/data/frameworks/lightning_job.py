"""A Lightning job as its users write it for Slurm: the default ``SLURMEnvironment``
(``auto_requeue=True``) saves an ``hpc_ckpt_*.ckpt`` on SIGUSR1, runs ``scontrol requeue``,
and the requeued job resumes from that checkpoint. A tiny CPU model; each training step is
logged to ``<workdir>/events.jsonl``. Usage: ``python lightning_job.py WORKDIR STEPS [SIGNAL]``;
SIGNAL (``USR2``) is given to ``SLURMEnvironment(requeue_signal=...)``, as users who submit
with ``--signal=USR2@...`` write it (default: Lightning's own, SIGUSR1)."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset


def event(workdir: Path, name: str, **fields: object) -> None:
    with open(workdir / "events.jsonl", "a") as fh:
        fh.write(json.dumps({"event": name, "time": time.time(), **fields}) + "\n")


class Tiny(L.LightningModule):
    def __init__(self, workdir: Path) -> None:
        super().__init__()
        self.workdir = workdir
        self.layer = torch.nn.Linear(4, 1)

    def on_train_start(self) -> None:
        # What its user reads in the job's output to see where training (re)started.
        print(f"training from step {self.global_step} (epoch {self.current_epoch})", flush=True)
        event(self.workdir, "start", step=self.global_step,
              restart=int(os.environ.get("SLURM_RESTART_COUNT", 0)),
              slurm=type(self.trainer._accelerator_connector.cluster_environment).__name__)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], _: int) -> torch.Tensor:
        time.sleep(0.25)
        x, y = batch
        event(self.workdir, "step", step=self.global_step + 1)
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main() -> None:
    workdir, steps = Path(sys.argv[1]), int(sys.argv[2])
    plugins = []
    if len(sys.argv) > 3:
        from lightning.pytorch.plugins.environments import SLURMEnvironment

        plugins.append(SLURMEnvironment(requeue_signal=getattr(signal, f"SIG{sys.argv[3]}")))
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    trainer = L.Trainer(max_steps=steps, default_root_dir=workdir, accelerator="cpu", devices=1,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, plugins=plugins)
    trainer.fit(Tiny(workdir), DataLoader(data, batch_size=4))
    event(workdir, "done", step=trainer.global_step)


if __name__ == "__main__":
    main()
