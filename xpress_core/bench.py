"""``python -m xpress_core bench``: tokens/s of xPress side by side with what users would otherwise pick.

Methods, run in ONE process on the same target, prompts and ``max_new_tokens``, interleaved prompt by prompt:

1. ``hf-generate``: transformers ``generate`` (the reference every speedup divides by);
2. ``hf-assisted``: transformers assisted generation with the autoregressive drafter, several draft lengths;
3. ``hf-prompt-lookup``: transformers prompt lookup decoding, several candidate lengths;
4. ``xpress-none``: the xPress engine without a drafter (its own overhead);
5. ``xpress``: the xPress engine with the diffusion drafter over a (K, T, L, refine, verify) grid.

Every call is timed as a whole (CUDA-synchronized before and after). Per-round facts come from the engine's own
events for xPress, and from forward hooks on the target and the assistant for transformers (which has no events):
one target forward is one verify round there. Greedy outputs are compared with ``hf-generate`` token for token;
sampled xPress outputs with ``xpress-none`` at the same seed (the engine's "same seed, same text" promise).
"""

from __future__ import annotations

import argparse
import csv
import json
import platform
import random
import statistics
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from itertools import pairwise, product
from pathlib import Path

import torch

from .config import DIVERSITY, REFINE_MODES, SCHEDULES, VERIFY_MODES, DecodeConfig
from .drafters.base import Drafter, NoDrafter
from .engine import Models, decode, eos_ids, wait_for_gpus
from .errors import XpressError
from .models import (
    EMBEDDED_AR_DRAFTER,
    EMBEDDED_DRAFTER,
    EMBEDDED_GAUSS_DRAFTER,
    EMBEDDED_TARGET,
    check_tokenizer_match,
    encode_prompt,
    load_causal_lm,
    load_drafter,
    load_target,
    resolve_device,
    resolve_dtype,
)
from .trace import DecodeResult, RoundTrace, peak_memory_mb, tokens_per_round
from .train.cli import DEFAULT_DATA

SCHEMA = "xpress-bench/1"

HF_GENERATE = "hf-generate"
HF_ASSISTED = "hf-assisted"
HF_LOOKUP = "hf-prompt-lookup"
XPRESS_NONE = "xpress-none"
XPRESS = "xpress"
METHODS = (HF_GENERATE, HF_ASSISTED, HF_LOOKUP, XPRESS_NONE, XPRESS)
REFERENCE = HF_GENERATE

# Grid keys as users write them -> DecodeConfig fields; "T=L" means as many denoise steps as block positions.
GRID_KEYS = {"K": "drafts", "T": "steps", "L": "block", "refine": "refine", "verify": "verify",
             "schedule": "schedule", "diversity": "diversity"}
GRID_CHOICES = {"refine": REFINE_MODES, "verify": VERIFY_MODES, "schedule": SCHEDULES, "diversity": DIVERSITY}
STEPS_EQUAL_BLOCK = "L"
FULL_GRID = "K=1,2,4,8 T=1,2,4,L L=4,8,16 refine=parallel,serial verify=tree,batch"
QUICK_GRID = "K=1,4 T=1,2 L=8; K=4 T=2 L=8 refine=serial; K=4 T=2 L=8 verify=batch"

# Assisted generation: candidate tokens per round, constant schedule. ``None`` = transformers' own default (start at
# 20, heuristic schedule, confidence threshold 0.4), what a user gets without tuning.
ASSISTED_TOKENS = (2, 4, 8, None)
ASSISTED_TOKENS_QUICK = (4, None)
LOOKUP_TOKENS = (3, 5, 10)
LOOKUP_TOKENS_QUICK = (5,)

SAMPLING_TEMPERATURE = 0.7
TEMPERATURES = (0.0, SAMPLING_TEMPERATURE)

# Two stages keep the full grid affordable on a 2-core CPU: the search stage runs every setting once, greedy, on a
# spread subset of the prompts; the final stage measures the finalists (the best setting of every method, the top
# xPress settings) on all prompts, at every temperature, with repeats. Grids this small skip the search.
SEARCH_PROMPTS = 12
FINALISTS = 3
SEARCH_STAGE, FINAL_STAGE = "search", "final"

# Issue 5's goals (embedded models, greedy): what the JSON's "goals" checks.
GOAL_SPEEDUP = 2.5  # best xPress over generate
GOAL_OVER_RIVALS = 1.5  # best xPress over the best assisted / prompt lookup setting
GOAL_ENGINE_SHARE = 0.9  # xpress-none tokens/s at least this share of generate's
GOAL_DRAFT_RATIO = 1.6  # drafting time per round, K=4 over K=1, parallel refinement
REFINEMENT_PAIR = (1, 4)  # the K values the drafting-time goal compares
PARALLEL = REFINE_MODES[0]

# Default prompts (issue 5): 50 held-out sgd_dev chats, spread over the file (it is grouped by domain), each cut
# after its second user turn so the reply has context to continue (and prompt lookup something to copy), plus
# story requests phrased unlike the training ones.
SGD_DEV = Path("sgd") / "sgd_dev.txt"
SGD_PROMPTS = 50
SGD_CONTEXT_TURNS = 3
STORY_REQUESTS = (
    "Write a short story about a puppy who is afraid of the rain.",
    "Tell me a story about a girl named Mia and her red kite.",
    "Can you tell me a story about a dragon who wants to be friends?",
    "Please write a bedtime story about the moon and a little owl.",
    "Tell me a story where a boy finds a magic box in the garden.",
    "Write a story about two friends who build a boat.",
    "Tell me a short story about a cat who loves to bake.",
    "Please tell me a story about a tree that can talk.",
    "Can you write a story for kids about a lost teddy bear?",
    "Tell me a happy story about a fish who learns to sing.",
)
QUICK_PROMPTS = (2, 2)  # (sgd chats, story requests) in --quick


