"""One torchrun agent per node, as ``slurm-spot sbatch --torchrun`` starts them with srun.

``python -m slurm_spot.jobs.injob.torchrun_agent [--nproc-per-node N] [--port P] -- SCRIPT ARGS``

- rendezvous: torchrun's static one (:func:`torchrun_args`): the first node's NodeAddr is the
  master (cloud nodes have no DNS for Slurm node names), so workers reach it by address
  (docs/local-slurm.md), and each node's rank is its place in the step's node list; a
  requeued job's new run starts a new store;
- the preemption signal: ignored by the agent (torchrun treats a handled USR2 as a death
  signal, and by default USR2 would kill it), delivered by Slurm straight to the workers,
  which checkpoint at the next step boundary and exit with the requeue code; so are USR1 and
  USR2 whatever spot.yaml says (:data:`JOB_SIGNALS`: what a job's own ``--signal``, such as
  Lightning's ``USR1@90``, names), in both modes;
- exit code: torchrun reports any failed worker as exit 1; this wrapper exits with the requeue
  code instead when the workers exited with it, so the batch script (and Slurm's
  ``RequeueExit``) can tell a preemption from a crash;
- a death signal to the agent (SIGTERM when Slurm ends the step: the job requeued itself,
  ``scancel``, a power-down): torchrun stops the workers, the agent exits 128 + the signal;
- workers start warm by default (:func:`launch_warm`, as in elastic mode below): forks of a
  fork server that is itself a fork of this agent, taken once the agent has imported torch
  and before it starts any thread; the server imports the script's top-level imports while
  the agent forms the rendezvous, so the node starts one interpreter, imports torch once,
  and starts no interpreter and imports nothing on the way from rendezvous to the workers'
  first line (where the agent cannot be forked, the server is a new interpreter that imports
  torch again, and the agent's log line says why); the fork server and the
  workers keep the preemption signal ignored (as a stock worker inherits it) until the
  script installs its handler, and get SIGTERM/SIGHUP back at their default action;
  ``--no-preload`` keeps torchrun's ``python -u SCRIPT`` per worker;
- timing: the agent's first line on stderr, ``slurm-spot: agent started at T``
  (:data:`STARTED`, seconds since the epoch once this module's own imports are done:
  after the interpreter's start, before torch), is what ``slurm-spot demo`` reads for its breakdown
  (slurm_spot/recovery.py);
- exit: once torchrun has returned (workers ended, rendezvous closed) the agent runs its
  ``atexit`` handlers, flushes and leaves with ``os._exit``: tearing down an interpreter that
  imported torch took 2.7-3.5 s on the shared 2-CPU test machine, and the job step (so the
  job's requeue) ends only when this process has (see :func:`leave`).

Elastic mode (``--elastic MIN:MAX --rendezvous HOST:PORT``, as ``slurm-spot sbatch --torchrun
--elastic`` starts it, one job step per node):

- rendezvous through the store that ``slurm-spot rendezvous`` hosts off the spot nodes
  (``is_host=false``: no agent hosts it), ``--nnodes=MIN:MAX``, id ``<job>-<restart count>``
  (a requeued job starts a rendezvous of its own), a short ``last_call_timeout`` (a round
  completes ~2 s after MIN nodes joined, not torchrun's default 30 s), ``join_timeout`` (how
  long survivors wait for MIN nodes before the job falls back to requeue) and
  ``--max-restarts`` (worker-group restarts, one per re-rendezvous);
- the preemption signal means *this node leaves*: the agent forwards it to its workers (which
  save at the next step boundary, all ranks agreeing, and exit) and stops without closing the
  rendezvous (torchrun closes it only on a normal end), so the other nodes' workers exit,
  their agents re-rendezvous with the smaller world and restart them from the checkpoint;
- a replacement node (a one-node companion job, :mod:`slurm_spot.jobs.injob.elastic_replacement`)
  runs the same agent with ``--rdzv-run-id`` (the elastic job's ``<job>-<restart count>``, not
  its own) and ``--checkpoint-dir`` (the elastic job's checkpoints); it waits in the
  rendezvous until the running agents see a node waiting, restart their workers (SIGTERM:
  they save at the step boundary) and form the next round with it (torch/distributed/elastic/
  agent/server/api.py, ``_invoke_run``: ``num_nodes_waiting() > 0``);
- workers start warm (:func:`launch_warm`, :mod:`slurm_spot.jobs.injob.warm_worker`): forks of a
  fork server forked from this agent after its torch import, which imported the script's
  top-level imports while the first rendezvous formed, so a restart after a re-rendezvous
  starts no interpreter and imports nothing; ``--no-preload`` keeps torchrun's
  ``python -u SCRIPT`` per worker (slower restarts, for scripts whose imports must see the
  worker's environment: RANK, CUDA_VISIBLE_DEVICES).
  The fork server ignores the preemption signal, SIGTERM and SIGHUP (Slurm signals every
  process of the step, and it must outlive its workers); it is killed with the agent;
- exit code: 0 when training finished; the requeue code when the rendezvous could not be
  formed again (fewer than MIN nodes within ``join_timeout``, or the store is gone): the
  batch script then requeues the job (checkpoint-and-requeue fallback); 128 + the signal when
  this node was told to leave.
"""

