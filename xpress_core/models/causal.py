"""Causal LMs: the target, checked for what verification needs, and the autoregressive drafter."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from ..attention import IMPLEMENTATION as ATTENTION_IMPLEMENTATION
from ..attention import use_grouped_attention
from ..cache import check_target_layers
from ..drafters.autoregressive import AutoregressiveDrafter
from ..errors import XpressError
from ..head import ROWS_HEAD
from ..hub import ModelSpec
from ..packing import fp32_rows_linear, one_token_kernels
from ..presets import Access
from .dtypes import fp32_on_native_bf16_cpu
from .pretrained import check_tokenizer_match, load_pretrained, load_tokenizer, resolve_model


def load_causal_lm(
    kind: str, spec: str | Path | ModelSpec, device: torch.device, dtype: torch.dtype, device_map=None, access=None
):
    access = access or Access.from_env()
    return load_pretrained(AutoModelForCausalLM, resolve_model(kind, spec, access), device, dtype, device_map, access)


def load_target(spec: str | Path | ModelSpec, device: torch.device, dtype: torch.dtype, device_map=None, access=None):
    access = access or Access.from_env()
    spec = resolve_model("target", spec, access)
    target = load_causal_lm("target", spec, device, dtype, device_map, access)
    check_target_layers(target.config)
    check_tree_attention(target.config)
    use_grouped_attention(target)  # a CPU's verify forwards (attention.py)
    one_token_kernels(target)  # its plain steps' products: packed oneDNN's or ATen's, whichever is faster here
    if fp32_on_native_bf16_cpu(target.dtype, target.device):
        keep_rows_head(target)
    return target, load_tokenizer(spec.name)


def keep_rows_head(target) -> None:
    """On a CPU with native bf16 (AVX-512: oneDNN's kernels use it, where MKL's fp32 products at a few rows did not,
    measured on such an EPYC), the fp32 head the tree walk computes its rows with (head.py ``ROWS_HEAD``): packed for
    oneDNN (``packing.fp32_rows_linear``). Plain steps and ``generate`` keep the head itself."""
    head = target.get_output_embeddings()
    rows = fp32_rows_linear(head) if type(head) is torch.nn.Linear else None
    if rows is not None:
        object.__setattr__(target, ROWS_HEAD, rows)  # not a submodule: never saved, moved or counted


# Attention implementations that apply a custom 4-D additive mask: the tree mask (docs/DESIGN.md §2.3). Others
# (flash_attention_2/3, paged variants, kernels from the Hub) take a causal or padding mask at most and would verify
# every node against its siblings without a word.
TREE_MASK_ATTENTION = ("sdpa", "eager", ATTENTION_IMPLEMENTATION)


def check_tree_attention(config) -> None:
    """Refuse a target whose attention implementation would ignore the tree attention mask."""
    for part in {id(c): c for c in (config, getattr(config, "get_text_config", lambda: config)())}.values():
        implementation = getattr(part, "_attn_implementation", None)
        if implementation is not None and implementation not in TREE_MASK_ATTENTION:
            raise XpressError(
                f"the target's attention implementation {implementation!r} ignores the tree attention mask that "
                f"verification needs; load it with one of {', '.join(TREE_MASK_ATTENTION)} (attn_implementation)"
            )


def load_autoregressive_drafter(
    spec: ModelSpec, target, tokenizer, device, dtype, banned, access
) -> AutoregressiveDrafter:
    """A small causal LM with the target's tokenizer and vocabulary, drafting token by token (drafters/autoregressive.py)."""
    check_tokenizer_match("drafter", spec.name, tokenizer)
    model = load_causal_lm("drafter", spec, device, dtype, access=access)
    one_token_kernels(model)  # a chain drafts one token a forward: as the target's plain steps
    if model.config.vocab_size != target.config.vocab_size:
        raise XpressError(
            f"drafter {spec.name!r} has vocabulary size {model.config.vocab_size}, the target {target.config.vocab_size}"
        )
    return AutoregressiveDrafter(model, banned)
