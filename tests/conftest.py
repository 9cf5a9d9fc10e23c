import os

import pytest
import torch

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing downloads in tests
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
torch.set_num_threads(max(1, int(os.environ.get("XPRESS_TEST_THREADS", "1"))))


@pytest.fixture(scope="session")
def zoo(tmp_path_factory):
    from tests.tiny import build_tiny_zoo

    return build_tiny_zoo(tmp_path_factory.mktemp("zoo"))
