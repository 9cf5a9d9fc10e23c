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

That is our ``XpressDrafter`` with ``qk_norm=True`` and ``learned_mask=False``; only the parameter names differ, and
``key_mapping`` renames them at load time. No remote code runs: the checkpoint's own ``dflash.py`` is never imported.
"""

from __future__ import annotations

from ..errors import XpressError
from .diffusion_model import XpressDrafterConfig

DFLASH_ARCHITECTURE = "DFlashDraftModel"

# Published parameter name (regex) -> our module's name.
DFLASH_KEY_MAPPING = {
    r"^hidden_norm\.": "context_norm.",
    r"\.self_attn\.": ".attn.",
    r"\.input_layernorm\.": ".input_norm.",
    r"\.post_attention_layernorm\.": ".post_norm.",
    r"\.mlp\.(gate|up|down)_proj\.": r".\1_proj.",
}


def is_dflash_config(config: dict) -> bool:
    return DFLASH_ARCHITECTURE in (config.get("architectures") or []) or "dflash_config" in config


def dflash_value(config: dict, name: str):
    """DFlash keeps some fields in ``dflash_config`` and some at the top level, depending on the release."""
    return (config.get("dflash_config") or {}).get(name, config.get(name))


def dflash_drafter_config(config: dict, spec: str) -> XpressDrafterConfig:
    """Our drafter config for a published DFlash config.json; refuses the variants our module does not compute."""
    architectures = config.get("architectures") or []
    if any(a != DFLASH_ARCHITECTURE for a in architectures):
        raise XpressError(f"drafter {spec!r} is a {architectures} checkpoint; xPress loads {DFLASH_ARCHITECTURE} only")
    if "sliding_attention" in (config.get("layer_types") or []):
        raise XpressError(f"drafter {spec!r} uses sliding-window attention, which xPress's drafter does not implement")
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if rope.get("rope_type", "default") != "default":
        raise XpressError(f"drafter {spec!r} uses rope type {rope['rope_type']!r}; xPress implements the default one")
    layer_ids, mask_id, block = (dflash_value(config, k) for k in ("target_layer_ids", "mask_token_id", "block_size"))
    missing = [
        k for k, v in (("target_layer_ids", layer_ids), ("mask_token_id", mask_id), ("block_size", block)) if v is None
    ]
    if missing:
        raise XpressError(f"drafter {spec!r} is a DFlash checkpoint without {', '.join(missing)} in its config.json")
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
    )