from __future__ import annotations

import argparse
import atexit
import os
import re
import signal
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from types import FrameType
from typing import NoReturn

from slurm_spot.contract import jobenv
from slurm_spot.errors import BadInputError
from slurm_spot.hostlist import expand
from slurm_spot.slurm.client import SlurmClient

#: When this module's imports were done (seconds since the epoch): the agent's start, before
#: any import of torch, for the start-up breakdown (slurm_spot/recovery.py).
STARTED = time.time()

DEFAULT_PORT_BASE = 29400
#: torchrun's rendezvous backend of elastic runs: the c10d backend on the store of
#: ``slurm-spot rendezvous``, reached as the job's owner (slurm_spot.jobs.injob.rendezvous_client).
RENDEZVOUS_BACKEND = "slurm-spot"


def node_addr(client: SlurmClient, node: str) -> str:
    """NodeAddr of ``node`` from ``scontrol show node`` (the node name if it has none)."""
    nodes = client.nodes([node], with_jobs=False)
    return (nodes[0].addr if nodes and nodes[0].addr else node)


def step_nodes(env: Mapping[str, str]) -> list[str]:
    """The nodes of this agent's job step (``SLURM_STEP_NODELIST``, else the job's
    ``SLURM_JOB_NODELIST``), expanded in hostlist order: every agent of the step reads the same
    list, so they agree on the first node and on each node's place. Empty outside Slurm."""
    text = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or ""
    return expand(text) if text else []


def node_rank(env: Mapping[str, str]) -> int:
    """This node's (``SLURMD_NODENAME``) place in :func:`step_nodes` (0 outside Slurm), the rank
    of its agent in a static rendezvous.

    Raises:
        JobEnvError: ``SLURMD_NODENAME`` is unset on a step of several nodes (every agent would
            take rank 0), or is not one of the step's nodes.
    """
    nodes = step_nodes(env)
    if not nodes:
        return 0
    me = env.get("SLURMD_NODENAME")
    if me is None and len(nodes) > 1:
        raise jobenv.JobEnvError(f"SLURMD_NODENAME is not set in a job step on "
                                 f"{len(nodes)} nodes: this agent's rank is unknown")
    me = me or nodes[0]
    if me not in nodes:
        raise jobenv.JobEnvError(f"SLURMD_NODENAME={me!r} is not a node of this job step "
                                 f"({','.join(nodes)})")
    return nodes.index(me)


