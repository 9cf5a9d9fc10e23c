"""Published DFlash drafter checkpoints (z-lab ``*-DFlash-b16``) loaded into our target-conditioned drafter.

What the format is, as the z-lab checkpoints and reference code publish it (read for facts, arXiv 2602.06036):

- ``config.json`` is a Qwen3 config (``model_type: qwen3``, ``architectures: [DFlashDraftModel]``) with extra fields:
  ``block_size`` (block length *including* the first position, which holds the last committed token),
  ``num_target_layers``, and ``dflash_config: {mask_token_id, target_layer_ids}`` (0-based decoder layers whose
  outputs, i.e. ``hidden_states[id + 1]``, are concatenated as the context features).
- Weights: ``fc`` (fuses the concatenated features), ``hidden_norm`` (RMSNorm after it), per layer
  ``input_layernorm``, ``self_attn.{q,k,v,o}_proj``, ``self_attn.{q,k}_norm`` (per-head RMSNorm),
  ``post_attention_layernorm``, ``mlp.{gate,up,down}_proj``, and a final ``norm``. No embedding and no LM head: the
  target's are used, and masked positions are the target's embedding of ``mask_token_id``.
- Forward: the context keys/values come from the fused features (no layer norm on them), the block attends to the
  context and to itself bidirectionally, rotary positions are absolute, logits = target LM head on the final norm,
  position j of the block predicting token j (no shift).

- Newer releases (z-lab's reference package ``dflash`` 0.1.0, the oracle of tests/test_reference.py): masked positions
  are the target's *raw* embedding rows times ``input_embedding_scale``; logits are multiplied by
  ``output_multiplier`` and soft-capped at ``final_logit_softcapping``; ``layer_types`` may hold sliding-window layers
  (causal by default, full layers bidirectional, ``is_causal`` overriding both).
- DFlash 2 (``architectures: [DFlash2DraftModel]``): around each layer's attention and MLP, grouped dynamic causal
  convolutions along the block (``conv_kernel_size``, ``conv_group_size``), and a candidate selector choosing each
  position among its ``selector_top_k`` best tokens given the token before it (``selector_rank``); its codebooks are
  published without the ``.weight`` of an embedding.

That is our ``XpressDrafter`` with ``qk_norm=True`` and ``learned_mask=False`` (and the fields above); only the
parameter names differ, and ``key_mapping`` renames them at load time. No remote code runs: the checkpoint's own
``dflash.py`` is never imported. ``dflash_export`` goes the other way, for a drafter of ours of that architecture.
"""

from __future__ import annotations

import math
import re

from transformers import Qwen3Config

from ..errors import XpressError
from .diffusion_config import XpressDrafterConfig

DFLASH_ARCHITECTURE = "DFlashDraftModel"
DFLASH2_ARCHITECTURE = "DFlash2DraftModel"
ARCHITECTURES = (DFLASH_ARCHITECTURE, DFLASH2_ARCHITECTURE)

# Published parameter name (regex) -> our module's name. DFlash 2's convolutions keep their names; its selector's
# codebooks are published without the ``.weight`` of an embedding (the reference class maps them the same way), while
# a checkpoint saved by the reference class has it: both load.
DFLASH_KEY_MAPPING = {
    r"^hidden_norm\.": "context_norm.",
    r"\.self_attn\.": ".attn.",
    r"\.input_layernorm\.": ".input_norm.",
    r"\.post_attention_layernorm\.": ".post_norm.",
    r"\.mlp\.(gate|up|down)_proj\.": r".\1_proj.",
    r"^candidate_selector\.(predecessor|successor)_codebook$": r"candidate_selector.\1_codebook.weight",
}
# Fields read as the reference reads them: from ``dflash_config`` first, then the top level; 1 / None when absent.
SCALARS = ("input_embedding_scale", "output_multiplier", "final_logit_softcapping")
DFLASH2_FIELDS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")


def is_dflash_config(config: dict) -> bool:
    return any(a in ARCHITECTURES for a in config.get("architectures") or []) or "dflash_config" in config


def dflash_value(config: dict, name: str):
    """DFlash keeps some fields in ``dflash_config`` and some at the top level, depending on the release."""
    return (config.get("dflash_config") or {}).get(name, config.get(name))