@dataclass(frozen=True)
class Prompt:
    name: str
    content: str | tuple[tuple[str, str], ...]  # raw text, or chat messages as (role, content)
    chat: bool

    def ids(self, tokenizer) -> torch.Tensor:
        """(1, n) prompt ids, the chat template applied for chat prompts."""
        if isinstance(self.content, str):
            return encode_prompt(tokenizer, self.content, chat=self.chat)
        return encode_prompt(tokenizer, [{"role": r, "content": c} for r, c in self.content], chat=True)


@dataclass(frozen=True)
class Setting:
    """One method with its parameters; what a row of the results names."""

    method: str
    decode: DecodeConfig | None = None  # xpress: the drafter settings (K, T, L, refine, verify, ...)
    draft_tokens: int | None = None  # hf-assisted / hf-prompt-lookup: candidates per round (None: HF default)

    @property
    def label(self) -> str:
        if self.method == XPRESS:
            d = self.decode
            return f"K={d.drafts} T={d.steps} L={d.block} {d.refine} {d.verify}"
        if self.method in (HF_ASSISTED, HF_LOOKUP):
            return "default" if self.draft_tokens is None else f"n={self.draft_tokens}"
        return ""

    @property
    def name(self) -> str:
        return f"{self.method} {self.label}".strip()

    def params(self) -> dict:
        d = self.decode if self.method == XPRESS else None
        return {
            "method": self.method,
            "setting": self.label,
            **{key: getattr(d, field) if d else None for key, field in GRID_KEYS.items()},
            "draft_tokens": self.draft_tokens,
        }


@dataclass(frozen=True)
class Outcome:
    """What one call produced, read from the engine's events or the forward hooks."""

    token_ids: tuple[int, ...]
    prefill_s: float
    draft_s: float
    verify_s: float
    accept_lens: tuple[int, ...]  # per verify round: draft tokens accepted
    tree_sizes: tuple[int, ...]  # per verify round: draft tokens verified
    target_forwards: int
    peak_mem_mb: float


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
        return {
            **self.setting.params(),
            "temperature": self.temperature,
            "prompt": self.prompt,
            "repeat": self.repeat,
            "prompt_tokens": self.prompt_tokens,
            "new_tokens": self.new_tokens,
            "time_s": round(self.time_s, 6),
            "tokens_per_s": round(self.tokens_per_s, 3),
            "tau": round(self.tau, 4),
            "rounds": len(o.accept_lens),
            "target_forwards": o.target_forwards,
            "prefill_s": round(o.prefill_s, 6),
            "draft_s": round(o.draft_s, 6),
            "verify_s": round(o.verify_s, 6),
            "other_s": round(self.other_s, 6),
            "mean_tree_size": round(statistics.fmean(o.tree_sizes), 3) if o.tree_sizes else 0.0,
            "peak_mem_mb": round(o.peak_mem_mb, 1),
            "matches_reference": self.matches,
        }


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
    speedup: float | None  # median over repeats of tokens/s over the reference's in the same repeat
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

    def to_json(self) -> dict:
        return {
            **self.setting.params(),
            "temperature": self.temperature,
            "calls": self.calls,
            "new_tokens": self.new_tokens,
            "tokens_per_s": round(self.tokens_per_s, 3),
            "tokens_per_s_min": round(self.tokens_per_s_min, 3),
            "tokens_per_s_max": round(self.tokens_per_s_max, 3),
            "speedup": _round(self.speedup),
            "speedup_min": _round(self.speedup_min),
            "speedup_max": _round(self.speedup_max),
            "tau": round(self.tau, 4),
            "tau_hist": {str(k): v for k, v in self.tau_hist},
            "forwards_per_token": round(self.forwards_per_token, 4),
            "ms_per_token": {k: round(v, 4) for k, v in self.ms_per_token.items()},
            "draft_ms_per_round": round(self.draft_ms_per_round, 4),
            "verify_ms_per_round": round(self.verify_ms_per_round, 4),
            "mean_tree_size": round(self.mean_tree_size, 3),
            "peak_mem_mb": round(self.peak_mem_mb, 1),
            "checked": self.checked,
            "mismatches": self.mismatches,
        }


@dataclass(frozen=True)
class Mismatch:
    setting: Setting
    temperature: float
    prompt: str
    repeat: int
    reference: str  # the method it was compared with
    first_difference: int  # index of the first differing new token
    expected: str
    got: str

    def to_json(self) -> dict:
        return {"method": self.setting.method, "setting": self.setting.label, "temperature": self.temperature,
                "prompt": self.prompt, "repeat": self.repeat, "reference": self.reference,
                "first_difference": self.first_difference, "expected": self.expected, "got": self.got}


@dataclass(frozen=True)
class BenchRun:
    measurements: tuple[Measurement, ...]
    summaries: tuple[Summary, ...]
    mismatches: tuple[Mismatch, ...]
    skipped: tuple[tuple[str, str], ...]  # (setting name, why) for settings the models cannot run


@dataclass(frozen=True)
class BenchModels:
    """The target and every drafter the selected methods need, loaded once and shared."""

    target: torch.nn.Module
    tokenizer: object
    drafter: Drafter | None = None  # xpress: the diffusion drafter
    assistant: torch.nn.Module | None = None  # hf-assisted: an AutoModelForCausalLM with the target's tokenizer

    @property
    def device(self) -> torch.device:
        return self.target.device


@dataclass(frozen=True)
class RunPlan:
    """What to run: settings x temperatures on prompts, how often, and how long each answer is."""

    settings: tuple[Setting, ...]
    temperatures: tuple[float, ...] = (0.0,)
    max_new_tokens: int = 128
    repeats: int = 3
    warmup: int = 1
    seed: int = 0


@dataclass(frozen=True)
class Stage:
    name: str  # SEARCH_STAGE or FINAL_STAGE
    prompts: tuple[Prompt, ...]
    plan: RunPlan
    run: BenchRun


