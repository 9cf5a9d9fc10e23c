"""xPress's target-conditioned drafters: read from their own checkpoints (or, with ``reading``, from another format's:
dflash.py), bound to the target in the dtype they draft in; the tree sharpness a masked drafter's config.json keeps;
and an untrained drafter sized for a target, where training starts."""

from __future__ import annotations

import math
from pathlib import Path

import torch

from ..drafters.dflash_format import export_refusals, serving_taps
from ..drafters.diffusion import TargetConditionedDrafter, diffusion_drafter
from ..drafters.diffusion_config import XpressDrafterConfig, default_tapped_layers
from ..drafters.diffusion_model import XpressDrafter
from ..drafters.draft_vocab import vocabulary_head
from ..errors import XpressError
from ..packing import packed_linear
from .causal import load_target
from .dtypes import fp32_on_native_bf16_cpu
from .pretrained import check_tokenizer_match, describe_missing, freeze


def tree_sharpness(config: dict | None, spec: str) -> float:
    """A masked drafter's ``tree_sharpness`` (greedy draft trees, DESIGN 2.2) from its config.json, where
    ``train sharpness --write`` keeps it; 1 when absent (the drafter's distribution as it is)."""
    value = (config or {}).get("tree_sharpness", 1.0)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise XpressError(f"drafter {spec!r}: tree_sharpness in its config.json must be a number > 0, got {value!r}")
    return float(value)


def read_xpress_drafter(spec: str, dtype: torch.dtype, **reading) -> XpressDrafter:
    """Our drafter module, unbound and unfused, from ``spec``; ``reading``: ``from_pretrained``'s arguments that read
    another format's checkpoint into it (its config, its weights' names)."""
    try:
        return XpressDrafter.from_pretrained(spec, dtype=dtype, **reading)
    except (OSError, ValueError) as error:
        raise describe_missing("drafter", spec, error) from error


def load_conditioned_drafter(
    spec: str, target, tokenizer, device, dtype, banned, **reading
) -> TargetConditionedDrafter:
    """Our target-conditioned drafter bound to ``target``, checked against it (``reading``: ``read_xpress_drafter``)."""
    check_tokenizer_match("drafter", spec, tokenizer)
    dtype = drafter_dtype(dtype, device)
    model = freeze(read_xpress_drafter(spec, dtype, **reading).fuse_projections().to(device))
    cfg = model.config
    vocab, hidden = target.get_input_embeddings().weight.shape
    if cfg.vocab_size != vocab or cfg.hidden_size != hidden:
        raise XpressError(
            f"drafter {spec!r} was built for vocabulary {cfg.vocab_size} / hidden size {cfg.hidden_size}; "
            f"the target has {vocab} / {hidden}"
        )
    if max(cfg.tapped_layers) >= target.config.num_hidden_layers:
        raise XpressError(
            f"drafter {spec!r} taps layers {cfg.tapped_layers}; the target has only {target.config.num_hidden_layers}"
        )
    head = drafter_head(target, dtype) or target.get_output_embeddings()
    return diffusion_drafter(model.bind(target, vocabulary_head(model, head)), banned)


def drafter_dtype(target_dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """The dtype a target-conditioned drafter runs in: bf16 beside an fp32 target on a CPU with native bf16, else the
    target's. Why: a draft's precision never reaches the output (the target's walk decides every token, §2.4), and
    its products over a dozen rows cost a half to a third in packed bf16 there (packing.py: 13 x 256 x 1280 in 55 us
    against 138 us in fp32, the head over 9 rows 106 against 368 us), where the fp32 target keeps plain
    decoding's tokens exactly."""
    if fp32_on_native_bf16_cpu(target_dtype, device):
        return torch.bfloat16
    return target_dtype


def drafter_head(target, dtype: torch.dtype) -> torch.nn.Module | None:
    """The target's LM head for a drafter in ``dtype``: None (the head itself) where its dtype is the same, else a
    frozen copy in ``dtype``, packed where that keeps its outputs (packing.py)."""
    head = target.get_output_embeddings()
    if head is None or head.weight.dtype == dtype:
        return None
    bias = getattr(head, "bias", None)
    rows, columns = head.weight.shape
    copy = torch.nn.Linear(columns, rows, bias=bias is not None, device=head.weight.device, dtype=dtype)
    copy.requires_grad_(False)
    with torch.no_grad():
        copy.weight.copy_(head.weight)
        if bias is not None:
            copy.bias.copy_(bias)
    return packed_linear(copy) or copy.eval()


def rope_theta(config) -> float:
    """The target's RoPE base, which the drafter's positions share: transformers 5 keeps it in ``rope_parameters``
    (per layer type where they differ: the full-attention layers', as the drafter attends over all it reads), older
    configs in ``rope_theta``; 10000, RoPE's own, where neither states it."""
    parameters = getattr(config, "rope_parameters", None) or {}
    parameters = parameters.get("full_attention", parameters)
    return float(parameters.get("rope_theta") or getattr(config, "rope_theta", None) or 10000.0)


def init_drafter(
    target_spec: str | Path,
    out: Path,
    layers: int = 1,
    block: int = 16,
    seed: int = 0,
    noise: str = "mask",
    clean_rms: float = 1.0,
    tapped_layers: list[int] | None = None,
    fuse_previous: bool = False,
    dflash_layout: bool = False,
) -> XpressDrafter:
    """An untrained diffusion drafter sized for any HF causal-LM target (the start of training, and for tests).
    ``dflash_layout``: the architecture the DFlash format holds (per-head query/key norms, masked positions embedded
    as the target's mask token), so that the trained drafter can be exported (``export_dflash``).

    ``noise``: "mask" or "gaussian"; ``clean_rms``: the gaussian drafter's clean-embedding scale (see its config);
    ``tapped_layers``: the target layers it reads (default ``default_tapped_layers``, ``serving_taps`` in the DFlash
    layout: engines read the last layer differently); ``fuse_previous``: block
    inputs also read the features of the token before the root (see its config)."""
    target, tokenizer = load_target(target_spec, torch.device("cpu"), torch.float32)
    taps_for = serving_taps if dflash_layout else default_tapped_layers
    if dflash_layout and (noise != "mask" or fuse_previous or tokenizer.mask_token_id is None):
        raise XpressError(
            "the DFlash layout needs a masked drafter without fuse_previous, and a target tokenizer with a mask token"
        )
    embed = target.get_input_embeddings().weight
    tcfg = target.config
    heads = tcfg.num_attention_heads
    config = XpressDrafterConfig(
        hidden_size=embed.shape[1],
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=getattr(tcfg, "num_key_value_heads", None) or heads,
        intermediate_size=getattr(tcfg, "intermediate_size", None) or 4 * embed.shape[1],
        vocab_size=embed.shape[0],
        tapped_layers=tapped_layers or taps_for(tcfg.num_hidden_layers),
        block_size=block,
        mask_token_id=tokenizer.mask_token_id,
        target_name_or_path=str(target_spec),
        target_num_layers=tcfg.num_hidden_layers,
        rope_theta=rope_theta(tcfg),
        noise=noise,
        clean_rms=clean_rms,
        fuse_previous=fuse_previous,
        qk_norm=dflash_layout,
        learned_mask=not dflash_layout,
    )
    if dflash_layout and (refusals := export_refusals(config)):  # before anything is written
        raise XpressError(f"the drafter could not be written in the DFlash format: {'; '.join(refusals)}")
    torch.manual_seed(seed)
    model = XpressDrafter(config)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return model
