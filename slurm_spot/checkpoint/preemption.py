"""Preemption signals in a training loop: flag, agree, checkpoint, requeue, exit.

::

    handler = PreemptionHandler().install()       # SIGUSR2 (or SLURM_SPOT_PREEMPT_SIGNAL) + SIGTERM
    loader = DataLoader(..., worker_init_fn=handler.worker_init_fn)
    for batch in loader:
        ...one step...
        if handler.should_stop():                  # collective: every rank, every step
            checkpointer.save(state)
            handler.exit_for_requeue()             # never returns

- The signal handler only records that a signal came (async-signal safe: no I/O, no locks).
- :meth:`PreemptionHandler.should_stop` all-reduces the flag (MAX) over the ranks when
  torch.distributed is initialised, so every rank stops after the same step even if the
  signal reached only some of them. Call it at the same step boundaries on all ranks.
- DataLoader workers are processes of the job step too, so Slurm signals them as well; give the
  DataLoader ``worker_init_fn=handler.worker_init_fn`` (or :func:`ignore_signals_in_worker`)
  so they ignore the preemption signal and SIGTERM instead of dying (the default action) and
  breaking the next batch. They still end with their parent through the DataLoader's watchdog.
- :meth:`PreemptionHandler.exit_for_requeue`: rank 0 alone asks Slurm to requeue the job, unless
  it is already pending/requeued (the node-side watcher may have done it); then every rank exits
  with the requeue exit code (default 85, ``SLURM_SPOT_REQUEUE_EXIT_CODE``). Outside Slurm it
  only exits.

Under torchrun the agent should ignore the preemption signal (``trap '' USR2`` before ``exec
torchrun``), and it reports workers exiting 85 as a failure (exit 1) after they have exited.
"""

from __future__ import annotations

import atexit
import functools
import gc
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from types import FrameType
from typing import Any, NoReturn

from slurm_spot.contract import jobenv
from slurm_spot.errors import BadInputError, SlurmCommandError
from slurm_spot.slurm.client import SlurmClient

log = logging.getLogger(__name__)
_UNCATCHABLE = {int(signal.SIGKILL), int(signal.SIGSTOP)}
_ALREADY_REQUEUED = {"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"}


class PreemptionSignalMismatch(BadInputError, ValueError):
    """The signal this process would handle is not the one sbatch was told to send."""


def _handled_signals(spec: jobenv.SignalSpec, handle_sigterm: bool) -> tuple[int, ...]:
    numbers = [spec.number]
    if handle_sigterm and spec.number != int(signal.SIGTERM):
        numbers.append(int(signal.SIGTERM))
    return tuple(numbers)


def ignore_signals_in_worker(worker_id: int, signals: Sequence[int] | None = None) -> None:
    """A DataLoader ``worker_init_fn``: ignore ``signals`` in this worker process.

    Args:
        worker_id: passed by the DataLoader (unused).
        signals: signal numbers; default the preemption signal from
            ``SLURM_SPOT_PREEMPT_SIGNAL`` (else SIGUSR2) and SIGTERM.
    """
    del worker_id
    if signals is None:
        signals = _handled_signals(jobenv.preemption_signal(os.environ), handle_sigterm=True)
    for number in signals:
        signal.signal(number, signal.SIG_IGN)


def _default_client(env: Mapping[str, str]) -> SlurmClient:
    scontrol = jobenv.find_scontrol({"PATH": os.environ.get("PATH", ""), **env})
    return SlurmClient(bin_dir=os.path.dirname(scontrol) if scontrol else "/usr/bin")


