"""DFlash checkpoints: a published one read into our target-conditioned drafter (drafters/dflash_format.py maps its
config and weights), and a drafter of ours written in that format for the engines that serve z-lab's."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from ..drafters.dflash_format import DFLASH_KEY_MAPPING, dflash_drafter_config, dflash_export
from ..drafters.diffusion import TargetConditionedDrafter
from ..drafters.diffusion_model import XpressDrafter
from ..errors import XpressError
from ..hub import ModelSpec, read_config_json
from .kinds import drafter_kind
from .ours import load_conditioned_drafter, read_xpress_drafter, tree_sharpness
from .pretrained import describe_missing, load_tokenizer, ships_tokenizer


def dflash_reading(config: dict, spec: str) -> dict:
    """``from_pretrained``'s arguments that read a DFlash checkpoint into our drafter: its config translated, its
    weights' names mapped."""
    return {"config": dflash_drafter_config(config, spec), "key_mapping": DFLASH_KEY_MAPPING}


def load_dflash_drafter(spec: ModelSpec, target, tokenizer, device, dtype, banned) -> TargetConditionedDrafter:
    """A published DFlash checkpoint as our target-conditioned drafter, bound to the target."""
    reading = dflash_reading(spec.config, spec.name)
    drafter = load_conditioned_drafter(spec.name, target, tokenizer, device, dtype, banned, **reading)
    drafter.tree_sharpness = tree_sharpness(spec.config, spec.name)  # not a DFlash field: it rides along in config.json
    return drafter


def read_conditioned_drafter(spec: str | Path, dtype: torch.dtype = torch.float32) -> XpressDrafter:
    """Our target-conditioned drafter module, unbound and unfused, from its own format or a DFlash checkpoint (for
    training on and for export)."""
    spec = str(spec)
    config = read_config_json(spec)
    if config is None:
        raise describe_missing("drafter", spec, OSError("no readable config.json"))
    kind = drafter_kind(config)
    if kind not in ("xpress", "dflash"):
        raise XpressError(f"drafter {spec!r} is neither an xPress drafter nor a DFlash checkpoint")
    return read_xpress_drafter(spec, dtype, **(dflash_reading(config, spec) if kind == "dflash" else {}))


def export_dflash(spec: str | Path, out: Path) -> dict:
    """Write a drafter of ours in the DFlash format (config.json, model.safetensors, the tokenizer it ships): what
    the reference classes and the serving engines that read z-lab's checkpoints load. Returns the written config."""
    model = read_conditioned_drafter(spec)
    config, weights = dflash_export(model, str(spec))
    out.mkdir(parents=True, exist_ok=True)
    for stale in ("config.json", "model.safetensors", "model.safetensors.index.json"):
        (out / stale).unlink(missing_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_file(weights, out / "model.safetensors", metadata={"format": "pt"})
    if ships_tokenizer(str(spec)) and Path(spec).resolve() != out.resolve():
        load_tokenizer(str(spec)).save_pretrained(out)
    return config