def torchrun_args(env: Mapping[str, str], head_addr: str, nproc: int, port: int,
                  command: list[str]) -> list[str]:
    """The torchrun argument list of a job of fixed size (pure): torchrun's static rendezvous,
    the first node of the step (:func:`step_nodes`; its NodeAddr is ``head_addr``: cloud nodes
    have no DNS for Slurm node names) hosting the store on ``port``, this node's rank its
    place in that list, ``--nnodes`` the list's length (Slurm fixed the nodes and their order,
    so no node has to be found by the others). The workers reach the store and each other
    through ``--master-addr`` (torch 2.13's static backend ignores ``--local-addr``, which
    only the c10d and etcd backends read).

    Why static, not c10d: the c10d backend polls its shared state once a second while a node
    waits for the others (torch/distributed/elastic/rendezvous/dynamic_rendezvous.py,
    ``_Action.SYNC``: ``_delay(seconds=1)``), which put ~1 s on every (re)start of a
    two-node job (BENCHMARKS.md, "The demo"); the static rendezvous is one TCPStore that the
    head serves and the others connect to.

    Raises:
        JobEnvError: as :func:`node_rank`.
    """
    rank = node_rank(env)
    return [
        f"--nnodes={len(step_nodes(env)) or 1}", f"--nproc-per-node={nproc}",
        "--rdzv-backend=static", f"--master-addr={head_addr}", f"--master-port={port}",
        f"--node-rank={rank}", f"--rdzv-id={jobenv.requeue_target(env)}",
        "--max-restarts=0", *command,
    ]


@dataclass(frozen=True)
class ElasticSettings:
    """An elastic run: node counts, the store, and torchelastic's timeouts (seconds)."""

    min_nodes: int
    max_nodes: int
    endpoint: str
    join_timeout_s: int = 60
    last_call_timeout_s: int = 2
    max_restarts: int = 20
    run_id: str | None = None


#: torchrun's environment in elastic mode. ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``: by default
#: (torch 2.4+) the rank-0 *agent* hosts the workers' store and keeps it across rounds, and the
#: other agents keep its address from the first round (torch/distributed/elastic/rendezvous/
#: dynamic_rendezvous.py, ``next_rendezvous``): after a re-rendezvous the workers read the
#: gloo addresses the previous round's workers left there ("Connection refused"), and when the
#: rank-0 node is the one that left, the others point at a store that is gone. Opted out, each
#: round's rank-0 worker hosts a fresh store on a free port, announced through the rendezvous.
ELASTIC_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


#: The most nodes ``--elastic`` accepts: a sanity cap (Slurm's own node limit depends on the
#: build and configuration; no cluster of slurm-spot's is near it).
MAX_NODES = 100000

#: Signals a job's own ``--signal`` names (Lightning's auto-requeue: ``USR1@90``; submitit:
#: ``USR2@90``) besides spot.yaml's preemption signal: without ``B:`` Slurm sends them to every
#: process of every job step (sbatch(1), 22.05-26.05, ``--signal``), the agent included, whose
#: default action for them is to end, and the job step with it, before the workers' own
#: handler has saved. The agent ignores them; its workers inherit that until they install a
#: handler (as they do the preemption signal).
JOB_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2)


def parse_nnodes(text: str, where: str = "--elastic") -> tuple[int, int]:
    """``MIN:MAX`` (or ``N``, meaning N:N) -> (min, max).

    Raises:
        BadInputError: not two positive integers with MIN <= MAX <= :data:`MAX_NODES`
            (names ``where``).
    """
    low, sep, high = text.strip().partition(":")
    high = high if sep else low
    if not (low.isascii() and low.isdigit() and high.isascii() and high.isdigit()) or not (
            1 <= int(low) <= int(high) <= MAX_NODES):
        raise BadInputError(f"{where}={text!r}: expected MIN:MAX, two positive integers with "
                            f"MIN <= MAX <= {MAX_NODES} (e.g. 2:4)")
    return int(low), int(high)