Progress = Callable[[int, int, str], None]  # (calls done, calls in all, what just ran)


# ----------------------------------------------------------------------------------------------------------- grid


def parse_grid(spec: str) -> tuple[DecodeConfig, ...]:
    """``"K=1,4 T=1,2,L L=8 refine=parallel; K=4 ..."``: the union of the ';'-separated cartesian products.

    Keys left out take DecodeConfig's default; settings with T > L are skipped; duplicates (T=4 and T=L at L=4) are
    kept once.
    """
    configs: dict[DecodeConfig, None] = {}  # ordered set
    defaults = DecodeConfig()
    for part in filter(str.strip, spec.split(";")):
        values = _grid_values(part)
        axes = {key: values.get(key, (getattr(defaults, field),)) for key, field in GRID_KEYS.items()}
        for combo in product(*axes.values()):
            chosen = dict(zip(axes, combo))
            block = chosen["L"]
            steps = block if chosen["T"] == STEPS_EQUAL_BLOCK else chosen["T"]
            if steps > block:
                continue
            fields = {GRID_KEYS[k]: v for k, v in chosen.items()} | {"steps": steps}
            configs[DecodeConfig(**fields).validate()] = None
    if not configs:
        raise XpressError(f"the grid {spec!r} selects no setting (is every T <= L?)")
    return tuple(configs)


def _grid_values(part: str) -> dict[str, tuple]:
    values = {}
    for item in part.split():
        key, sep, raw = item.partition("=")
        if not sep or key not in GRID_KEYS or not raw:
            raise XpressError(f"grid item {item!r}: write KEY=V1,V2 with KEY one of {', '.join(GRID_KEYS)}")
        values[key] = tuple(_grid_value(key, v) for v in raw.split(","))
    return values


def _grid_value(key: str, raw: str):
    if key in GRID_CHOICES:
        if raw not in GRID_CHOICES[key]:
            raise XpressError(f"grid {key}={raw!r}: choose from {', '.join(GRID_CHOICES[key])}")
        return raw
    if key == "T" and raw == STEPS_EQUAL_BLOCK:
        return raw
    if not raw.isdigit() or int(raw) < 1:
        raise XpressError(f"grid {key}={raw!r}: expected a positive integer" + (" or L" if key == "T" else ""))
    return int(raw)


def method_settings(methods: Sequence[str], grid: Sequence[DecodeConfig], assisted_tokens: Sequence[int | None],
                    lookup_tokens: Sequence[int | None]) -> tuple[Setting, ...]:
    """Every setting of the selected methods; the reference always runs (speedups divide by it)."""
    unknown = set(methods) - set(METHODS)
    if unknown:
        raise XpressError(f"unknown method(s) {', '.join(sorted(unknown))}; choose from {', '.join(METHODS)}")
    if HF_LOOKUP in methods and (not lookup_tokens or None in lookup_tokens):
        raise XpressError("prompt lookup needs candidate lengths (integers): it has no default")
    per_method = {
        HF_GENERATE: [Setting(HF_GENERATE)],
        HF_ASSISTED: [Setting(HF_ASSISTED, draft_tokens=n) for n in assisted_tokens],
        HF_LOOKUP: [Setting(HF_LOOKUP, draft_tokens=n) for n in lookup_tokens],
        XPRESS_NONE: [Setting(XPRESS_NONE)],
        XPRESS: [Setting(XPRESS, decode=d) for d in grid],
    }
    chosen = [REFERENCE, *(m for m in METHODS if m in methods and m != REFERENCE)]
    return tuple(s for m in chosen for s in per_method[m])


# -------------------------------------------------------------------------------------------------------- prompts


def default_prompts(data_dir: Path, sgd: int = SGD_PROMPTS, stories: int = len(STORY_REQUESTS)) -> tuple[Prompt, ...]:
    from .train.corpus import read_dialogues

    path = data_dir / SGD_DEV
    if not path.exists():
        raise XpressError(f"the default prompts need {path} (the shared data folder); pass --data DIR or "
                          f"--prompts FILE.jsonl")
    dialogues = [d for d in read_dialogues(path) if d and d[0]["role"] == "user"]
    stride = max(1, len(dialogues) // sgd)
    chats = []
    for i in range(0, len(dialogues), stride)[:sgd]:
        turns = dialogues[i][:SGD_CONTEXT_TURNS]
        while turns[-1]["role"] != "user":  # the prompt ends with the user's turn: the reply is the assistant's
            turns = turns[:-1]
        chats.append(Prompt(f"sgd_dev-{i}", tuple((m["role"], m["content"]) for m in turns), chat=True))
    return tuple(chats) + story_prompts(stories)


def story_prompts(count: int = len(STORY_REQUESTS)) -> tuple[Prompt, ...]:
    """The first ``count`` story requests: held out too, and built in (they need no data folder)."""
    return tuple(Prompt(f"story-{i}", (("user", text),), chat=True) for i, text in enumerate(STORY_REQUESTS[:count]))


def read_prompt_file(path: Path) -> tuple[Prompt, ...]:
    """JSONL, one object a line: ``{"messages": [{"role", "content"}, ...]}`` or ``{"prompt": "raw text"}``."""
    if not path.exists():
        raise XpressError(f"prompt file {path} does not exist")
    prompts = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            item = json.loads(line)
        except json.JSONDecodeError as error:
            raise XpressError(f"{where}: not JSON ({error.msg})") from error
        name = str(item.get("name", f"{path.stem}-{number}")) if isinstance(item, dict) else ""
        if isinstance(item, dict) and isinstance(item.get("prompt"), str):
            prompts.append(Prompt(name, item["prompt"], chat=False))
        elif isinstance(item, dict) and isinstance(item.get("messages"), list) and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in item["messages"]
        ) and item["messages"]:
            prompts.append(Prompt(name, tuple((m["role"], m["content"]) for m in item["messages"]), chat=True))
        else:
            raise XpressError(f'{where}: expected {{"messages": [{{"role": ..., "content": ...}}]}} or {{"prompt": "..."}}')
    if not prompts:
        raise XpressError(f"prompt file {path} holds no prompt")
    return tuple(prompts)