def required(config: dict, spec: str, names) -> list:
    values = [dflash_value(config, k) for k in names]
    missing = [k for k, v in zip(names, values) if v is None]
    if missing:
        raise XpressError(f"drafter {spec!r} is a DFlash checkpoint without {', '.join(missing)} in its config.json")
    return values


def number(config: dict, spec: str, name: str, default):
    value = dflash_value(config, name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise XpressError(f"drafter {spec!r}: {name} in its config.json must be a finite number, got {value!r}")
    return float(value)


def layer_attention(config: dict, spec: str) -> tuple[list[bool] | None, list[int | None] | None]:
    """Per layer (causal, sliding window) as the reference's attention reads them: the layer types and window that
    transformers' Qwen3 config resolves (a window only where ``use_sliding_window`` keeps one), sliding layers causal
    and full ones bidirectional unless ``is_causal`` says otherwise for all. (None, None) when every layer attends to
    everything, as our drafter does by default."""
    resolved = Qwen3Config.from_dict({k: v for k, v in config.items() if k not in ("architectures", "auto_map")})
    types = list(resolved.layer_types or ["full_attention"] * resolved.num_hidden_layers)
    unknown = sorted(set(types) - {"full_attention", "sliding_attention"})
    if unknown:
        raise XpressError(f"drafter {spec!r}: layer_types {unknown} in its config.json are not DFlash attention kinds")
    is_causal = config.get("is_causal")
    causal = [t == "sliding_attention" if is_causal is None else bool(is_causal) for t in types]
    windows = [resolved.sliding_window if t == "sliding_attention" else None for t in types]
    if not any(causal) and all(w is None for w in windows):
        return None, None
    return causal, windows


def dflash_drafter_config(config: dict, spec: str) -> XpressDrafterConfig:
    """Our drafter config for a published DFlash or DFlash 2 config.json; refuses the variants our module does not
    compute, naming the field."""
    architectures = config.get("architectures") or []
    if any(a not in ARCHITECTURES for a in architectures):
        raise XpressError(
            f"drafter {spec!r} is a {architectures} checkpoint; xPress loads {' and '.join(ARCHITECTURES)}"
        )
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if rope.get("rope_type", "default") != "default":
        raise XpressError(f"drafter {spec!r} uses rope type {rope['rope_type']!r}; xPress implements the default one")
    layer_ids, mask_id, block = required(config, spec, ("target_layer_ids", "mask_token_id", "block_size"))
    second = DFLASH2_ARCHITECTURE in architectures
    kernel, group, rank, top_k = required(config, spec, DFLASH2_FIELDS) if second else (0, 0, 0, 0)
    if second and config["hidden_size"] % int(group):
        raise XpressError(f"drafter {spec!r}: conv_group_size {group} does not divide hidden_size")
    causal, windows = layer_attention(config, spec)
    scale, multiplier, cap = (number(config, spec, k, d) for k, d in zip(SCALARS, (1.0, 1.0, None)))
    return XpressDrafterConfig(
        hidden_size=config["hidden_size"],
        num_hidden_layers=config["num_hidden_layers"],
        num_attention_heads=config["num_attention_heads"],
        num_key_value_heads=config.get("num_key_value_heads") or config["num_attention_heads"],
        head_dim=config.get("head_dim"),
        intermediate_size=config["intermediate_size"],
        rms_norm_eps=config.get("rms_norm_eps", 1e-6),
        rope_theta=float(rope.get("rope_theta") or config.get("rope_theta") or 10000.0),
        vocab_size=config["vocab_size"],
        tapped_layers=list(layer_ids),
        # DFlash's block counts the committed first position; ours counts only the drafted positions after it.
        block_size=int(block) - 1,
        mask_token_id=int(mask_id),
        target_num_layers=config.get("num_target_layers", 0),
        qk_norm=True,
        learned_mask=False,
        attention_bias=bool(config.get("attention_bias", False)),
        input_embedding_scale=scale,
        output_multiplier=multiplier,
        final_logit_softcapping=cap,
        layer_causal=causal,
        layer_window=windows,
        conv_kernel_size=int(kernel),
        conv_group_size=int(group),
        selector_rank=int(rank),
        selector_top_k=int(top_k),
        reference_norms=True,
    )


# Our parameter name (regex) -> the published one: DFLASH_KEY_MAPPING read backwards.
EXPORT_KEY_MAPPING = {
    r"^context_norm\.": "hidden_norm.",
    r"\.attn\.": ".self_attn.",
    r"\.input_norm\.": ".input_layernorm.",
    r"\.post_norm\.": ".post_attention_layernorm.",
    r"^(layers\.\d+)\.(gate|up|down)_proj\.": r"\1.mlp.\2_proj.",
}


def serving_taps(num_layers: int, count: int = 3) -> list[int]:
    """Taps for a drafter that serving engines will load: spread from layer 1 to the one before the last, never the
    last (what an engine hands the drafter for the last layer is not what transformers' ``hidden_states`` holds)."""
    if num_layers <= 2:
        return [0]
    last = num_layers - 2
    return sorted({round(1 + i * (last - 1) / max(count - 1, 1)) for i in range(count)})


def export_refusals(cfg: XpressDrafterConfig) -> list[str]:
    """What in a drafter's config the DFlash formats cannot hold (empty: it exports exactly)."""
    checks = [
        (cfg.noise != "mask", "it is a gaussian drafter (DFlash drafters mask)"),
        (
            cfg.learned_mask,
            (
                "it learned its own mask vector, where DFlash embeds the mask token with the target's embedding "
                "(train it with --format dflash)"
            ),
        ),
        (not cfg.qk_norm, "it has no per-head query and key norms, which DFlash layers always have"),
        (cfg.mask_token_id is None, "it has no mask token id"),
        (cfg.root_predicts_next, "its root predicts the first token (in DFlash, position j predicts token j)"),
        (cfg.fuse_previous, "its block reads the features of the token before the root (fuse_previous)"),
        (cfg.layer_causal is not None, "it has causal or sliding-window layers (export writes full attention)"),
        (getattr(cfg, "refiner_rank", 0) > 0, "it has a refiner head, which DFlash drafters do not have"),
        (getattr(cfg, "draft_vocab", 0) > 0, "it drafts from a vocabulary of its own, which DFlash drafters do not"),
        (
            cfg.target_num_layers is not None and cfg.target_num_layers - 1 in cfg.tapped_layers,
            (
                f"it taps the target's last layer ({(cfg.target_num_layers or 0) - 1}), which engines read differently: "
                "transformers (xPress, z-lab's reference) after the final norm, vLLM before it (tap earlier layers, "
                "--taps)"
            ),
        ),
    ]
    return [why for bad, why in checks if bad]


def dflash_export(model, spec: str) -> tuple[dict, dict]:
    """(config.json, weights) of a drafter of ours in the DFlash format, or DFlash 2's when it has the convolutions
    and the selector; refused, saying why, when the format cannot hold it. The weights are the module's own tensors
    under the published names: the reference class drafts with them what xPress drafts (tests/test_reference.py)."""
    cfg = model.config
    refusals = export_refusals(cfg)
    if refusals:
        raise XpressError(f"drafter {spec!r} cannot be written in the DFlash format: {'; '.join(refusals)}")
    second = cfg.selector_top_k > 0
    dflash = {"mask_token_id": cfg.mask_token_id, "target_layer_ids": list(cfg.tapped_layers)}
    dflash |= {k: getattr(cfg, k) for k, neutral in zip(SCALARS, (1.0, 1.0, None)) if getattr(cfg, k) != neutral}
    if second:
        dflash |= {k: getattr(cfg, k) for k in DFLASH2_FIELDS}
    config = {
        "architectures": [DFLASH2_ARCHITECTURE if second else DFLASH_ARCHITECTURE],
        "model_type": "qwen3",
        "hidden_size": cfg.hidden_size,
        "num_hidden_layers": cfg.num_hidden_layers,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "intermediate_size": cfg.intermediate_size,
        "hidden_act": "silu",
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
        "attention_bias": cfg.attention_bias,
        "layer_types": ["full_attention"] * cfg.num_hidden_layers,
        "tie_word_embeddings": False,
        "vocab_size": cfg.vocab_size,
        # DFlash's block counts the committed first position.
        "block_size": cfg.block_size + 1,
        "num_target_layers": cfg.target_num_layers,
        "dflash_config": dflash,
        "tree_sharpness": cfg.tree_sharpness,  # xPress's loader reads it; the reference ignores it
    }
    weights = {}
    for name, tensor in model.state_dict().items():
        for pattern, replacement in EXPORT_KEY_MAPPING.items():
            name = re.sub(pattern, replacement, name)
        weights[name] = tensor.detach().contiguous()
    return config, weights
