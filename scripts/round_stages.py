"""Where a round of xPress's goes, finer than its trace's draft / verify / other (``scripts/serve_vllm.py``).

The engine's stage functions are wrapped in wall-clock accumulators while requests decode one at a time, in this
thread only: the drafter's draft, the tree built from it, the tree's tensors and mask, the verify forward (the
target's forward over the round's tokens), acceptance, the cache commit (``keep``: the accepted nodes' keys and
values kept, the rest dropped), the drafter's commit (the accepted tokens' features into its context), the stop
checks, and the round's event (built while the engine's clock is paused, so in no stage, but in a request's wall
time). What no wrapper covers is the controller's choice and bookkeeping and the loop itself.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

from xpress_core import engine
from xpress_core import verify as verifying
from xpress_core.config import DecodeConfig
from xpress_core.models import Models
from xpress_core.trace import RoundTrace

# (owner, attribute, the stage's name); the engine looks these names up at call time. "verify forward" is the
# verifier's call of the target, which the prefill (engine.target_forward, another name) does not go through.
WRAPPED = (
    (engine, "build_tree", "tree built"),
    (verifying, "tree_tensors", "tree tensors"),
    (verifying, "tree_attention_mask", "tree mask"),
    (verifying, "target_forward", "verify forward"),
    (engine, "accept", "acceptance"),
    (verifying.TreeVerifier, "keep", "cache commit"),
    (engine, "finish", "stop checks"),
    (engine, "record", "round event"),
)
ROUND_EVENT = "round event"


def timed(seconds: dict[str, float], name: str, function: Callable) -> Callable:
    def wrapper(*args, **kwargs):
        started = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            seconds[name] += time.perf_counter() - started

    return wrapper


@contextmanager
def wrapped(models: Models, seconds: dict[str, float]) -> Iterator[None]:
    """The stage functions (and this drafter's draft and commit) timed into ``seconds`` while inside."""
    drafter = models.drafter
    owners = [*WRAPPED, (drafter, "draft", "drafter draft"), (drafter, "commit", "drafter commit")]
    owners = [(owner, attr, name) for owner, attr, name in owners if hasattr(owner, attr)]  # an engine may lack one
    originals = [(owner, attr, owner.__dict__.get(attr)) for owner, attr, _ in owners]
    for owner, attr, name in owners:
        setattr(owner, attr, timed(seconds, name, getattr(owner, attr)))
    try:
        yield
    finally:
        for owner, attr, original in originals:
            if original is None:
                delattr(owner, attr)  # an instance's method, found on its class again
            else:
                setattr(owner, attr, original)


def round_stages(models: Models, prompts: list[torch.Tensor], cfg: DecodeConfig) -> dict[str, float]:
    """Mean wall ms per round (the prefill's excluded) of each wrapped stage, of the whole round (its trace's
    draft + verify + other) and of what no wrapper covers, over ``prompts`` decoded one at a time after one warm-up."""
    for _ in engine.decode(models, prompts[0], cfg):
        pass
    seconds: dict[str, float] = defaultdict(float)
    rounds: list[RoundTrace] = []
    with wrapped(models, seconds), torch.no_grad():
        for ids in prompts:
            before = dict(seconds)  # the prefill's calls are taken back out: only rounds are counted
            for event in engine.decode(models, ids, cfg):
                if isinstance(event, RoundTrace) and event.index == 0:
                    prefill = {name: seconds[name] - before.get(name, 0.0) for name in list(seconds)}
                    for name, s in prefill.items():
                        seconds[name] -= s
                elif isinstance(event, RoundTrace):
                    rounds.append(event)
    n = max(len(rounds), 1)
    ms = {name: 1000 * s / n for name, s in seconds.items()}
    whole = 1000 * sum(r.draft_s + r.verify_s + r.other_s for r in rounds) / n
    within = sum(v for name, v in ms.items() if name != ROUND_EVENT)  # the event is built outside the round's clock
    ms |= {"not wrapped": whole - within, "round (its trace's draft + verify + other)": whole}
    return {name: round(v, 3) for name, v in ms.items()}
