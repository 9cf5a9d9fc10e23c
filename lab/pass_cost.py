"""What a refinement pass costs: the embedded drafter's draft at T = 1 and at more passes, against one plain step.

    python -m lab.pass_cost [--threads 1] [--dtype float32] [--turns 15]

Drafts one block after a held-out chat's prompt at a few (K, T, diversity) settings and times each, with a plain step
of the target (one token on the prompt's cache) taking its turn among them, so that a drift of the machine's speed
falls on all alike; each figure is the median over the turns of 20 calls. A pass costs (draft at T - draft at T = 1)
/ (T - 1), printed in plain steps. Drafting only: the verify of the drafts is ``lab/profile_round.py``'s.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from xpress_core.config import DecodeConfig
from xpress_core.data import evaluation_prompts
from xpress_core.drafters.base import DraftRandomness
from xpress_core.models import load_models, tapped_forward

SETTINGS = (
    (1, 1, "none"),
    (1, 2, "none"),
    (1, 4, "none"),
    (4, 1, "none"),
    (4, 3, "none"),
    (4, 1, "tree"),
    (4, 3, "tree"),
)
CALLS = 20


def median_ms(turns: int, stages: dict) -> dict:
    """Median ms per call of every stage, the stages taking turns."""
    for stage in stages.values():
        for _ in range(CALLS):
            stage()
    times = {name: [] for name in stages}
    for _ in range(turns):
        for name, stage in stages.items():
            start = time.perf_counter()
            for _ in range(CALLS):
                stage()
            times[name].append((time.perf_counter() - start) / CALLS * 1000)
    return {name: statistics.median(t) for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--turns", type=int, default=15)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    models = load_models(dtype=args.dtype, device="cpu")
    drafter, target = models.drafter, models.target
    ids = evaluation_prompts(["sgd_dev"])[3].ids(models.tokenizer)
    with torch.no_grad():
        _, features = tapped_forward(target, list(drafter.tapped_layers), input_ids=ids)
        state = drafter.start(ids, features[0])
        cache = target(ids, use_cache=True).past_key_values
        token = torch.tensor([[5]])

        def plain() -> None:
            target(token, cache=cache, use_cache=True)
            cache.crop(-1)

        def drafting(k: int, t: int, diversity: str):
            cfg = DecodeConfig(drafts=k, steps=t, block=8, diversity=diversity)
            return lambda: drafter.draft(state, 17, cfg, DraftRandomness(torch.Generator().manual_seed(0)), False)

        ms = median_ms(args.turns, {"plain": plain, **{s: drafting(*s) for s in SETTINGS}})
    step = ms["plain"]
    print(f"{args.dtype}, {args.threads} thread(s): a plain step {step:.3f} ms")
    for k, t, diversity in SETTINGS:
        print(
            f"  K={k} T={t} {diversity:5} draft {ms[(k, t, diversity)]:.3f} ms = {ms[(k, t, diversity)] / step:.3f} steps"
        )
    for k, diversity in ((1, "none"), (4, "none"), (4, "tree")):
        one = ms[(k, 1, diversity)]
        for k2, t, d2 in SETTINGS:
            if (k2, d2) == (k, diversity) and t > 1:
                print(
                    f"  a pass, K={k} {diversity} T={t}: {(ms[(k, t, diversity)] - one) / (t - 1) / step:.3f} plain steps"
                )


if __name__ == "__main__":
    main()
