"""Paired A/B of a round's stage costs: variants of the engine in one process, in turns, medians of paired figures.

    OMP_NUM_THREADS=1 python -m scripts.round_ab --dtype bfloat16 -K 4 -T 1 -L 8 [--drafter assets/drafter_dflash]
        [--variants sdpa,grouped] [--turns 4] [--wall]

Each turn runs every variant (in an order that alternates from turn to turn) over ``profile_round``'s chat prompts:
plainly (the "none" drafter through the same engine) and at the fixed (K, T, L), and prints per variant the median
over turns of its plain step and its round's draft / verify / other, in ms and in that turn's plain steps. On a
machine shared with other jobs only figures from one process, taken in turns, compare (docs/experiments.md).

Variants (``VARIANTS``): ``sdpa`` (the target's attention as transformers loads it) and ``grouped`` (its masked
forwards over several tokens in xPress's grouped attention, ``xpress_core/attention.py``: what loading sets on a CPU).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from scripts.profile_round import PROMPTS, stage_ms
from xpress_core import engine
from xpress_core.attention import IMPLEMENTATION
from xpress_core.config import DecodeConfig
from xpress_core.drafters.base import NoDrafter
from xpress_core.engine import Models
from xpress_core.models import encode_prompt, load_models
from xpress_core.trace import StageClock

# Per variant, the target's attention implementation.
VARIANTS = {"sdpa": "sdpa", "grouped": IMPLEMENTATION}


def use_variant(models: Models, variant: str) -> None:
    models.target.set_attn_implementation(VARIANTS[variant])


def turn(models: Models, prompts, cfg: DecodeConfig, repeats: int) -> dict[str, float]:
    """One variant's figures: its plain step and its round's stages (ms), tau and tokens/s."""
    plain = stage_ms(Models(models.target, models.tokenizer, NoDrafter()), prompts, cfg, repeats)
    spec = stage_ms(models, prompts, cfg, repeats)
    return {"plain": plain["round"], **{k: spec[k] for k in ("draft", "verify", "other", "round", "tau")}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--drafter", default=None, help="a drafter folder (default: the embedded drafter)")
    parser.add_argument("-K", type=int, default=4)
    parser.add_argument("-T", type=int, default=1)
    parser.add_argument("-L", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=1, help="passes over the prompts per variant and turn")
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--wall", action="store_true", help="time the stages by the wall clock, not CPU time")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if not args.wall:
        engine.Clock.raw = lambda self: time.thread_time()
        StageClock.host_time = staticmethod(time.thread_time)
    models = load_models(device="cpu", dtype=args.dtype, **({"drafter": args.drafter} if args.drafter else {}))
    prompts = [encode_prompt(models.tokenizer, p, chat=True) for p in PROMPTS]
    cfg = DecodeConfig(drafts=args.K, steps=args.T, block=args.L, max_new_tokens=args.max_new_tokens)
    variants = args.variants.split(",")
    figures: dict[str, list[dict[str, float]]] = {v: [] for v in variants}
    for variant in variants:  # warm-up: every variant's shapes built once
        use_variant(models, variant)
        stage_ms(models, prompts[:1], cfg, 1)
    for number in range(args.turns):
        for variant in variants if number % 2 == 0 else variants[::-1]:
            use_variant(models, variant)
            figures[variant].append(turn(models, prompts, cfg, args.repeats))
    print(f"dtype {args.dtype}, (K, T, L) = ({args.K}, {args.T}, {args.L}); {args.turns} turns, medians")
    for variant, turns in figures.items():
        stages = " / ".join(f"{median(turns, k):.2f}" for k in ("draft", "verify", "other"))
        steps = " / ".join(f"{median(turns, k, True):.2f}" for k in ("draft", "verify", "other"))
        print(
            f"{variant:10s} plain step {median(turns, 'plain'):.2f} ms; draft / verify / other {stages} ms = {steps} "
            f"(round {median(turns, 'round', True):.2f}) plain steps; tau {median(turns, 'tau'):.2f}"
        )


def median(turns: list[dict[str, float]], key: str, per_step: bool = False) -> float:
    """The median over turns of a figure, in ms or (``per_step``) in that turn's plain steps."""
    return statistics.median(t[key] / (t["plain"] if per_step else 1.0) for t in turns)


if __name__ == "__main__":
    main()
