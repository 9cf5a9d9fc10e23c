"""Paired before/after of a round's stage costs: the engine's models as loaded before issue 47's stop 53 (or 54)
and as loaded now, in one process, in turns, medians of per-turn figures.

    OMP_NUM_THREADS=1 python -m lab.round_ab --dtype bfloat16 -K 4 -T 1 -L 8 [--drafter assets/drafter_dflash]
        [--turns 6] [--wall] [--before stop54]

Each turn runs both (in an order that alternates from turn to turn) over ``profile_round``'s chat prompts: plainly
(the "none" drafter through the same engine) and at the fixed (K, T, L), and prints per variant the median over turns
of its plain step and its round's draft / verify / other, in ms and in that turn's plain steps, and both runs'
tokens/s (decode time, the prefill left out). On a machine shared with other jobs only figures from one process,
taken in turns, compare (docs/experiments.md).

``before`` (stop 53): the target's attention transformers' sdpa, the drafter in the target's dtype, the walk's head
rows by the head itself; ``--before stop54``: as loaded now but each packed layer its own product (no shared
products, ``packing.fuse_shared_inputs``) and a draft's first block embedded through ids and flags; both run their
requests' work with no grad, not in inference mode. ``after``: as ``load_models`` loads now (on a CPU: grouped
attention for masked forwards over several tokens, ``xpress_core/attention.py``; beside an fp32 target on a CPU with
native bf16, a bf16 drafter and the walk's rows through oneDNN, ``models.drafter_dtype`` and ``keep_rows_head``; in
bf16 on a CPU, q/k/v and gate/up as one packed product each), its requests' work in inference mode.
"""

from __future__ import annotations

import statistics
import time
from functools import partial

import torch

from lab.profile_round import PROMPTS, round_arguments, stage_ms
from xpress_core import engine
from xpress_core.config import DecodeConfig
from xpress_core.drafters.base import NoDrafter
from xpress_core.drafters.masked import MaskedDiffusionDrafter
from xpress_core.engine import Models
from xpress_core.models import dtypes, encode_prompt, load_models, pretrained
from xpress_core.trace import StageClock


def load_before(**options) -> Models:
    """The models as loaded before: no native bf16 seen at load (the drafter keeps the target's dtype, the walk the
    head itself), the target's attention sdpa."""
    native = dtypes.native_bf16
    dtypes.native_bf16 = lambda: False
    try:
        models = load_models(**options)
    finally:
        dtypes.native_bf16 = native
    models.target.set_attn_implementation("sdpa")
    return models


def load_unshared(**options) -> Models:
    """The models as loaded before stop 54: every packed layer its own product, and a draft's first block embedded
    through ids and flags (``MaskedDiffusionDrafter.first_denoise``, not the drafter's ``first_block``)."""
    fuse = pretrained.fuse_shared_inputs
    pretrained.fuse_shared_inputs = lambda model: 0
    try:
        models = load_models(**options)
    finally:
        pretrained.fuse_shared_inputs = fuse
    if isinstance(models.drafter, MaskedDiffusionDrafter):
        models.drafter.first_denoise = partial(MaskedDiffusionDrafter.first_denoise, models.drafter)
    return models


# Per stop, how its ``before`` models load; both ran a request's work with autograd off (no grad), not in inference
# mode (``engine.WORK_MODE``, stop 54).
BEFORE = {"stop53": load_before, "stop54": load_unshared}


def turn(models: Models, prompts, cfg: DecodeConfig, repeats: int, mode=engine.WORK_MODE) -> dict[str, float]:
    """One variant's figures: its plain step and its round's stages (ms), tau and tokens/s; its requests' work in
    ``mode`` (``engine.WORK_MODE`` as the engine has it now, or ``torch.no_grad`` as before)."""
    kept, engine.WORK_MODE = engine.WORK_MODE, mode
    try:
        plain = stage_ms(Models(models.target, models.tokenizer, NoDrafter()), prompts, cfg, repeats)
        spec = stage_ms(models, prompts, cfg, repeats)
    finally:
        engine.WORK_MODE = kept
    figures = {k: spec[k] for k in ("draft", "verify", "other", "round", "tau", "tokens_per_s")}
    return {"plain": plain["round"], "plain_tokens_per_s": plain["tokens_per_s"], **figures}


def main() -> None:
    parser = round_arguments(__doc__, drafts=4, repeats=1, repeats_help="passes over the prompts per variant and turn")
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--before", choices=BEFORE, default="stop53", help="the models before: as of which stop")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if not args.wall:
        engine.Clock.raw = lambda self: time.thread_time()
        StageClock.host_time = staticmethod(time.thread_time)
    options = {"device": "cpu", "dtype": args.dtype, **({"drafter": args.drafter} if args.drafter else {})}
    variants = {"before": BEFORE[args.before](**options), "after": load_models(**options)}
    prompts = [encode_prompt(variants["after"].tokenizer, p, chat=True) for p in PROMPTS]
    cfg = DecodeConfig(drafts=args.K, steps=args.T, block=args.L, max_new_tokens=args.max_new_tokens)
    figures: dict[str, list[dict[str, float]]] = {name: [] for name in variants}
    for models in variants.values():  # warm-up: each variant's shapes built once
        stage_ms(models, prompts[:1], cfg, 1)
    for number in range(args.turns):
        for name in list(variants) if number % 2 == 0 else list(variants)[::-1]:
            mode = torch.no_grad if name == "before" else engine.WORK_MODE
            figures[name].append(turn(variants[name], prompts, cfg, args.repeats, mode))
    print(f"dtype {args.dtype}, (K, T, L) = ({args.K}, {args.T}, {args.L}); {args.turns} turns, medians")
    for variant, turns in figures.items():
        stages = " / ".join(f"{median(turns, k):.2f}" for k in ("draft", "verify", "other"))
        steps = " / ".join(f"{median(turns, k, True):.2f}" for k in ("draft", "verify", "other"))
        print(
            f"{variant:10s} plain step {median(turns, 'plain'):.2f} ms; draft / verify / other {stages} ms = {steps} "
            f"(round {median(turns, 'round', True):.2f}) plain steps; tau {median(turns, 'tau'):.2f}; tok/s "
            f"{median(turns, 'tokens_per_s'):.1f}, plain {median(turns, 'plain_tokens_per_s'):.1f}"
        )


def median(turns: list[dict[str, float]], key: str, per_step: bool = False) -> float:
    """The median over turns of a figure, in ms or (``per_step``) in that turn's plain steps."""
    return statistics.median(t[key] / (t["plain"] if per_step else 1.0) for t in turns)


if __name__ == "__main__":
    main()