def elastic_torchrun_args(env: Mapping[str, str], settings: ElasticSettings, local_addr: str,
                          nproc: int, command: list[str]) -> list[str]:
    """The torchrun argument list of an elastic run (pure); see the module docstring."""
    conf = (f"is_host=false,join_timeout={settings.join_timeout_s},"
            f"last_call_timeout={settings.last_call_timeout_s},close_timeout=10,"
            "keep_alive_interval=2,keep_alive_max_attempt=3")
    run_id = settings.run_id or elastic_run_id(env)
    return [
        f"--nnodes={settings.min_nodes}:{settings.max_nodes}", f"--nproc-per-node={nproc}",
        f"--rdzv-backend={RENDEZVOUS_BACKEND}", f"--rdzv-endpoint={settings.endpoint}",
        f"--rdzv-id={run_id}", f"--rdzv-conf={conf}", f"--local-addr={local_addr}",
        f"--max-restarts={settings.max_restarts}", "--monitor-interval=0.5", *command,
    ]


def elastic_run_id(env: Mapping[str, str]) -> str:
    """The rendezvous id of an elastic job's run: ``<job>-<restart count>`` (``<array job>_<task>``
    for an array task); a requeued job forms a rendezvous of its own.

    Raises:
        JobEnvError: ``SLURM_JOB_ID`` or ``SLURM_RESTART_COUNT`` is missing or malformed.
    """
    return f"{jobenv.requeue_target(env)}-{jobenv.restart_count(env)}"


#: A rendezvous id as :func:`elastic_run_id` makes it (``--rdzv-run-id`` is checked against it).
RUN_ID_PATTERN = r"[0-9]+(_[0-9]+)?-[0-9]+"


