"""The target-conditioned block-diffusion drafter (docs/DESIGN.md §3; the DFlash family, arXiv 2602.06036).

- Hidden states of a few tapped target layers, for the context tokens, are fused by one linear layer and injected as
  keys/values into every drafter layer (computed once per committed token and cached across rounds).
- A block ``[root, MASK x L]`` attends bidirectionally to itself and to the whole context.
- The token embedding and the LM head are the target's own, frozen and not saved with the drafter: the drafter
  shares the tokenizer by construction, and ``bind(target)`` attaches them after loading.
- Two options make the same module run published DFlash checkpoints (``dflash_format.py``): per-head RMSNorm on
  queries and keys (``qk_norm``, as Qwen3 and DFlash have), and masked positions embedded as the target's embedding of
  the mask token instead of a learned vector (``learned_mask=False``); the newer releases' fields and DFlash 2's
  convolutions and candidate selector (``dflash2.py``) are ``DFLASH_FIELDS`` (its config, ``diffusion_config.py``),
  neutral for our own drafters.

Two noise types (``config.noise``), one architecture:

- ``mask``: a block ``[root, MASK x L]``; masked positions get a learned mask vector (discrete diffusion).
- ``gaussian``: the seed article's continuous variant. Block positions hold noisy token embeddings
  ``x_t = sqrt(a(t)) e + sqrt(1 - a(t)) eps`` (DDPM forward process, Ho et al. 2020) plus a timestep embedding, with
  the cosine schedule ``a(t) = cos(pi t / 2)^2`` (Nichol & Dhariwal 2021): ``t = 1`` is pure noise, ``t = 0`` clean.
  The clean embeddings ``e`` are the target's token embeddings rescaled to one RMS per coordinate,
  ``config.clean_rms``, whatever the target's own scale (ours: rows of norm about 1.2 in 256 dimensions). That RMS
  sets the signal-to-noise ratio of the whole schedule: a token is told apart from the others by all H coordinates
  together, so its SNR at level t is about ``H clean_rms^2 a / (1 - a)``. At ``clean_rms = 1`` (unit-variance, like
  the noise) a 256-wide embedding is still readable at ``t = 0.9``; at ``1 / sqrt(H)`` (unit norm) the token SNR is
  ``a / (1 - a)``, 1 at ``t = 0.5``. The drafter predicts the clean tokens' logits (x0-prediction).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers import initialization as init

from .dflash2 import BlockConvolution, CandidateSelector
from .diffusion_config import XpressDrafterConfig
from .layer_masks import block_masks
from .refiner import BlockRefiner


def rotate(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding (x: (B, H, S, D), cos and ``Rotary``'s signed sine: (B, 1, S, D)).

    The usual ``x cos + cat(-x2, x1) sin`` with the minus moved onto the sine's first half (``Rotary``): the halves
    swapped by one ``roll`` instead of two slices, a negation and a cat (four tensor calls fewer a rotation, a fixed
    cost each on a CPU; 4 rotations a draft). Bit for bit the same: a product's sign does not change its rounding."""
    return x * cos + x.roll(x.shape[-1] // 2, -1) * signed_sin


def rotary_inv_freq(head_dim: int, theta: float) -> torch.Tensor:
    return 1.0 / theta ** (torch.arange(0, head_dim, 2).float() / head_dim)


class Rotary(nn.Module):
    def __init__(self, head_dim: int, theta: float):
        super().__init__()
        self.register_buffer("inv_freq", rotary_inv_freq(head_dim, theta), persistent=False)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, S) positions -> cos and signed sine (B, 1, S, D): the sine's first half negated, as ``rotate`` reads
        it (once per forward, where each rotation would negate its input's half)."""
        freqs = positions[..., None].float() * self.inv_freq  # (B, S, D/2)
        emb = torch.cat((freqs, freqs), dim=-1)[:, None]  # (B, 1, S, D)
        signed_sin = emb.sin()
        signed_sin[..., : freqs.shape[-1]].neg_()
        return emb.cos().to(dtype), signed_sin.to(dtype)


class ReferenceRMSNorm(nn.RMSNorm):
    """RMSNorm rounded as transformers' Qwen3 norm (DFlash's): normalised in fp32, cast back, then scaled by the
    weight in the input's dtype. The same function as ``nn.RMSNorm``; in bf16 the rounding differs, and with it now
    and then a draft token (measured against z-lab's reference in bf16: 373 of 392 rounds' drafts equal with
    ``nn.RMSNorm``, 654 of 659 with this; docs/experiments.md)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normed = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * normed.to(x.dtype)


def rms_norm(size: int, cfg: XpressDrafterConfig) -> nn.RMSNorm:
    """A drafter norm: DFlash checkpoints' rounding (``reference_norms``), or torch's fused one (ours)."""
    norm = ReferenceRMSNorm if cfg.reference_norms else nn.RMSNorm
    return norm(size, eps=cfg.rms_norm_eps)


class DrafterAttention(nn.Module):
    def __init__(self, cfg: XpressDrafterConfig):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        bias = cfg.attention_bias
        self.q_proj = nn.Linear(cfg.hidden_size, self.heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(cfg.hidden_size, self.kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(cfg.hidden_size, self.kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.heads * self.head_dim, cfg.hidden_size, bias=bias)
        # Per-head norms before the rotation (Qwen3 / DFlash); none for our own drafters (not identity modules: a module
        # call is a fixed cost, 4 us on a CPU, four a draft).
        self.q_norm = rms_norm(self.head_dim, cfg) if cfg.qk_norm else None
        self.k_norm = rms_norm(self.head_dim, cfg) if cfg.qk_norm else None
        self.qkv_proj: nn.Linear | None = None  # the three in one product, once fused for inference (``fuse``)

    def fuse(self) -> None:
        """Inference: q, k and v in one matrix product (``XpressDrafter.fuse_projections``)."""
        self.qkv_proj = fused_linear(self.q_proj, self.k_proj, self.v_proj)
        del self.q_proj, self.k_proj, self.v_proj

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(B, S, H) -> queries (B, heads, S, D), keys and values (B, kv_heads, S, D), normed, not rotated."""
        b, s, _ = x.shape
        if self.qkv_proj is None:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        else:
            q, k, v = self.qkv_proj(x).split([self.heads * self.head_dim, *[self.kv_heads * self.head_dim] * 2], -1)
        q, k = q.view(b, s, self.heads, self.head_dim), k.view(b, s, self.kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        return q.transpose(1, 2), k.transpose(1, 2), v.view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)

    def project_kv(self, x: torch.Tensor, cos, sin) -> tuple[torch.Tensor, torch.Tensor]:
        """Context keys (rotated) and values of fused target features (B, S, H). Fused for inference, the product
        computes queries too, thrown away: once per prompt, the rounds' context tokens go through ``forward``."""
        _, k, v = self.project(x)
        return rotate(k, cos, sin), v

    def forward(self, h, cos, sin, context, mask, pending=None):
        """The block ``h`` (B, Q, H) attending to ``context`` (a layer's keys/values, or ``KVSlots``) and to itself.
        ``pending`` (1, m, H): fused features of context tokens not yet in ``context``; their keys/values are projected
        with the block's, in the same matrix products, and come first (cos/sin then span m + Q positions)."""
        b, q_len, _ = h.shape
        q, k, v = self.project(h if pending is None else torch.cat([pending, h], dim=1))
        q = rotate(q[:, :, -q_len:], cos[..., -q_len:, :], sin[..., -q_len:, :])
        k = rotate(k, cos, sin)
        k, v = context.extend(k, v) if isinstance(context, KVSlots) else with_block(context, k, v)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=self.kv_heads != self.heads)
        return self.o_proj(out.transpose(1, 2).reshape(b, q_len, -1))


