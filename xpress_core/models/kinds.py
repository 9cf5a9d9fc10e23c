"""The drafter kinds, and the kind a checkpoint's config.json implies: what ``load_drafter`` dispatches on, and what
``dflash.read_conditioned_drafter`` tells the formats apart by."""

from __future__ import annotations

from ..drafters.dflash_format import is_dflash_config
from ..drafters.diffusion_config import XpressDrafterConfig
from ..drafters.diffusion_lm import FAMILIES

NO_DRAFTER = "none"
# How a drafter is loaded: "auto" reads its config.json. xpress = our target-conditioned drafter; dflash = a published
# DFlash checkpoint loaded into it; diffusion-lm = a standalone masked-diffusion LM; autoregressive = a small causal LM.
DRAFTER_KINDS = ("auto", "xpress", "dflash", "diffusion-lm", "autoregressive")


def drafter_kind(config: dict | None) -> str:
    """The drafter kind its config.json implies (``DRAFTER_KINDS``); a causal LM when nothing else fits."""
    if config is None:
        return "autoregressive"  # unreadable: the causal-LM loader reports what is wrong
    model_type = config.get("model_type")
    if model_type == XpressDrafterConfig.model_type:
        return "xpress"
    if is_dflash_config(config):
        return "dflash"
    masked = any(a.endswith("ForMaskedLM") for a in config.get("architectures") or [])
    if model_type in FAMILIES or masked or "AutoModelForMaskedLM" in (config.get("auto_map") or {}):
        return "diffusion-lm"
    return "autoregressive"
