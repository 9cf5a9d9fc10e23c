"""A standalone masked-diffusion LM from the Hub (LLaDA, Dream, MDLM, dllm's Qwen3 diffusion models) as the drafter.

Unlike our target-conditioned drafter it knows nothing of the target's hidden states: every denoise step it reads the
committed context itself, as ``[context, root, block]`` with the block's undecided positions set to its mask token,
with bidirectional attention, and its logits at the block positions drive the same parallel refinement
(``MaskedDiffusionDrafter``). It keeps no cache: the models it targets attend bidirectionally over the whole sequence,
so a prefix cache would change their output (only block-causal models such as BD3-LM could keep one).

Families differ in their conventions, recorded per ``model_type`` in ``FAMILIES`` (read from each project's
reference sampler):
- *logit shift*: Dream is adapted from an autoregressive model and keeps its convention, the logits at position i
  predicting token i + 1; LLaDA, MDLM and dllm's A2D models predict token i at position i.
- *mask token*: the tokenizer's or config's; MDLM has none in the GPT-2 tokenizer and appends it as the last id.
- *call*: Dream selects bidirectional attention with ``attention_mask="full"``; MDLM's forward takes the noise level
  ``timesteps`` (zero: the released checkpoints are not time-conditioned).
- *architecture*: dllm's A2D models are a transformers architecture (Qwen3, Llama) with the causal mask removed and
  the same parameter names, so they load into transformers' own class, without remote code, and an all-zero additive
  4-D attention mask opens the attention both ways.
MDLM's substitution step (SUBS: the mask token gets zero probability, decided positions keep their token) holds for
every family here: the mask token is banned before the softmax, and the refinement never reopens a committed position.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from ..errors import XpressError
from ..tree import to_device
from .base import banned_token_bias, forward_takes, logits_kept
from .masked import MaskedDiffusionDrafter


@dataclass(frozen=True)
class FamilyConvention:
    logit_shift: bool = False  # logits at position i predict token i + 1 (Dream)
    full_attention_arg: bool = False  # forward(attention_mask="full") asks for bidirectional attention (Dream)
    timesteps_arg: bool = False  # forward(timesteps=...) takes the noise level (MDLM)
    mask_is_last_id: bool = False  # no mask token in the tokenizer: the mask is the last vocabulary id (MDLM)
    architecture: str | None = None  # transformers model type holding these weights (A2D: the causal original)


FAMILIES: dict[str, FamilyConvention] = {
    "dream": FamilyConvention(logit_shift=True, full_attention_arg=True),
    "llada": FamilyConvention(),
    "mdlm": FamilyConvention(timesteps_arg=True, mask_is_last_id=True),
    "a2d-qwen3": FamilyConvention(architecture="qwen3"),
    "a2d-llama": FamilyConvention(architecture="llama"),
}


def family_convention(model_type: str, logit_shift: bool | None) -> FamilyConvention:
    """The family's convention (plain masked LM when unknown), with an explicit logit-shift choice on top."""
    convention = FAMILIES.get(model_type, FamilyConvention())
    return convention if logit_shift is None else replace(convention, logit_shift=logit_shift)


def resolve_mask_token_id(convention: FamilyConvention, explicit: int | None, tokenizer, config) -> int:
    """The drafter's mask token: given explicitly, else its tokenizer's, its config's, or the family's rule."""
    for candidate in (explicit, getattr(tokenizer, "mask_token_id", None), getattr(config, "mask_token_id", None)):
        if candidate is not None:
            return int(candidate)
    if convention.mask_is_last_id:
        return int(config.vocab_size) - 1
    raise XpressError(
        "the diffusion-LM drafter has no mask token (none in its tokenizer or config); give one with --mask-token-id"
    )


def position_limit(config) -> int | None:
    for name in ("max_position_embeddings", "max_sequence_length", "model_length", "n_positions"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


@dataclass
class DiffusionLMState:
    ids: list[int]  # the committed tokens the target cache holds (the root is passed to each draft)
    # The last ``[context, root]`` sent to the device, by (committed tokens, root, room): a draft's steps share it.
    sent: tuple[tuple[int, int, int], torch.Tensor] | None = None


class DiffusionLMDrafter(MaskedDiffusionDrafter):
    name = "diffusion-lm"

    def __init__(self, model, convention: FamilyConvention, mask_token_id: int, vocab_size: int, banned_ids: list[int]):
        """``vocab_size``: token ids drafts may use (those the target can verify); the mask is always banned (SUBS)."""
        self.model, self.convention, self.mask_token_id = model, convention, mask_token_id
        self.device = model.device
        self.banned = banned_token_bias(vocab_size, [*banned_ids, mask_token_id], model.device)
        self.limit = position_limit(model.config)
        # The block and its root must fit the drafter's positions next to at least one context token.
        self.max_block = None if self.limit is None else self.limit - 2
        self.max_block_reason = "longest block that fits its positions"

    def start(self, prompt_ids, features):
        return DiffusionLMState(ids=prompt_ids[0].tolist())

    def commit(self, state: DiffusionLMState, tokens, features):
        state.ids.extend(tokens)

    def context_length(self, state: DiffusionLMState) -> int:
        return len(state.ids)

    def denoise(self, state: DiffusionLMState, root: int, tokens: torch.Tensor, committed: torch.Tensor):
        """(R, L) block rows -> (R, L, V) logits for the block positions, read over ``[context, root, block]``."""
        rows, length = tokens.shape
        prefix = self.prefix(state, root, length).expand(rows, -1)
        block = torch.where(committed, tokens, self.mask_token_id)
        logits = self.forward(torch.cat([prefix, block], dim=1), length + 1)  # (R, >= L + 1, V)
        # Shifted logits: block position j is predicted at the position before it (the root for j = 0).
        return logits[:, -length - 1 : -1] if self.convention.logit_shift else logits[:, -length:]

    def prefix(self, state: DiffusionLMState, root: int, length: int) -> torch.Tensor:
        """(1, S) ``[context, root]`` on the device, the most recent context that fits the drafter's positions: sent
        once a draft, in a copy that does not wait."""
        key = (len(state.ids), root, length)
        if state.sent is None or state.sent[0] != key:
            context = state.ids + [root]
            if self.limit is not None:
                context = context[-(self.limit - length) :]
            state.sent = key, to_device([context], self.device)
        return state.sent[1]

    def forward(self, ids: torch.Tensor, kept: int | None = None) -> torch.Tensor:
        """(R, S) ids -> (R, S', V) logits, S' >= ``kept`` (None: every position): the LM head over the last ``kept``
        positions only and no cache where the model's forward takes the keywords (transformers' classes do,
        repository code may not)."""
        kwargs = {} if kept is None else logits_kept(self.model, kept)
        if forward_takes(self.model, "use_cache"):
            kwargs["use_cache"] = False
        if self.convention.full_attention_arg:
            kwargs["attention_mask"] = "full"
        if self.convention.architecture:  # (R, 1, S, S) additive zeros: every position sees every position
            size = ids.shape[1]
            kwargs["attention_mask"] = torch.zeros(
                (ids.shape[0], 1, size, size), dtype=self.model.dtype, device=ids.device
            )
        if self.convention.timesteps_arg:
            kwargs["timesteps"] = torch.zeros(ids.shape[0], device=ids.device)
        out = self.model(input_ids=ids, **kwargs)
        # Remote-code models answer with a ModelOutput, a tuple or (MDLM with return_dict off) the bare logits.
        if torch.is_tensor(out):
            return out
        return out.logits if hasattr(out, "logits") else out[0]
