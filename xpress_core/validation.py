"""One validation layer for every way a request comes in: the CLI, the app and its API, the benchmark.

Each setting is checked for type and range before any model work, and each problem gets one ``XpressError`` that
names the setting, the accepted range and the value received. The CLI prints it as one ``error:`` line (exit code 2);
the app shows it as a message. Types are strict because API clients send JSON: a string, a bool or ``None`` where a
number belongs is refused, never coerced, and a fractional value where a whole number belongs is refused, never
rounded.

Two documented decisions:
- Temperatures: 0 is greedy; a positive temperature below ``MIN_TEMPERATURE`` is refused (``logits / T`` overflows to
  NaN long before T reaches 0, and below 0.01 sampling is greedy in all but name: the message says to use 0).
- Seeds: whole numbers in 0..``MAX_SEED`` (2**32 - 1). The drafter's generator is seeded with ``seed + 1`` and torch
  generators take 64-bit seeds, so the range leaves room and is the one most tools state.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from .config import (
    DIVERSITY,
    MAX_BLOCK,
    MAX_DRAFTS,
    REFINE_MODES,
    SAMPLED_DRAFTS,
    SCHEDULES,
    VERIFY_MODES,
    DecodeConfig,
)
from .errors import XpressError

MIN_TEMPERATURE = 0.01
MAX_SEED = 2**32 - 1
ROLES = ("system", "user", "assistant")  # spliced into chat templates as strings: only these
MAX_SPEC_CHARS = 4096  # a path or Hub id longer than any file system allows
DEVICE_PATTERN = re.compile(r"(auto|cpu|mps|cuda(:\d{1,3})?)")


@dataclass(frozen=True)
class Limits:
    """Upper bounds for one entry point: the engine's own for the CLI and the bench, tighter ones for the app."""

    max_drafts: int = MAX_DRAFTS
    max_block: int = MAX_BLOCK
    max_new_tokens: int = 1 << 20
    max_temperature: float = 100.0
    max_top_k: int = 1 << 31


ENGINE_LIMITS = Limits()