def rendezvous_port(env: Mapping[str, str], base: int = DEFAULT_PORT_BASE) -> int:
    """A port derived from the job id, so two jobs on one host do not collide."""
    job = env.get("SLURM_JOB_ID", "0")
    return base + (int(job) % 1000 if job.isdigit() else 0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="slurm_spot.jobs.injob.torchrun_agent")
    parser.add_argument("--nproc-per-node", type=int, default=1)
    parser.add_argument("--port", type=int, default=None)
    parser.add_argument("--elastic", default=None, metavar="MIN:MAX")
    parser.add_argument("--rendezvous", default=None, metavar="HOST:PORT")
    parser.add_argument("--join-timeout", type=int, default=60)
    parser.add_argument("--max-restarts", type=int, default=20)
    parser.add_argument("--rdzv-run-id", default=None, metavar="JOB-RESTART",
                        help="join this run's rendezvous (a replacement node's agent, which "
                             "runs in a job of its own: slurm_spot.jobs.injob.elastic_replacement)")
    parser.add_argument("--checkpoint-dir", default=None,
                        help="the workers' SLURM_SPOT_CHECKPOINT_DIR (a replacement's workers "
                             "use the elastic job's checkpoints, not their own job's)")
    parser.add_argument("--no-preload", action="store_true",
                        help="start each worker as a new 'python -u SCRIPT' (torchrun's own "
                             "way) instead of as a fork of a server that preloaded torch and "
                             "the script's imports (see the module docstring)")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no training script given")
    env = os.environ
    print(f"slurm-spot: agent started at {STARTED:.3f} on "
          f"{env.get('SLURMD_NODENAME', 'localhost')}", file=sys.stderr, flush=True)
    spec = jobenv.preemption_signal(env)
    job_signals = sorted({int(s) for s in JOB_SIGNALS} - {spec.number})
    client = SlurmClient(os.environ.get(jobenv.ENV_SLURM_BIN_DIR, "/usr/bin"))
    head = expand(env.get("SLURM_JOB_NODELIST", env.get("SLURMD_NODENAME", "localhost")))[0]
    me = env.get("SLURMD_NODENAME", head)
    if args.elastic:
        if not args.rendezvous:
            parser.error("--elastic needs --rendezvous HOST:PORT")
        low, high = parse_nnodes(args.elastic)
        if args.rdzv_run_id is not None and not re.fullmatch(RUN_ID_PATTERN, args.rdzv_run_id):
            parser.error(f"--rdzv-run-id={args.rdzv_run_id!r}: expected JOB-RESTART (e.g. 42-0)")
        if args.checkpoint_dir:
            os.environ[jobenv.ENV_CHECKPOINT_DIR] = args.checkpoint_dir  # the workers inherit it
        settings = ElasticSettings(low, high, args.rendezvous, args.join_timeout,
                                   max_restarts=args.max_restarts, run_id=args.rdzv_run_id)
        targs = elastic_torchrun_args(env, settings, node_addr(client, me),
                                      args.nproc_per_node, command)
        print(f"slurm-spot: torchrun {' '.join(targs)}", file=sys.stderr, flush=True)
        os.environ.update(ELASTIC_ENV)
        for number in job_signals:
            signal.signal(number, signal.SIG_IGN)
        signal.signal(spec.number, _leave_on_signal)
        reset = sorted({spec.number, int(signal.SIGTERM), int(signal.SIGHUP)})
        if args.no_preload:
            return run_torchrun(targs, jobenv.requeue_exit_code(env), elastic=True,
                                joining=args.rdzv_run_id is not None)
        return run_torchrun(targs, jobenv.requeue_exit_code(env), elastic=True,
                            joining=args.rdzv_run_id is not None,
                            warm_signals=sorted({*reset, *job_signals}), warm_reset=reset)
    for number in (spec.number, *job_signals):
        signal.signal(number, signal.SIG_IGN)
    port = args.port or rendezvous_port(env)
    node_rank(env)  # a node outside the step's list is said before any Slurm command runs
    head = (step_nodes(env) or [head])[0]
    targs = torchrun_args(env, node_addr(client, head), args.nproc_per_node, port, command)
    print(f"slurm-spot: torchrun {' '.join(targs)}", file=sys.stderr, flush=True)
    # The workers inherit SIG_IGN until they install their own handler: a signal that comes
    # before that is lost rather than fatal; the watcher's power-down still requeues the job.
    # Warm, the fork server ignores SIGTERM and SIGHUP too (Slurm signals every process of
    # the step, and it must outlive its workers); the workers get those two back at their
    # default action and keep the preemption signal ignored, as a subprocess worker has them.
    if args.no_preload:
        return run_torchrun(targs, jobenv.requeue_exit_code(env))
    deaths = sorted({int(signal.SIGTERM), int(signal.SIGHUP)} - {spec.number})
    return run_torchrun(targs, jobenv.requeue_exit_code(env),
                        warm_signals=sorted({spec.number, *job_signals, *deaths}),
                        warm_reset=deaths)


def _leave_on_signal(signum: int, _frame: FrameType | None) -> None:
    """Elastic mode's preemption-signal handler: stop this node's agent as torchrun's own
    death-signal handler does (``SignalException``), so torchrun sends the signal on to the
    workers, waits for them (they save and exit) and leaves without closing the rendezvous."""
    from torch.distributed.elastic.multiprocessing import SignalException

    signal.signal(signum, signal.SIG_IGN)  # once: the watcher may signal again
    raise SignalException(f"node leaving: signal {signum}", sigval=signal.Signals(signum))


_HANDLERS: list[object] = []


def _capture_rendezvous_handler() -> None:
    """Keep the rendezvous handler torchrun creates, so that a leaving node can take itself
    out of the rendezvous (:func:`_leave_rendezvous`)."""
    import torch.distributed.elastic.rendezvous.registry as registry

    original = registry.get_rendezvous_handler

    def capture(params: object) -> object:
        handler = original(params)  # type: ignore[arg-type]
        _HANDLERS.append(handler)
        return handler

    registry.get_rendezvous_handler = capture  # type: ignore[assignment]