def fused_linear(*parts: nn.Linear) -> nn.Linear:
    """One linear layer computing ``parts``' outputs side by side (their weights, and biases, stacked)."""
    first = parts[0]
    fused = nn.Linear(
        first.in_features,
        sum(p.out_features for p in parts),
        bias=first.bias is not None,
        device=first.weight.device,
        dtype=first.weight.dtype,
    )
    with torch.no_grad():
        fused.weight.copy_(torch.cat([p.weight for p in parts]))
        if first.bias is not None:
            fused.bias.copy_(torch.cat([p.bias for p in parts]))
    return fused


def context_keys(context, pending: torch.Tensor | None) -> int:
    """Keys of a layer's context before the block: its ``KVSlots``' used slots or its keys, then the pending
    tokens'."""
    held = context.start if isinstance(context, KVSlots) else context[0].shape[2]
    return held + (0 if pending is None else pending.shape[1])


def with_block(context: tuple[torch.Tensor, torch.Tensor], k: torch.Tensor, v: torch.Tensor):
    """A layer's context keys/values followed by the block's (training, and K different blocks at once)."""
    ctx_k, ctx_v = context
    return torch.cat([ctx_k, k], dim=2), torch.cat([ctx_v, v], dim=2)


@dataclass
class KVSlots:
    """One layer's preallocated (1, kv_heads, capacity, head_dim) key/value buffers whose first ``start`` slots hold
    the context: a single block writes its keys/values into the next slots and attends to the buffers' views, with
    no concatenation (a later draft overwrites what was not committed)."""

    keys: torch.Tensor
    values: torch.Tensor
    start: int

    def extend(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        end = self.start + k.shape[2]
        self.keys[:, :, self.start : end] = k
        self.values[:, :, self.start : end] = v
        return self.keys[:, :, :end], self.values[:, :, :end]


class DrafterLayer(nn.Module):
    def __init__(self, cfg: XpressDrafterConfig):
        super().__init__()
        self.input_norm = rms_norm(cfg.hidden_size, cfg)
        self.attn = DrafterAttention(cfg)
        self.post_norm = rms_norm(cfg.hidden_size, cfg)
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)
        self.gate_up_proj: nn.Linear | None = None  # gate and up in one product, once fused for inference
        convolved = cfg.conv_kernel_size > 0
        kernel, group = cfg.conv_kernel_size, cfg.conv_group_size
        self.attention_conv = BlockConvolution(cfg.hidden_size, kernel, group) if convolved else None
        self.mlp_conv = BlockConvolution(cfg.hidden_size, kernel, group) if convolved else None

    def fuse(self) -> None:
        self.attn.fuse()
        self.gate_up_proj = fused_linear(self.gate_proj, self.up_proj)
        del self.gate_proj, self.up_proj

    def forward(self, h, cos, sin, context, mask, pending=None):
        x = self.input_norm(h)
        if self.attention_conv is not None:
            x, after = self.attention_conv.before(x)
        x = self.attn(x, cos, sin, context, mask, pending)
        h = h + (x if self.attention_conv is None else self.attention_conv.after(x, after))
        x = self.post_norm(h)
        if self.mlp_conv is not None:
            x, after = self.mlp_conv.before(x)
        x = self.mlp(x)
        return h + (x if self.mlp_conv is None else self.mlp_conv.after(x, after))

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate_up_proj is None:
            gate, up = self.gate_proj(x), self.up_proj(x)
        else:
            gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


