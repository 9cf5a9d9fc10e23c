"""The diffusion drafter's config (``XpressDrafterConfig``, its config.json) with the DFlash releases' fields it carries
(``DFLASH_FIELDS``), and the target layers a new drafter taps; the model that reads them is diffusion_model.py
(docs/DESIGN.md §3).
"""

from __future__ import annotations

import math

from transformers import AutoConfig, PreTrainedConfig

from ..config import NOISE_TYPES

# Fields of the DFlash releases (dflash_format.py), with values that change nothing (our own drafters'):
# - input_embedding_scale: masked positions and the root enter as the target's raw embedding rows times this (not
#   its embedding module's output, which some families scale);
# - output_multiplier, final_logit_softcapping: the logits multiplied by it, then soft-capped;
# - layer_causal, layer_window: per layer, whether the block attends causally and its sliding window over absolute
#   positions; None: every layer attends to the whole context and bidirectionally within the block;
# - conv_kernel_size, conv_group_size (DFlash 2): grouped dynamic causal convolutions around each layer's attention
#   and MLP (0: none); selector_rank, selector_top_k (DFlash 2): a candidate selector that rescores a position's top
#   tokens given the token before it (0: none);
# - reference_norms: RMSNorm rounded as DFlash's own code rounds it (``ReferenceRMSNorm``), not torch's fused one.
DFLASH_FIELDS = {
    "input_embedding_scale": 1.0,
    "output_multiplier": 1.0,
    "final_logit_softcapping": None,
    "layer_causal": None,
    "layer_window": None,
    "conv_kernel_size": 0,
    "conv_group_size": 0,
    "selector_rank": 0,
    "selector_top_k": 0,
    "reference_norms": False,
}


class XpressDrafterConfig(PreTrainedConfig):
    model_type = "xpress_drafter"

    def __init__(
        self,
        hidden_size: int = 256,
        num_hidden_layers: int = 1,
        num_attention_heads: int = 4,
        num_key_value_heads: int = 2,
        intermediate_size: int = 640,
        rms_norm_eps: float = 1e-6,
        rope_theta: float = 10000.0,
        vocab_size: int = 4096,
        tapped_layers: list[int] | None = None,
        block_size: int = 16,
        mask_token_id: int | None = None,
        target_name_or_path: str = "",
        target_num_layers: int = 0,
        noise: str = "mask",
        clean_rms: float = 1.0,
        initializer_range: float = 0.02,
        head_dim: int | None = None,
        qk_norm: bool = False,
        learned_mask: bool = True,
        attention_bias: bool = False,
        root_predicts_next: bool = False,
        fuse_previous: bool = False,
        tree_sharpness: float = 1.0,
        refiner_rank: int = 0,
        refiner_gains: list[list[float]] | None = None,
        draft_vocab: int = 0,
        **kwargs,
    ):
        if noise not in NOISE_TYPES:
            raise ValueError(f"drafter noise must be one of {NOISE_TYPES}, got {noise!r}")
        if clean_rms <= 0:
            raise ValueError(f"clean_rms must be > 0, got {clean_rms}")
        if refiner_rank < 0:
            raise ValueError(f"refiner_rank must be >= 0, got {refiner_rank}")
        if not 0 <= draft_vocab < vocab_size:
            raise ValueError(f"draft_vocab must be 0 (the whole vocabulary) to {vocab_size - 1}, got {draft_vocab}")
        if not 0 < tree_sharpness < math.inf:
            raise ValueError(f"tree_sharpness must be > 0, got {tree_sharpness}")
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.intermediate_size = intermediate_size
        self.rms_norm_eps = rms_norm_eps
        self.rope_theta = rope_theta
        self.vocab_size = vocab_size
        self.tapped_layers = list(tapped_layers or [0])
        self.block_size = block_size
        self.mask_token_id = mask_token_id
        self.target_name_or_path = target_name_or_path
        self.target_num_layers = target_num_layers
        self.noise = noise
        self.clean_rms = clean_rms  # gaussian noise: RMS per coordinate of the clean embeddings (noise has 1)
        self.initializer_range = initializer_range
        # Qwen3-family models fix head_dim apart from hidden_size / heads (Qwen3-4B: 2560 / 32 heads, head_dim 128).
        self.head_dim = head_dim or hidden_size // num_attention_heads
        self.qk_norm = qk_norm
        self.learned_mask = learned_mask
        self.attention_bias = attention_bias
        # The root's own output predicts the block's first token (as an autoregressive model's last position does)
        # instead of the first masked position: the root knows its token from the first layer on, so every layer's
        # attention to the context is already asked about it, where a masked position spends a layer fetching it.
        self.root_predicts_next = root_predicts_next
        # Every block position's input also holds the fused target features of the token before the root (EAGLE's
        # input, Li et al. 2024): the target's own state one token back, where attention alone passes a layer only
        # its values' few dimensions of it.
        self.fuse_previous = fuse_previous
        # Greedy draft trees read each node's chance from softmax(tree_sharpness x logits) (diffusion.py,
        # ``tree_drafts``). Trained on the target's distributions (soft labels), the drafter says how likely the target
        # finds a token, where a greedy round needs the chance that it is the target's most likely one: a sharper
        # figure (a token at 0.4 against two at 0.3 is the greedy choice every time). Fitted by ``train sharpness``.
        self.tree_sharpness = tree_sharpness
        # Rank of the causal refiner head (refiner.py); 0 = none: the drafter's steps are then denoise steps.
        self.refiner_rank = refiner_rank
        # Per number of passes 1, 2, ...: each block position's greedy acceptance after them over after none, on
        # held-out text (``train refiner`` measures it): the prior the controller auto starts T > 1 from.
        self.refiner_gains = refiner_gains
        # The tokens a draft may hold, where fewer than the vocabulary (draft_vocab.py): their ids are the model's
        # ``draft_ids`` buffer. 0: every token.
        self.draft_vocab = draft_vocab
        for name, neutral in DFLASH_FIELDS.items():
            setattr(self, name, kwargs.pop(name, neutral))
        super().__init__(**kwargs)


# Lets AutoConfig/AutoTokenizer read a drafter directory's config.json (idempotent).
AutoConfig.register(XpressDrafterConfig.model_type, XpressDrafterConfig, exist_ok=True)


def default_tapped_layers(num_layers: int, count: int = 3) -> list[int]:
    """Spread taps from an early layer to the last (DFlash taps shallow to deep): e.g. 6 layers -> [1, 3, 5]. The
    last layer's output is the target's next-token prediction, the best single hint of what the block holds."""
    if num_layers <= count:
        return list(range(num_layers))
    last = num_layers - 1
    return sorted({round(1 + i * (last - 1) / (count - 1)) for i in range(count)})
