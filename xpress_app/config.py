"""The app's options (flags and their environment variables, so that a Hugging Face Space can set them) and the model
presets it offers."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field

from xpress_core.models import EMBEDDED_AR_DRAFTER, EMBEDDED_DRAFTER, EMBEDDED_GAUSS_DRAFTER, EMBEDDED_TARGET
from xpress_core.presets import ALLOW_UNKNOWN_ENV, TRUST_REMOTE_CODE_ENV, Access, ModelPreset, hub_presets

ENV = {
    "target": "XPRESS_TARGET",  # a custom preset's target: local directory or Hub id
    "drafter": "XPRESS_DRAFTER",  # its drafter: directory, Hub id or "none"
    "device": "XPRESS_DEVICE",
    "dtype": "XPRESS_DTYPE",
    "device_map": "XPRESS_DEVICE_MAP",  # "auto": spread the target over all GPUs (accelerate)
    "allow_unknown": ALLOW_UNKNOWN_ENV,  # load Hub ids no preset names
    "trust_remote_code": TRUST_REMOTE_CODE_ENV,  # allow model code from a model repository (presets that need it)
    "concurrency": "XPRESS_CONCURRENCY",  # requests decoded at the same time; more wait in the queue
}
DEFAULT_HOST, DEFAULT_PORT = "127.0.0.1", 7860  # overridden by Gradio's GRADIO_SERVER_NAME / GRADIO_SERVER_PORT
DEFAULT_CONCURRENCY = 2
QUEUE_SIZE = 64
MAX_UPLOAD = "64kb"  # the app takes no file; Gradio's upload route stays open, so keep what it accepts small

EMBEDDED_PRESET = "Embedded · diffusion drafter"
EMBEDDED_GAUSS_PRESET = "Embedded · gaussian diffusion drafter"
EMBEDDED_AR_PRESET = "Embedded · autoregressive drafter"
CUSTOM_PRESET = "Custom (--target / --drafter)"


@dataclass(frozen=True)
class AppConfig:
    presets: tuple[ModelPreset, ...]  # the first one is selected at start
    device: str = "auto"
    dtype: str = "auto"
    concurrency: int = DEFAULT_CONCURRENCY
    device_map: str | None = None
    access: Access = field(default_factory=Access)


def default_presets(target: str | None = None, drafter: str | None = None) -> tuple[ModelPreset, ...]:
    """The embedded presets, then the Hub presets (downloaded on first use); a custom one first when a target or
    drafter was given."""
    embedded = (
        ModelPreset(EMBEDDED_PRESET, str(EMBEDDED_TARGET), str(EMBEDDED_DRAFTER)),
        ModelPreset(EMBEDDED_GAUSS_PRESET, str(EMBEDDED_TARGET), str(EMBEDDED_GAUSS_DRAFTER)),
        ModelPreset(EMBEDDED_AR_PRESET, str(EMBEDDED_TARGET), str(EMBEDDED_AR_DRAFTER)),
    )
    if target is None and drafter is None:
        return embedded + hub_presets()
    custom = ModelPreset(CUSTOM_PRESET, target or str(EMBEDDED_TARGET), drafter or str(EMBEDDED_DRAFTER))
    return (custom,) + embedded + hub_presets()


def parse_args(argv: list[str] | None = None) -> AppConfig:
    env = os.environ
    parser = argparse.ArgumentParser(description="xPress: the speculative decoding app (Gradio).")
    parser.add_argument(
        "--target",
        default=env.get(ENV["target"]),
        help=f"target of a custom preset: local directory or Hub id (env {ENV['target']})",
    )
    parser.add_argument(
        "--drafter",
        default=env.get(ENV["drafter"]),
        help=f"drafter of the custom preset: directory, Hub id or 'none' (env {ENV['drafter']})",
    )
    parser.add_argument(
        "--device", default=env.get(ENV["device"], "auto"), help=f"auto, cpu, cuda (env {ENV['device']})"
    )
    parser.add_argument(
        "--dtype",
        default=env.get(ENV["dtype"], "auto"),
        help=f"auto (bf16 on CUDA and on CPUs with native bf16, else fp32), float32, bfloat16 (env {ENV['dtype']})",
    )
    parser.add_argument(
        "--device-map",
        default=env.get(ENV["device_map"]),
        help=f"'auto': spread the target over all GPUs, for targets larger than one (env {ENV['device_map']})",
    )
    parser.add_argument(
        "--allow-unknown-models",
        action="store_true",
        help=f"load Hub ids that no preset names (env {ENV['allow_unknown']}=1)",
    )
    parser.add_argument(
        "--trust-remote-code",
        action="store_true",
        help=f"allow model code from a model's repository, for presets that need it (env {ENV['trust_remote_code']}=1)",
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        default=int(env.get(ENV["concurrency"], DEFAULT_CONCURRENCY)),
        help=f"requests decoded at the same time (env {ENV['concurrency']})",
    )
    args = parser.parse_args(argv)
    if args.concurrency < 1:
        parser.error("--concurrency must be at least 1")
    access = Access.from_env(args.allow_unknown_models, args.trust_remote_code)
    return AppConfig(
        default_presets(args.target, args.drafter), args.device, args.dtype, args.concurrency, args.device_map, access
    )
