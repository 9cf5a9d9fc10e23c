"""Counting, on a CPU, the host-device synchronizations a CUDA device would make (``HostSyncs``).

On a CPU nothing waits, so the count comes from what the code asks for. Every torch function and tensor method runs
through a ``TorchFunctionMode`` that tracks where each tensor would live on a GPU: *host* tensors are made from Python
data or by factories without a device (and whatever is computed from host tensors alone); every other tensor
(parameters, tensors made with ``device=``, results of ops on them) is a *device* tensor. Counted as a sync, as CUDA
would block the host on it:

- a device tensor read by the host: ``item``, ``tolist``, ``cpu``, ``numpy``, ``__bool__`` / ``__int__`` /
  ``__float__`` / ``__index__`` (``if t:``, ``int(t)``, ``range(t)``), ``in``, printing, ``nonzero``, ``unique``,
  ``masked_select``, ``equal``, ``allclose``, a boolean-mask index or a 0-dim tensor index (output sizes the host
  must learn);
- a blocking host-to-device copy: ``torch.tensor(data, device=...)``, ``as_tensor`` of Python data with a device,
  ``.to(device)`` / ``.cuda()`` / ``copy_`` of a host tensor without ``non_blocking=True``, a Python list or host
  tensor indexing a device tensor;
- ``torch.cuda.synchronize``, ``Event.synchronize``, ``Stream.synchronize`` (the module is replaced by a stand-in).

A host-to-device copy with ``non_blocking=True`` is counted apart (``transfers``): it does not wait for the device.
An op mixing a host tensor of more than one element with a device tensor would fail on CUDA: it is recorded under
``mixed``. A torch function written in Python is seen as one call (what it calls inside is not): the ones that read
are listed above. ``torch.cuda.Event`` is replaced by a stand-in with CUDA's contract: ``elapsed_time`` fails unless a
synchronization since both events were recorded has completed them, or when they were recorded on two devices;
``current_stream(device)`` gives each device a stream that logs what was recorded on it and what it waited for.
"""

from __future__ import annotations

import time
import weakref
from collections import Counter
from contextlib import ExitStack
from functools import partial

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

READS = {
    torch.Tensor.item,
    torch.Tensor.tolist,
    torch.Tensor.cpu,
    torch.Tensor.numpy,
    torch.Tensor.__bool__,
    torch.Tensor.__int__,
    torch.Tensor.__float__,
    torch.Tensor.__index__,
    torch.Tensor.__array__,
    torch.Tensor.__contains__,
    torch.Tensor.__repr__,
    torch.Tensor.__format__,
    torch.Tensor.nonzero,
    torch.nonzero,
    torch.Tensor.unique,
    torch.unique,
    torch.masked_select,
    torch.Tensor.masked_select,
    torch.equal,
    torch.Tensor.equal,
    torch.allclose,
    torch.Tensor.allclose,
}
FACTORIES_FROM_DATA = {torch.tensor, torch.as_tensor, torch.asarray}
MOVES = {torch.Tensor.to, torch.Tensor.cuda}


def _tensors(tree) -> list[torch.Tensor]:
    return [x for x in tree_flatten(tree)[0] if isinstance(x, torch.Tensor)]


class _Event:
    """``torch.cuda.Event`` as CUDA behaves: recorded events complete only when a synchronization covers them."""

    def __init__(self, counter: HostSyncs, enable_timing: bool = False, **_):
        self.counter, self.timing, self.at, self.seq = counter, enable_timing, None, None

    def record(self, stream=None):
        self.at, self.seq = time.perf_counter(), self.counter.next_seq()
        self.device = None if stream is None else stream.device
        if stream is not None:
            stream.log.append(("record", self))

    def query(self) -> bool:
        return self.seq is not None and self.seq <= self.counter.completed

    def synchronize(self):
        self.counter.sync("Event.synchronize")

    def elapsed_time(self, end: _Event) -> float:
        if not (self.timing and end.timing and self.query() and end.query()):
            raise RuntimeError("elapsed_time of an event not completed (CUDA would fail here)")
        if self.device != end.device:
            raise RuntimeError("elapsed_time of events on two devices (CUDA would fail here)")
        return (end.at - self.at) * 1000.0


class _Stream:
    """A device's stream: what was recorded on it and which events it was made to wait for, in order (``log``)."""

    def __init__(self, counter: HostSyncs, device):
        self.counter, self.device, self.log = counter, device, []

    def synchronize(self):
        self.counter.sync("Stream.synchronize")

    def wait_event(self, event: _Event):  # the device waits, the host does not
        self.log.append(("wait", event))


