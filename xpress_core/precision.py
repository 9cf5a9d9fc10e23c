"""``--dtype auto`` on a CPU: load the models in float32 and in bfloat16, time both, keep the faster.

Why measure: which dtype is faster depends on the CPU, the thread count and the model's size, not on a CPU flag. On
the project's 2-core CPU (native bf16) the embedded pair decoded faster in fp32 than in bf16 at 2 threads and slower
at one (issue 30). So both are timed at the thread count this process runs with,
in turns (a machine whose speed drifts shifts both alike), and bf16 is kept only where it is clearly faster: fp32
gives plain decoding's tokens exactly (docs/DESIGN.md §2.5), a margin worth a little speed.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import replace
from pathlib import Path

import torch

from . import machine
from .config import DecodeConfig
from .drafters.base import NoDrafter
from .engine import CALIBRATION_TEXT, calibrated, decode_to_end
from .models import (
    DrafterOptions,
    DtypeChoice,
    DtypeTiming,
    Models,
    load_models,
    measures_dtype,
    resolve_device,
    resolve_drafter,
    resolve_model,
)
from .presets import Access

CANDIDATES = ("float32", "bfloat16")
# bf16 must be this much faster (per token) to be kept: below it fp32's exactness wins.
BF16_MARGIN = 0.05
# What ``--dtype auto`` does (``measures_dtype``, ``fastest``), as the command lines' --help says it ("%%": argparse).
DTYPE_AUTO_HELP = (
    "auto (bf16 on CUDA; fp32 on a CPU without native bf16; on one with it both are timed at load and the faster "
    f"kept, bf16 only if {100 * BF16_MARGIN:.0f}%% faster)"
)
TIMING_PROMPT_TOKENS = 32  # a short chat's prompt
# Tokens per timed request and timed turns (after one that warms up): long enough that auto's mix of drafting rounds,
# verified cuts and plain steps is in the figures, not one short request's first rounds (16 tokens, 3 turns flipped
# the choice run to run on a quiet machine: issue 48). The choice is measured once and cached (``cached_choice``).
TIMING_TOKENS = 64
TIMING_TURNS = 4


def choose_dtype(timings: dict[str, DtypeTiming], threads: int) -> DtypeChoice:
    """The faster dtype per token (speculative decoding's rounds when there is a drafter, else plain decoding's);
    bf16 only when it is ``BF16_MARGIN`` faster than fp32."""
    fp32, bf16 = timings["float32"], timings["bfloat16"]
    drafting = fp32.round_token_s is not None and bf16.round_token_s is not None
    what = "a round" if drafting else "a plain step"

    def cost(t: DtypeTiming) -> float:
        return t.round_token_s if drafting else t.plain_token_s

    ratio = cost(fp32) / cost(bf16)  # > 1: bf16 faster
    dtype = "bfloat16" if ratio > 1 + BF16_MARGIN else "float32"
    figures = " against ".join(f"{name} {describe(timings[name], drafting)}" for name in (dtype, other(dtype)))
    if dtype == "bfloat16":
        why = f"bfloat16 was {ratio:.2f}x faster per token"
    elif ratio > 1:
        why = f"bfloat16 was only {ratio:.2f}x faster per token (fp32 is exact; bf16 needs {1 + BF16_MARGIN:.2f}x)"
    else:
        why = f"float32 was {1 / ratio:.2f}x faster per token"
    where = f"{threads} thread" + ("" if threads == 1 else "s")
    return DtypeChoice(dtype, f"measured at load, {where}, {what}: {why} ({figures})", threads, timings)


def other(dtype: str) -> str:
    return CANDIDATES[1 - CANDIDATES.index(dtype)]


def describe(t: DtypeTiming, drafting: bool) -> str:
    plain = f"plain step {1000 * t.plain_step_s:.2f} ms"
    return f"round {1000 * t.round_s:.2f} ms, {plain}" if drafting else plain


def time_dtypes(candidates: dict, turns: int = TIMING_TURNS) -> dict[str, DtypeTiming]:
    """Each ``Models`` of ``candidates`` (by dtype name) timed on a greedy request, plain (the target alone) and as
    the default decodes it (``auto``, at the models' calibrated costs: its drafting rounds, cut trees and plain steps
    as they mix), the dtypes in turns; the first turn warms up (first shapes, kernel choice)."""
    first = next(iter(candidates.values()))
    prompt = first.tokenizer(CALIBRATION_TEXT * 8, return_tensors="pt")["input_ids"][:, :TIMING_PROMPT_TOKENS]
    cfg = DecodeConfig(auto=True, max_new_tokens=TIMING_TOKENS)
    runs = {name: {"plain": [], "rounds": []} for name in candidates}
    for turn in range(turns + 1):
        for name, models in candidates.items():
            plain = decode_to_end(replace(models, drafter=NoDrafter()), prompt.to(models.device), cfg)
            spec = None
            if not isinstance(models.drafter, NoDrafter):
                spec = decode_to_end(models, prompt.to(models.device), cfg)
            if turn:
                runs[name]["plain"].append(plain)
                if spec is not None:
                    runs[name]["rounds"].append(spec)
    return {name: timing(r["plain"], r["rounds"]) for name, r in runs.items()}


def timing(plain: list, rounds: list) -> DtypeTiming:
    """Medians over the timed requests (``DecodeResult``); the prefill and its first token are left out."""

    def per(results: list, unit) -> float:
        return statistics.median((r.draft_s + r.verify_s + r.other_s) / max(1, unit(r)) for r in results)

    return DtypeTiming(
        plain_step_s=per(plain, lambda r: r.rounds),
        round_s=per(rounds, lambda r: r.rounds) if rounds else None,
        plain_token_s=per(plain, lambda r: r.new_tokens - 1),
        round_token_s=per(rounds, lambda r: r.new_tokens - 1) if rounds else None,
    )


def load_fastest(
    target, drafter, device: str = "auto", dtype: str = "auto", device_map=None, drafter_options=None, access=None
) -> Models:
    """``models.load_models``, except that ``auto`` on a CPU with native bf16 loads both dtypes and keeps the faster
    (``fastest``): what the CLI and the app load with."""
    options = drafter_options or DrafterOptions()
    if not measures_dtype(dtype, resolve_device(device)):
        return load_models(target, drafter, device, dtype, device_map, options, access)
    access = access or Access.from_env()
    target, drafter = resolve_model("target", target, access), resolve_drafter(drafter, options, access)
    load = lambda name: load_models(target, drafter, device, name, None, options, access)
    choice, models = chosen_dtype(target, drafter, load)
    return replace(models or load(choice.dtype), dtype_choice=choice)


def chosen_dtype(target, drafter, load) -> tuple[DtypeChoice, Models | None]:
    """``auto``'s dtype for these models (``ModelSpec``s) at this process's threads: the choice measured before on this
    machine (``cached_choice``; no models loaded), or ``fastest``'s, then cached, with the models it kept. The CLI, the
    app and the benchmark all choose so: two loads timed afresh, on one quiet machine, chose bf16 and fp32 in turn
    (issue 48), and whatever the choice, every load of the same models here should run in the same dtype."""
    threads = torch.get_num_threads()
    key = choice_key(target, drafter, threads)
    cached = cached_choice(key)
    if cached is not None:
        return cached, None
    models, choice = fastest(load, threads)
    store_choice(key, choice)
    return choice, models


def with_costs(models):
    """The models with auto's stage costs measured (the timed requests decode with ``auto``); Models as they are
    where they are not a ``Models`` (tests inject stand-ins)."""
    return calibrated(models) if isinstance(models, Models) else models


def cache_file() -> Path:
    """The JSON file of measured dtype choices (``machine.cache_file``)."""
    return machine.cache_file("dtype_choice.json")


def spec_identity(spec) -> dict:
    """A model spec as the choice depends on it (``machine.model_identity``)."""
    return machine.model_identity(spec.name, spec.local, spec.config)


def choice_key(target, drafter, threads: int) -> str:
    """The cache key of a choice: this machine, the thread count, torch's version and the models (``machine_key``)."""
    return machine.machine_key(threads, target=spec_identity(target), drafter=spec_identity(drafter))


