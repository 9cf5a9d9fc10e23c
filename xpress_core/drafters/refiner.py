"""The refiner: a small causal head that lets each block position see the tokens drafted before it (docs/DESIGN.md §3.5).

A one-forward block drafter picks every position from its own marginal, blind to the token drafted one position
earlier. The refiner corrects position j's logits from what the block says at positions up to j:

- per position, the drafter's final hidden state ``h_j`` (computed once per round), the block's mean hidden state,
  and the target's embedding of the token drafted at j - 1 (the root's at j = 1), each projected to rank r and added;
- a causal mix across positions: per channel, a learned lower-triangular (L, L) matrix over those inputs, on top of
  the position's own (so position j reads the tokens at 0 .. j - 1 and nothing after);
- a small SwiGLU in the rank-r space;
- a projection back to the drafter's width added to ``h_j`` (from position 2 on: position 1 reads only the root,
  which the drafter already saw), read out by the drafter's own LM head (the target's, frozen): the correction
  lives in the vocabulary's geometry instead of a V-wide matrix of its own.

The projection back starts at zero, so a drafter given a new head drafts exactly as before until the head is trained
(the mix starts at zero too: each position first learns from its own inputs, the previous token among them).
Resolved by refinement passes (``refine_passes``): pass 0 is the drafter's own block; every next pass re-reads the
tokens of the pass before, at all positions at once. Position j's logits depend only on the tokens before it, so
after p passes the first p positions hold what a left-to-right walk through the head would draft, and a block whose
tokens a pass does not change is a fixed point: more passes change nothing. A draft tree is refined along its own
paths instead: each pass reads every node's path, and the tree is built again from those distributions
(``RefinementPasses.refined_trees``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..tree import TreePaths, best_first_on_device, best_first_tree, read_trees, to_device
from .base import read_top


class BlockRefiner(nn.Module):
    def __init__(self, hidden_size: int, rank: int, block_size: int, eps: float):
        super().__init__()
        self.hidden_in = nn.Linear(hidden_size, rank, bias=False)
        self.summary_in = nn.Linear(hidden_size, rank, bias=False)
        self.token_in = nn.Linear(hidden_size, rank, bias=False)
        # (rank, L, L): per channel, how much position j reads position i <= j's inputs (zero: reads its own only).
        self.mix = nn.Parameter(torch.zeros(rank, block_size, block_size))
        self.norm = nn.RMSNorm(rank, eps=eps)
        self.gate_up = nn.Linear(rank, 4 * rank, bias=False)
        self.down = nn.Linear(2 * rank, rank, bias=False)
        self.out = nn.Linear(rank, hidden_size, bias=False)  # zero-started (``XpressDrafter._init_weights``)

    def forward(self, hidden: torch.Tensor, previous: torch.Tensor) -> torch.Tensor:
        """Corrected hidden states (..., L, H) from the drafter's (..., L, H) and the embeddings (..., L, H) of the
        tokens one position earlier (the root's first): what the LM head then reads."""
        inputs = self.round_inputs(hidden) + self.token_in(previous.to(hidden.dtype))
        correction = self.out(self.code(inputs, torch.tril(self.mix)))
        # The first position reads only the root, which the drafter's block already holds: nothing for the head to
        # add there, and a correction only moves it off what the drafter learned (measured: first-position
        # agreement 0.858 corrected against 0.867).
        return hidden + torch.cat([torch.zeros_like(correction[..., :1, :]), correction[..., 1:, :]], dim=-2)

    def round_inputs(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., L, r): the inputs that do not depend on the drafted tokens, the same for every pass of a round."""
        return self.hidden_in(hidden) + self.summary_in(hidden.mean(-2, keepdim=True))

    def code(self, inputs: torch.Tensor, causal: torch.Tensor, start: int = 0) -> torch.Tensor:
        """(..., L - start, r) the correction of positions ``start``.. before the projection back, from every
        position's inputs (..., L, r) and the mix's lower triangle ``causal`` (r, >= L, >= L): position j mixes in the
        inputs of positions <= j, so later positions need the earlier ones' inputs but not their code."""
        length = inputs.shape[-2]
        causal = causal[:, start:length, :length]  # (r, L - start, L): a block may be shorter than the trained one
        mixed = inputs[..., start:, :] + torch.einsum("cji,...ic->...jc", causal.to(inputs.dtype), inputs)
        return self.transform(mixed)

    def transform(self, mixed: torch.Tensor) -> torch.Tensor:
        """The SwiGLU over mixed inputs (..., r), with its residual: the correction before the projection back."""
        gate, up = self.gate_up(self.norm(mixed)).chunk(2, dim=-1)
        return mixed + self.down(F.silu(gate) * up)


# Per block position, the tokens a refinement pass chooses among: pass 0's best by the drafter's logit. A pass's
# product with the vocabulary then runs over these only. Measured with the embedded drafter on held-out chats: with
# K = 4 rows and T = 4 (12 chats), the whole vocabulary's choice was among pass 0's best 64 at 99.2 % of positions,
# best 128 at 99.9 %; tau the same to three decimals as with the whole vocabulary (20 chats, greedy, one chain at
# T = 1..4 and the K = 4 tree at T = 1..3).
PASS_CANDIDATES = 64


@dataclass(frozen=True)
class PassInputs:
    """What every refinement pass of a round shares (``RefinementPasses``)."""

    base: torch.Tensor  # (1, L, r) fp32, ``BlockRefiner.round_inputs`` of the drafter's hidden states
    candidates: torch.Tensor  # (L, C) token ids: per position, pass 0's best, best first (``PASS_CANDIDATES``)
    raw: torch.Tensor  # (L, C) fp32, their pass-0 LM-head logits before ``processed``
    head_out: torch.Tensor  # (L, r, C) fp32, their rows of ``RefinementPasses.head_out``


class RefinementPasses:
    """A frozen drafter's refinement passes as decoding runs them (``DiffusionDrafter.refined_draft``): the same
    logits as ``XpressDrafter.refined_logits`` up to rounding, at a fraction of the work.

    - The correction reaches the vocabulary through ``head_out`` = W_head W_out, formed once: head(h + out(z)) =
      head(h) + (W_head W_out) z, so a pass adds to pass 0's logits a product of rank r, not of the hidden width.
    - Each position chooses among its candidates only (``PASS_CANDIDATES``, pass 0's best): the product runs over C
      tokens, not the vocabulary.
    - A pass computes the positions from ``start`` on only: the first has no correction (the rows' passes start at 1,
      so that no pass waits to learn where the one before changed a token).
    """

    def __init__(self, model):  # an XpressDrafter with a refiner, bound to its target, frozen from now on
        self.model = model
        refiner, device = model.refiner, model.refiner.out.weight.device
        with torch.no_grad():
            self.head_out = model.shared[1].weight.to(device, torch.float32) @ refiner.out.weight.float()  # (V', r)
            self.causal = torch.tril(refiner.mix.float())  # (r, L, L)
            self.mix_lines = self.causal.permute(1, 2, 0).contiguous()  # (L, L, r): position j's line, j's row
            # (V, r): each token's input to the head, token_in of its embedding, one row read per position and pass
            # instead of an embedding and a product. In slices: a large vocabulary's embeddings in fp32 at once would
            # take gigabytes.
            ids = torch.arange(model.config.vocab_size, device=model.shared[0].weight.device)
            self.token_rows = torch.cat(
                [refiner.token_in(model.shared[0](part).to(device, torch.float32)) for part in ids.split(16384)]
            )

    def inputs(self, hidden: torch.Tensor, raw: torch.Tensor, candidates: torch.Tensor) -> PassInputs:
        """What the passes of a round share, from its (1, L, H) hidden states, their (1, L, V') raw logits and the
        (L, C) candidate tokens."""
        device = self.head_out.device
        base = self.model.refiner.round_inputs(hidden.to(device, torch.float32))
        candidates = candidates.to(device)
        # index_select, and the product reading the rows transposed: a fifth of indexing's time, no copy (CPU).
        chosen_out = self.head_out.index_select(0, candidates.flatten()).view(*candidates.shape, -1).transpose(1, 2)
        return PassInputs(base, candidates, raw[0].to(device).gather(-1, candidates).float(), chosen_out)

    def logits(self, inputs: PassInputs, previous: torch.Tensor, start: int) -> torch.Tensor:
        """One pass over positions ``start`` >= 1 of R rows: (R, L - start, C) logits of the positions' candidates,
        given the tokens (R, L) one position earlier."""
        base = inputs.base
        code = self.model.refiner.code(
            base + F.embedding(previous.to(base.device), self.token_rows), self.causal, start
        )
        correction = torch.matmul(code.transpose(0, 1), inputs.head_out[start:]).transpose(0, 1)  # (R, L - start, C)
        return self.model.processed(inputs.raw[start:] + correction)

    def node_logits(self, inputs: PassInputs, previous: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """A pass at one position per row: (S, C) logits of the candidates of position ``positions[s]`` of row s,
        given the (S, L) tokens one position earlier (those after that position are not read). A tree's nodes need
        one position each: its rows' other positions would repeat the prefixes the rows share."""
        inputs_ = inputs.base[0] + F.embedding(previous.to(inputs.base.device), self.token_rows)  # (S, L, r)
        rows, (length, rank, count) = torch.arange(len(positions), device=positions.device), inputs.head_out.shape
        # Per row, its position's line of the mix (zero past the position: the triangle): a product and a sum over
        # at most L positions, not an einsum over every position's line.
        mix = self.mix_lines[positions, :length]  # (S, L, r)
        code = self.model.refiner.transform(inputs_[rows, positions] + (mix * inputs_).sum(1))  # (S, r)
        # One product with every position's candidates, each row then reading its own position's: fewer and larger
        # kernels than a product per position or a gathered (r, C) matrix per row.
        every = (code @ inputs.head_out.transpose(0, 1).reshape(rank, -1)).view(-1, length, count)  # (S, L, C)
        return self.model.processed(inputs.raw[positions] + every[rows, positions])

    def refined_trees(
        self,
        inputs: PassInputs,
        root: int,
        first: tuple[list[list[float]], list[list[int]]],
        chances: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        budget: int,
        passes: int,
    ) -> list[TreePaths]:
        """A draft tree of ``budget`` nodes refined along its own paths: the tree after each pass, pass 0's first.

        Pass 0 is the tree of the block's marginals, ``first`` (per position, the chances and tokens best first), as
        at T = 1. Each pass runs the head, as one batch, once per node of the tree that no pass read yet: at the
        position after the node, reading the node's path (``node_logits``), which gives the distribution of the
        node's children (``chances`` turns the (S, C) candidate logits of the (S,) positions into chances). Those are
        kept, and the tree is built again best-first (``best_first_tree``), each node's children scored by its own
        path's distribution where a pass computed it, by the marginals where none did. A pass whose tree is the one
        before is a fixed point. Unlike K rows refined from a chain's branches, the tree keeps its budget on distinct
        nodes; unlike a tree of one refined chain's distributions, no node is scored in another path's context."""
        known: dict[tuple[int, ...], tuple[list[float], list[int]]] = {}
        probs, tokens = first

        def choices(path: tuple[int, ...]) -> tuple[list[float], list[int]]:
            return known.get(path) or (probs[len(path)], tokens[len(path)])

        depth = len(probs)
        trees = [best_first_tree(choices, budget, depth)]
        for _ in range(passes):
            paths = trees[-1].tokens
            # The prefixes whose children no pass has scored yet: each node of the tree, up to depth L - 1
            needed = sorted(
                {path[:j] for path in paths for j in range(1, min(len(path), depth - 1) + 1)} - known.keys()
            )
            if not needed:
                break  # a fixed point: the pass would build the same tree
            # Per prefix its position, then the tokens one position earlier: one copy to the device
            sent = to_device([[len(p), root, *p, *[p[-1]] * (depth - 1 - len(p))] for p in needed], inputs.base.device)
            positions, previous = sent[:, 0], sent[:, 1:]
            scored = chances(self.node_logits(inputs, previous, positions), positions)  # (S, C)
            top = scored.topk(min(budget, scored.shape[-1]), dim=-1)
            values, top_tokens = read_top(top.values, inputs.candidates[positions].gather(-1, top.indices))
            known.update(zip(needed, zip(values, top_tokens)))
            tree = best_first_tree(choices, budget, depth)
            if tree.tokens == paths:
                break  # a fixed point: the next passes would build the same tree
            trees.append(tree)
        return trees

    def refined_trees_on_device(
        self,
        inputs: PassInputs,
        root: int,
        first: tuple[torch.Tensor, torch.Tensor],
        chances: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        budget: int,
        passes: int,
    ) -> list[TreePaths]:
        """``refined_trees`` with the host reading once, at the end: ``first``'s (L, W) chances and tokens stay on
        the device, and every tree is built there (``best_first_on_device``). Each pass scores every node of the
        tree before, as a batch of fixed size, those an earlier pass scored too (their first scores are kept, as the
        host keeps them), and passes run through a fixed point: the trees after one repeat it and are left out."""
        probs, device = first[0], first[0].device
        depth, width = probs.shape[0], max(probs.shape[-1], min(budget, inputs.candidates.shape[-1]))
        marginals = [F.pad(part, (0, width - part.shape[-1])) for part in first]  # chance 0: never a node
        # Per node a pass scored: its path (tokens, then -1; -2 where not scored), its children's chances and tokens
        scored = [torch.empty((0, depth), dtype=torch.long, device=device), marginals[0][:0], marginals[1][:0]]

        def choices(paths: torch.Tensor, d: int) -> tuple[torch.Tensor, torch.Tensor]:
            at = [part[d].expand(len(paths), -1) for part in marginals]
            keys, values, tokens = scored
            if d == 0 or not len(keys):  # the root's children: no correction at position 0
                return at[0], at[1]
            same = (paths[:, None] == keys[None]).all(-1)  # (n, N)
            found = same.any(-1, keepdim=True)
            earliest = (same * torch.arange(len(keys), 0, -1, device=device)).argmax(-1)  # the first pass's scores
            return torch.where(found, values[earliest], at[0]), torch.where(found, tokens[earliest], at[1])

        trees = [best_first_on_device(choices, budget, depth, device)]
        for _ in range(passes if depth > 1 else 0):  # a block of 1 has no node with children to score
            tree = trees[-1]
            read = (tree.path_chances > 0) & (tree.depths < depth)  # the nodes whose children a pass scores
            positions = tree.depths.clamp(max=depth - 1)
            # Per node its path, then its last token again (not read), one position later than the head reads it
            filled = tree.paths.gather(1, torch.minimum(torch.arange(depth, device=device), positions[:, None] - 1))
            previous = torch.cat([torch.full_like(positions[:, None], root), filled[:, :-1]], dim=1)
            node_chances = chances(self.node_logits(inputs, previous, positions), positions)  # (N, C)
            top = node_chances.topk(min(budget, node_chances.shape[-1]), dim=-1)
            children = [top.values, inputs.candidates[positions].gather(-1, top.indices)]
            new = [torch.where(read[:, None], tree.paths, -2), *(F.pad(p, (0, width - p.shape[-1])) for p in children)]
            scored = [torch.cat(parts) for parts in zip(scored, new)]
            trees.append(best_first_on_device(choices, budget, depth, device))
        built = read_trees(trees)  # the round's one read
        kept = built[:1]
        for tree in built[1:]:
            if tree.tokens == kept[-1].tokens:
                break  # a fixed point: every tree after it is this one
            kept.append(tree)
        return kept


def reads_between_passes(device: torch.device) -> bool:
    """Whether refinement passes read what the pass before drafted to skip work (a fixed point, a tree's nodes
    already scored): on a CPU a read costs nothing; on a GPU it waits for the device, so passes run on there."""
    return device.type == "cpu"


def previous_tokens(roots: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """(..., L) the token one position earlier than each block position, what the head reads: the root (...,), then
    the block's tokens 1..L-1."""
    return torch.cat([roots[..., None], tokens[..., :-1]], dim=-1)