# ------------------------------------------------------------------------------------------------------- methods


def synchronized_clock(device: torch.device) -> Callable[[], float]:
    """perf_counter that first waits for queued CUDA work, so a call's time includes its kernels."""

    def now() -> float:
        if device.type == "cuda":
            wait_for_gpus()
        return time.perf_counter()

    return now


@dataclass
class ForwardCall:
    cache_len: int  # tokens in the KV cache before the forward
    input_len: int
    seconds: float = 0.0


class ForwardProbe:
    """Records a module's forward calls (cache length, input length, time): transformers' ``generate`` yields no
    per-round events, and one target forward is one verify round there.

    Only calls from the thread that opened the probe count: in the app, other requests share the target.
    """

    def __init__(self, module: torch.nn.Module | None, now: Callable[[], float]):
        self.module, self.now = module, now
        self.calls: list[ForwardCall] = []
        self.handles = []
        self.started = 0.0
        self.thread = threading.get_ident()

    def __enter__(self) -> ForwardProbe:
        if self.module is not None:
            self.handles = [self.module.register_forward_pre_hook(self.before, with_kwargs=True),
                            self.module.register_forward_hook(self.after, with_kwargs=True)]
        return self

    def __exit__(self, *exc) -> None:
        for handle in self.handles:
            handle.remove()

    def before(self, module, args, kwargs) -> None:
        if threading.get_ident() != self.thread:
            return
        cache = kwargs.get("cache")
        ids = kwargs.get("input_ids", args[0] if args else None)
        if cache is None or ids is None:
            raise XpressError("transformers called the model without `cache`/`input_ids` keywords: the bench's "
                              "forward probe needs updating for this transformers version")
        self.calls.append(ForwardCall(cache.get_seq_length(), ids.shape[1]))
        self.started = self.now()

    def after(self, module, args, kwargs, output) -> None:
        if threading.get_ident() == self.thread:
            self.calls[-1].seconds = self.now() - self.started

    @property
    def seconds(self) -> float:
        return sum(c.seconds for c in self.calls)