def _leave_rendezvous() -> None:
    """Take this node out of the current rendezvous round, as torchrun does before it joins
    the next one (``_RendezvousExitOp``, torch/distributed/elastic/rendezvous/
    dynamic_rendezvous.py): the survivors' next round then need not wait for this node's
    keep-alive to lapse (keep_alive_interval x keep_alive_max_attempt). Uses torch's private
    names; if they are not there (another torch), the survivors wait for the keep-alive."""
    import time

    try:
        from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _RendezvousExitOp

        for handler in _HANDLERS:
            handler._stop_heartbeats()  # type: ignore[attr-defined]
            handler._op_executor.run(_RendezvousExitOp(),  # type: ignore[attr-defined]
                                     time.monotonic() + 5)
    except Exception as exc:
        print(f"slurm-spot: could not leave the rendezvous early ({exc}); the others "
              "notice when this node's keep-alive lapses", file=sys.stderr, flush=True)


def run_torchrun(targs: list[str], requeue_code: int, elastic: bool = False,
                 joining: bool = False, warm_signals: list[int] | None = None,
                 warm_reset: list[int] | None = None) -> int:
    """Run torchrun (``torch.distributed.run``) with ``targs`` in this process; returns the
    agent's exit status: 0, ``requeue_code`` when a worker exited with it (or, ``elastic``,
    when the rendezvous could not be formed again), 128 + the signal when a death signal
    stopped the agent, else 1 (a worker failed). ``elastic``: workers whose last exit was
    :data:`~slurm_spot.contract.jobenv.REJOIN_EXIT_CODE` (the world changed) when torchrun's
    ``--max-restarts`` were spent also give the requeue code. ``joining`` (a replacement's agent): a
    rendezvous already closed means the run is over, exit 0 (nothing to requeue: the
    replacement's job is not the elastic job).

    ``warm_signals`` (not None): start the workers warm (:func:`launch_warm`, forks of a fork
    server that preloaded torch and the script's imports) instead of as ``python -u SCRIPT``;
    the listed signals (signal numbers) are ignored in the fork server and get their default
    action back in each worker, or, with ``warm_reset`` (not None), only those listed there
    do (the others stay ignored in the workers). Exit codes are the same either way."""
    from torch.distributed import DistError
    from torch.distributed.elastic.multiprocessing import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import RendezvousClosedError, RendezvousError
    from torch.distributed.run import main as torchrun_main

    if elastic:
        from slurm_spot.jobs.injob.rendezvous_client import register_backend

        register_backend()
        _capture_rendezvous_handler()
    try:
        if warm_signals is not None:
            launch_warm(targs, warm_signals, warm_reset)
        else:
            torchrun_main(targs)
    except DistError as exc:
        if elastic:
            raise
        # The static rendezvous' store: rank 0 could not listen on its port (another job's
        # store on the same first node: the port is 29400 + job id % 1000), or another node's
        # agent could not reach it within the timeout. One line, not torch's traceback.
        port = next((a.split("=", 1)[1] for a in targs if a.startswith("--master-port=")), "?")
        print(f"slurm-spot: the job's rendezvous store on port {port} failed "
              f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); "
              f"the port is {DEFAULT_PORT_BASE} + job id % 1000, so a job whose id ends in "
              f"the same three digits may hold it on the first node", file=sys.stderr,
              flush=True)
        return 1
    except RendezvousError as exc:
        if joining and isinstance(exc, RendezvousClosedError):
            print("slurm-spot: the run's rendezvous is closed (training is over); leaving",
                  file=sys.stderr, flush=True)
            return 0
        if not elastic:
            raise
        # Fewer than MIN nodes came back within join_timeout, or the store is gone: the job
        # falls back to checkpoint-and-requeue (the batch script requeues it).
        print(f"slurm-spot: rendezvous failed ({type(exc).__name__}: {exc}); falling back "
              f"to requeue (exit {requeue_code})", file=sys.stderr, flush=True)
        return requeue_code
    except SignalException as exc:
        if elastic:
            _leave_rendezvous()
        # Slurm ends the step (the job requeued itself, scancel, a power-down): torchrun has
        # stopped its workers (SIGTERM, SIGKILL after its shutdown timeout). Report it as a
        # process killed by that signal would be, without a traceback.
        print(f"slurm-spot: torchrun agent stopped by {exc.sigval.name}",
              file=sys.stderr, flush=True)
        return 128 + int(exc.sigval)
    except ChildFailedError as exc:
        codes = {failure.exitcode for failure in exc.failures.values()}
        if requeue_code in codes:
            print(f"slurm-spot: workers stopped for a requeue (exit {requeue_code})",
                  file=sys.stderr, flush=True)
            return requeue_code
        if elastic and codes == {jobenv.REJOIN_EXIT_CODE}:
            # Every re-rendezvous after a node left used one of torchrun's --max-restarts;
            # once they are spent, the workers' last exit still says "the world changed":
            # an interruption, not a crash. Requeue (a new run, a new budget), never FAILED.
            print("slurm-spot: torchrun's restart budget (--max-restarts) is spent on "
                  f"interruptions; falling back to requeue (exit {requeue_code})",
                  file=sys.stderr, flush=True)
            return requeue_code
        return 1
    return 0


