"""ZeroGPU support: on such a Space, ``spaces`` must be imported before torch touches CUDA, and it runs each call of
a decorated function in a worker process it forks (reused while idle), sending the arguments there and every result
or yielded value back by pickle. So a GPU function here takes plain data (a message, settings, a stop ticket), finds
the models in the process's own state (``models.served``) and returns what pickles without them; the web process
loads the models and never runs CUDA. Elsewhere the package is absent and functions run as they are, in-process."""

from __future__ import annotations

import os
from collections.abc import Callable

try:
    import spaces
except ImportError:
    spaces = None

# What a GPU call is granted (ZeroGPU's ``duration``), from its request: a fresh worker first moves the weights to the
# GPU, warms the kernels and times the stage costs; then each new token of each run costs at most about this much
# (a Qwen3-8B target's plain step in bf16 with transformers is a few tens of ms on a ZeroGPU card).
GPU_SETUP_S = 20.0
GPU_TOKEN_S = 0.05


def on_gpu(fn, duration: Callable[..., float]):
    """``fn`` with a GPU attached for each call on ZeroGPU, for ``duration(*args, **kwargs)`` seconds; ``fn`` itself
    elsewhere."""
    return spaces.GPU(fn, duration=duration) if spaces is not None else fn


def is_zero_gpu() -> bool:
    return spaces is not None and bool(os.environ.get("SPACES_ZERO_GPU"))