class HostSyncs(TorchFunctionMode):
    """``with HostSyncs() as syncs: ...``; ``syncs.total`` counts syncs, ``syncs.kinds`` by kind, ``syncs.log``
    in order."""

    def __init__(self):
        super().__init__()
        self.kinds: Counter = Counter()
        self.log: list[str] = []
        self.transfers = 0
        self.mixed = 0
        self.host_refs: dict[int, weakref.ref] = {}  # id -> the host tensor (ids, not a WeakSet: == is elementwise)
        self.seq = 0
        self.completed = 0
        self.stack = ExitStack()
        self.streams: dict[str, _Stream] = {}

    def stream(self, device=None) -> _Stream:
        """``torch.cuda.current_stream``: one stream per device."""
        key = str(torch.device(device)) if device is not None else "cuda:0"
        return self.streams.setdefault(key, _Stream(self, key))

    @property
    def total(self) -> int:
        return sum(self.kinds.values())

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq

    def sync(self, kind: str) -> None:
        self.kinds[kind] += 1
        self.log.append(kind)
        self.completed = self.seq  # the device has done everything queued so far

    def host(self, *tensors: torch.Tensor) -> None:
        """Mark tensors made outside the counter as host tensors (a tokenizer's ids)."""
        for t in tensors:
            key = id(t)
            self.host_refs[key] = weakref.ref(t, partial(self.forget, key))

    def forget(self, key: int, _ref) -> None:
        self.host_refs.pop(key, None)

    def is_host(self, t: torch.Tensor) -> bool:
        ref = self.host_refs.get(id(t))
        return ref is not None and ref() is t

    def __enter__(self):
        from unittest import mock

        cuda = torch.cuda
        self.stack.enter_context(mock.patch.object(cuda, "synchronize", lambda *a, **k: self.sync("cuda.synchronize")))
        self.stack.enter_context(mock.patch.object(cuda, "Event", lambda **k: _Event(self, **k)))
        self.stack.enter_context(mock.patch.object(cuda, "current_stream", self.stream))
        self.stack.enter_context(mock.patch.object(cuda, "device_count", lambda: 1))
        return super().__enter__()

    def __exit__(self, *exc):
        self.stack.close()
        return super().__exit__(*exc)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.classify(func, args, kwargs)
        out = func(*args, **kwargs)
        to_device = func in MOVES and self.is_host(args[0]) and self.moves_to_device(func, args, kwargs)
        to_host = func is torch.Tensor.cpu and not self.is_host(args[0])
        if (to_device or to_host) and out is args[0]:
            out = out.view_as(out)  # on a CPU the move returns its input; on CUDA the copy is a tensor of its own
        self.track(func, args, kwargs, out)
        return out

    def classify(self, func, args, kwargs) -> None:
        inputs = _tensors((args, kwargs))
        device_inputs = [t for t in inputs if not self.is_host(t)]
        name = getattr(func, "__name__", str(func))
        if func in READS and args and isinstance(args[0], torch.Tensor) and not self.is_host(args[0]):
            self.sync(f"read:{name}")
        elif func in FACTORIES_FROM_DATA and kwargs.get("device") is not None:
            data = args[0] if args else kwargs.get("data")
            empty = isinstance(data, (list, tuple)) and not data  # nothing to copy: CUDA returns at once
            if not empty and (not isinstance(data, torch.Tensor) or self.is_host(data)):
                self.sync(f"h2d:{name}")
        elif func in MOVES and args and self.is_host(args[0]) and self.moves_to_device(func, args, kwargs):
            self.h2d(name, kwargs)
        elif func is torch.Tensor.copy_ and len(args) > 1 and self.is_host(args[1]) and not self.is_host(args[0]):
            self.h2d("copy_", kwargs)
        elif func in (torch.Tensor.__getitem__, torch.Tensor.__setitem__) and not self.is_host(args[0]):
            self.index(name, args[1])
        elif device_inputs and any(self.is_host(t) and t.dim() > 0 for t in inputs) and func not in MOVES:
            self.mixed += 1
            self.log.append(f"mixed:{name}")

    def h2d(self, name: str, kwargs) -> None:
        if kwargs.get("non_blocking"):
            self.transfers += 1
            self.log.append(f"transfer:{name}")
        else:
            self.sync(f"h2d:{name}")

    @staticmethod
    def moves_to_device(func, args, kwargs) -> bool:
        if func is torch.Tensor.cuda:
            return True
        targets = list(args[1:]) + [kwargs.get("device")]
        return any(isinstance(a, (str, torch.device)) for a in targets)

    def index(self, name: str, index) -> None:
        parts = index if isinstance(index, tuple) else (index,)
        for part in parts:
            if isinstance(part, list):
                self.sync(f"h2d:{name}[list]")
            elif isinstance(part, torch.Tensor) and self.is_host(part) and part.dim() > 0:
                self.sync(f"h2d:{name}[host tensor]")
            elif isinstance(part, torch.Tensor) and part.dtype == torch.bool:
                self.sync(f"read:{name}[bool mask]")
            elif isinstance(part, torch.Tensor) and part.dim() == 0:
                self.sync(f"read:{name}[0-dim tensor]")

    def track(self, func, args, kwargs, out) -> None:
        """Where the outputs would live: host when made without a device from host inputs only."""
        outputs = _tensors(out)
        if not outputs:
            return
        if func in MOVES and self.moves_to_device(func, args, kwargs):
            return  # a move to the device makes device tensors
        if func in (torch.Tensor.cpu, torch.Tensor.numpy):
            host = True
        else:
            inputs = _tensors((args, kwargs))
            host = kwargs.get("device") is None and all(self.is_host(t) for t in inputs)
        if host:
            self.host(*outputs)


def round_syncs(decode_events, counter: HostSyncs, kept: list | None = None) -> list[tuple[int, int, tuple[str, ...]]]:
    """Per event of a decode (round 0 the prefill): (syncs, non-blocking transfers, what synced) since the one before;
    the events themselves appended to ``kept``."""
    rounds, seen, transfers, logged = [], 0, 0, 0
    for event in decode_events:
        if kept is not None:
            kept.append(event)
        rounds.append((counter.total - seen, counter.transfers - transfers, tuple(counter.log[logged:])))
        seen, transfers, logged = counter.total, counter.transfers, len(counter.log)
    return rounds