def launch_warm(targs: list[str], ignore_signals: list[int],
                reset_signals: list[int] | None = None) -> None:
    """torchrun with ``targs`` (the same arguments, parsed by ``torch.distributed.run``'s own
    ``parse_args``/``config_from_args``), but its workers started warm
    (:mod:`slurm_spot.jobs.injob.warm_worker`): the fork server is forked from this process now
    (:func:`~slurm_spot.jobs.injob.warm_worker.fork_fork_server`: it has torch already, and
    imports the training script's top-level imports while the agent joins the first
    rendezvous; a new interpreter, :func:`~slurm_spot.jobs.injob.warm_worker.start_fork_server`,
    where this process cannot be forked: the log line says which), and each worker, in that
    round and every later one, is a fork of it that runs the script with
    :func:`~slurm_spot.jobs.injob.warm_worker.run_script` (start method ``forkserver``,
    torch's ``MultiprocessContext``). ``ignore_signals`` (signal numbers): ignored in the
    fork server, which Slurm signals with the rest of the step; the workers get their
    default action back (only ``reset_signals`` do where it is given: the others stay
    ignored in the workers, as a worker started by an agent that ignores them inherits them).

    Raises what ``torch.distributed.run.main`` raises (``ChildFailedError``,
    ``SignalException``, ``RendezvousError``).
    """
    import torch.distributed.run as torchrun
    from torch.distributed.launcher.api import elastic_launch

    from slurm_spot.jobs.injob import warm_worker

    args = torchrun.parse_args(targs)
    if args.master_port is None:
        args.master_port = 29500  # as torch.distributed.run.run (elastic runs: unused by c10d)
    config, _, _ = torchrun.config_from_args(args)
    config.start_method = "forkserver"
    _use_warm_context()
    script = args.training_script
    modules = warm_worker.preload_modules(script)
    folder = warm_worker.script_folder(script)
    try:
        pid = warm_worker.fork_fork_server(modules, ignore_signals, folder)
        how = "forked from the agent"
    except warm_worker.ForkUnavailable as exc:
        pid = warm_worker.start_fork_server(modules, ignore_signals, folder)
        how = f"a new interpreter: cannot fork it from the agent, {exc}"
    print(f"slurm-spot: warm worker start: fork server {pid} ({how}) preloads "
          f"{','.join(modules)}", file=sys.stderr, flush=True)
    reset = ignore_signals if reset_signals is None else reset_signals
    elastic_launch(config, warm_worker.run_script)(
        ",".join(str(n) for n in reset), script, *args.training_script_args)


