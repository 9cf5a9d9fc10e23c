"""Diffusion LMs as drafters: a standalone masked-diffusion LM (LLaDA, Dream, MDLM, an A2D model) that drafts a block
from the text alone, on the target's tokenizer or one that extends it (its mask token)."""

from __future__ import annotations

from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForMaskedLM
from transformers.models.auto.modeling_auto import MODEL_FOR_MASKED_LM_MAPPING_NAMES

from ..drafters.diffusion_lm import DiffusionLMDrafter, family_convention, resolve_mask_token_id
from ..errors import XpressError
from ..hub import ModelSpec
from .ours import tree_sharpness
from .pretrained import load_pretrained, load_tokenizer, ships_tokenizer


def check_tokenizer_extends(spec: ModelSpec, target_tokenizer):
    """A diffusion LM may add tokens (its mask) to the target's tokenizer, but every target token must keep its id.
    Returns the drafter's tokenizer, or None when it has none (MDLM: its vocabulary size is still checked)."""
    if spec.local and not ships_tokenizer(spec.name):
        return None
    try:
        tokenizer = load_tokenizer(spec.name)
    except XpressError:  # a Hub repository without a tokenizer
        return None
    vocab = tokenizer.get_vocab()
    if any(vocab.get(token) != i for token, i in target_tokenizer.get_vocab().items()):
        raise XpressError(
            f"{spec.role} {spec.name!r} uses a different tokenizer than the target: drafts would be meaningless"
        )
    return tokenizer


def diffusion_lm_class(config: dict | None):
    """The auto class a diffusion LM's repository registers (LLaDA and Dream: AutoModel; MDLM, dllm: masked LM)."""
    auto_map = (config or {}).get("auto_map") or {}
    if "AutoModelForMaskedLM" in auto_map:
        return AutoModelForMaskedLM
    if "AutoModel" in auto_map:
        return AutoModel
    if (config or {}).get("model_type") in MODEL_FOR_MASKED_LM_MAPPING_NAMES:
        return AutoModelForMaskedLM
    return AutoModelForCausalLM  # a causal LM read with the shifted convention (what Dream inherits)


def load_diffusion_lm(
    spec: ModelSpec,
    target,
    tokenizer,
    device,
    dtype,
    banned,
    access,
    logit_shift: bool | None = None,
    mask_token_id: int | None = None,
) -> DiffusionLMDrafter:
    """``logit_shift``, ``mask_token_id``: None = the family's convention, its tokenizer's / config's mask."""
    drafter_tokenizer = check_tokenizer_extends(spec, tokenizer)
    config = spec.config
    convention = family_convention((config or {}).get("model_type", ""), logit_shift)
    if convention.architecture:  # an A2D model: its weights in transformers' class of the causal original
        fields = {k: v for k, v in config.items() if k not in ("model_type", "auto_map", "architectures")}
        own = AutoConfig.for_model(convention.architecture, **fields)
        model = load_pretrained(AutoModelForCausalLM, spec, device, dtype, access=access, config=own)
    else:
        model = load_pretrained(diffusion_lm_class(config), spec, device, dtype, access=access)
    width = model.config.vocab_size
    if width < len(tokenizer):
        raise XpressError(
            f"drafter {spec.name!r} has vocabulary size {width}; the target's tokenizer has {len(tokenizer)} tokens"
        )
    mask_id = resolve_mask_token_id(convention, mask_token_id, drafter_tokenizer, model.config)
    if not 0 <= mask_id < width:
        raise XpressError(f"drafter {spec.name!r}: mask token id {mask_id} is outside its vocabulary of {width}")
    # Drafts hold only ids the target can verify (its embedding rows); the drafter may know more (its mask).
    vocab = min(width, target.get_input_embeddings().weight.shape[0])
    drafter = DiffusionLMDrafter(model, convention, mask_id, vocab, banned)
    drafter.tree_sharpness = tree_sharpness(config, spec.name)  # its config class is not ours: the field rides along
    return drafter
