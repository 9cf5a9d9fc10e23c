"""One call's measurement, and a setting's summary over prompts and repeats (medians, speedups, tau, timings)."""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..records import json_record
from ..trace import tokens_per_round
from .methods import METHODS, REFERENCE, Outcome, Setting


@dataclass(frozen=True)
class Measurement:
    setting: Setting
    temperature: float
    prompt: str
    repeat: int
    prompt_tokens: int
    time_s: float  # the whole call, wall clock
    outcome: Outcome
    matches: bool | None = None  # output equal to the reference's (None: not comparable)

    @property
    def new_tokens(self) -> int:
        return len(self.outcome.token_ids)

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.time_s if self.time_s > 0 else 0.0

    @property
    def tau(self) -> float:
        """Tokens emitted per verify round (accepted + the target's own)."""
        return tokens_per_round(self.outcome.accept_lens)

    @property
    def other_s(self) -> float:
        """Everything the call spent outside prefill, drafting and verifying (sampling, cache edits, Python)."""
        o = self.outcome
        return max(0.0, self.time_s - o.prefill_s - o.draft_s - o.verify_s)

    def row(self) -> dict:
        o = self.outcome
        return json_record(
            {
                **self.setting.params(),
                "temperature": self.temperature,
                "prompt": self.prompt,
                "repeat": self.repeat,
                "prompt_tokens": self.prompt_tokens,
                "new_tokens": self.new_tokens,
                "time_s": self.time_s,
                "tokens_per_s": self.tokens_per_s,
                "tau": self.tau,
                "rounds": len(o.accept_lens),
                "target_forwards": o.target_forwards,
                "prefill_s": o.prefill_s,
                "draft_s": o.draft_s,
                "verify_s": o.verify_s,
                "other_s": self.other_s,
                "mean_tree_size": statistics.fmean(o.tree_sizes) if o.tree_sizes else 0.0,
                "peak_mem_mb": o.peak_mem_mb,
                "matches_reference": self.matches,
            }
        )


@dataclass(frozen=True)
class Summary:
    """One setting at one temperature over all prompts and repeats."""

    setting: Setting
    temperature: float
    calls: int
    new_tokens: int  # over all calls
    tokens_per_s: float  # median over repeats of (tokens / seconds over all prompts)
    tokens_per_s_min: float
    tokens_per_s_max: float
    speedup: float | None  # median over repeats of tokens/s over the fastest plain decoding's in the same repeat
    speedup_min: float | None
    speedup_max: float | None
    tau: float
    tau_hist: tuple[tuple[int, int], ...]  # (tokens emitted in a round, rounds)
    forwards_per_token: float
    ms_per_token: dict[str, float]  # prefill / draft / verify / other, per generated token
    draft_ms_per_round: float
    verify_ms_per_round: float
    mean_tree_size: float
    peak_mem_mb: float
    checked: int  # calls compared with a reference
    mismatches: int

    @property
    def prefill_share(self) -> float:
        """The prefill's share of the time the calls took: large for short replies, where speculation can win only
        the rest."""
        total = sum(self.ms_per_token.values())
        return self.ms_per_token.get("prefill", 0.0) / total if total > 0 else 0.0

    def to_json(self) -> dict:
        return json_record(
            {
                **self.setting.params(),
                "temperature": self.temperature,
                "calls": self.calls,
                "prefill_share": self.prefill_share,
                "new_tokens": self.new_tokens,
                "tokens_per_s": self.tokens_per_s,
                "tokens_per_s_min": self.tokens_per_s_min,
                "tokens_per_s_max": self.tokens_per_s_max,
                "speedup": self.speedup,
                "speedup_min": self.speedup_min,
                "speedup_max": self.speedup_max,
                "tau": self.tau,
                "tau_hist": {str(k): v for k, v in self.tau_hist},
                "forwards_per_token": self.forwards_per_token,
                "ms_per_token": self.ms_per_token,
                "draft_ms_per_round": self.draft_ms_per_round,
                "verify_ms_per_round": self.verify_ms_per_round,
                "mean_tree_size": self.mean_tree_size,
                "peak_mem_mb": self.peak_mem_mb,
                "checked": self.checked,
                "mismatches": self.mismatches,
            }
        )


