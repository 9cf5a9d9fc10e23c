"""The device and dtype the models run in, and why. ``auto`` goes by the device and by whether a CPU computes bf16
natively: ``native_bf16`` is asked here alone, so a test or a script that replaces it here changes every loader."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from .. import validation
from ..errors import XpressError
from ..records import json_record


@dataclass(frozen=True)
class DtypeTiming:
    """One dtype's speed on these models: seconds per token of plain decoding and of speculative decoding's rounds
    (the prefill excluded), and seconds per plain step and per round."""

    plain_step_s: float
    round_s: float | None  # None without a drafter
    plain_token_s: float
    round_token_s: float | None


@dataclass(frozen=True)
class DtypeChoice:
    """The dtype the models run in, and why: measured (``timings``), pinned by the user, or the device's."""

    dtype: str
    reason: str
    threads: int
    timings: dict[str, DtypeTiming] | None = None

    def to_json(self) -> dict:
        timings = {name: json_record(vars(t)) for name, t in (self.timings or {}).items()}
        return {"dtype": self.dtype, "reason": self.reason, "threads": self.threads, "timings": timings}


def unmeasured(requested: str, dtype: torch.dtype, device: torch.device) -> DtypeChoice:
    """The choice where nothing is timed: a dtype the user pinned, or ``auto`` by the device: bf16 on CUDA, fp32 on a
    CPU without native bf16 (there bf16 is emulated, far slower), bf16 on one with it (``load_models``;
    ``precision.load_fastest`` times both there)."""
    if requested != "auto":
        why = f"pinned by --dtype {requested}"
    elif device.type == "cpu" and not native_bf16():
        why = "auto: this CPU has no native bf16 arithmetic"
    elif device.type == "cpu":
        why = "auto: this CPU computes bf16 natively (not timed: precision.load_fastest times both dtypes)"
    else:
        why = f"auto on {device.type}: bf16 (a verify forward over many tokens costs barely more than one)"
    return DtypeChoice(str(dtype).removeprefix("torch."), why, torch.get_num_threads())


def resolve_device(device: str) -> torch.device:
    if validation.device(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


# CPU flags of native bf16 arithmetic (AVX-512 BF16, AMX): there a multi-token forward costs barely more than a
# one-token forward in bf16, while fp32 pays for every token (docs/DESIGN.md §5.1; lab/profile_round.py).
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def native_bf16() -> bool:
    """Whether this CPU computes in bf16 natively (Linux: its /proc/cpuinfo flags; elsewhere: assume not)."""
    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False
    return any(flag in flags for flag in NATIVE_BF16_FLAGS)


def fp32_on_native_bf16_cpu(dtype: torch.dtype, device: torch.device) -> bool:
    """An fp32 model on a CPU that computes bf16 natively: there a target-conditioned drafter drafts in bf16
    (``ours.drafter_dtype``) and the target's head keeps a oneDNN copy for the walk's rows (``causal.keep_rows_head``)."""
    return dtype == torch.float32 and device.type == "cpu" and native_bf16()


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """``auto``: bf16 on CUDA and on CPUs with native bf16, else fp32; where ``measures_dtype``, only a first guess
    (``precision.fastest`` times both). Exactness: fp32 gives plain decoding's tokens exactly; bf16 gives plain bf16
    decoding's up to rounding, which differs between forward shapes (docs/DESIGN.md §2.5)."""
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" or native_bf16() else torch.float32
    choices = {
        "float32": torch.float32,
        "fp32": torch.float32,
        "bfloat16": torch.bfloat16,
        "bf16": torch.bfloat16,
        "float16": torch.float16,
        "fp16": torch.float16,
    }
    if dtype not in choices:
        raise XpressError(f"unknown dtype {dtype!r}; choose one of auto, {', '.join(choices)}")
    return choices[dtype]


def measures_dtype(dtype: str, device: torch.device) -> bool:
    """Whether ``auto`` times the dtypes (``precision.py``): on a CPU that computes bf16 natively (elsewhere the
    answer is known: bf16 on CUDA, fp32 on a CPU that would emulate bf16)."""
    return dtype == "auto" and device.type == "cpu" and native_bf16()
