"""What the benchmark compares: the methods, one ``Setting`` per method and parameters, the models they run on, and
what one call produced (``Outcome``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from ..config import DecodeConfig
from ..controller import CostModel
from ..drafters.base import Drafter
from ..errors import XpressError
from ..models import DtypeChoice
from ..trace import cuda_devices
from .grid import GRID_KEYS

HF_GENERATE = "hf-generate"


HF_ASSISTED = "hf-assisted"


HF_LOOKUP = "hf-prompt-lookup"


XPRESS_NONE = "xpress-none"


XPRESS = "xpress"


XPRESS_AUTO = "xpress-auto"  # the engine with the controller auto choosing (K, T, L) round by round


METHODS = (HF_GENERATE, HF_ASSISTED, HF_LOOKUP, XPRESS_NONE, XPRESS, XPRESS_AUTO)


DRAFTING = (XPRESS, XPRESS_AUTO)  # the methods that need the diffusion drafter


REFERENCE = HF_GENERATE


# Assisted generation: candidate tokens per round, constant schedule. ``None`` = transformers' own default (start at
# 20, heuristic schedule, confidence threshold 0.4), what a user gets without tuning.
ASSISTED_TOKENS = (2, 4, 8, None)


ASSISTED_TOKENS_QUICK = (4, None)


LOOKUP_TOKENS = (3, 5, 10)


LOOKUP_TOKENS_QUICK = (5,)


# Grid keys a setting's label names only where they leave the default (K, T, L, refine and verify it always names),
# so that every setting of a grid has a label of its own.
NAMED_IF_CHANGED = ("schedule", "diversity", "sampled")


DEFAULT_DECODE = DecodeConfig()


def changed(decode: DecodeConfig, key: str) -> bool:
    return getattr(decode, GRID_KEYS[key]) != getattr(DEFAULT_DECODE, GRID_KEYS[key])


@dataclass(frozen=True)
class Setting:
    """One method with its parameters; what a row of the results names."""

    method: str
    decode: DecodeConfig | None = None  # xpress: the drafter settings (K, T, L, refine, verify, ...)
    draft_tokens: int | None = None  # hf-assisted / hf-prompt-lookup: candidates per round (None: HF default)
    drafter: str = ""  # xpress: which of BenchModels.drafters drafts ("": BenchModels.drafter)
    dtype: str = ""  # hf-generate: the target's dtype when not the run's ("": the run's, the reference)

    @property
    def is_reference(self) -> bool:
        """The setting every speedup divides by: ``generate`` in the run's dtype."""
        return self.method == REFERENCE and not self.dtype

    @property
    def label(self) -> str:
        if self.method == XPRESS:
            d = self.decode
            named = f"{self.drafter} " if self.drafter else ""
            others = "".join(f" {key}={getattr(d, GRID_KEYS[key])}" for key in NAMED_IF_CHANGED if changed(d, key))
            return f"{named}K={d.drafts} T={d.steps} L={d.block} {d.refine} {d.verify}{others}"
        if self.method in (HF_ASSISTED, HF_LOOKUP):
            return "default" if self.draft_tokens is None else f"n={self.draft_tokens}"
        if self.method == XPRESS_AUTO:
            return "auto"
        return self.dtype

    @property
    def name(self) -> str:
        return f"{self.method} {self.label}".strip()

    def params(self) -> dict:
        d = self.decode if self.method == XPRESS else None
        return {
            "method": self.method,
            "setting": self.label,
            **{key: getattr(d, attr) if d else None for key, attr in GRID_KEYS.items()},
            "draft_tokens": self.draft_tokens,
        }


def method_settings(
    methods: Sequence[str],
    grid: Sequence[DecodeConfig],
    assisted_tokens: Sequence[int | None],
    lookup_tokens: Sequence[int | None],
    generate_dtypes: Sequence[str] = (),
) -> tuple[Setting, ...]:
    """Every setting of the selected methods; the reference always runs (speedups divide by it), and ``generate``
    runs again in each of ``generate_dtypes`` (so no speedup comes from a baseline held to a slower dtype)."""
    unknown = set(methods) - set(METHODS)
    if unknown:
        raise XpressError(f"unknown method(s) {', '.join(sorted(unknown))}; choose from {', '.join(METHODS)}")
    if HF_LOOKUP in methods and (not lookup_tokens or None in lookup_tokens):
        raise XpressError("prompt lookup needs candidate lengths (integers): it has no default")
    per_method = {
        HF_GENERATE: [Setting(HF_GENERATE), *(Setting(HF_GENERATE, dtype=d) for d in generate_dtypes)],
        HF_ASSISTED: [Setting(HF_ASSISTED, draft_tokens=n) for n in assisted_tokens],
        HF_LOOKUP: [Setting(HF_LOOKUP, draft_tokens=n) for n in lookup_tokens],
        XPRESS_NONE: [Setting(XPRESS_NONE)],
        XPRESS: [Setting(XPRESS, decode=d) for d in grid],
        XPRESS_AUTO: [Setting(XPRESS_AUTO, decode=DecodeConfig(auto=True))],
    }
    chosen = [REFERENCE, *(m for m in METHODS if m in methods and m != REFERENCE)]
    return tuple(s for m in chosen for s in per_method[m])


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
class BenchModels:
    """The target and every drafter the selected methods need, loaded once and shared."""

    target: torch.nn.Module
    tokenizer: object
    drafter: Drafter | None = None  # xpress: the diffusion drafter
    assistant: torch.nn.Module | None = None  # hf-assisted: an AutoModelForCausalLM with the target's tokenizer
    drafters: dict[str, Drafter] = field(default_factory=dict)  # more, by name, to compare (``train eval``)
    costs: CostModel | None = None  # xpress-auto: the drafter's stage costs, measured once at load (engine.calibrate)
    targets: dict[str, torch.nn.Module] = field(default_factory=dict)  # the target in other dtypes, by name
    dtype_choice: DtypeChoice | None = None  # the run's dtype and why (precision.py)

    @property
    def device(self) -> torch.device:
        return self.target.device

    @property
    def cuda_devices(self) -> tuple[torch.device, ...]:
        drafters = [getattr(d, "model", None) for d in (self.drafter, *self.drafters.values())]
        return cuda_devices(self.target, self.assistant, *self.targets.values(), *drafters)

    def target_of(self, setting: Setting) -> torch.nn.Module:
        return self.targets[setting.dtype] if setting.dtype else self.target

    def drafter_of(self, setting: Setting) -> Drafter:
        return self.drafters[setting.drafter] if setting.drafter else self.drafter