def cached_choice(key: str) -> DtypeChoice | None:
    """The choice measured before for ``key``, saying so, or None (no cache, another key, an unreadable file)."""
    try:
        entry = machine.cached_entry(cache_file(), key)
        timings = {name: DtypeTiming(**t) for name, t in entry["timings"].items()}
        reason = f"{entry['reason']}; cached in {cache_file()} (delete it to measure again)"
        return DtypeChoice(entry["dtype"], reason, entry["threads"], timings)
    except (KeyError, TypeError, AttributeError):
        return None


def store_choice(key: str, choice: DtypeChoice) -> None:
    """Keep a measured choice for the next load on this machine and these models."""
    machine.store_entry(cache_file(), key, choice.to_json())


def fastest(load, threads: int | None = None) -> tuple[Models, DtypeChoice]:
    """``load(dtype)`` -> Models in each candidate dtype, with their stage costs (``engine.calibrated``: auto decodes
    the timed requests at them, and the kept models keep them); the faster kept (the other released), with its
    choice."""
    start = time.perf_counter()
    candidates = {name: with_costs(load(name)) for name in CANDIDATES}
    with torch.no_grad():
        choice = choose_dtype(time_dtypes(candidates), threads or torch.get_num_threads())
    models = candidates.pop(choice.dtype)
    candidates.clear()
    seconds = time.perf_counter() - start
    return models, replace(choice, reason=f"{choice.reason}; loading and timing both took {seconds:.1f} s")
