"""The snapshot an asynchronous save writes: copies of the state's tensors that the training
loop can no longer change, in host buffers reused from one save to the next.

Two ways to take it (:class:`~slurm_spot.checkpoint.checkpointer.Checkpointer`'s ``snapshot``):

- ``eager`` (the default): every tensor is copied before ``save_async`` returns. The training
  loop is blocked for one copy of the state (memory bandwidth; for CUDA tensors a device-to-host
  copy into pinned buffers).
- ``deferred``: only what the forward and backward passes can change (module buffers such as
  BatchNorm statistics, ``extra``, the scheduler) is copied before ``save_async`` returns. The
  parameters and the optimizer's state tensors change only in ``optimizer.step()``: they are
  copied by the writer thread while the next forward/backward runs, and an optimizer-step
  pre-hook (``torch.optim.Optimizer.register_step_pre_hook``) blocks the next step until that
  copy is done. Every deferred tensor's version counter (bumped by every in-place operation on
  it) is compared after its copy: a parameter changed in place outside ``optimizer.step()``
  fails the save (nothing is committed) instead of committing a torn state. Writes through
  ``tensor.data`` bypass the version counter and are not caught: code that changes parameters
  that way between ``save_async`` and the next ``optimizer.step()`` must use ``eager``.

Either way the writer owns its buffers (a thread, never a forked process: field case
async-pinned-memory-fork), and a buffer is reused only after the writer that read it is done.

A CPU tensor is copied with the C library's ``memmove`` (:func:`copy_into`), not with
``Tensor.copy_``: on the shared 2-core benchmark machine torch's element-wise copy kernel
(two intra-op threads that wait for each other) moved a 1 GB float32 tensor into a reused
buffer in 0.35-0.77 s, ``memmove`` (which glibc does with non-temporal stores for large sizes,
so the destination is not read first) in 0.11-0.38 s in the same runs (BENCHMARKS.md,
"Checkpoints"). ``ctypes.memmove`` releases the GIL (ctypes' CFUNCTYPE calls
do), so a deferred copy in the writer thread does not hold up the training loop's Python.
"""

from __future__ import annotations

import copy as copy_module
import ctypes
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class _Copy:
    where: str
    source: torch.Tensor
    target: torch.Tensor
    version: int


@dataclass
class PendingCopies:
    """The deferred part of a snapshot: run by the writer thread (:meth:`run`), waited for by
    the training loop (:meth:`wait`).

    Attributes:
        error: why the snapshot is not consistent ("" when it is), set by :meth:`run`.
        step: the step being saved (for messages).
    """

    step: int
    copies: list[_Copy] = field(default_factory=list)
    error: str = ""
    _done: threading.Event = field(default_factory=threading.Event)
    _event: Any = None  # a CUDA event recorded on the trainer's stream at the hand-off

    def run(self) -> None:
        """Copy every pending tensor (writer thread), then release :meth:`wait`. A source
        whose version changed while it was pending makes ``error`` name it."""
        try:
            changed: list[str] = []
            cuda = [c for c in self.copies if c.source.is_cuda]
            stream = torch.cuda.Stream(device=cuda[0].source.device) if cuda else None
            if stream is not None and self._event is not None:
                stream.wait_event(self._event)
            for item in self.copies:
                if item.source.is_cuda and stream is not None:
                    with torch.cuda.stream(stream):
                        item.target.copy_(item.source, non_blocking=True)
                else:
                    copy_into(item.target, item.source)
                if item.source._version != item.version:
                    changed.append(item.where)
            if stream is not None:
                stream.synchronize()
            for item in cuda:  # a change enqueued before the copy ran
                if item.source._version != item.version and item.where not in changed:
                    changed.append(item.where)
            if changed:
                names = ", ".join(w.strip("/").replace("'", "") for w in changed[:3])
                self.error = (
                    f"step {self.step}: {names}"
                    f"{' and others' if len(changed) > 3 else ''} changed in place after "
                    "save_async returned and before the deferred snapshot copied it; only "
                    "optimizer.step() waits for that copy (use snapshot='eager' when other "
                    "code changes parameters between a save and the next step)")
        except Exception as exc:  # the save fails; training must never hang on it
            self.error = f"step {self.step}: the deferred snapshot failed: {exc}"
        finally:
            self._done.set()

    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout_s: float) -> bool:
        """Block until :meth:`run` finished; False if it did not within ``timeout_s``."""
        return self._done.wait(max(0.0, timeout_s))