def hf_rounds(calls: list[ForwardCall], prompt_len: int, new_tokens: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(accepted, verified) draft tokens per round, from the target's forwards.

    Between rounds the cache holds every committed token but the last, so the tokens a round emitted are the growth
    of the cache length from its forward to the next one (the prompt's last token plays the cache's first "root").
    The first forward is the prefill; it counts as a round only when it verified candidates too (assisted).
    """
    starts = [prompt_len - 1] + [c.cache_len for c in calls[1:]] + [prompt_len + new_tokens - 1]
    emitted = [b - a for a, b in pairwise(starts)]
    verified = [calls[0].input_len - prompt_len] + [c.input_len - 1 for c in calls[1:]]
    rounds = [(e - 1, v) for i, (e, v) in enumerate(zip(emitted, verified)) if i > 0 or v > 0]
    return tuple(a for a, _ in rounds), tuple(v for _, v in rounds)


def configure_assistant(assistant: torch.nn.Module, draft_tokens: int | None) -> None:
    """transformers reads the draft length from the assistant's generation config; set it before each call so no
    call inherits what an earlier one adapted (the heuristic schedule and the confidence threshold persist)."""
    config = assistant.generation_config
    if draft_tokens is None:
        defaults = config._get_default_generation_params()
        for key in ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold"):
            setattr(config, key, defaults[key])
    else:
        config.num_assistant_tokens = draft_tokens
        config.num_assistant_tokens_schedule = "constant"
        config.assistant_confidence_threshold = 0.0  # off: exactly draft_tokens candidates every round


def run_hf(models: BenchModels, setting: Setting, ids: torch.Tensor, cfg: DecodeConfig,
           now: Callable[[], float]) -> Outcome:
    """transformers ``generate`` with the same sampler as the engine (temperature, top-k, top-p; nothing else)."""
    pad = models.tokenizer.pad_token_id
    kwargs = {"max_new_tokens": cfg.max_new_tokens, "do_sample": not cfg.greedy,
              "pad_token_id": models.tokenizer.eos_token_id if pad is None else pad}
    if not cfg.greedy:
        kwargs.update(temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p)
        torch.manual_seed(cfg.seed)  # generate samples from torch's global generator
    assistant = models.assistant if setting.method == HF_ASSISTED else None
    if assistant is not None:
        configure_assistant(assistant, setting.draft_tokens)
        kwargs["assistant_model"] = assistant
    if setting.method == HF_LOOKUP:
        kwargs["prompt_lookup_num_tokens"] = setting.draft_tokens
    with ForwardProbe(models.target, now) as verify, ForwardProbe(assistant, now) as draft:
        out = models.target.generate(ids, attention_mask=torch.ones_like(ids), **kwargs)
    tokens = tuple(out[0, ids.shape[1]:].tolist())
    accepted, verified = hf_rounds(verify.calls, ids.shape[1], len(tokens))
    return Outcome(tokens, verify.calls[0].seconds, draft.seconds, verify.seconds - verify.calls[0].seconds,
                   accepted, verified, len(verify.calls), peak_memory_mb(models.device))


def run_xpress(models: Models, ids: torch.Tensor, cfg: DecodeConfig) -> Outcome:
    """One request through the engine, read from its events (round 0 is the prefill)."""
    tree_sizes = []
    for event in decode(models, ids, cfg):
        if isinstance(event, RoundTrace) and event.index > 0:
            tree_sizes.append(event.tree_size)
    assert isinstance(event, DecodeResult)  # decode() always ends with its result
    return Outcome(event.token_ids, event.prefill_s, event.draft_s, event.verify_s, event.accept_lens,
                   tuple(tree_sizes), event.target_forwards, event.peak_mem_mb)


def run_setting(models: BenchModels, setting: Setting, ids: torch.Tensor, cfg: DecodeConfig,
                now: Callable[[], float]) -> Outcome:
    if setting.method == XPRESS_NONE:
        return run_xpress(Models(models.target, models.tokenizer, NoDrafter()), ids, cfg)
    if setting.method == XPRESS:
        engine = Models(models.target, models.tokenizer, models.drafter)
        return run_xpress(engine, ids, replace(setting.decode, temperature=cfg.temperature, seed=cfg.seed,
                                               max_new_tokens=cfg.max_new_tokens))
    return run_hf(models, setting, ids, cfg, now)


def timed_call(models: BenchModels, setting: Setting, ids: torch.Tensor, cfg: DecodeConfig) -> tuple[float, Outcome]:
    if models.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(models.device)
    now = synchronized_clock(models.device)
    with torch.no_grad():
        start = now()
        outcome = run_setting(models, setting, ids, cfg, now)
        return now() - start, outcome


# ------------------------------------------------------------------------------------------------------ the run


def measure(models: BenchModels, prompts: Sequence[Prompt], plan: RunPlan,
            progress: Progress | None = None) -> BenchRun:
    """Warm every setting up, then run ``repeats`` rounds over the prompts; within a prompt, every setting and
    temperature once, in a shuffled order, so drift of the machine spreads over all methods alike."""
    if not prompts:
        raise XpressError("no prompt to measure")
    encoded = [p.ids(models.tokenizer).to(models.device) for p in prompts]
    jobs = [(s, t) for s in plan.settings for t in plan.temperatures]
    total = len(jobs) * (plan.warmup + plan.repeats * len(prompts))
    done = 0

    def call(setting: Setting, temperature: float, ids: torch.Tensor) -> tuple[float, Outcome]:
        nonlocal done
        cfg = DecodeConfig(temperature=temperature, seed=plan.seed, max_new_tokens=plan.max_new_tokens)
        result = timed_call(models, setting, ids, cfg)
        done += 1
        if progress:
            progress(done, total, setting.name)
        return result

    skipped: dict[Setting, str] = {}
    for _ in range(plan.warmup):
        for setting, temperature in jobs:
            if setting in skipped:
                done += 1
                continue
            try:
                call(setting, temperature, encoded[0])
            except XpressError as error:  # e.g. L beyond the drafter's trained block: reported, not fatal
                if setting.method == REFERENCE:
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
                measurements.append(Measurement(setting, temperature, prompt.name, repeat, ids.shape[1], seconds,
                                                outcome))
    checked, mismatches = check_outputs(measurements, models.tokenizer)
    return BenchRun(tuple(checked), summarize(checked), tuple(mismatches),
                    tuple((s.name, why) for s, why in skipped.items()))


def reference_method(setting: Setting, temperature: float) -> str | None:
    """Greedy: every method must give ``generate``'s tokens. Sampling: xPress with a drafter must give the engine's
    plain tokens at the same seed; transformers samples with its own draws, so its outputs are not comparable."""
    if temperature == 0.0:
        return REFERENCE if setting.method != REFERENCE else None
    return XPRESS_NONE if setting.method == XPRESS else None


def check_outputs(measurements: list[Measurement], tokenizer) -> tuple[list[Measurement], list[Mismatch]]:
    expected = {(m.setting.method, m.temperature, m.prompt, m.repeat): m.outcome.token_ids for m in measurements
                if m.setting.method in (REFERENCE, XPRESS_NONE)}
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
            mismatches.append(Mismatch(m.setting, m.temperature, m.prompt, m.repeat, ref, first,
                                       tokenizer.decode(want[first:]), tokenizer.decode(got[first:])))
    return checked, mismatches


def summarize(measurements: Sequence[Measurement]) -> tuple[Summary, ...]:
    groups: dict[tuple[Setting, float], list[Measurement]] = {}
    for m in measurements:
        groups.setdefault((m.setting, m.temperature), []).append(m)
    reference = {(t, r): throughput([m for m in ms if m.repeat == r]) for (s, t), ms in groups.items()
                 if s.method == REFERENCE for r in {m.repeat for m in ms}}
    return tuple(summarize_group(s, t, ms, reference) for (s, t), ms in groups.items())


def throughput(measurements: Sequence[Measurement]) -> float:
    seconds = sum(m.time_s for m in measurements)
    return sum(m.new_tokens for m in measurements) / seconds if seconds > 0 else 0.0


def summarize_group(setting: Setting, temperature: float, ms: list[Measurement],
                    reference: dict[tuple[float, int], float]) -> Summary:
    repeats = sorted({m.repeat for m in ms})
    rates = [throughput([m for m in ms if m.repeat == r]) for r in repeats]
    ratios = [rate / reference[(temperature, r)] for rate, r in zip(rates, repeats)
              if reference.get((temperature, r))]
    rounds = [a for m in ms for a in m.outcome.accept_lens]
    trees = [t for m in ms for t in m.outcome.tree_sizes]
    tokens = sum(m.new_tokens for m in ms) or 1
    compared = [m.matches for m in ms if m.matches is not None]
    per_token = {"prefill": sum(m.outcome.prefill_s for m in ms), "draft": sum(m.outcome.draft_s for m in ms),
                 "verify": sum(m.outcome.verify_s for m in ms), "other": sum(m.other_s for m in ms)}
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


def best_per_method(summaries: Sequence[Summary], temperature: float) -> dict[str, Summary]:
    """The fastest setting of each method at one temperature (what "tuned" means for every method alike)."""
    best: dict[str, Summary] = {}
    for s in summaries:
        if s.temperature == temperature and (s.setting.method not in best
                                             or s.tokens_per_s > best[s.setting.method].tokens_per_s):
            best[s.setting.method] = s
    return {m: best[m] for m in METHODS if m in best}


def choose_finalists(summaries: Sequence[Summary], count: int) -> tuple[Setting, ...]:
    """The reference, the fastest setting of every other method, and the ``count`` fastest xPress settings
    (greedy), for the final stage."""
    best = [s.setting for m, s in best_per_method(summaries, 0.0).items() if m != XPRESS]
    xpress = sorted((s for s in summaries if s.setting.method == XPRESS and s.temperature == 0.0),
                    key=lambda s: s.tokens_per_s, reverse=True)
    return tuple(best + [s.setting for s in xpress[:count]])


def spread(prompts: Sequence[Prompt], count: int) -> tuple[Prompt, ...]:
    """``count`` prompts evenly spaced over the list (both chats and stories end up in the search subset)."""
    if count >= len(prompts):
        return tuple(prompts)
    return tuple(prompts[i * len(prompts) // count] for i in range(count))


def goals(summaries: Sequence[Summary], grid: Sequence[Summary]) -> dict:
    """The issue's targets at greedy, with the measured numbers behind each verdict: speedups from the final
    stage's ``summaries``, drafting time over K from the ``grid`` (every setting measured)."""
    best = best_per_method(summaries, 0.0)
    out: dict = {}
    xp, ref = best.get(XPRESS), best.get(REFERENCE)
    if xp and ref:
        out["best_xpress"] = {"setting": xp.setting.label, "speedup": _round(xp.speedup), "tau": round(xp.tau, 3),
                              "goal": GOAL_SPEEDUP, "met": (xp.speedup or 0) >= GOAL_SPEEDUP}
        for rival in (HF_ASSISTED, HF_LOOKUP):
            if rival in best:
                ratio = xp.tokens_per_s / best[rival].tokens_per_s
                out[f"xpress_over_{rival}"] = {"rival_setting": best[rival].setting.label, "ratio": round(ratio, 3),
                                               "goal": GOAL_OVER_RIVALS, "met": ratio >= GOAL_OVER_RIVALS}
    none = best.get(XPRESS_NONE)
    if none and ref:
        ratio = none.tokens_per_s / ref.tokens_per_s
        out["engine_overhead"] = {"xpress_none_over_generate": round(ratio, 3), "goal": GOAL_ENGINE_SHARE,
                                  "met": ratio >= GOAL_ENGINE_SHARE}
        if xp and none.verify_ms_per_round > 0 and xp.verify_ms_per_round > 0:
            # DESIGN 5 / issue 5: a round costs at least one verify forward, so tau x t(AR step) / t(verify) bounds
            # the speedup over a plain loop whatever the drafter costs.
            out["speedup_limit"] = {"tau": round(xp.tau, 3), "ar_step_ms": round(none.verify_ms_per_round, 3),
                                    "verify_ms": round(xp.verify_ms_per_round, 3),
                                    "limit": round(xp.tau * none.verify_ms_per_round / xp.verify_ms_per_round, 3)}
    out["refinement"] = refinement_ratios(grid)
    return out


def refinement_ratios(summaries: Sequence[Summary]) -> list[dict]:
    """Drafting time per round at K=4 over K=1 for every other setting measured at both, greedy."""
    few, many = REFINEMENT_PAIR
    by_key = {(replace(s.setting.decode, drafts=0), s.setting.decode.drafts): s for s in summaries
              if s.setting.method == XPRESS and s.temperature == 0.0}
    rows = []
    for (rest, drafts), one in by_key.items():
        other = by_key.get((rest, many))
        if drafts == few and other and one.draft_ms_per_round > 0:
            ratio = other.draft_ms_per_round / one.draft_ms_per_round
            goal = GOAL_DRAFT_RATIO if rest.refine == PARALLEL else None  # serial is expected near K x
            rows.append({"T": rest.steps, "L": rest.block, "refine": rest.refine, "verify": rest.verify,
                         f"draft_ms_k{few}": round(one.draft_ms_per_round, 3),
                         f"draft_ms_k{many}": round(other.draft_ms_per_round, 3), "ratio": round(ratio, 3),
                         "goal": goal, "met": None if goal is None else ratio <= goal})
    return rows


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


# ---------------------------------------------------------------------------------------------------- the app API


def sweep(models: Models, prompts: Sequence[str | Prompt], grid: str | Sequence[DecodeConfig], *,
          temperature: float = 0.0, max_new_tokens: int = 64, repeats: int = 1, warmup: int = 1, seed: int = 0,
          progress: Progress | None = None) -> BenchRun:
    """A live (K, T, ...) grid search for the app: ``hf-generate`` (the reference) and xPress at every grid
    setting, on the app's loaded models. Feed ``run.summaries`` to ``bench_figures.heatmap``."""
    configs = parse_grid(grid) if isinstance(grid, str) else tuple(c.validate() for c in grid)
    chats = tuple(p if isinstance(p, Prompt) else Prompt(f"prompt-{i}", (("user", p),), chat=True)
                  for i, p in enumerate(prompts))
    plan = RunPlan(method_settings([XPRESS], configs, (), ()), (temperature,), max_new_tokens, repeats, warmup, seed)
    return measure(BenchModels(models.target, models.tokenizer, models.drafter), chats, plan, progress)


# ------------------------------------------------------------------------------------------------------------ CLI


@dataclass(frozen=True)
class Preset:
    grid: str
    assisted_tokens: tuple[int | None, ...]
    lookup_tokens: tuple[int | None, ...]
    max_new_tokens: int
    repeats: int
    prompts: tuple[int, int] | None  # (sgd chats, story requests); None = all
    search_prompts: int


FULL = Preset(FULL_GRID, ASSISTED_TOKENS, LOOKUP_TOKENS, 128, 3, None, SEARCH_PROMPTS)
QUICK = Preset(QUICK_GRID, ASSISTED_TOKENS_QUICK, LOOKUP_TOKENS_QUICK, 64, 1, QUICK_PROMPTS, 0)


def add_bench_parser(sub: argparse._SubParsersAction) -> None:
    bench = sub.add_parser("bench", help="measure tokens/s against transformers generate, assisted, prompt lookup")
    bench.add_argument("--target", default=str(EMBEDDED_TARGET), help="target: local dir or Hub id")
    bench.add_argument(
        "--drafter",
        default=str(EMBEDDED_DRAFTER),
        help=f"diffusion drafter for the xpress method (masked; the gaussian one: {EMBEDDED_GAUSS_DRAFTER})",
    )
    bench.add_argument("--ar-drafter", default=str(EMBEDDED_AR_DRAFTER), help="assistant model for hf-assisted")
    bench.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")
    bench.add_argument("--dtype", default="auto", help="auto (bf16 on CUDA, fp32 on CPU), float32, bfloat16")
    bench.add_argument("--prompts", type=Path, help="JSONL: {\"messages\": [...]} or {\"prompt\": \"...\"} a line")
    bench.add_argument("--data", type=Path, default=DEFAULT_DATA, help="shared data folder (default prompts)")
    bench.add_argument("--num-prompts", type=int, help="use only the first N prompts (the defaults: chats, then stories)")
    bench.add_argument("--methods", default=",".join(METHODS), help=f"comma list of {', '.join(METHODS)}")
    bench.add_argument("--grid", help=f"xpress settings, e.g. \"K=1,4 T=1,2 L=8; K=4 T=2 L=8 refine=serial\" "
                                      f"(default: {FULL_GRID})")
    bench.add_argument("--assisted-tokens", help="hf-assisted draft lengths, comma list; 'default' = HF's schedule")
    bench.add_argument("--lookup-tokens", help="hf-prompt-lookup candidate lengths, comma list")
    bench.add_argument("--temperatures", help="comma list (default 0,0.7)")
    bench.add_argument("--max-new-tokens", type=int, help=f"default {FULL.max_new_tokens} ({QUICK.max_new_tokens} with --quick)")
    bench.add_argument("--repeats", type=int, help=f"final-stage passes over the prompts (default {FULL.repeats}, "
                                                   f"{QUICK.repeats} with --quick)")
    bench.add_argument("--warmup", type=int, default=1, help="untimed calls per setting before measuring")
    bench.add_argument("--seed", type=int, default=0)
    bench.add_argument("--search-prompts", type=int, help=f"prompts of the search stage (default {SEARCH_PROMPTS}; "
                                                          "0 = no search: every setting in the final stage)")
    bench.add_argument("--finalists", type=int, default=FINALISTS, help="xPress settings the final stage measures")
    bench.add_argument("--quick", action="store_true", help=f"{sum(QUICK_PROMPTS)} prompts, grid {QUICK_GRID!r}, "
                                                            "1 repeat, no search: under 3 minutes on 2 CPU cores")
    bench.add_argument("--json", type=Path, default=Path("runs") / "bench" / "bench.json",
                       help="results JSON; the CSV, table and HTML figures go beside it")
    bench.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")




def _int_list(raw: str, flag: str) -> tuple[int | None, ...]:
    try:
        return tuple(None if v == "default" else int(v) for v in raw.split(","))
    except ValueError as error:
        raise XpressError(f"{flag}: expected a comma list of integers, got {raw!r}") from error


def _float_list(raw: str, flag: str) -> tuple[float, ...]:
    try:
        return tuple(float(v) for v in raw.split(","))
    except ValueError as error:
        raise XpressError(f"{flag}: expected a comma list of numbers, got {raw!r}") from error


def load_bench_models(args: argparse.Namespace, methods: Sequence[str]) -> BenchModels:
    device = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    target, tokenizer = load_target(args.target, device, dtype)
    drafter = load_drafter(args.drafter, target, tokenizer, device, dtype) if XPRESS in methods else None
    assistant = None
    if HF_ASSISTED in methods:
        check_tokenizer_match("AR drafter", args.ar_drafter, tokenizer)
        assistant = load_causal_lm("AR drafter", args.ar_drafter, device, dtype)
        if assistant.config.vocab_size != target.config.vocab_size:
            raise XpressError(f"AR drafter {args.ar_drafter!r} has vocabulary size {assistant.config.vocab_size}, "
                              f"the target {target.config.vocab_size}")
        # transformers stops the assistant where the target stops; give it the target's end tokens.
        assistant.generation_config.eos_token_id = sorted(eos_ids(target, tokenizer))
    return BenchModels(target, tokenizer, drafter, assistant)


def machine_info(models: BenchModels) -> dict:
    import transformers

    info = {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "cpu_threads": torch.get_num_threads(), "python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "device": str(models.device),
            "dtype": str(models.target.dtype).removeprefix("torch.")}
    if models.device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(models.device)
    return info


def run_bench(args: argparse.Namespace) -> int:
    preset = QUICK if args.quick else FULL
    methods = tuple(m.strip() for m in args.methods.split(",") if m.strip())
    grid = parse_grid(args.grid or preset.grid)
    assisted = _int_list(args.assisted_tokens, "--assisted-tokens") if args.assisted_tokens else preset.assisted_tokens
    lookup = _int_list(args.lookup_tokens, "--lookup-tokens") if args.lookup_tokens else preset.lookup_tokens
    settings = method_settings(methods, grid, assisted, lookup)
    temperatures = _float_list(args.temperatures, "--temperatures") if args.temperatures else TEMPERATURES
    search_prompts = preset.search_prompts if args.search_prompts is None else args.search_prompts
    plan = RunPlan(settings, temperatures, args.max_new_tokens or preset.max_new_tokens,
                   args.repeats or preset.repeats, args.warmup, args.seed)
    if min(plan.repeats, plan.max_new_tokens, args.num_prompts or 1, args.finalists) < 1:
        raise XpressError("--repeats, --max-new-tokens, --num-prompts and --finalists must be >= 1")
    if min(plan.warmup, search_prompts, *temperatures) < 0:
        raise XpressError("--warmup, --search-prompts and temperatures must be >= 0")
    if args.prompts:
        prompts = read_prompt_file(args.prompts)
    else:
        prompts = default_prompts(args.data, *preset.prompts) if preset.prompts else default_prompts(args.data)
    prompts = prompts[: args.num_prompts] if args.num_prompts else prompts
    models = load_bench_models(args, {s.method for s in settings})

    stages = []
    if search_prompts and len(grid) > args.finalists:
        search_plan = replace(plan, temperatures=(0.0,), repeats=1)
        stages.append(run_stage(SEARCH_STAGE, models, spread(prompts, search_prompts), search_plan, args.no_progress))
        plan = replace(plan, settings=choose_finalists(stages[0].run.summaries, args.finalists))
    stages.append(run_stage(FINAL_STAGE, models, prompts, plan, args.no_progress))
    files = write_outputs(stages, args, models)
    print(markdown_table(stages[-1].run.summaries))
    print(json.dumps({"mismatches": sum(len(st.run.mismatches) for st in stages),
                      "skipped": sum(len(st.run.skipped) for st in stages), "files": files}, indent=2))
    return 0


def run_stage(name: str, models: BenchModels, prompts: Sequence[Prompt], plan: RunPlan, quiet: bool) -> Stage:
    from tqdm import tqdm

    with tqdm(total=0, unit="call", desc=name, disable=quiet, file=sys.stderr) as bar:

        def progress(done: int, total: int, label: str) -> None:
            bar.total = total
            bar.set_postfix_str(label, refresh=False)
            bar.update(done - bar.n)

        run = measure(models, prompts, plan, progress)
    return Stage(name, tuple(prompts), plan, run)


# -------------------------------------------------------------------------------------------------------- outputs


def output_paths(json_path: Path, figure_names: Sequence[str]) -> dict[str, Path]:
    """Everything a run writes, named after the JSON: ``OUT.json``, ``OUT.csv``, ``OUT_table.md``, ``OUT_NAME.html``."""
    stem = json_path.with_suffix("")
    paths = {"json": json_path, "csv": stem.with_suffix(".csv"), "table": Path(f"{stem}_table.md")}
    return paths | {name: Path(f"{stem}_{name}.html") for name in figure_names}


def write_outputs(stages: Sequence[Stage], args: argparse.Namespace, models: BenchModels) -> dict[str, str]:
    """CSV of every measurement of every stage; JSON with the final stage's summaries (the headline), the grid's
    (the search stage's, or the final's when no search ran), goals, mismatches and the measurements; figures."""
    from .bench_figures import bench_figures  # plotting depends on the bench's types, not the other way round

    final, grid = stages[-1], stages[0]
    figures = bench_figures(final.run.summaries, grid.run.summaries)
    paths = output_paths(args.json, list(figures))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    rows = [{"stage": st.name, **m.row()} for st in stages for m in st.run.measurements]
    with paths["csv"].open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    for name, figure in figures.items():
        # plotly.js is written once beside the figures: they open offline and stay small.
        figure.write_html(paths[name], include_plotlyjs="directory")
    paths["table"].write_text(markdown_table(final.run.summaries) + "\n")
    files = {k: str(v) for k, v in paths.items()}
    document = {
        "schema": SCHEMA,
        "args": {k: v if isinstance(v, (int, float, bool, type(None))) else str(v) for k, v in vars(args).items()},
        "machine": machine_info(models),
        "models": {"target": args.target, "drafter": args.drafter, "ar_drafter": args.ar_drafter,
                   "drafter_noise": getattr(models.drafter, "noise", None),
                   "target_params": sum(p.numel() for p in models.target.parameters())},
        "stages": [{"name": st.name, "prompts": [p.name for p in st.prompts],
                    "plan": {**asdict(st.plan), "settings": [s.name for s in st.plan.settings]}} for st in stages],
        "summaries": [s.to_json() for s in final.run.summaries],
        "grid": [s.to_json() for s in grid.run.summaries],
        "best": {str(t): {m: s.setting.label for m, s in best_per_method(final.run.summaries, t).items()}
                 for t in final.plan.temperatures},
        "goals": goals(final.run.summaries, grid.run.summaries),
        "mismatches": [{"stage": st.name, **m.to_json()} for st in stages for m in st.run.mismatches],
        "skipped": [{"stage": st.name, "setting": name, "reason": why} for st in stages for name, why in st.run.skipped],
        "measurements": rows,
        "files": files,
    }
    paths["json"].write_text(json.dumps(document, indent=1, default=str))
    return files


def markdown_table(summaries: Sequence[Summary]) -> str:
    """The best setting of every method at every temperature: what the README's Results table shows."""
    lines = ["| method | setting | temperature | tokens/s | speedup | tau | greedy/same-seed mismatches |",
             "|---|---|---|---|---|---|---|"]
    for temperature in sorted({s.temperature for s in summaries}):
        for method, s in best_per_method(summaries, temperature).items():
            speedup = "" if s.speedup is None else f"{s.speedup:.2f}x ({s.speedup_min:.2f}-{s.speedup_max:.2f})"
            checked = f"{s.mismatches}/{s.checked}" if s.checked else "n/a"
            lines.append(f"| {method} | {s.setting.label or '-'} | {temperature:g} | {s.tokens_per_s:.1f} | "
                         f"{speedup} | {s.tau:.2f} | {checked} |")
    return "\n".join(lines)
