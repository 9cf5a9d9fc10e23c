"""Measuring: every setting warmed up, then timed call by call, interleaved prompt by prompt; outputs checked against
the reference; ``sweep`` is the same measurement for the app's Sweep tab."""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace

import torch

from ..config import DecodeConfig
from ..data import Prompt
from ..drafters.base import NoDrafter
from ..engine import decode, wait_for_gpus
from ..errors import XpressError
from ..models import Models, context_limit
from ..records import json_record
from ..trace import DecodeResult, RoundTrace
from .grid import parse_grid
from .hf import run_hf
from .methods import DRAFTING, REFERENCE, XPRESS, XPRESS_NONE, BenchModels, Outcome, Setting, method_settings
from .summary import Measurement, Summary, summarize


@dataclass(frozen=True)
class Mismatch:
    setting: Setting
    temperature: float
    prompt: str
    repeat: int
    reference: str  # the method it was compared with
    first_difference: int  # index of the first differing new token
    expected: str  # the reference's text from there on
    got: str
    expected_token: str  # the first differing token's text ("" past the end)
    got_token: str

    def to_json(self) -> dict:
        rest = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "setting"}
        return json_record({"method": self.setting.method, "setting": self.setting.label, **rest})


@dataclass(frozen=True)
class MachineLoad:
    """The OS's 1-minute load average while a run measured (lowest and highest, sampled after every call) beside the
    cores and the threads the run itself used. Work beyond those threads shared the cores and slowed the timings,
    plain decoding's many small forwards more than speculation's few larger ones (issue 39), so a speedup measured
    then is the speedup under that load."""

    lowest: float
    highest: float
    cores: int
    threads: int

    @property
    def others(self) -> float:
        """Runnable threads beyond the run's own, at the highest load seen."""
        return max(0.0, self.highest - self.threads)

    @property
    def busy(self) -> bool:
        return self.others >= 0.5


def load_average() -> float | None:
    """The 1-minute load average, or None where the OS has none (Windows)."""
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else None


def machine_load(samples: Sequence[float | None]) -> MachineLoad | None:
    known = [x for x in samples if x is not None]
    if not known:
        return None
    return MachineLoad(min(known), max(known), os.cpu_count() or 1, torch.get_num_threads())


@dataclass(frozen=True)
class BenchRun:
    measurements: tuple[Measurement, ...]
    summaries: tuple[Summary, ...]
    mismatches: tuple[Mismatch, ...]
    skipped: tuple[tuple[str, str], ...]  # (setting name, why) for settings the models cannot run
    load: MachineLoad | None = None  # None where the OS reports no load average


@dataclass(frozen=True)
class RunPlan:
    """What to run: settings x temperatures on prompts, how often, and how long each answer is."""

    settings: tuple[Setting, ...]
    temperatures: tuple[float, ...] = (0.0,)
    max_new_tokens: int = 128
    repeats: int = 3
    warmup: int = 1
    seed: int = 0


Progress = Callable[[int, int, str], None]  # (calls done, calls in all, what just ran)


def synchronized_clock(devices: tuple[torch.device, ...]) -> Callable[[], float]:
    """perf_counter that first waits for the queued work of the models' GPUs, so a call's time includes its kernels."""

    def now() -> float:
        wait_for_gpus(devices)
        return time.perf_counter()

    return now


def run_xpress(models: Models, ids: torch.Tensor, cfg: DecodeConfig) -> Outcome:
    """One request through the engine, read from its events (round 0 is the prefill)."""
    tree_sizes = []
    for event in decode(models, ids, cfg):
        if isinstance(event, RoundTrace) and event.index > 0:
            tree_sizes.append(event.tree_size)
    assert isinstance(event, DecodeResult)  # decode() always ends with its result
    return Outcome(
        event.token_ids,
        event.prefill_s,
        event.draft_s,
        event.verify_s,
        event.accept_lens,
        tuple(tree_sizes),
        event.target_forwards,
        event.peak_mem_mb,
    )


def run_setting(
    models: BenchModels, setting: Setting, ids: torch.Tensor, cfg: DecodeConfig, now: Callable[[], float]
) -> Outcome:
    if setting.method == XPRESS_NONE:
        return run_xpress(Models(models.target, models.tokenizer, NoDrafter()), ids, cfg)
    if setting.method in DRAFTING:
        engine = Models(models.target, models.tokenizer, models.drafter_of(setting), models.costs)
        return run_xpress(
            engine,
            ids,
            replace(setting.decode, temperature=cfg.temperature, seed=cfg.seed, max_new_tokens=cfg.max_new_tokens),
        )
    return run_hf(models, setting, ids, cfg, now)


def timed_call(models: BenchModels, setting: Setting, ids: torch.Tensor, cfg: DecodeConfig) -> tuple[float, Outcome]:
    for device in models.cuda_devices:
        torch.cuda.reset_peak_memory_stats(device)
    now = synchronized_clock(models.cuda_devices)
    with torch.no_grad():
        start = now()
        outcome = run_setting(models, setting, ids, cfg, now)
        return now() - start, outcome


