import os

import pytest
import torch

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing downloads in tests
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
# The exactness oracles are fp32's (token for token): apps the tests start load fp32 whatever the CPU ...
os.environ.setdefault("XPRESS_DTYPE", "float32")
torch.set_num_threads(max(1, int(os.environ.get("XPRESS_TEST_THREADS", "1"))))


@pytest.fixture(scope="session")
def zoo(tmp_path_factory):
    from tests.tiny import build_tiny_zoo

    return build_tiny_zoo(tmp_path_factory.mktemp("zoo"))


@pytest.fixture(scope="session", autouse=True)
def fp32_by_default():
    """... and so does ``dtype="auto"`` in the tests' own process (the tests that want bf16 ask for it)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("xpress_core.models.dtypes.native_bf16", lambda: False)
        yield


@pytest.fixture(scope="session", autouse=True)
def cache_in_session_tmp(tmp_path_factory):
    """Module fixtures (the app's caches and servers, the bench run) run before each test's own folder is set
    (``dtype_cache_in_tmp``): what they measure and keep goes to one folder of the session's, never the user's."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XPRESS_CACHE_DIR", str(tmp_path_factory.mktemp("session-cache")))
        yield


@pytest.fixture(autouse=True)
def dtype_cache_in_tmp(tmp_path, monkeypatch):
    """``--dtype auto``'s cached choices (precision.cache_file) and converted models go to the test's own folder, never
    the user's."""
    monkeypatch.setenv("XPRESS_CACHE_DIR", str(tmp_path / "xpress-cache"))


@pytest.fixture(scope="session", params=["llama", "gpt2", "qwen3"])
def family(request, zoo):
    """Each tiny target family with its drafter, the test prompts and generate's greedy replies to them."""
    from tests.oracles import PROMPTS, hf_greedy
    from xpress_core.models import encode_prompt, load_models

    models = load_models(zoo[request.param], zoo[f"drafter_{request.param}"], device="cpu")
    prompts = [encode_prompt(models.tokenizer, p, chat=True) for p in PROMPTS]
    return models, prompts, [hf_greedy(models, p) for p in prompts]


@pytest.fixture(scope="session")
def embedded():
    """The embedded pair (read only): loaded once for the tests that need a trained drafter's confidences."""
    from xpress_core.models import load_models

    return load_models(device="cpu")
