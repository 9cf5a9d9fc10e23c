"""auto's variants against fixed settings and plain decoding in real time: paired, in one process, in turns.

    OMP_NUM_THREADS=1 python -m lab.auto_ab --split tune --temperatures 0.7 --seeds 6 \
        --methods "auto;mem:GAIN_MEMORY_SAMPLED=0.8,GAIN_WEIGHT_SAMPLED=3;1x1x8;plain" [--wall]

``auto_replay`` charges every round a fixed price, which hides what the rounds really cost (its sampled figures read
about 0.98x the best fixed setting where the wall clock read 0.90-0.93x, lab log, stop 53). This script times them:
every request of the split (each seed of it when sampling) is decoded by every method in turn, the order rotating from
one request to the next, and each method's tokens and decoding seconds (prefill left out) are summed per prompt class.
The engine's clock reads this thread's CPU time (``--wall``: the wall clock), so that a job on the other core does not
move one method's figures more than another's. Methods: ``NAME:CONST=VALUE,...`` is auto with the controller's
constants set for its requests only (``auto`` alone: as it is), ``KxTxL`` a fixed setting, ``plain`` the "none"
drafter through the same engine. Printed per class: tokens per second of each, and each over the first method.
"""

from __future__ import annotations

import argparse
import re
import time
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import replace

import torch

from lab.auto_replay import holders, method_config, set_constant
from xpress_core import engine
from xpress_core.config import DecodeConfig
from xpress_core.data import evaluation_prompts, prompt_class, split_of
from xpress_core.drafters.base import NoDrafter
from xpress_core.engine import Models
from xpress_core.models import load_models
from xpress_core.trace import StageClock


def parse_method(text: str) -> tuple[str, dict[str, float]]:
    """``NAME:CONST=VALUE,...`` -> (NAME, {CONST: VALUE}); a fixed setting or ``plain`` has no constants."""
    name, _, changes = text.partition(":")
    constants = dict(change.split("=") for change in changes.split(",") if change)
    for constant in constants:
        holders(constant)
    return name, {constant: float(value) for constant, value in constants.items()}


@contextmanager
def constants_set(changes: dict[str, float]):
    """The controller's constants changed for the requests run inside, then restored."""
    before = {(module, name): getattr(module, name) for name in changes for module in holders(name)}
    for name, value in changes.items():
        set_constant(name, value)
    try:
        yield
    finally:
        for (module, name), value in before.items():
            setattr(module, name, value)


def method_run(models: Models, plain: Models, name: str, cfg: DecodeConfig) -> tuple[Models, DecodeConfig]:
    """The models and config a method decodes a request with (``cfg``: auto's; ``auto_replay.method_config``)."""
    if name == "plain":
        return plain, replace(cfg, auto=False, drafts=1, steps=1, block=1)
    return models, method_config(name if re.fullmatch(r"\d+x\d+x\d+", name) else "auto", cfg)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--methods", default="auto;1x1x8;plain", help="';'-separated, the first is the reference")
    parser.add_argument("--sets", default="sgd_dev,sgd_short,stories")
    parser.add_argument("--split", choices=("tune", "held", "all"), default="tune")
    parser.add_argument("--temperatures", default="0.7")
    parser.add_argument("--seeds", type=int, default=4, help="seeds per prompt when sampling")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--wall", action="store_true", help="time by the wall clock, not this thread's CPU time")
    args = parser.parse_args()
    methods = [parse_method(m) for m in args.methods.split(";")]
    torch.set_num_threads(1)
    if not args.wall:
        engine.Clock.raw = lambda self: time.thread_time()
        StageClock.host_time = staticmethod(time.thread_time)
    models = engine.calibrated(load_models(device="cpu", dtype=args.dtype))  # one calibration for every request
    plain = Models(models.target, models.tokenizer, NoDrafter())
    prompts = [p for p in evaluation_prompts(args.sets.split(",")) if args.split in ("all", split_of(p))]
    totals: dict = defaultdict(lambda: [0, 0.0])  # (class, temperature, method) -> [tokens, seconds]
    turn = 0
    for temperature in (float(t) for t in args.temperatures.split(",")):
        for prompt in prompts:
            ids = prompt.ids(models.tokenizer, max_new_tokens=args.max_new_tokens)
            for seed in range(args.seeds if temperature else 1):
                base = DecodeConfig(auto=True, max_new_tokens=args.max_new_tokens, temperature=temperature, seed=seed)
                turn += 1
                for name, changes in methods[turn % len(methods) :] + methods[: turn % len(methods)]:
                    run_models, cfg = method_run(models, plain, name, base)
                    with constants_set(changes):
                        result = engine.decode_to_end(run_models, ids, cfg)
                    total = totals[(prompt_class(prompt.name), temperature, name)]
                    total[0] += result.new_tokens
                    total[1] += result.time_s - result.prefill_s
    print(f"split {args.split}: {len(prompts)} prompts, {args.seeds} seeds when sampling, tokens/s:")
    for temperature, name in sorted({(t, c) for c, t, _ in totals}):
        rates = {m: totals[(name, temperature, m)][0] / totals[(name, temperature, m)][1] for m, _ in methods}
        reference = rates[methods[0][0]]
        row = "  ".join(f"{m} {rate:.1f} ({rate / reference:.3f})" for m, rate in rates.items())
        print(f"{temperature:.1f} {name:11s} {row}")


if __name__ == "__main__":
    main()
