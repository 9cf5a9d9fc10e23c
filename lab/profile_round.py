"""Per-round stage costs of the engine on the embedded pair: draft / verify / other ms per round against one plain step.

    OMP_NUM_THREADS=1 python -m lab.profile_round --dtype float32 [-K 1 -T 1 -L 8] [--drafter assets/drafter_dflash]
        [--profile] [--unpacked] [--threads 2 --wall]

Runs a few chat requests at a fixed (K, T, L) and the same requests plainly (the "none" drafter through the same
engine), and prints the mean stage times of the drafting rounds (the prefill excluded). The engine's clock reads
this thread's CPU time here instead of the wall clock, so that other jobs on a shared machine do not inflate the
stages (``--wall`` for the wall clock). ``--profile`` adds the cProfile table (cumulative time) of the speculative runs.
``--unpacked`` loads the models without packing their bf16 linear layers (``xpress_core/packing.py``), for a before
and after of that step. ``--threads``: torch's threads (1 by default; a CPU time is one thread's, so with more than one
time by ``--wall``): a verify's products over many rows share out across cores, a plain step's one row barely does.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import time

import torch

from xpress_core import engine
from xpress_core.config import DecodeConfig
from xpress_core.drafters.base import NoDrafter
from xpress_core.engine import Models, decode
from xpress_core.models import encode_prompt, load_models, pretrained
from xpress_core.trace import DecodeResult, RoundTrace, StageClock

PROMPTS = (
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "I'd like to book a table for four at an Italian restaurant tonight.",
    "Tell me a story about a dragon who is afraid of the dark.",
    "Can you find me a flight from Boston to Denver next Friday?",
)


def stage_ms(models: Models, prompts: list[torch.Tensor], cfg: DecodeConfig, repeats: int) -> dict[str, float]:
    rounds: list[RoundTrace] = []
    results: list[DecodeResult] = []
    for _ in range(repeats):
        for ids in prompts:
            for event in decode(models, ids, cfg):
                if isinstance(event, RoundTrace):
                    if event.index > 0:
                        rounds.append(event)
                else:
                    results.append(event)

    def mean_ms(values) -> float:
        return 1000 * statistics.fmean(values)

    tokens = sum(r.new_tokens for r in results)
    return {
        "draft": mean_ms(r.draft_s for r in rounds),
        "verify": mean_ms(r.verify_s for r in rounds),
        "other": mean_ms(r.other_s for r in rounds),
        "round": mean_ms(r.draft_s + r.verify_s + r.other_s for r in rounds),
        "tau": sum(len(r.emitted) for r in rounds) / len(rounds),
        "tokens_per_s": tokens / sum(r.time_s - r.prefill_s for r in results),
    }


def round_arguments(description: str, drafts: int, repeats: int, repeats_help: str = "") -> argparse.ArgumentParser:
    """The options this script and ``round_ab`` share: the models' dtype and drafter, the round, the requests."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--drafter", default=None, help="a drafter folder (default: the embedded drafter)")
    parser.add_argument("-K", type=int, default=drafts)
    parser.add_argument("-T", type=int, default=1)
    parser.add_argument("-L", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=repeats, help=repeats_help or None)
    parser.add_argument("--wall", action="store_true", help="time the stages by the wall clock, not CPU time")
    return parser


def main() -> None:
    parser = round_arguments(__doc__, drafts=1, repeats=2)
    parser.add_argument("--profile", action="store_true", help="print the cProfile table of the speculative runs")
    parser.add_argument("--unpacked", action="store_true", help="bf16 linear layers as transformers loads them")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    if args.threads > 1 and not args.wall:
        parser.error("--threads above 1 needs --wall: CPU time is this thread's alone")
    torch.set_num_threads(args.threads)
    if not args.wall:
        engine.Clock.raw = lambda self: time.thread_time()
        StageClock.host_time = staticmethod(time.thread_time)
    if args.unpacked:
        pretrained.pack_linears = lambda model: 0  # what loading did before it packed
    models = load_models(device="cpu", dtype=args.dtype, **({"drafter": args.drafter} if args.drafter else {}))
    plain = Models(models.target, models.tokenizer, NoDrafter())
    prompts = [encode_prompt(models.tokenizer, p, chat=True) for p in PROMPTS]
    cfg = DecodeConfig(drafts=args.K, steps=args.T, block=args.L, max_new_tokens=args.max_new_tokens)
    stage_ms(models, prompts[:1], cfg, 1)  # warm-up
    base = stage_ms(plain, prompts, cfg, args.repeats)
    profiler = cProfile.Profile() if args.profile else None
    if profiler:
        profiler.enable()
    spec = stage_ms(models, prompts, cfg, args.repeats)
    if profiler:
        profiler.disable()
    step = base["round"]
    print(f"dtype {args.dtype}, (K, T, L) = ({args.K}, {args.T}, {args.L}); plain step {step:.2f} ms")
    print(
        f"round: draft {spec['draft']:.2f} / verify {spec['verify']:.2f} / other {spec['other']:.2f} ms "
        f"= {spec['draft'] / step:.2f} / {spec['verify'] / step:.2f} / {spec['other'] / step:.2f} plain steps; "
        f"tau {spec['tau']:.2f}; {spec['tokens_per_s']:.1f} tok/s vs plain {base['tokens_per_s']:.1f} "
        f"({spec['tokens_per_s'] / base['tokens_per_s']:.2f}x)"
    )
    if profiler:
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(30)


if __name__ == "__main__":
    main()