class PreemptionHandler:
    """Turns the preemption signal (and SIGTERM) into a flag that all ranks agree on.

    Args:
        signal: the signal to handle (``"USR2"``, ``12``, ``"B:USR2@90"``, ...); default
            ``SLURM_SPOT_PREEMPT_SIGNAL``, else SIGUSR2.
        env: the job environment (default ``os.environ``).
        handle_sigterm: also turn SIGTERM into the flag (Slurm sends it before killing a job).
        client: Slurm access for the requeue (default: the CLI tools found on ``PATH``).
        exit_code: the requeue exit code; default ``SLURM_SPOT_REQUEUE_EXIT_CODE``, else 85.
        process_group: the torch.distributed group to agree over (default: the world).

    Raises:
        PreemptionSignalMismatch: ``signal`` is given and differs from
            ``SLURM_SPOT_PREEMPT_SIGNAL`` (Slurm would send a signal nobody handles).
        JobEnvError: a malformed signal, exit code or Slurm variable; or a signal that cannot
            be caught (KILL, STOP).
    """

    def __init__(
        self,
        signal: str | int | None = None,
        *,
        env: Mapping[str, str] | None = None,
        handle_sigterm: bool = True,
        client: SlurmClient | None = None,
        exit_code: int | None = None,
        process_group: Any = None,
    ) -> None:
        self.env: Mapping[str, str] = os.environ if env is None else env
        announced = self.env.get(jobenv.ENV_PREEMPT_SIGNAL, "").strip()
        spec = jobenv.preemption_signal(self.env)
        if signal is not None:
            explicit = jobenv.parse_signal(signal)
            if announced and explicit.number != spec.number:
                raise PreemptionSignalMismatch(
                    f"this process would handle SIG{explicit.name} but sbatch was told to send "
                    f"SIG{spec.name} ({jobenv.ENV_PREEMPT_SIGNAL}={announced!r}); the job would "
                    "be killed instead of checkpointing. Use the same signal in both places."
                )
            spec = explicit
        if spec.number in _UNCATCHABLE:
            raise jobenv.JobEnvError(f"SIG{spec.name} cannot be caught; use USR2 (the default)")
        if spec.batch_only and self.env.get("SLURM_STEP_ID", "").strip():
            log.warning("%s=%r has the B: flag: Slurm signals only the batch shell at the time "
                        "limit, not this step", jobenv.ENV_PREEMPT_SIGNAL, announced)
        self.spec = spec
        self.signals = _handled_signals(spec, handle_sigterm)
        self.exit_code = jobenv.requeue_exit_code(self.env) if exit_code is None else exit_code
        self.group = process_group
        self._client = client
        if client is None and jobenv.is_slurm_job(self.env) and jobenv.find_scontrol(
                {"PATH": os.environ.get("PATH", ""), **self.env}) is None:
            # said now, at the start of training, not when the requeue fails at preemption
            log.warning("scontrol is neither on this job's PATH nor in %s: rank 0 cannot "
                        "requeue this job on preemption; add Slurm's bin directory to PATH "
                        "in the batch script", jobenv.ENV_SLURM_BIN_DIR)
        self._flag = False
        self._received: int | None = None
        self._received_at: float | None = None
        self._previous: dict[int, Any] = {}
        self.requeue_outcome = ""

    # -- signals ------------------------------------------------------------------------------
    def install(self) -> PreemptionHandler:
        """Install the handlers (main thread only); returns ``self``.

        Raises:
            RuntimeError: called from another thread (Python delivers signals to the main one).
        """
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("PreemptionHandler.install() must run in the main thread")
        for number in self.signals:
            if number not in self._previous:
                self._previous[number] = signal.signal(number, self._on_signal)
        return self

    def uninstall(self) -> None:
        """Put back the handlers that were there before :meth:`install`."""
        for number, previous in self._previous.items():
            signal.signal(number, previous if previous is not None else signal.SIG_DFL)
        self._previous.clear()

    def __enter__(self) -> PreemptionHandler:
        return self.install()

    def __exit__(self, *exc: object) -> None:
        self.uninstall()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        # Only plain assignments: this runs between two bytecodes of whatever was executing.
        self._received = signum
        self._received_at = time.monotonic()
        self._flag = True

    def request_stop(self) -> None:
        """Set the flag from code (a time budget, a test), as a signal would."""
        self._flag = True

    @property
    def stop_requested(self) -> bool:
        """This rank's flag (no communication)."""
        return self._flag

    @property
    def received_signal(self) -> int | None:
        """The number of the last signal received, or None."""
        return self._received

    @property
    def worker_init_fn(self) -> Callable[[int], None]:
        """A picklable DataLoader ``worker_init_fn`` that ignores :attr:`signals`."""
        return functools.partial(ignore_signals_in_worker, signals=self.signals)

    # -- agreement ----------------------------------------------------------------------------
    def should_stop(self) -> bool:
        """True if any rank got the signal: an all-reduce (MAX) of the flag when
        torch.distributed is initialised, else this process's flag. Collective: call it on
        every rank at the same step boundaries. Once True, the flag stays set.

        With torch.distributed the answer is the all-reduced value only, the same on every
        rank: a signal that arrives after this rank's flag went into the all-reduce (while it
        waits in it, or before the result is read) sets the flag for the next boundary, never
        this one's answer; otherwise that rank alone would stop and save while the others go
        on to the next step, and each would wait for the other's collective until a timeout.
        """
        dist = _initialised_dist()
        if dist is None:
            return self._flag
        import torch

        backend = str(dist.get_backend(self.group))
        device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else None
        flag = torch.tensor([1 if self._flag else 0], dtype=torch.int32, device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.group)
        agreed = bool(int(flag.item()))
        if agreed:
            self._flag = True
        return agreed

    # -- exit ---------------------------------------------------------------------------------
    def notice_left_s(self, default_lead_s: float = 60.0) -> float:
        """Seconds left of the notice: the signal's lead (``@N`` of the sbatch ``--signal``
        value, else sbatch's default of 60 s: sbatch(1)) minus the time since this rank got
        the signal (0 elapsed when it was not signalled itself)."""
        lead = float(self.spec.lead_s if self.spec.lead_s is not None else default_lead_s)
        since = self._received_at
        return max(0.0, lead - (time.monotonic() - since if since is not None else 0.0))

    def checkpoint_and_exit(self, checkpointer: Any, state: Any) -> NoReturn:
        """On a preemption: let the asynchronous save in flight commit within the notice left
        (:meth:`notice_left_s`), save the final ``state``, then :meth:`exit_for_requeue`.

        Collective: every rank calls it after :meth:`should_stop` returned True. If the final
        save fails the previous committed checkpoint remains and the job is still requeued
        (the error is logged).

        Args:
            checkpointer: a :class:`~slurm_spot.checkpoint.checkpointer.Checkpointer`.
            state: its :class:`~slurm_spot.checkpoint.trainstate.TrainState`.
        """
        from slurm_spot.checkpoint.files import CheckpointError

        try:
            checkpointer.save_final(state, within_s=self.notice_left_s())
        except CheckpointError as exc:
            log.error("slurm-spot: the final checkpoint failed, the job resumes from the "
                      "previous one: %s", exc)
        self.exit_for_requeue()

    def exit_for_requeue(self) -> NoReturn:
        """Requeue (rank 0 only, if needed), wait for every rank, exit with :attr:`exit_code`.

        Call it after the checkpoint is committed. A failing Slurm command is logged, not
        raised: the exit code still tells Slurm (``RequeueExit``) or the batch script what to do.
        The handled signals are ignored from then on, so that a launcher's SIGTERM cannot
        change the exit status while the interpreter shuts down, and ``gc.freeze`` is
        registered with ``atexit`` so that the interpreter's shutdown skips its full garbage
        collections (seconds saved on the way to the requeue; nothing is left unflushed).

        Raises:
            SystemExit: always, with :attr:`exit_code`.
        """
        dist = _initialised_dist()
        rank = dist.get_rank(self.group) if dist is not None else 0
        if rank == 0:
            self.requeue_outcome = self._requeue()
            log.warning("slurm-spot: %s; exiting with code %d", self.requeue_outcome,
                        self.exit_code)
        if dist is not None:
            dist.barrier(group=self.group)
            dist.destroy_process_group()
        # From here on this process is leaving anyway. A launcher that saw another rank exit
        # first sends SIGTERM, and Python restores default handlers while it shuts down: ignore
        # the signals so that every rank's exit status is the requeue code.
        if threading.current_thread() is threading.main_thread():
            for number in self.signals:
                signal.signal(number, signal.SIG_IGN)
        # The job's step, and so its requeue, waits for this process to end. With torch
        # imported, the interpreter's final garbage collections over the whole heap cost
        # ~1 s (0.7-1.5 s on the shared 2-CPU test machine, 0.2-0.35 s with this): freeze the
        # heap at exit, so they skip it. Objects are still freed by reference count (files
        # flushed and closed, as usual); finally blocks and atexit handlers run as usual.
        atexit.register(gc.freeze)
        sys.stdout.flush()
        raise SystemExit(self.exit_code)

    def _requeue(self) -> str:
        if not jobenv.is_slurm_job(self.env):
            return "not in a Slurm job (no SLURM_JOB_ID): no requeue"
        target = jobenv.requeue_target(self.env)
        client = self._client or _default_client(self.env)
        try:
            jobs = client.jobs([int(self.env["SLURM_JOB_ID"])])
        except SlurmCommandError as exc:
            log.warning("cannot read the state of job %s: %s", target, exc)
            jobs = []
        state = jobs[0].state if jobs else None
        if state and (state.base in _ALREADY_REQUEUED or state.flags & _ALREADY_REQUEUED):
            shown = "+".join([state.base, *sorted(state.flags)])
            return f"job {target} is already {shown} (requeued by the node watcher)"
        try:
            requeued = client.requeue(target)
        except SlurmCommandError as exc:
            return f"requeue of job {target} failed ({exc}); relying on the exit code"
        return f"requeued job {target}" if requeued else f"job {target} was already pending"


def _initialised_dist() -> Any:
    """``torch.distributed`` if torch is already imported and a process group is up, else
    None (never imports torch)."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    return dist