def _use_warm_context() -> None:
    """Make torch's launcher start function entrypoints in :class:`_WarmContext` (torch/
    distributed/elastic/multiprocessing/__init__.py ``start_processes`` looks the class up in
    its module), and log a worker's failure without a traceback of torch's own, as for a
    subprocess worker. Uses torch's module layout; if it differs, workers still start warm,
    only a worker that ends with ``os._exit(0)`` is then not seen to have finished, and one
    misses what the agent put in its environment after the fork server started."""
    import logging

    import torch.distributed.elastic.multiprocessing as tmp
    import torch.distributed.elastic.multiprocessing.api as tmp_api

    base = getattr(tmp, "MultiprocessContext", None)
    if base is None or getattr(base, "_slurm_spot_warm", False):
        return

    class _WarmContext(base):  # type: ignore[valid-type,misc]
        """``MultiprocessContext`` that also takes a worker that exited 0 without returning
        (``os._exit(0)``: no return value reaches the agent) as finished; torch's own waits
        for a return value from every worker and would poll forever."""

        _slurm_spot_warm = True

        def _start(self):
            # A subprocess worker gets the agent's environment as it is at the launch plus
            # torch's per-rank variables (SubprocessContext); a fork of the fork server has
            # the environment the server started with, and torch's worker wrapper adds the
            # per-rank ones (``_wrap``: os.environ.update). Give it the agent's, as now, too:
            # torch sets some after the server started (TORCHELASTIC_SIGNALS_TO_HANDLE,
            # torch/distributed/launcher/api.py ``launch_agent``).
            agent = dict(os.environ)
            envs: dict[int, dict[str, str]] = self.envs  # type: ignore[has-type]
            self.envs = {rank: {**agent, **env} for rank, env in envs.items()}
            return super()._start()

        def _poll(self):
            result = super()._poll()
            if result is None and self._pc is not None:
                exited = [rank for rank, proc in enumerate(self._pc.processes)
                          if rank not in self._return_values and proc.exitcode == 0]
                if exited:
                    for rank in exited:
                        self._return_values[rank] = None
                    result = super()._poll()
            return result

    class _NoTraceback(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            if str(record.msg).startswith("failed (exitcode"):
                record.exc_info, record.exc_text = None, None
            return True

    tmp.MultiprocessContext = _WarmContext  # type: ignore[misc]
    logger = getattr(tmp_api, "logger", None)
    if isinstance(logger, logging.Logger):
        logger.addFilter(_NoTraceback())


def leave(code: int) -> NoReturn:
    """End the agent with exit status ``code`` without tearing the interpreter down.

    Runs the ``atexit`` handlers (``atexit._run_exitfuncs``, what ``sys.exit`` would run) and
    flushes stdout/stderr, then ``os._exit(code)``: the module and object teardown skipped here
    is what costs seconds once torch is imported. Measured on the shared 2-CPU test machine
    (load average 10-14), two agents (c10d rendezvous, one gloo worker each), from the
    workers' ``atexit`` to the agents' exit: 4.7-5.7 s with ``sys.exit``, 1.5-2.8 s with this
    (``python -c 'import torch'`` alone spent 2-3 s after its ``atexit``). Only for the agent:
    its own state is gone once torchrun returns (workers ended, rendezvous closed), while a
    training process may hold open files that only the interpreter's teardown flushes.
    """
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def run_main(argv: list[str] | None = None) -> int:
    """:func:`main`, with bad input from the job's environment (``JobEnvError``, a
    ``BadInputError``: a malformed ``SLURM_SPOT_PREEMPT_SIGNAL``, a node not in the job's node
    list) said on one line of stderr and exit status 2 instead of a traceback."""
    try:
        return main(argv)
    except BadInputError as exc:
        print(f"slurm-spot: torchrun agent: {exc}", file=sys.stderr, flush=True)
        return 2


if __name__ == "__main__":
    leave(run_main())