class Snapshotter:
    """Takes snapshots of a payload (nested dicts, lists, tuples of tensors and plain values)
    into host buffers kept between saves.

    Each buffer is keyed by its place in the payload (the index of each dict item, list or
    tuple element on the way to it, so keys that print alike never share one); a buffer of
    the same shape and dtype is overwritten instead of allocated again (a fresh 100 MB
    allocation costs more in page faults than the copy); buffers of places gone from the
    payload are freed. For CUDA tensors the buffers are pinned host memory and the
    copies asynchronous (one synchronisation at the end). The caller reuses a Snapshotter
    only after the writer that read its previous snapshot is done.

    Containers keep their type: dict and list subclasses are rebuilt as :mod:`copy` rebuilds
    them (a ``defaultdict`` keeps its ``default_factory``, an ``OrderedDict`` its order; one
    that cannot be rebuilt item by item becomes a plain dict or list), named tuples with
    ``_make``; any other value is deep-copied.
    """

    def __init__(self) -> None:
        # keyed by structural position (:data:`_Place`), never by repr: two keys with the
        # same repr (two float('nan') keys, objects with one __repr__) must not share a buffer
        self._pool: dict[_Place, torch.Tensor] = {}

    def _buffer(self, place: _Place, t: torch.Tensor, used: dict[_Place, torch.Tensor]
                ) -> torch.Tensor:
        """A host buffer for the plain strided tensor ``t`` at ``place``, reused when the
        previous snapshot had one of the same shape and dtype there."""
        buf = self._pool.get(place)
        if buf is None or buf.shape != t.shape or buf.dtype != t.dtype:
            buf = torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=t.is_cuda)
        used[place] = buf
        return buf

    def take(self, value: Any, step: int, defer: Iterable[torch.Tensor] = ()) -> tuple[
            Any, PendingCopies | None]:
        """A copy of ``value`` the trainer cannot change, and the copies left to the writer.

        Args:
            value: the payload (None gives None).
            step: the step being saved (for messages).
            defer: tensors (parameters, optimizer state) whose copy may wait for the writer
                thread; matched by storage, so a ``state_dict()`` view of a parameter counts.

        Returns:
            ``(snapshot, pending)``: ``pending`` (None when nothing was deferred) must be run
            before the snapshot is read, and waited for before anything changes a deferred
            tensor.
        """
        if value is None:
            return None, None
        deferred = {_storage_key(t) for t in defer if _plain(t) and t.numel()}
        pending = PendingCopies(step)
        memo: dict[int, Any] = {}
        used: dict[_Place, torch.Tensor] = {}
        cuda_copies = False

        def copy(t: torch.Tensor, where: str, place: _Place) -> torch.Tensor:
            nonlocal cuda_copies
            if not _plain(t):  # copied as it is, the way save() writes it
                return _copy_as_is(t)
            t = t.detach()
            buf = self._buffer(place, t, used)
            if t.numel() and _storage_key(t) in deferred:
                pending.copies.append(_Copy(where, t, buf, t._version))
            elif t.is_cuda:
                buf.copy_(t, non_blocking=True)
                cuda_copies = True
            else:
                copy_into(buf, t)
            return buf

        def walk(v: Any, where: str, place: _Place) -> Any:
            if isinstance(v, torch.Tensor):
                if id(v) not in memo:
                    memo[id(v)] = copy(v, where, place)
                return memo[id(v)]
            if isinstance(v, dict):
                items = [(k, walk(x, f"{where}/{k!r}", (*place, i)))
                         for i, (k, x) in enumerate(v.items())]
                return dict(items) if type(v) is dict else _rebuild_mapping(v, items)
            if isinstance(v, list):
                walked = [walk(x, f"{where}/{i}", (*place, i)) for i, x in enumerate(v)]
                return walked if type(v) is list else _rebuild_list(v, walked)
            if type(v) is tuple:
                return tuple(walk(x, f"{where}/{i}", (*place, i)) for i, x in enumerate(v))
            if isinstance(v, tuple) and hasattr(v, "_fields") and hasattr(v, "_make"):
                return v._make(walk(x, f"{where}/{i}", (*place, i)) for i, x in enumerate(v))
            return copy_module.deepcopy(v)

        snapshot = walk(value, "", ())
        self._pool = used  # buffers of places gone from the payload are freed
        if cuda_copies:
            torch.cuda.synchronize()  # the eager device-to-host copies have landed
        if not pending.copies:
            return snapshot, None
        if any(c.source.is_cuda for c in pending.copies):
            pending._event = torch.cuda.current_stream(
                next(c.source.device for c in pending.copies if c.source.is_cuda)).record_event()
        return snapshot, pending


_Place = tuple[int, ...]
"""Where a tensor is in a payload: the index of each dict item, list or tuple element on the
way to it (dict items in their iteration order)."""


def _plain(t: torch.Tensor) -> bool:
    """Whether ``t`` can be copied into a reused ``torch.empty`` host buffer: a dense
    (strided) tensor with real storage, of class ``torch.Tensor`` or ``nn.Parameter``, not
    quantized (``torch.empty`` cannot make a quantized tensor: it has no quantizer), not a
    nested tensor (no sizes), not on the meta device (no data), not a DTensor."""
    return (type(t) in (torch.Tensor, torch.nn.Parameter) and t.layout == torch.strided
            and not t.is_quantized and not t.is_nested and not t.is_meta)