def measure(
    models: BenchModels, prompts: Sequence[Prompt], plan: RunPlan, progress: Progress | None = None
) -> BenchRun:
    """Warm every setting up (on the longest prompt), then run ``repeats`` rounds over the prompts; within a prompt,
    every setting and temperature once, in a shuffled order, so drift of the machine spreads over all methods alike.
    The machine's load is sampled after every timed call."""
    if not prompts:
        raise XpressError("no prompt to measure")
    limit = context_limit(models.target)
    encoded = [p.ids(models.tokenizer, limit, plan.max_new_tokens).to(models.device) for p in prompts]
    jobs = [(s, t) for s in plan.settings for t in plan.temperatures]
    total = len(jobs) * (plan.warmup + plan.repeats * len(prompts))
    done = 0
    loads = []  # sampled after every timed call, the warm-up's excluded

    def call(setting: Setting, temperature: float, ids: torch.Tensor) -> tuple[float, Outcome]:
        nonlocal done
        cfg = DecodeConfig(temperature=temperature, seed=plan.seed, max_new_tokens=plan.max_new_tokens)
        result = timed_call(models, setting, ids, cfg)
        done += 1
        if progress:
            progress(done, total, setting.name)
        return result

    skipped: dict[Setting, str] = {}
    longest = max(encoded, key=lambda ids: ids.shape[1])  # warm-up at the largest shapes the timed calls will meet
    for _ in range(plan.warmup):
        for setting, temperature in jobs:
            if setting in skipped:
                done += 1
                continue
            try:
                call(setting, temperature, longest)
            except XpressError as error:  # e.g. L beyond the drafter's trained block: reported, not fatal
                if setting.is_reference:
                    raise
                skipped[setting] = str(error)
    jobs = [(s, t) for s, t in jobs if s not in skipped]
    total -= len(plan.temperatures) * len(skipped) * plan.repeats * len(prompts)
    measurements = []
    for repeat in range(plan.repeats):
        for index, (prompt, ids) in enumerate(zip(prompts, encoded)):
            order = list(jobs)
            random.Random(f"{plan.seed}-{repeat}-{index}").shuffle(order)
            for setting, temperature in order:
                seconds, outcome = call(setting, temperature, ids)
                loads.append(load_average())
                measurements.append(
                    Measurement(setting, temperature, prompt.name, repeat, ids.shape[1], seconds, outcome)
                )
    checked, mismatches = check_outputs(measurements, models.tokenizer)
    return BenchRun(
        tuple(checked),
        summarize(checked),
        tuple(mismatches),
        tuple((s.name, why) for s, why in skipped.items()),
        machine_load(loads),
    )


def reference_method(setting: Setting, temperature: float) -> str | None:
    """Greedy: every method must give ``generate``'s tokens. Sampling: xPress with a drafter must give the engine's
    plain tokens at the same seed; transformers samples with its own draws, so its outputs are not comparable.
    ``generate`` in another dtype is not checked: its tokens differ from the reference's by that dtype's rounding."""
    if temperature == 0.0:
        return REFERENCE if setting.method != REFERENCE else None
    return XPRESS_NONE if setting.method in DRAFTING else None


def check_outputs(measurements: list[Measurement], tokenizer) -> tuple[list[Measurement], list[Mismatch]]:
    expected = {
        (m.setting.method, m.temperature, m.prompt, m.repeat): m.outcome.token_ids
        for m in measurements
        if m.setting.is_reference or m.setting.method == XPRESS_NONE
    }
    checked, mismatches = [], []
    for m in measurements:
        ref = reference_method(m.setting, m.temperature)
        want = expected.get((ref, m.temperature, m.prompt, m.repeat))
        if want is None:
            checked.append(m)
            continue
        got = m.outcome.token_ids
        checked.append(replace(m, matches=got == want))
        if got != want:
            first = next((i for i, (a, b) in enumerate(zip(want, got)) if a != b), min(len(want), len(got)))
            mismatches.append(
                Mismatch(
                    m.setting,
                    m.temperature,
                    m.prompt,
                    m.repeat,
                    ref,
                    first,
                    tokenizer.decode(want[first:]),
                    tokenizer.decode(got[first:]),
                    tokenizer.decode(want[first : first + 1]),
                    tokenizer.decode(got[first : first + 1]),
                )
            )
    return checked, mismatches


def sweep(
    models: Models,
    prompts: Sequence[str | Prompt],
    grid: str | Sequence[DecodeConfig],
    *,
    temperature: float = 0.0,
    max_new_tokens: int = 64,
    repeats: int = 1,
    warmup: int = 1,
    seed: int = 0,
    progress: Progress | None = None,
) -> BenchRun:
    """A live (K, T, ...) grid search for the app: ``hf-generate`` (the reference) and xPress at every grid
    setting, on the app's loaded models. Feed ``run.summaries`` to ``figures.heatmap``."""
    configs = parse_grid(grid) if isinstance(grid, str) else tuple(c.validate() for c in grid)
    chats = tuple(
        p if isinstance(p, Prompt) else Prompt(f"prompt-{i}", (("user", p),), chat=True) for i, p in enumerate(prompts)
    )
    plan = RunPlan(method_settings([XPRESS], configs, (), ()), (temperature,), max_new_tokens, repeats, warmup, seed)
    return measure(BenchModels(models.target, models.tokenizer, models.drafter), chats, plan, progress)
