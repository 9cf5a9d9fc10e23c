"""Loading targets and drafters (embedded assets, local directories, Hub ids, GGUF files), with clear errors for
mismatches: the one entry, ``load_models``, and the dispatch on the drafter's kind. Each source and kind is a module:

- ``dtypes``: the device and dtype the models run in, and why;
- ``bundle``: the loaded ``Models`` and what the engine reads from them (stop tokens, banned ids, a tapped forward);
- ``pretrained``: any checkpoint's spec resolved once, read frozen, its tokenizer checked against the target's;
- ``kinds``: the drafter kinds and the one a config.json implies (the options and the dispatch are below);
- ``causal``: causal LMs: the target, and the autoregressive drafter;
- ``ours``: xPress's target-conditioned drafters (and an untrained one, where training starts);
- ``dflash``: DFlash checkpoints read into ours, and ours written as one;
- ``diffusion_lm``: standalone diffusion LMs as drafters;
- ``gguf``: a GGUF target converted once into an HF folder.

Nothing here runs at import time; every loader is called by the CLI, the app, the benchmark or a test.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import torch

from ..drafters.base import Drafter, NoDrafter
from ..errors import XpressError
from ..hub import ModelSpec
from ..needs import check_loadable
from ..presets import Access
from .bundle import (
    WARM_ROWS,
    Models,
    banned_draft_ids,
    context_limit,
    encode_prompt,
    eos_ids,
    tapped_forward,
    target_banned_ids,
    warm_kernels,
)
from .causal import check_tree_attention, load_autoregressive_drafter, load_causal_lm, load_target
from .dflash import export_dflash, load_dflash_drafter, read_conditioned_drafter
from .diffusion_lm import load_diffusion_lm
from .dtypes import DtypeChoice, DtypeTiming, measures_dtype, native_bf16, resolve_device, resolve_dtype, unmeasured
from .kinds import DRAFTER_KINDS, NO_DRAFTER, drafter_kind
from .ours import init_drafter, load_conditioned_drafter
from .pretrained import check_tokenizer_match, resolve_model

# The names the rest of the project imports from here: the package's public face.
__all__ = [
    "DRAFTER_KINDS",
    "EMBEDDED_AR_DRAFTER",
    "EMBEDDED_DRAFTER",
    "EMBEDDED_GAUSS_DRAFTER",
    "EMBEDDED_TARGET",
    "NO_DRAFTER",
    "WARM_ROWS",
    "DrafterOptions",
    "DtypeChoice",
    "DtypeTiming",
    "Models",
    "banned_draft_ids",
    "check_tokenizer_match",
    "check_tree_attention",
    "context_limit",
    "encode_prompt",
    "eos_ids",
    "export_dflash",
    "init_drafter",
    "load_causal_lm",
    "load_drafter",
    "load_models",
    "load_target",
    "measures_dtype",
    "native_bf16",
    "read_conditioned_drafter",
    "resolve_device",
    "resolve_drafter",
    "resolve_dtype",
    "resolve_model",
    "tapped_forward",
    "target_banned_ids",
    "unmeasured",
    "warm_kernels",
]

ASSETS = Path(__file__).resolve().parents[2] / "assets"
EMBEDDED_TARGET = ASSETS / "target"
EMBEDDED_DRAFTER = ASSETS / "drafter"
EMBEDDED_GAUSS_DRAFTER = ASSETS / "drafter_gauss"
EMBEDDED_AR_DRAFTER = ASSETS / "ar_drafter"


@dataclass(frozen=True)
class DrafterOptions:
    kind: str = "auto"  # one of DRAFTER_KINDS
    logit_shift: bool | None = None  # diffusion-lm: None = the family's convention (Dream shifts, others do not)
    mask_token_id: int | None = None  # diffusion-lm: None = its tokenizer's / config's / family's


def resolve_drafter(
    spec: str | Path | ModelSpec, options: DrafterOptions = DrafterOptions(), access: Access | None = None
) -> ModelSpec:
    """The drafter spec resolved once: its kind from ``options`` or, for ``auto``, from its config.json."""
    if isinstance(spec, ModelSpec):
        return spec
    name = str(spec)
    if name == NO_DRAFTER:
        return ModelSpec("drafter", name, True, NO_DRAFTER, None)
    if options.kind not in DRAFTER_KINDS:
        raise XpressError(f"drafter kind must be one of {DRAFTER_KINDS}, got {options.kind!r}")
    resolved = resolve_model("drafter", name, access or Access.from_env(), options.kind)
    if options.kind == "auto":
        resolved = replace(resolved, kind=drafter_kind(resolved.config))
    if resolved.kind == "dflash" and resolved.config is None:
        raise XpressError(f"drafter {name!r} has no readable config.json, so it cannot be read as a DFlash checkpoint")
    return resolved


def load_drafter(
    spec: str | Path | ModelSpec,
    target,
    tokenizer,
    device: torch.device,
    dtype: torch.dtype,
    options: DrafterOptions = DrafterOptions(),
    access: Access | None = None,
) -> Drafter:
    """The drafter of the kind its spec resolves to, checked against the target and bound to it."""
    access = access or Access.from_env()
    spec = resolve_drafter(spec, options, access)
    if spec.kind == NO_DRAFTER:
        return NoDrafter()
    banned = target_banned_ids(target, tokenizer)
    if spec.kind == "xpress":
        return load_conditioned_drafter(spec.name, target, tokenizer, device, dtype, banned)
    if spec.kind == "dflash":
        return load_dflash_drafter(spec, target, tokenizer, device, dtype, banned)
    if spec.kind == "diffusion-lm":
        shift, mask = options.logit_shift, options.mask_token_id
        return load_diffusion_lm(spec, target, tokenizer, device, dtype, banned, access, shift, mask)
    return load_autoregressive_drafter(spec, target, tokenizer, device, dtype, banned, access)


def load_models(
    target: str | Path | ModelSpec = EMBEDDED_TARGET,
    drafter: str | Path | ModelSpec = EMBEDDED_DRAFTER,
    device: str = "auto",
    dtype: str = "auto",
    device_map: str | None = None,
    drafter_options: DrafterOptions = DrafterOptions(),
    access: Access | None = None,
) -> Models:
    """``device_map="auto"`` spreads the target over the GPUs (accelerate); the drafter goes where its input is.
    ``dtype="auto"`` here goes by the device (``resolve_dtype``); ``precision.load_fastest`` times both dtypes."""
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    access = access or Access.from_env()
    for role, spec in (("target", target), ("drafter", drafter)):  # both, before either's config.json is read
        check_loadable(role, str(spec))
    target_spec = resolve_model("target", target, access)
    drafter_spec = resolve_drafter(drafter, drafter_options, access)
    target_model, tokenizer = load_target(target_spec, dev, dt, device_map, access)
    drafter_device = target_model.device if device_map else dev
    drafter_model = load_drafter(drafter_spec, target_model, tokenizer, drafter_device, dt, drafter_options, access)
    return Models(target_model, tokenizer, drafter_model, dtype_choice=unmeasured(dtype, dt, dev))
