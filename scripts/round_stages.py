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


class Stages:
    """Seconds per stage, into the table of whichever engine decodes now (``into``)."""

    def __init__(self):
        self.seconds: dict[str, float] = defaultdict(float)

    def into(self, seconds: dict[str, float]) -> None:
        self.seconds = seconds

    def timed(self, name: str, function: Callable) -> Callable:
        def wrapper(*args, **kwargs):
            started = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.seconds[name] += time.perf_counter() - started

        return wrapper


@contextmanager
def wrapped(drafters: list, stages: Stages) -> Iterator[None]:
    """The stage functions (and these drafters' draft and commit) timed into ``stages`` while inside."""
    owners = list(WRAPPED)
    for drafter in drafters:
        owners += [(drafter, "draft", "drafter draft"), (drafter, "commit", "drafter commit")]
    owners = [(owner, attr, name) for owner, attr, name in owners if hasattr(owner, attr)]  # an engine may lack one
    originals = [(owner, attr, owner.__dict__.get(attr)) for owner, attr, _ in owners]
    for owner, attr, name in owners:
        setattr(owner, attr, stages.timed(name, getattr(owner, attr)))
    try:
        yield
    finally:
        for owner, attr, original in reversed(originals):
            if original is None:
                delattr(owner, attr)  # an instance's method, found on its class again
            else:
                setattr(owner, attr, original)


def round_stages(
    engines: dict[str, tuple[Models, DecodeConfig]], prompts: list[torch.Tensor]
) -> dict[str, dict[str, float]]:
    """Per engine, the mean wall ms per round (the prefill's excluded) of each wrapped stage, of the whole round (its
    trace's draft + verify + other) and of what no wrapper covers, over ``prompts`` decoded one at a time, the
    engines taking turns prompt by prompt, after one warm-up request each."""
    for models, cfg in engines.values():
        for _ in engine.decode(models, prompts[0], cfg):
            pass
    stages = Stages()
    seconds = {name: defaultdict(float) for name in engines}
    rounds: dict[str, list[RoundTrace]] = {name: [] for name in engines}
    with wrapped([models.drafter for models, _ in engines.values()], stages), torch.no_grad():
        for ids in prompts:
            for name, (models, cfg) in engines.items():
                stages.into(seconds[name])
                rounds[name] += decoded_rounds(models, ids, cfg, seconds[name])
    return {name: mean_ms(seconds[name], rounds[name]) for name in engines}


def decoded_rounds(models: Models, ids: torch.Tensor, cfg: DecodeConfig, seconds: dict[str, float]) -> list:
    """One request's rounds after the prefill; the prefill's stage seconds are taken back out of ``seconds``."""
    before, rounds = dict(seconds), []
    for event in engine.decode(models, ids, cfg):
        if isinstance(event, RoundTrace) and event.index == 0:
            for name in list(seconds):
                seconds[name] = before.get(name, 0.0)
        elif isinstance(event, RoundTrace):
            rounds.append(event)
    return rounds


def mean_ms(seconds: dict[str, float], rounds: list[RoundTrace]) -> dict[str, float]:
    n = max(len(rounds), 1)
    ms = {name: 1000 * s / n for name, s in seconds.items()}
    whole = 1000 * sum(r.draft_s + r.verify_s + r.other_s for r in rounds) / n
    within = sum(v for name, v in ms.items() if name != ROUND_EVENT)  # the event is built outside the round's clock
    ms |= {"not wrapped": whole - within, "round (its trace's draft + verify + other)": whole}
    return {name: round(v, 3) for name, v in ms.items()}