def summarize(measurements: Sequence[Measurement]) -> tuple[Summary, ...]:
    groups: dict[tuple[Setting, float], list[Measurement]] = {}
    for m in measurements:
        groups.setdefault((m.setting, m.temperature), []).append(m)
    reference = fastest_plain(groups)
    return tuple(summarize_group(s, t, ms, reference) for (s, t), ms in groups.items())


def fastest_plain(groups: dict[tuple[Setting, float], list[Measurement]]) -> dict[tuple[float, int], float]:
    """(temperature, repeat) -> tokens/s of ``generate`` in the dtype that decoded faster at that temperature over all
    repeats (the run's, or another it measured, ``--generate-dtypes``): every speedup is over the fastest plain
    decoding on this machine, never over a baseline held to its slower dtype (a bf16 run on a CPU where fp32 plain
    decoding is faster: issue 48)."""
    generate = {key: ms for key, ms in groups.items() if key[0].method == REFERENCE}
    faster: dict[float, list[Measurement]] = {}
    for (_, t), ms in generate.items():
        if t not in faster or throughput(ms) > throughput(faster[t]):
            faster[t] = ms
    return {(t, r): rate for t, ms in faster.items() for r, rate in repeat_rates(ms).items()}


def throughput(measurements: Sequence[Measurement]) -> float:
    seconds = sum(m.time_s for m in measurements)
    return sum(m.new_tokens for m in measurements) / seconds if seconds > 0 else 0.0


def repeat_rates(measurements: Sequence[Measurement]) -> dict[int, float]:
    """Repeat -> tokens/s of that repeat's calls, in the repeats' order."""
    return {r: throughput([m for m in measurements if m.repeat == r]) for r in sorted({m.repeat for m in measurements})}


BOOTSTRAP_ROUNDS = 1000
NOISE_INTERVAL = (0.05, 0.95)  # the bootstrap's percentiles a ratio's interval spans


def prompt_interval(calls: Sequence[Measurement], rival: Sequence[Measurement], seed: int = 0) -> tuple[float, float]:
    """The 90 % interval of ``calls``' tokens/s over ``rival``'s when the prompts they share are drawn again with
    replacement (``BOOTSTRAP_ROUNDS`` times, each prompt's calls of every repeat together, both sides the same draw):
    how far a ratio over one class's prompts moves with the prompts that happened to be in it. Why: on 6-29 prompts a
    class, one repeat, the same method read 0.91-1.02x itself, and fixed settings a few per cent apart swapped places
    from run to run (lab log, stop 69); a shortfall is one only where the whole interval lies below the goal."""

    def per_prompt(ms: Sequence[Measurement]) -> dict[str, tuple[int, float]]:
        totals: dict[str, tuple[int, float]] = {}
        for m in ms:
            tokens, seconds = totals.get(m.prompt, (0, 0.0))
            totals[m.prompt] = (tokens + m.new_tokens, seconds + m.time_s)
        return totals

    mine, theirs = per_prompt(calls), per_prompt(rival)
    shared = sorted(set(mine) & set(theirs))
    if not shared:
        return (0.0, 0.0)
    table = torch.tensor([[*mine[p], *theirs[p]] for p in shared], dtype=torch.float64)  # (prompts, 4)
    draws = torch.randint(
        0, len(shared), (BOOTSTRAP_ROUNDS, len(shared)), generator=torch.Generator().manual_seed(seed)
    )
    sums = table[draws].sum(1)  # (rounds, 4): tokens and seconds of each side over a draw
    ratios = (sums[:, 0] / sums[:, 1]) / (sums[:, 2] / sums[:, 3])
    low, high = torch.quantile(ratios, torch.tensor(NOISE_INTERVAL, dtype=torch.float64)).tolist()
    return (low, high)


