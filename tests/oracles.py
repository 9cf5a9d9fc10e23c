"""What the engine tests share: running a request to its events (in this process, or through the CLI), HF
``generate`` as the greedy oracle, plain sampling as the sampled one, and the cache invariants every decode must keep."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

from xpress_core.engine import decode, stop_token_ids
from xpress_core.sampling import TargetNoise, draw_token
from xpress_core.trace import DecodeResult, RoundTrace

PROMPTS = ["I want to book a table", "Once upon a time"]
NEW = 24


def run(models, prompt_ids, cfg, costs=None) -> tuple[list[RoundTrace], DecodeResult]:
    """Every event of a watched request (with the drafter's denoise steps); ``costs``: for ``auto``."""
    events = list(decode(models, prompt_ids, cfg, watch=True, costs=costs))
    assert isinstance(events[-1], DecodeResult) and all(isinstance(e, RoundTrace) for e in events[:-1])
    return events[:-1], events[-1]


def hf_greedy(models, prompt_ids, new=NEW) -> list[int]:
    out = models.target.generate(prompt_ids, max_new_tokens=new, do_sample=False)
    return out[0, prompt_ids.shape[1] :].tolist()


def check_invariants(traces, prompt_len, result):
    """Between rounds the target cache holds every committed token but the root; the drafter's context likewise."""
    for t in traces[:-1]:
        assert t.cache_len == prompt_len + t.new_tokens_total - 1
        assert t.draft_context_len == t.cache_len
    assert result.rounds == len(traces) - 1
    assert sum(len(t.emitted) for t in traces) == result.new_tokens


def cli(*args: str) -> subprocess.CompletedProcess:
    """``python -m xpress_core ARGS`` from the repository root, one thread."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    root = Path(__file__).resolve().parent.parent
    return subprocess.run(
        [sys.executable, "-m", "xpress_core", *args],
        check=False,
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def plain_sampling(models, prompt_ids, cfg, new) -> list[int]:
    """Reference autoregressive sampler: one HF forward per token, the same processing, the same seeded generator."""
    noise = TargetNoise(torch.Generator().manual_seed(cfg.seed), models.target.config.vocab_size)
    ids, out = prompt_ids, []
    eos = stop_token_ids(models)
    with torch.no_grad():
        for _ in range(new):
            token = draw_token(models.target(input_ids=ids).logits[0, -1], cfg, noise)
            out.append(token)
            if token in eos:
                break
            ids = torch.cat([ids, torch.tensor([[token]])], dim=1)
    return out
