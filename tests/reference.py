"""The published DFlash reference (z-lab's ``dflash`` package, 0.1.0) as the oracle of the DFlash format.

Checkpoints are built by the reference classes themselves, given random weights and saved with ``save_pretrained``:
real checkpoints of the published format, offline. ``reference_rounds`` runs the reference ``dflash_generate`` and
reads every round's draft off the block it sends the target to verify.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from time import perf_counter
from unittest import mock

import torch
from dflash.model import DFlash2DraftModel, DFlashDraftModel, dflash_generate
from safetensors.torch import load_file, save_file
from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

REFERENCE_CLASSES = {"dflash": DFlashDraftModel, "dflash2": DFlash2DraftModel}


@dataclass(frozen=True)
class Variant:
    """One reference checkpoint: its class, size, block, tapped target layers and the newer config fields."""

    name: str
    kind: str = "dflash"  # or "dflash2"
    layers: int = 1
    block_size: int = 5  # the reference's: the root plus block_size - 1 drafted positions
    taps: tuple[int, ...] = (0, 2)
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 32
    fields: tuple[tuple[str, object], ...] = ()  # extra dflash_config entries (input_embedding_scale, ...)
    top_level: tuple[tuple[str, object], ...] = ()  # extra Qwen3Config fields (layer_types, sliding_window, ...)
    published_keys: bool = False  # DFlash 2: the selector's codebooks saved under their published names (no .weight)


def reference_config(variant: Variant, target_dir: Path) -> Qwen3Config:
    tok = AutoTokenizer.from_pretrained(target_dir)
    target = Qwen3Config.from_pretrained(target_dir)
    dflash = {"mask_token_id": tok.mask_token_id, "target_layer_ids": list(variant.taps)} | dict(variant.fields)
    if variant.kind == "dflash2":
        dflash = {"conv_kernel_size": 3, "conv_group_size": 16, "selector_rank": 8, "selector_top_k": 6} | dflash
    return Qwen3Config(
        hidden_size=target.hidden_size,
        num_hidden_layers=variant.layers,
        num_attention_heads=variant.heads,
        num_key_value_heads=variant.kv_heads,
        head_dim=variant.head_dim,
        intermediate_size=96,
        vocab_size=target.vocab_size,
        max_position_embeddings=512,
        block_size=variant.block_size,
        num_target_layers=target.num_hidden_layers,
        dflash_config=dflash,
        **dict(variant.top_level),
    )


def randomize(model: torch.nn.Module, seed: int) -> None:
    """Every parameter drawn from a seeded generator (the reference leaves its convolution kernels uninitialised):
    norms near 1, the rest at a scale that makes argmax choices clear-cut. The layers write nothing into channel 0,
    so the block keeps the constant that the few-token target's embeddings carry there (``make_few_token_target``)
    and the drafter, too, ranks the target's few tokens above all others."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            noise = torch.randn(p.shape, generator=gen)
            if "norm" in name:
                p.copy_(1.0 + 0.1 * noise)
            elif "base_kernel" in name or "kernel_projection" in name:
                p.copy_(0.3 * noise)
            elif "codebook" in name:  # a selector strong enough to overrule the logits' order now and then
                p.copy_(noise)
            else:
                p.copy_(0.2 * noise)
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                p[0] = 0.0


def make_reference_drafter(variant: Variant, target_dir: Path, out: Path, seed: int = 3) -> Path:
    model = REFERENCE_CLASSES[variant.kind](reference_config(variant, target_dir))
    randomize(model, seed)
    model.save_pretrained(out)
    if variant.published_keys:
        weights = load_file(out / "model.safetensors")
        renamed = {k.removesuffix(".weight") if "_codebook" in k else k: v for k, v in weights.items()}
        save_file(renamed, out / "model.safetensors", metadata={"format": "pt"})
    AutoTokenizer.from_pretrained(target_dir).save_pretrained(out)
    return out


def load_reference(kind: str, path: Path) -> DFlashDraftModel:
    return REFERENCE_CLASSES[kind].from_pretrained(path, dtype=torch.float32).eval()


@dataclass(frozen=True)
class ReferenceRun:
    drafts: list[list[int]]  # per round, the drafted tokens of the verified block
    produced: list[int]  # per round, the tokens it added (accepted + 1, cut at the end or a stop)
    output: list[int]  # the new tokens


def reference_rounds(model, target, prompt_ids: torch.Tensor, new: int, stop_ids: list[int], **sampling):
    """``dflash_generate`` with every verify forward's block recorded (its first token is the root)."""
    blocks = []

    def record(module, args, kwargs):
        blocks.append(kwargs.get("input_ids", args[0] if args else None)[0].tolist())

    hook = target.register_forward_pre_hook(record, with_kwargs=True)
    # Its statistics time the rounds with a CUDA clock; on a CPU the plain clock stands in (timings are not compared).
    with mock.patch("dflash.model._cuda_time", perf_counter):
        try:
            stats = dflash_generate(model, target, prompt_ids, new, stop_ids, return_stats=True, **sampling)
        finally:
            hook.remove()
    n = prompt_ids.shape[1]
    return ReferenceRun([b[1:] for b in blocks[1:]], list(stats.acceptance_lengths), stats.output_ids[0, n:].tolist())


EMBED_CONSTANT, HEAD_CONSTANT = 3.0, 20.0


def make_few_token_target(
    tok, out: Path, speaks: tuple[int, ...], layers: int = 4, seed: int = 0, spread: float = 1.0
) -> Path:
    """A tiny random Qwen3 target that writes only the tokens ``speaks``: every embedding carries a large constant in
    coordinate 0, which survives the final norm, and only the LM head rows of ``speaks`` read it. A random drafter
    sharing this head then drafts among the same few tokens and is right now and then, so rounds accept 0 to L
    tokens and every path of the comparison runs (a target of the whole vocabulary accepts nothing from it).
    ``spread``: the scale of those rows' other weights, how far apart the few tokens' logits are."""
    from tests.tiny import make_target

    make_target("qwen3", tok, out, seed=seed, layers=layers)
    model = Qwen3ForCausalLM.from_pretrained(out, dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        embed = model.get_input_embeddings().weight
        embed.copy_(torch.randn(embed.shape, generator=gen))
        embed[:, 0] = EMBED_CONSTANT
        head = model.get_output_embeddings().weight
        head.zero_()
        rows = torch.tensor(speaks)
        head[rows] = spread * torch.randn((len(speaks), head.shape[1]), generator=gen)
        head[rows, 0] = HEAD_CONSTANT
    model.save_pretrained(out)
    return out