def summarize_group(
    setting: Setting, temperature: float, ms: list[Measurement], reference: dict[tuple[float, int], float]
) -> Summary:
    by_repeat = repeat_rates(ms)
    rates = list(by_repeat.values())
    ratios = [rate / reference[(temperature, r)] for r, rate in by_repeat.items() if reference.get((temperature, r))]
    rounds = [a for m in ms for a in m.outcome.accept_lens]
    trees = [t for m in ms for t in m.outcome.tree_sizes]
    tokens = sum(m.new_tokens for m in ms) or 1
    compared = [m.matches for m in ms if m.matches is not None]
    per_token = {
        "prefill": sum(m.outcome.prefill_s for m in ms),
        "draft": sum(m.outcome.draft_s for m in ms),
        "verify": sum(m.outcome.verify_s for m in ms),
        "other": sum(m.other_s for m in ms),
    }
    return Summary(
        setting=setting,
        temperature=temperature,
        calls=len(ms),
        new_tokens=sum(m.new_tokens for m in ms),
        tokens_per_s=statistics.median(rates),
        tokens_per_s_min=min(rates),
        tokens_per_s_max=max(rates),
        speedup=statistics.median(ratios) if ratios else None,
        speedup_min=min(ratios) if ratios else None,
        speedup_max=max(ratios) if ratios else None,
        tau=tokens_per_round(rounds),
        tau_hist=tuple(sorted(Counter(a + 1 for a in rounds).items())),
        forwards_per_token=sum(m.outcome.target_forwards for m in ms) / tokens,
        ms_per_token={k: 1000 * v / tokens for k, v in per_token.items()},
        draft_ms_per_round=1000 * per_token["draft"] / len(rounds) if rounds else 0.0,
        verify_ms_per_round=1000 * per_token["verify"] / len(rounds) if rounds else 0.0,
        mean_tree_size=statistics.fmean(trees) if trees else 0.0,
        peak_mem_mb=max(m.outcome.peak_mem_mb for m in ms),
        checked=len(compared),
        mismatches=compared.count(False),
    )


@dataclass(frozen=True)
class PairedSpeedup:
    """A setting's speedup call by call: each call's tokens/s over the reference's on the same prompt, temperature and
    repeat, which ran beside it (the methods take turns prompt by prompt). A load that comes and goes then moves a few
    pairs, not the median, where it can move a whole repeat's total (docs/experiments.md, issue 39)."""

    median: float
    low: float  # the first quartile: half the pairs lie between low and high
    high: float  # the third quartile
    pairs: int


def paired_speedups(measurements: Sequence[Measurement]) -> dict[tuple[Setting, float], PairedSpeedup]:
    """(setting, temperature) -> its paired speedup, for every setting but the reference."""
    reference = {(m.temperature, m.prompt, m.repeat): m.tokens_per_s for m in measurements if m.setting.is_reference}
    ratios: dict[tuple[Setting, float], list[float]] = {}
    for m in measurements:
        base = reference.get((m.temperature, m.prompt, m.repeat))
        if not m.setting.is_reference and base:
            ratios.setdefault((m.setting, m.temperature), []).append(m.tokens_per_s / base)
    paired = {}
    for key, values in ratios.items():
        low, _, high = statistics.quantiles(values, n=4, method="inclusive") if len(values) > 1 else values * 3
        paired[key] = PairedSpeedup(statistics.median(values), low, high, len(values))
    return paired


def best_per_method(summaries: Sequence[Summary], temperature: float) -> dict[str, Summary]:
    """The fastest setting of each method at one temperature (what "tuned" means for every method alike)."""
    best: dict[str, Summary] = {}
    for s in summaries:
        if s.temperature == temperature and (
            s.setting.method not in best or s.tokens_per_s > best[s.setting.method].tokens_per_s
        ):
            best[s.setting.method] = s
    return {m: best[m] for m in METHODS if m in best}
