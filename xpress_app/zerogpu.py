"""ZeroGPU support: on such a Space, ``spaces`` must be imported before torch touches CUDA and attaches a GPU to each
call of a decorated function; elsewhere the package is absent and functions run as they are."""

from __future__ import annotations

import os

try:
    import spaces
except ImportError:
    spaces = None


def on_gpu(fn):
    """``fn`` with a GPU attached for each call on ZeroGPU; ``fn`` itself elsewhere."""
    return spaces.GPU(fn) if spaces is not None else fn


def is_zero_gpu() -> bool:
    return spaces is not None and bool(os.environ.get("SPACES_ZERO_GPU"))
