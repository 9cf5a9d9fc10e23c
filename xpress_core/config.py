"""Frozen configuration of one decode request, validated up front so the loop never sees nonsense settings."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields

from .errors import XpressError

# Choice strings shared by the CLI, the app and the benchmark.
REFINE_MODES = ("parallel", "serial")
VERIFY_MODES = ("tree", "batch")
SCHEDULES = ("confidence", "left-to-right")
# A draft tree shaped by one refined row's distributions (drafters/diffusion.py), or K rows made to differ.
TREE = "tree"
DIVERSITY = (TREE, "branch-first", "branch-uncertain", "gumbel", "none")
# When sampling, a draft token is the one coupled to the target's coming draw (sampling.py), or the drafter's most
# likely token (what speculative decoding usually drafts; kept to measure the difference).
SAMPLED_DRAFTS = ("coupled", "most-likely")
NOISE_TYPES = ("mask", "gaussian")  # the diffusion drafter's noise (a property of a trained drafter, not of a request)

MAX_DRAFTS = 16
MAX_BLOCK = 32
# K x L bounds the tree (verify forward width) and the drafter batch, hence memory per round.
MAX_TREE_TOKENS = 256


@dataclass(frozen=True)
class DecodeConfig:
    drafts: int = 1  # K: drafts refined together
    steps: int = 1  # T: denoise steps per round
    block: int = 8  # L: tokens per draft
    # True: the controller picks (K, T, L) before every round (controller.py) and the three above are unused.
    auto: bool = False
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    seed: int = 0
    max_new_tokens: int = 128
    refine: str = "parallel"
    verify: str = "tree"
    schedule: str = "confidence"
    diversity: str = TREE
    sampled_drafts: str = "coupled"
    stop: tuple[str, ...] = field(default_factory=tuple)

    @classmethod
    def from_mapping(cls, values: Mapping[str, object]) -> DecodeConfig:
        """The validated config named by ``values`` (CLI arguments, the app's settings, a request): keys that are not
        fields are ignored, missing fields take their defaults, whole-number floats (what sliders send) become ints."""
        chosen = {}
        for f in fields(cls):
            if f.name in values:
                chosen[f.name] = field_value(f.name, f.type, values[f.name])
        return cls(**chosen).validate()

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def validate(self) -> DecodeConfig:
        checks = [
            (1 <= self.drafts <= MAX_DRAFTS, f"drafts K must be in 1..{MAX_DRAFTS}, got {self.drafts}"),
            (1 <= self.block <= MAX_BLOCK, f"block L must be in 1..{MAX_BLOCK}, got {self.block}"),
            (1 <= self.steps <= self.block, f"denoise steps T must be in 1..L={self.block}, got {self.steps}"),
            (
                self.drafts * self.block <= MAX_TREE_TOKENS,
                f"K x L = {self.drafts * self.block} exceeds the cap of {MAX_TREE_TOKENS} draft tokens per round",
            ),
            (self.temperature >= 0.0, f"temperature must be >= 0, got {self.temperature}"),
            (0.0 < self.top_p <= 1.0, f"top-p must be in (0, 1], got {self.top_p}"),
            (self.top_k >= 0, f"top-k must be >= 0 (0 = off), got {self.top_k}"),
            (self.max_new_tokens >= 1, f"max new tokens must be >= 1, got {self.max_new_tokens}"),
            (self.refine in REFINE_MODES, f"refine must be one of {REFINE_MODES}, got {self.refine!r}"),
            (self.verify in VERIFY_MODES, f"verify must be one of {VERIFY_MODES}, got {self.verify!r}"),
            (self.schedule in SCHEDULES, f"schedule must be one of {SCHEDULES}, got {self.schedule!r}"),
            (self.diversity in DIVERSITY, f"diversity must be one of {DIVERSITY}, got {self.diversity!r}"),
            (
                self.sampled_drafts in SAMPLED_DRAFTS,
                f"sampled drafts must be one of {SAMPLED_DRAFTS}, got {self.sampled_drafts!r}",
            ),
            (all(self.stop), "stop strings must not be empty"),
        ]
        for ok, message in checks:
            if not ok:
                raise XpressError(message)
        return self


def field_value(name: str, kind: str, value: object) -> object:
    """``value`` as the DecodeConfig field ``name`` of type ``kind`` holds it, or a clear error."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "int":
        if not (number and float(value).is_integer()):
            raise XpressError(f"{name} must be a whole number, got {value!r}")
        return int(value)
    if kind == "float":
        if not number:
            raise XpressError(f"{name} must be a number, got {value!r}")
        return float(value)
    return tuple(value) if name == "stop" else value