def signal_share(t: torch.Tensor) -> torch.Tensor:
    """a(t) = cos(pi t / 2)^2, the cosine schedule: the share of the clean signal's variance left at noise level t."""
    return torch.cos(t * (math.pi / 2)).pow(2)


def add_noise(clean: torch.Tensor, noise: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """x_t = sqrt(a(t)) clean + sqrt(1 - a(t)) noise; clean/noise (B, Q, H), t (B, Q) per position (0 = clean)."""
    a = signal_share(t.to(clean.dtype))[..., None]
    return a.sqrt() * clean + (1 - a).clamp(min=0).sqrt() * noise


def timestep_features(t: torch.Tensor, dim: int) -> torch.Tensor:
    """Sinusoidal features of the noise level (B, Q) -> (B, Q, dim), as in DDPM's timestep embedding."""
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, device=t.device, dtype=torch.float32) / half)
    angles = (t.float() * 1000.0)[..., None] * freqs  # t in [0, 1] read as a step count out of 1000
    return torch.cat([angles.sin(), angles.cos()], dim=-1)


class TimestepEmbedding(nn.Module):
    def __init__(self, hidden_size: int):
        super().__init__()
        self.fc_in = nn.Linear(hidden_size, hidden_size)
        self.fc_out = nn.Linear(hidden_size, hidden_size)

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        x = timestep_features(t, self.fc_in.in_features).to(self.fc_in.weight.dtype)
        return self.fc_out(F.silu(self.fc_in(x)))


ContextKV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: (B, kv_heads, S, head_dim) keys and values