def _copy_as_is(t: torch.Tensor) -> torch.Tensor:
    """A copy of a tensor that has no reusable buffer (sparse, quantized, nested, meta, a
    subclass such as DTensor): ``detach().clone()``, which keeps its layout, quantizer and
    class, so the snapshot holds what :meth:`Checkpointer.save` would have written at the
    call. A CUDA sparse tensor is copied to the host (``Tensor.to``) as the buffers are."""
    t = t.detach()
    if t.is_cuda and type(t) is torch.Tensor and t.layout != torch.strided:
        return t.to("cpu", copy=True)
    return t.clone()


def _rebuild_mapping(v: dict[Any, Any], items: list[tuple[Any, Any]]) -> dict[Any, Any]:
    """A ``dict`` subclass rebuilt the way :func:`copy.copy` rebuilds it (from
    ``__reduce_ex__(4)``: the constructor and its arguments, e.g. a ``defaultdict``'s
    ``default_factory``; the instance's state deep-copied; then each item set), holding
    ``items`` instead of the original values. ``OrderedDict`` keeps its order. A subclass
    that does not reduce that way (no items in its reduction, or its constructor fails) is
    rebuilt as a plain ``dict`` of ``items``."""
    try:
        reduced = v.__reduce_ex__(4)
        if not isinstance(reduced, tuple) or len(reduced) < 5 or reduced[4] is None:
            return dict(items)
        func, args, state = reduced[0], reduced[1], reduced[2]
        out = func(*copy_module.deepcopy(args))
        _set_state(out, state)
        for k, x in items:
            out[k] = x
        return out
    except Exception:
        return dict(items)


def _rebuild_list(v: list[Any], walked: list[Any]) -> list[Any]:
    """A ``list`` subclass rebuilt as :func:`_rebuild_mapping` rebuilds a dict subclass
    (falls back to a plain ``list``)."""
    try:
        reduced = v.__reduce_ex__(4)
        if not isinstance(reduced, tuple) or len(reduced) < 4 or reduced[3] is None:
            return walked
        func, args, state = reduced[0], reduced[1], reduced[2]
        out = func(*copy_module.deepcopy(args))
        _set_state(out, state)
        out.extend(walked)
        return out
    except Exception:
        return walked


def _set_state(out: Any, state: Any) -> None:
    """Apply a deep copy of a reduction's ``state`` as :mod:`copy` does."""
    if not state:
        return
    state = copy_module.deepcopy(state)
    if hasattr(out, "__setstate__"):
        out.__setstate__(state)
        return
    slots = None
    if isinstance(state, tuple) and len(state) == 2:
        state, slots = state
    if state:
        out.__dict__.update(state)
    for key, value in (slots or {}).items():
        setattr(out, key, value)


def copy_into(target: torch.Tensor, source: torch.Tensor) -> None:
    """Copy ``source`` into ``target`` (same shape), as ``target.copy_(source)`` does.

    Two dense, contiguous CPU tensors of the same dtype (not quantized, no lazy conjugate or
    negative bit) are copied byte for byte with ``memmove`` on their data pointers, the GIL
    released; anything else (other devices, strides, dtypes) goes through ``Tensor.copy_``.

    Raises:
        RuntimeError: the shapes differ (from ``Tensor.copy_`` when it cannot broadcast).
    """
    if (source.device.type == "cpu" and target.device.type == "cpu"
            and source.dtype == target.dtype and source.shape == target.shape
            and source.layout == torch.strided and target.layout == torch.strided
            and source.is_contiguous() and target.is_contiguous()
            and not (source.is_quantized or source.is_conj() or source.is_neg()
                     or target.is_quantized)):
        nbytes = source.numel() * source.element_size()
        if nbytes:
            ctypes.memmove(target.data_ptr(), source.data_ptr(), nbytes)
        return
    target.copy_(source)


def _storage_key(t: torch.Tensor) -> tuple[str, int]:
    return (str(t.device), t.untyped_storage().data_ptr())


def step_tensors(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """What only ``optimizer.step()`` changes: the model's parameters that ``optimizer``
    updates and the optimizer's state tensors (the rest of a payload is copied eagerly)."""
    owned = {id(p) for group in optimizer.param_groups for p in group["params"]}
    out: list[torch.Tensor] = [p for p in model.parameters() if id(p) in owned]
    for per_param in optimizer.state.values():
        out.extend(v for v in per_param.values() if isinstance(v, torch.Tensor))
    return out


def wait_for(pending: PendingCopies | None, timeout_s: float, what: str) -> float:
    """Block ``what`` (e.g. ``optimizer.step()``) until ``pending`` copied its tensors;
    returns the seconds waited.

    Raises:
        TimeoutError: not done within ``timeout_s`` (a hung writer).
    """
    if pending is None or pending.done():
        return 0.0
    started = time.monotonic()
    if not pending.wait(timeout_s):
        raise TimeoutError(f"{what}: the snapshot of step {pending.step} was not copied within "
                           f"{timeout_s:g} s (hung writer)")
    return time.monotonic() - started
