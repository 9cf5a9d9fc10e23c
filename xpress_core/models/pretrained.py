"""Reading a checkpoint, whatever its kind: its spec resolved once (where it lives, its config.json), an HF class read
from it frozen, its tokenizer, and clear errors for a missing model or a tokenizer other than the target's."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoTokenizer

from ..errors import XpressError
from ..hub import ModelSpec, frozen_config, is_local, read_config_json
from ..needs import check_loadable
from ..packing import fuse_shared_inputs, pack_linears
from ..presets import Access, check_known, remote_code_allowed
from .gguf import converted_folder, is_gguf

CAUSAL_LM = "causal-lm"  # the kind of a target (and of the benchmark's AR drafter)


def describe_missing(kind: str, spec: str, error: Exception) -> XpressError:
    if is_local(spec) and not Path(spec).expanduser().exists():
        return XpressError(f"{kind} {spec!r}: directory does not exist")
    reason = str(error).splitlines()[0] if str(error) else type(error).__name__
    return XpressError(f"{kind} {spec!r} could not be loaded (not a model directory, nor a reachable Hub id): {reason}")


def load_tokenizer(spec: str):
    try:
        return AutoTokenizer.from_pretrained(spec)
    except (OSError, ValueError) as error:
        raise describe_missing("tokenizer for", spec, error) from error


def resolve_model(role: str, spec: str | Path | ModelSpec, access: Access, kind: str = CAUSAL_LM) -> ModelSpec:
    """``spec`` resolved once: a Hub id must be known or allowed, and its config.json is read here, once."""
    if isinstance(spec, ModelSpec):
        return spec
    name = str(spec)
    if is_gguf(name):  # read from its converted folder (converted on first use)
        name = str(converted_folder(name))
    check_known(role, name, access)
    check_loadable(role, name)
    return ModelSpec(role, name, is_local(name), kind, frozen_config(read_config_json(name)))


def load_pretrained(
    auto_class, spec: ModelSpec, device: torch.device, dtype: torch.dtype, device_map=None, access=None, config=None
):
    """Any HF model class from a resolved spec, after the remote-code opt-in; frozen, on ``device`` or spread over the
    GPUs by accelerate (``device_map="auto"``, for a model larger than one GPU). ``config``: read the weights into
    transformers' own class for this config (no remote code runs then)."""
    access = access or Access.from_env()
    trust = config is None and remote_code_allowed(spec.role, spec.name, spec.config, access)
    extra = {"device_map": device_map} if device_map else {}
    if config is not None:
        extra["config"] = config
    try:
        model = auto_class.from_pretrained(spec.name, dtype=dtype, trust_remote_code=trust, **extra)
    except (OSError, ValueError) as error:
        raise describe_missing(spec.role, spec.name, error) from error
    return freeze(model if device_map else model.to(device))


def freeze(model: torch.nn.Module) -> torch.nn.Module:
    """Inference only: no parameter needs a gradient, so no caller builds autograd graphs through it, whatever its
    grad mode. On a CPU in bf16 its linear layers are packed for oneDNN, and sibling projections of one input become
    one product (``packing.py``: the same outputs, sooner)."""
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    pack_linears(model)
    fuse_shared_inputs(model)
    return model.eval()


def same_vocabulary(a, b) -> bool:
    return a.get_vocab() == b.get_vocab()


def ships_tokenizer(spec: str) -> bool:
    return (Path(spec) / "tokenizer_config.json").exists() or (Path(spec) / "tokenizer.json").exists()


def check_tokenizer_match(kind: str, spec: str, target_tokenizer) -> None:
    """A drafter directory that ships a tokenizer must ship the target's."""
    if ships_tokenizer(spec) and not same_vocabulary(load_tokenizer(spec), target_tokenizer):
        raise XpressError(f"{kind} {spec!r} uses a different tokenizer than the target: drafts would be meaningless")
