"""A stand-in for ZeroGPU's ``spaces.GPU``, forking and pickling as spaces 0.51 does (``spaces/zero/wrappers.py``):

- a call runs in a worker process forked from the web process (``fork`` context), kept and reused for the next call
  (ZeroGPU reuses an idle worker), so the worker holds the web process's state as it was when it was forked;
- ``(args, kwargs)`` go to it by pickle over a fork-context ``SimpleQueue``: what does not pickle fails the call;
- the result, or each value a generator yields, comes back by pickle the same way; one that does not pickle (or, here,
  holds a tensor) fails the call; a closed stream sets the worker's stop event, which it reads after each value;
- the duration is asked for before each call: a number, or a callable given the call's own arguments;
- the web process may not initialise CUDA (ZeroGPU makes ``torch._C._cuda_init`` raise there and says CUDA is
  available) nor, here, run a model's forward; the worker may.
"""

from __future__ import annotations

import inspect
import io
import multiprocessing
import os
import pickle
import signal
import sys
import traceback
from contextlib import contextmanager
from functools import wraps

import torch

FORK = multiprocessing.get_context("fork")
PICKLE_ERRORS = (pickle.PicklingError, AttributeError, TypeError)  # what pickling an unpicklable object raises
# Where CUDA gets initialised: torch's C entry point (a CUDA build's) and the lazy initialiser every torch.cuda module
# that needs the device calls (bound by name in several); and the availability spaces fakes in the web process.
CUDA_HOOKS = {
    (module, name): getattr(module, name)
    for module in [torch._C] + [m for n, m in sys.modules.items() if n.startswith("torch.cuda")]
    for name in ("_cuda_init", "_lazy_init")
    if hasattr(module, name) and (module is torch._C or getattr(module, name) is torch.cuda._lazy_init)
}
CUDA_HOOKS[torch.cuda, "is_available"] = torch.cuda.is_available


class CudaInWebProcess(RuntimeError):
    """The web process tried to initialise CUDA."""


class WorkerError(RuntimeError):
    """A GPU call failed in its worker (ZeroGPU's "ZeroGPU worker error"); the message holds the worker's traceback."""


MODULE_CALL = torch.nn.Module.__call__


def forbid_cuda() -> None:
    """CUDA's initialisation raises in this process, and so does a model's forward (on a CPU build nothing would
    initialise CUDA, but a forward here is what would run it on ZeroGPU); processes forked from it may do both."""
    web_pid = os.getpid()

    def refuse(*args, **kwargs):
        raise CudaInWebProcess("CUDA must not be initialised in the web process on ZeroGPU")

    def forward_elsewhere(module, *args, **kwargs):
        if os.getpid() == web_pid:
            raise CudaInWebProcess(f"a {type(module).__name__} forward ran in the web process")
        return MODULE_CALL(module, *args, **kwargs)

    for module, name in CUDA_HOOKS:
        setattr(module, name, refuse)
    torch.cuda.is_available = lambda: True  # as spaces says in the web process
    torch.nn.Module.__call__ = forward_elsewhere


def allow_cuda() -> None:
    for (module, name), original in CUDA_HOOKS.items():
        setattr(module, name, original)
    torch.nn.Module.__call__ = MODULE_CALL


@contextmanager
def web_process():
    """This process as ZeroGPU's web process: CUDA initialisation raises."""
    forbid_cuda()
    try:
        yield
    finally:
        allow_cuda()


class Worker:
    def __init__(self, task, generator: bool):
        self.calls, self.results, self.stop = FORK.SimpleQueue(), FORK.SimpleQueue(), FORK.Event()
        self.process = FORK.Process(target=serve_calls, args=(task, generator, self.calls, self.results, self.stop))
        self.process.daemon = True
        self.process.start()
        print(f"ZeroGPU stand-in: worker {self.process.pid} forked for {task.__name__}", file=sys.stderr, flush=True)

    def close(self) -> None:
        self.process.kill()
        self.process.join()


def serve_calls(task, generator: bool, calls, results, stop) -> None:
    """The worker: run each call that arrives, send back its values, then an end mark."""
    allow_cuda()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # ended without a word (spaces, too, ends quietly on SIGTERM)
    while True:
        args, kwargs = calls.get()
        stop.clear()
        try:
            if generator:
                for value in task(*args, **kwargs):
                    if stop.is_set() or not send(results, "value", value):
                        break
            else:
                send(results, "value", task(*args, **kwargs))
        except Exception:  # noqa: BLE001 (reported to the caller, as ZeroGPU does)
            results.put(("error", traceback.format_exc()))
        results.put(("end", None))


class NoTensors(pickle.Pickler):
    """Pickles nowhere, refusing tensors: a GPU tensor sent back would be rebuilt on the GPU in the web process, so
    what the app's GPU functions return holds none (stricter than ZeroGPU, which takes CPU tensors: on this CPU a
    tensor cannot show which device it would be on there)."""

    def reducer_override(self, obj):
        if isinstance(obj, torch.Tensor):
            raise pickle.PicklingError(f"it holds a tensor of shape {tuple(obj.shape)}")
        return NotImplemented


def send(results, kind: str, value) -> bool:
    try:
        NoTensors(io.BytesIO()).dump(value)
        results.put((kind, value))
    except PICKLE_ERRORS as error:
        results.put(("error", f"the worker's value does not pickle: {error!r}"))
        return False
    return True


class ZeroGPU:
    """``spaces`` as the app imports it: ``ZeroGPU().GPU(fn, duration=...)``. ``durations``: what each call asked
    for; ``workers``: the processes forked."""

    def __init__(self):
        self.durations: list[float] = []
        self.workers: list[Worker] = []

    def GPU(self, task, duration=None):  # spaces. name
        generator = inspect.isgeneratorfunction(task)
        worker: list[Worker] = []

        def start(args, kwargs) -> Worker:
            self.durations.append(duration(*args, **kwargs) if callable(duration) else duration)
            if not worker or not worker[0].process.is_alive():
                worker[:] = [Worker(task, generator)]
                self.workers.append(worker[0])
            worker[0].calls.put((args, kwargs))  # pickles here: an argument that does not pickle fails the call
            return worker[0]

        @wraps(task)
        def stream(*args, **kwargs):
            running = start(args, kwargs)
            try:
                while (item := received(running))[0] == "value":
                    yield item[1]
            except GeneratorExit:
                running.stop.set()
                while received(running)[0] != "end":  # the worker stops after its current value
                    pass
                raise

        @wraps(task)
        def call(*args, **kwargs):
            running = start(args, kwargs)
            _, value = received(running)
            received(running)  # the end mark
            return value

        return stream if generator else call

    def close(self) -> None:
        for worker in self.workers:
            worker.close()


def received(worker: Worker) -> tuple[str, object]:
    kind, value = worker.results.get()
    if kind == "error":
        worker.results.get()  # the end mark
        raise WorkerError(value)
    return kind, value
