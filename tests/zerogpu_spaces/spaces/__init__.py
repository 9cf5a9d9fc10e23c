"""``spaces`` for ``python app.py`` under test (on ``PYTHONPATH``, with ``SPACES_ZERO_GPU`` set): ZeroGPU's contract
from ``tests/zerogpu_standin.py``, set up on import as spaces sets up ZeroGPU: CUDA refused in this (the web) process,
each ``GPU`` function run in a forked worker with its arguments and results pickled."""

from tests.zerogpu_standin import ZeroGPU, forbid_cuda

forbid_cuda()
GPU = ZeroGPU().GPU