def is_number(value) -> bool:
    """A JSON number: int or float, and not a bool (``True`` is an int in Python, never a number in a request)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def is_finite(value) -> bool:
    """A number that is not NaN or infinite (ints always are; math.isfinite would overflow on a huge one)."""
    return is_number(value) and (isinstance(value, int) or math.isfinite(value))


def whole(name: str, value, low: int, high: int) -> int:
    """A whole number in low..high; a float is accepted only when integral (sliders send 4.0 for 4)."""
    integral = isinstance(value, int) or (is_finite(value) and value.is_integer())
    if not (is_number(value) and integral and low <= value <= high):
        raise XpressError(f"{name} must be a whole number in {low}..{high}, got {value!r}")
    return int(value)


def number(name: str, value, low: float, high: float, low_open: bool = False) -> float:
    """A finite number in [low, high] (or (low, high] when ``low_open``)."""
    if not (is_finite(value) and (value > low if low_open else value >= low) and value <= high):
        bracket = "(" if low_open else "["
        raise XpressError(f"{name} must be a number in {bracket}{low}, {high}], got {value!r}")
    return float(value)


def flag(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise XpressError(f"{name} must be true or false, got {value!r}")
    return value


def choice(name: str, value, choices: tuple[str, ...]) -> str:
    if not (isinstance(value, str) and value in choices):
        raise XpressError(f"{name} must be one of {', '.join(choices)}; got {value!r}")
    return value


def text(name: str, value, max_chars: int | None = None) -> str:
    """A string that is valid Unicode text: invalid UTF-8 from the command line arrives as lone surrogates
    (Python's surrogateescape), which no tokenizer can encode."""
    if not isinstance(value, str):
        raise XpressError(f"{name} must be text, got {type(value).__name__} {value!r:.60}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as error:
        raise XpressError(
            f"{name} is not valid UTF-8 text (undecodable bytes at character {error.start}); send it in UTF-8"
        ) from None
    if max_chars is not None and len(value) > max_chars:
        raise XpressError(f"{name} is {len(value)} characters long; the limit is {max_chars}")
    return value


def temperature(value, high: float) -> float:
    t = number("temperature", value, 0.0, high)
    if 0.0 < t < MIN_TEMPERATURE:
        raise XpressError(
            f"temperature must be 0 (greedy) or in [{MIN_TEMPERATURE}, {high}], got {value!r}: below "
            f"{MIN_TEMPERATURE} sampling is greedy in all but name (and overflows), use 0"
        )
    return t


def seed(value) -> int:
    return whole("seed", value, 0, MAX_SEED)


def decode_config(settings: Mapping[str, object], limits: Limits = ENGINE_LIMITS) -> DecodeConfig:
    """A validated ``DecodeConfig`` from raw settings (argparse values or JSON from an API client).

    Only the keys present are checked; the others keep ``DecodeConfig``'s defaults. Strict types and this entry
    point's ranges first, then ``DecodeConfig.from_mapping`` with the engine's own checks (T <= L, K x L cap)."""
    checks = {
        "drafts": lambda v: whole("drafts K", v, 1, limits.max_drafts),
        "steps": lambda v: whole("denoise steps T", v, 1, limits.max_block),
        "block": lambda v: whole("block L", v, 1, limits.max_block),
        "auto": lambda v: flag("auto", v),
        "temperature": lambda v: temperature(v, limits.max_temperature),
        "top_p": lambda v: number("top-p", v, 0.0, 1.0, low_open=True),
        "top_k": lambda v: whole("top-k", v, 0, limits.max_top_k),
        "seed": seed,
        "max_new_tokens": lambda v: whole("max new tokens", v, 1, limits.max_new_tokens),
        "refine": lambda v: choice("refine", v, REFINE_MODES),
        "verify": lambda v: choice("verify", v, VERIFY_MODES),
        "schedule": lambda v: choice("schedule", v, SCHEDULES),
        "diversity": lambda v: choice("diversity", v, DIVERSITY),
        "sampled_drafts": lambda v: choice("sampled drafts", v, SAMPLED_DRAFTS),
        "stop": stop_strings,
    }
    unknown = set(settings) - set(checks)
    if unknown:
        raise XpressError(f"unknown setting(s) {', '.join(sorted(unknown))}")
    return DecodeConfig.from_mapping({key: checks[key](value) for key, value in settings.items()})


def stop_strings(value) -> tuple[str, ...]:
    if not isinstance(value, (list, tuple)):
        raise XpressError(f"stop strings must be a list of strings, got {value!r:.60}")
    return tuple(text("a stop string", s) for s in value)


def device(spec) -> str:
    """auto, cpu, mps, cuda or cuda:N, and only what this machine has: checked before anything loads."""
    import torch  # only here: the rest of this module must stay cheap to import

    if not (isinstance(spec, str) and DEVICE_PATTERN.fullmatch(spec)):
        raise XpressError(f"device must be auto, cpu, cuda or cuda:N (or mps), got {spec!r}")
    if spec.startswith("cuda"):
        if not torch.cuda.is_available():
            raise XpressError(f"device {spec!r} requested but CUDA is not available")
        index = int(spec.partition(":")[2] or 0)
        if index >= torch.cuda.device_count():
            raise XpressError(f"device {spec!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    if spec == "mps" and not torch.backends.mps.is_available():
        raise XpressError("device 'mps' requested but MPS is not available")
    return spec


def model_spec(name: str, value) -> str:
    """A model: a directory or a Hub id (or "none" for no drafter); valid text, not blank."""
    spec = text(name, value, max_chars=MAX_SPEC_CHARS)
    if not spec.strip() or "\0" in spec:
        raise XpressError(f"{name} must name a directory or a Hub id, got {value!r}")
    return spec


def output_file(name: str, path: Path) -> Path:
    """A file we will write after the work is done (a log, a JSON report): proved writable now, so that a long decode
    never ends in a traceback. Opening for append creates nothing we keep: a file that did not exist is removed."""
    path = Path(text(name, str(path)))
    if path.is_dir():
        raise XpressError(f"{name} {str(path)!r} is a directory; name a file")
    existed = path.exists()
    try:
        if not path.parent.is_dir():
            raise XpressError(f"{name} {str(path)!r}: {str(path.parent)!r} is not an existing folder")
        with path.open("a"):
            pass
    except OSError as error:
        raise XpressError(f"{name} {str(path)!r} cannot be written: {error.strerror or error}") from None
    if not existed:
        os.unlink(path)
    return path


def messages(name: str, value, roles: tuple[str, ...] = ROLES) -> list[dict[str, str]]:
    """A conversation: a list of {"role", "content"} objects, roles from a fixed set (they are spliced into the chat
    template as strings), contents valid text."""
    if not (isinstance(value, (list, tuple)) and value):
        raise XpressError(f"{name} must be a non-empty list of messages, got {value!r:.60}")
    checked = []
    for i, message in enumerate(value):
        if not (isinstance(message, Mapping) and "role" in message and "content" in message):
            raise XpressError(f'{name}: message {i} must be an object with "role" and "content", got {message!r:.60}')
        role = choice(f"{name}: the role of message {i}", message["role"], roles)
        checked.append({"role": role, "content": text(f"{name}: message {i}", message["content"])})
    return checked
