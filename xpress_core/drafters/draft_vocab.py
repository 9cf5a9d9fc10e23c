"""A drafter's draft vocabulary: the tokens it may draft, where it drafts from fewer than the target's (DESIGN §3.6).

Why: our drafter reuses the target's LM head, and over SmolLM2's 49,152 words that head is half a draft: 8 rows x 576
x 49,152 took 3.2 ms of a 6.5 ms (1, 1, 8) draft in packed bf16 on 2 threads, where the 16,384 words the target writes
most cover 98.6 % of its held-out distilled tokens. A head over those rows alone costs a third; the others' logits are
-inf, so no draft holds them. The target verifies every token, so what is drafted changes and the output does not
(frequency-ranked draft vocabularies: FR-Spec; EAGLE-3's draft-to-target map). ``train draft-vocab`` chooses the
tokens (``frequent_tokens``) and keeps them in the drafter (``draft_ids``, ``config.draft_vocab``); training always
reads the whole head, decoding this one (``models/ours.py``).
"""

from __future__ import annotations

import torch
from torch import nn

from ..packing import packed_linear


class DraftVocabularyHead(nn.Module):
    """The target's LM head over the draft vocabulary ``ids`` only, its logits laid out over the whole vocabulary
    (-inf elsewhere): every reader of a drafter's logits indexes them by token id as before. ``weight`` stays the
    whole head's (the refiner reads its candidates' rows from it, and they are always drafted tokens)."""

    def __init__(self, head: nn.Module, ids: torch.Tensor):
        super().__init__()
        weight = head.weight
        rows = nn.Linear(weight.shape[1], ids.numel(), bias=head.bias is not None, device=weight.device)
        rows = rows.to(weight.dtype).requires_grad_(False)
        with torch.no_grad():
            rows.weight.copy_(weight[ids.to(weight.device)])
            if head.bias is not None:
                rows.bias.copy_(head.bias[ids.to(weight.device)])
        self.rows = packed_linear(rows) or rows.eval()
        self.register_buffer("ids", ids.to(weight.device), persistent=False)
        self.whole = (head,)  # a plain tuple: the target's head is not this module's to move or count
        self.vocab_size = weight.shape[0]

    @property
    def weight(self) -> torch.Tensor:
        return self.whole[0].weight

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = hidden.new_full((*hidden.shape[:-1], self.vocab_size), float("-inf"))
        return logits.index_copy_(-1, self.ids, self.rows(hidden).to(logits.dtype))


def vocabulary_head(model, head: nn.Module) -> nn.Module:
    """``head`` cut to ``model``'s draft vocabulary where it has one, else ``head`` itself."""
    ids = getattr(model, "draft_ids", None)
    return head if ids is None else DraftVocabularyHead(head, ids)


def frequent_tokens(written: torch.Tensor, size: int, vocab_size: int) -> torch.Tensor:
    """The ``size`` token ids most frequent in ``written`` (any shape of ids), ascending; ties go to the lower id."""
    counts = torch.bincount(written.flatten().long(), minlength=vocab_size)
    # A stable sort on the negated counts keeps equal counts in id order.
    order = torch.sort(-counts, stable=True).indices
    return order[:size].sort().values


def with_draft_vocab(model, ids: torch.Tensor):
    """A copy of ``model`` (an ``XpressDrafter``) that drafts from ``ids`` only: ``config.draft_vocab`` and the
    ``draft_ids`` buffer set, every weight as it was."""
    config = type(model.config).from_dict(model.config.to_dict() | {"draft_vocab": int(ids.numel())})
    cut = type(model)(config).to(next(model.parameters()).dtype)
    state = {k: v for k, v in model.state_dict().items() if k != "draft_ids"}
    cut.load_state_dict(state | {"draft_ids": ids.long()})
    return cut
