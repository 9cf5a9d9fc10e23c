"""The loaded models every request shares (``Models``), and what the engine and training read from them: the context
limit, the stop tokens, the ids never drafted, the target's tapped forward, a prompt's ids, the kernels warmed."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch

from .. import validation
from ..chat import encode_chat, encode_text
from ..controller import CostModel
from ..drafters.base import Drafter, logits_kept
from ..errors import XpressError
from ..packing import warm_packed
from ..trace import cuda_devices
from .dtypes import DtypeChoice


@dataclass(frozen=True)
class Models:
    """Read-only models shared by every request."""

    target: torch.nn.Module
    tokenizer: object
    drafter: Drafter
    costs: CostModel | None = None  # stage costs the controller auto plans with; None: measured for each request
    dtype_choice: DtypeChoice | None = None  # the dtype they run in and why

    @cached_property  # transformers finds a model's device by its parameters: each round asks
    def device(self) -> torch.device:
        return self.target.device

    @cached_property
    def cuda_devices(self) -> tuple[torch.device, ...]:
        """The GPUs target and drafter are on: what peak memory sums and a wait waits for (none on a CPU)."""
        return cuda_devices(self.target, getattr(self.drafter, "model", None))


def context_limit(target) -> int | None:
    return getattr(target.config, "max_position_embeddings", None) or getattr(target.config, "n_positions", None)


def eos_ids(target, tokenizer) -> set[int]:
    """End-of-sequence ids as the target's generation config states them (what HF ``generate`` stops on)."""
    eos = getattr(target.generation_config, "eos_token_id", None)
    if eos is None:
        eos = tokenizer.eos_token_id
    return set([eos] if isinstance(eos, int) else (eos or []))


def tapped_forward(target, tapped, last_only: bool = False, **inputs) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One target forward -> (B, Q, V) logits and (B, Q, F) the tapped layers' hidden states (None when none are
    tapped): what the engine verifies with and what drafter training reads, by one definition. ``last_only``: the
    logits of the last position only, (B, 1, V), the LM head run there alone where the model can (a prefill).

    ``output_hidden_states`` takes the indices of the hidden states to keep, so only the tapped layers' outputs are
    collected (index i + 1 is decoder layer i's output; index 0 is the embeddings).
    """
    kept = logits_kept(target, 1) if last_only else {}
    out = target(**inputs, **kept, output_hidden_states=[i + 1 for i in tapped] if tapped else False)
    features = torch.cat([out.hidden_states[i + 1] for i in tapped], dim=-1) if tapped else None
    return (out.logits[:, -1:] if last_only else out.logits), features


def target_banned_ids(target, tokenizer) -> list[int]:
    """``banned_draft_ids`` for a target: its stop tokens stay draftable, its embedding rows bound the vocabulary."""
    return banned_draft_ids(tokenizer, eos_ids(target, tokenizer), target.get_input_embeddings().weight.shape[0])


def banned_draft_ids(tokenizer, eos: set[int], vocab_size: int) -> list[int]:
    """Never proposed in drafts: special tokens (the end-of-turn/eos tokens stay draftable), and the padding rows of an
    embedding larger than the tokenizer (Qwen3: 151,936 rows for 151,669 tokens; DFlash's mask is one of them)."""
    return sorted((set(tokenizer.all_special_ids) - eos) | set(range(len(tokenizer), vocab_size)))


# Row counts whose kernels ``warm_kernels`` builds at load: every plain step, verify and draft, and prompts of up to
# this many tokens (a chat's first turns; longer prompts pay once for each new bucket, packing.py).
WARM_ROWS = 256


def warm_kernels(models: Models, rows: int = WARM_ROWS) -> int:
    """Build the packed layers' kernels of target and drafter for every row count a forward of up to ``rows`` tokens
    runs at (``packing.warm_packed``), so that no reply pays for a first shape; the products run (0 outside bf16 on a
    CPU, where nothing is packed). For a server or a benchmark: a single request would pay more than it saves."""
    drafter = getattr(models.drafter, "model", None)
    modules = [models.target] + ([drafter] if isinstance(drafter, torch.nn.Module) else [])
    return warm_packed(modules, min(rows, context_limit(models.target) or rows))


def encode_prompt(tokenizer, prompt: str | list[dict[str, str]], chat: bool) -> torch.Tensor:
    """(1, n) ids. ``chat``: the tokenizer's chat template with the generation prompt; else the raw text. Typed
    special-token strings stay text either way (``chat.py``)."""
    if isinstance(prompt, str):
        messages = [{"role": "user", "content": validation.text("the prompt", prompt)}]
    else:
        messages = validation.messages("the prompt", prompt)
    if not any(m["content"].strip() for m in messages):
        raise XpressError("the prompt is empty")
    if chat:
        return torch.tensor([encode_chat(tokenizer, messages)])
    return torch.tensor([encode_text(tokenizer, "".join(m["content"] for m in messages))])
