"""Does a prompt length seen for the first time cost more than a seen one? The prefill with and without row buckets.

    OMP_NUM_THREADS=1 python -m lab.first_shape [--dtype bfloat16] [--lengths 40] [--seed 1]

Loads the embedded pair, builds the kernels of the bucketed row counts (``models.warm_kernels``, as the app does at
load), then times the engine's prefill (target forward and drafter start) over prompts of new lengths, each twice
(the first call meets the length first, the second has seen it), in turns: ``exact`` runs every product at the
prompt's own length (row buckets off: ``packing.EXACT_ROWS`` above any count), ``buckets`` as the app runs. The exact
prompts have odd lengths above 64, so none of them is a bucket the other kind built. Timed by this thread's CPU time,
which other jobs on a shared machine disturb far less than the wall clock; medians printed.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

from xpress_core import packing
from xpress_core.config import DecodeConfig
from xpress_core.engine import prefill
from xpress_core.models import load_models, warm_kernels

SHORTEST, LONGEST = 65, 250  # prompt lengths past the exact row counts, within the warmed ones


def timed_prefill(models, ids: torch.Tensor, buckets: bool) -> float:
    packing.EXACT_ROWS = 64 if buckets else 1 << 30
    with torch.no_grad():
        start = time.thread_time()
        prefill(models, ids, DecodeConfig())
        return 1000 * (time.thread_time() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--lengths", type=int, default=40, help="new prompt lengths per kind")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    models = load_models(dtype=args.dtype)
    warm_kernels(models)
    rng, tokens = random.Random(args.seed), torch.Generator().manual_seed(args.seed)
    kinds = {
        "exact": rng.sample(range(SHORTEST, LONGEST, 2), args.lengths),
        "buckets": rng.sample(range(SHORTEST - 1, LONGEST), args.lengths),
    }
    times: dict[str, list[tuple[float, float]]] = {kind: [] for kind in kinds}
    for i in range(args.lengths):
        for kind, lengths in kinds.items():
            ids = torch.randint(10, models.tokenizer.vocab_size, (1, lengths[i]), generator=tokens)
            first = timed_prefill(models, ids, kind == "buckets")
            times[kind].append((first, timed_prefill(models, ids, kind == "buckets")))
    for kind, pairs in times.items():
        new, seen = statistics.median(p[0] for p in pairs), statistics.median(p[1] for p in pairs)
        ratio = statistics.median(p[0] / p[1] for p in pairs)
        print(f"{kind:8s} prefill: new length {new:6.2f} ms, seen {seen:6.2f} ms, new/seen (median) {ratio:.2f}")


if __name__ == "__main__":
    main()