class XpressDrafter(PreTrainedModel):
    config_class = XpressDrafterConfig
    base_model_prefix = "drafter"
    _no_split_modules: ClassVar[list[str]] = ["DrafterLayer"]  # read by transformers (device_map="auto")

    def __init__(self, config: XpressDrafterConfig):
        super().__init__(config)
        n_tapped = len(config.tapped_layers)
        self.fc = nn.Linear(n_tapped * config.hidden_size, config.hidden_size, bias=False)
        self.context_norm = rms_norm(config.hidden_size, config)
        # Each noise type owns only the input it uses: the mask vector, or the timestep embedding. DFlash-format
        # drafters embed masked positions as the target's embedding of the mask token instead of a learned vector.
        self.mask_embedding = None
        if config.noise == "mask" and config.learned_mask:
            self.mask_embedding = nn.Parameter(torch.zeros(config.hidden_size))
        elif config.noise == "gaussian":
            self.time_embedding = TimestepEmbedding(config.hidden_size)
        self.previous_proj = (
            nn.Linear(config.hidden_size, config.hidden_size, bias=False) if config.fuse_previous else None
        )
        self.layers = nn.ModuleList(DrafterLayer(config) for _ in range(config.num_hidden_layers))
        self.candidate_selector = (
            CandidateSelector(config.vocab_size, config.hidden_size, config.selector_rank, config.selector_top_k)
            if config.selector_top_k > 0
            else None
        )
        self.norm = rms_norm(config.hidden_size, config)
        self.rotary = Rotary(config.head_dim, config.rope_theta)
        self.refiner = (
            BlockRefiner(config.hidden_size, config.refiner_rank, config.block_size, config.rms_norm_eps)
            if config.refiner_rank
            else None
        )
        if config.draft_vocab:  # saved with the weights: the token ids the draft vocabulary holds (draft_vocab.py)
            self.register_buffer("draft_ids", torch.zeros(config.draft_vocab, dtype=torch.long))
        self._shared: tuple[nn.Module, nn.Module] | None = None  # (target embedding, target LM head), not saved
        self.post_init()

    def _init_weights(self, module):
        super()._init_weights(module)
        if module is self and self.mask_embedding is not None:
            init.normal_(self.mask_embedding, mean=0.0, std=self.config.initializer_range)
        if self.refiner is not None and module is self.refiner.out:
            init.zeros_(module.weight)  # a new head starts as a no-op (refiner.py)
        if self.refiner is not None and module is self.refiner:
            init.zeros_(module.mix)
        if module is self.previous_proj:
            # Zero: a drafter given this input for continued training drafts exactly as before until it learns.
            init.zeros_(module.weight)
        if isinstance(module, BlockConvolution):
            init.zeros_(module.base_kernel)
        if isinstance(module, Rotary):
            # Not in the checkpoint (non-persistent): from_pretrained builds on the meta device, so without this the
            # buffer is uninitialised memory and drafts come out of garbage positions (NaN at random).
            init.copy_(module.inv_freq, rotary_inv_freq(self.config.head_dim, self.config.rope_theta))

    def fuse_projections(self) -> XpressDrafter:
        """For inference: every layer computes q, k and v in one matrix product and gate and up in another, the
        separate layers dropped (their weights now live in the fused ones); a refiner head runs in fp32. The products and the drafts are the same
        up to rounding (measured on the embedded drafter in bf16: the same drafts, each 9 % sooner on a CPU, where a
        small product's fixed cost is a large part of it). A fused model is not for training or saving: its state dict
        no longer has the checkpoint's layout."""
        for layer in self.layers:
            layer.fuse()
        if self.refiner is not None:
            # Its products are tiny: in bf16 they cost more than in fp32 on a CPU (a pass of the embedded drafter's
            # head, one thread: 1.19 ms in bf16 against 0.44 ms in fp32, measured on a loaded machine).
            self.refiner.float()
        return self

    def bind(self, target: PreTrainedModel, head: nn.Module | None = None) -> XpressDrafter:
        """Attach the target's (frozen) embedding and LM head (``head``: a copy of it in the drafter's dtype, where
        that differs from the target's); a plain tuple keeps them out of the state dict."""
        embed, head = target.get_input_embeddings(), head or target.get_output_embeddings()
        if embed.weight.shape[0] < self.config.vocab_size or embed.weight.shape[1] != self.config.hidden_size:
            raise ValueError(
                f"drafter expects vocabulary {self.config.vocab_size} x hidden {self.config.hidden_size}, "
                f"target embedding is {tuple(embed.weight.shape)}"
            )
        self._shared = (embed, head)
        return self

    @property
    def shared(self) -> tuple[nn.Module, nn.Module]:
        if self._shared is None:
            raise RuntimeError("drafter is not bound to a target: call bind(target) first")
        return self._shared

    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        """Tapped target features (..., n_tapped*H) -> (..., H), the drafter's view of a context token."""
        return self.context_norm(self.fc(features.to(self.fc.weight.dtype)))

    def context_kv(self, features: torch.Tensor, positions: torch.Tensor) -> ContextKV:
        """Fuse tapped target features (B, S, n_tapped*H) into per-layer keys/values at ``positions`` (B, S)."""
        x = self.fuse(features)
        cos, sin = self.rotary(positions, x.dtype)
        return [layer.attn.project_kv(x, cos, sin) for layer in self.layers]

    def embed_block(self, tokens: torch.Tensor, masked: torch.Tensor) -> torch.Tensor:
        """(B, Q) token ids and (B, Q) masked flags -> (B, Q, H) embeddings, masked positions get the mask vector."""
        if self.mask_embedding is None:  # DFlash: the target's raw rows (dflash_format.py), scaled by the config
            ids = torch.where(masked, self.config.mask_token_id, tokens)
            embeds = F.embedding(ids, self.shared[0].weight).to(self.norm.weight.dtype)
            scale = self.config.input_embedding_scale
            return embeds if scale == 1.0 else embeds * scale
        embeds = self.shared[0](tokens.clamp(min=0)).to(self.mask_embedding.dtype)
        return torch.where(masked[..., None], self.mask_embedding.expand_as(embeds), embeds)

    def first_block(self, root: int, length: int) -> torch.Tensor:
        """``embed_block`` of one row ``[root, MASK x length]`` (every draft's first forward) -> (1, L+1, H): the
        root's row and the mask's, put side by side (the values ``embed_block`` selects, without its ids, flags and
        selection: a few small ops a draft, each a fixed cost on a CPU)."""
        device = self.norm.weight.device
        if self.mask_embedding is None:  # the target's raw rows of the root and the mask token, scaled by the config
            ids = torch.full((1, length + 1), self.config.mask_token_id, device=device)
            ids[:, 0] = root
            embeds = F.embedding(ids, self.shared[0].weight).to(self.norm.weight.dtype)
            scale = self.config.input_embedding_scale
            return embeds if scale == 1.0 else embeds * scale
        root_row = self.shared[0](torch.full((1, 1), root, device=device)).to(self.mask_embedding.dtype)
        return torch.cat([root_row, self.mask_embedding.expand(1, length, -1)], dim=1)

    def token_embeddings(self, tokens: torch.Tensor) -> torch.Tensor:
        """(B, Q) ids -> (B, Q, H) the target's embeddings rescaled to RMS ``clean_rms`` per coordinate (the clean
        signal of the gaussian drafter; its scale against the noise is the module docstring's SNR)."""
        embeds = self.shared[0](tokens.clamp(min=0)).to(self.fc.weight.dtype)
        unit = embeds * torch.rsqrt(embeds.pow(2).mean(-1, keepdim=True) + self.config.rms_norm_eps)
        return unit * self.config.clean_rms

    def embed_noisy_block(self, noisy: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """Gaussian drafter input: noisy embeddings (B, Q, H) at noise levels (B, Q) -> (B, Q, H) block embeddings."""
        return noisy + self.time_embedding(t)

    def with_previous(self, block_embeds: torch.Tensor, previous: torch.Tensor) -> torch.Tensor:
        """Block inputs (B, Q, H) plus, with ``fuse_previous``, the fused features (B, 1 or Q, F) of the token
        before each position's root."""
        if self.previous_proj is None:
            return block_embeds
        return block_embeds + self.previous_proj(self.fuse(previous)).to(block_embeds.dtype)

    def forward(
        self,
        block_embeds: torch.Tensor,  # (B, Q, H)
        positions: torch.Tensor,  # (B, Q)
        context: ContextKV,
        attention_mask: torch.Tensor | None = None,  # (B or 1, 1, Q, S + Q) additive; None = attend to everything
    ) -> torch.Tensor:
        """Logits (B, Q, V) for every block position (no shift: position j predicts token j)."""
        return self.processed(self.shared[1](self.hidden(block_embeds, positions, context, attention_mask)))

    def processed(self, logits: torch.Tensor) -> torch.Tensor:
        """The LM head's logits times ``output_multiplier``, soft-capped at ``final_logit_softcapping`` (DFlash's
        newer fields; our drafters have neither)."""
        if self.config.output_multiplier != 1.0:
            logits = logits * self.config.output_multiplier
        cap = self.config.final_logit_softcapping
        return logits if not cap or cap <= 0 else torch.tanh(logits / cap) * cap

    def layer_masks(self, positions: torch.Tensor, q_len: int, keys: int) -> list[torch.Tensor | None]:
        """Per layer, the block's (1, 1, Q, S) boolean attention mask, or None (``layer_masks.block_masks``)."""
        causal, windows = self.config.layer_causal, self.config.layer_window
        if causal is None:
            return [None] * len(self.layers)
        return block_masks(causal, windows, positions, q_len, keys)

    def hidden(self, block_embeds, positions, context, attention_mask=None, pending=None, angles=None) -> torch.Tensor:
        """The final normed hidden states (B, Q, H) of every block position, what the LM head reads. ``context``: per
        layer, keys/values (``ContextKV``) or ``KVSlots``; ``pending`` (1, m, H) fused context features projected in
        the same forward (``DrafterAttention``), ``positions`` then covering them first; ``angles``: the positions'
        ``Rotary`` cos and signed sine, where the caller has them (a draft: ``rotary_angles``)."""
        cos, sin = self.rotary(positions, block_embeds.dtype) if angles is None else angles
        if attention_mask is None:
            q_len = block_embeds.shape[1]
            masks = self.layer_masks(positions, q_len, context_keys(context[0], pending) + q_len)
        elif self.config.layer_causal is None:
            masks = [attention_mask] * len(self.layers)
        else:
            raise ValueError("a drafter with causal or sliding-window layers takes no attention mask (no training)")
        h = block_embeds
        for layer, layer_context, mask in zip(self.layers, context, masks):
            h = layer(h, cos, sin, layer_context, mask, pending)
        return self.norm(h)

    def draft_hidden(self, block_embeds, positions, context, pending=None, angles=None) -> torch.Tensor:
        """Hidden states (B, L, H) that predict tokens 1..L of each block ``[root, L positions]``
        (``block_predictions``): what the LM head reads, and the refiner with it."""
        return self.block_predictions(self.hidden(block_embeds, positions, context, pending=pending, angles=angles))

    def head_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The LM head on (..., L, H) hidden states -> (..., L, V), processed (``processed``)."""
        return self.processed(self.raw_logits(hidden))

    def raw_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The LM head on (..., L, H) hidden states -> (..., L, V), before ``processed``."""
        # As rows of a matrix: a slice keeps its parent's batch stride, which sends CPU bf16 matmuls down a path
        # 8x slower than for the same rows laid out afresh (measured: 1.33 ms against 0.15 ms for 8 x 256 x 4096).
        return self.shared[1](hidden.reshape(-1, hidden.shape[-1])).view(*hidden.shape[:-1], -1)

    def refined_logits(self, hidden: torch.Tensor, previous: torch.Tensor) -> torch.Tensor:
        """One refinement pass: (..., L, V) logits of the block positions from the drafter's hidden states (..., L, H)
        and the tokens (..., L) one position earlier (the root's first), through the refiner (refiner.py)."""
        dtype = self.refiner.out.weight.dtype  # fp32 for inference (``fuse_projections``)
        corrected = self.refiner(hidden.to(dtype), self.shared[0](previous).to(dtype))
        return self.head_logits(corrected.to(hidden.dtype))

    def conditional_scores(
        self, hidden: torch.Tensor, previous: torch.Tensor, candidates: torch.Tensor, unary: torch.Tensor | None = None
    ) -> torch.Tensor:
        """DFlash 2's score of each candidate token given the token before it: the candidate's logit plus the
        selector's bilinear term. hidden (B, H) final hidden states of one block position per row, previous (B,)
        the token before that position, candidates (B, C) ids -> (B, C). ``unary``: the candidates' logits, when
        the caller has them (read off the LM head otherwise). A drafter without a selector scores by the logit."""
        if unary is None:
            unary = self.head_logits(hidden[:, None])[:, 0].gather(-1, candidates)
        if self.candidate_selector is None:
            return unary
        selector = self.candidate_selector
        return unary + selector.pairwise(selector.hidden_projection(hidden), previous, candidates)

    def block_predictions(self, logits: torch.Tensor) -> torch.Tensor:
        """Per block (..., L+1, D) outputs of ``[root, positions 1..L]`` (logits, or the hidden states the head reads)
        -> (..., L, D) those that predict tokens 1..L: the root's for token 1 when ``root_predicts_next``, else
        position j's for token j."""
        if self.config.root_predicts_next:
            return torch.cat([logits[..., :1, :], logits[..., 2:, :]], dim=-2)
        return logits[..., 1:, :]
