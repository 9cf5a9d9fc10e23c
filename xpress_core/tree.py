"""Stage 2 and 4 of a round: merge the K drafts into a trie, and walk it with the target's draws (exact acceptance);
and the shape of a tree drawn from a block's per-position distributions (``best_first_paths``, diversity "tree").

Node 0 is the root (the last committed token, not yet in the target cache); nodes 1..N are draft tokens, parents
before children, so ``[root] + nodes`` is a valid input order for one target forward.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from types import MappingProxyType

import torch

from .config import DecodeConfig
from .head import HeadRows, every_row
from .sampling import TargetNoise, draw_token, noisy_logits


@dataclass(frozen=True)
class DraftTree:
    tokens: tuple[int, ...]  # token of each node; tokens[0] is the root
    parents: tuple[int, ...]  # parent node index; parents[0] = -1
    depths: tuple[int, ...]  # root depth 0
    draft_paths: tuple[tuple[int, ...], ...]  # per draft: node indices of its tokens, in order

    @property
    def size(self) -> int:
        """Draft nodes, root excluded."""
        return len(self.tokens) - 1

    @cached_property
    def is_chain(self) -> bool:
        """Each node the child of the one before (one draft, or none): the tree is a plain sequence. Once per tree: a
        verify asks twice."""
        return all(parent == node - 1 for node, parent in enumerate(self.parents[1:], start=1))

    def children(self, node: int) -> Mapping[int, int]:
        """Child token -> child node."""
        return self.child_map[node]

    @cached_property
    def child_map(self) -> tuple[Mapping[int, int], ...]:
        """Per node, child token -> child node (read-only); built once per tree, since the acceptance walk asks at
        every step. A cached_property stores into the instance's __dict__, which a frozen dataclass allows."""
        kids: list[dict[int, int]] = [{} for _ in self.tokens]
        for node in range(1, len(self.tokens)):
            kids[self.parents[node]][self.tokens[node]] = node
        return tuple(MappingProxyType(k) for k in kids)

    @cached_property
    def ancestors(self) -> tuple[tuple[int, ...], ...]:
        """(depth + 1) rows of N+1: row d holds each node's ancestor d levels up (row 0 the node itself); the root is
        its own parent, so a walk that reaches it stays there."""
        parent = [max(p, 0) for p in self.parents]
        rows = [tuple(range(len(self.tokens)))]
        for _ in range(max(self.depths)):
            rows.append(tuple(parent[n] for n in rows[-1]))
        return tuple(rows)


def build_tree(root: int, drafts: list[list[int]]) -> DraftTree:
    """Merge drafts into a trie: shared prefixes become one node."""
    tokens, parents, depths = [root], [-1], [0]
    index: dict[tuple[int, int], int] = {}  # (parent, token) -> node
    paths = []
    for draft in drafts:
        node, path = 0, []
        for token in draft:
            key = (node, int(token))
            if key not in index:
                index[key] = len(tokens)
                tokens.append(int(token))
                parents.append(node)
                depths.append(depths[node] + 1)
            node = index[key]
            path.append(node)
        paths.append(tuple(path))
    return DraftTree(tuple(tokens), tuple(parents), tuple(depths), tuple(paths))


@dataclass(frozen=True)
class TreePaths:
    """A draft tree as its root-to-leaf paths, depth first (best branch first)."""

    tokens: tuple[tuple[int, ...], ...]  # per path, its tokens
    chances: tuple[tuple[float, ...], ...]  # per path, each node's own chance at its position
    order: tuple[tuple[int, ...], ...]  # per path, each node's place in the best-first order (0 = the first chosen)


# Per node, the chances of its children's tokens, best first, and the tokens: read by the node's path (its tokens from
# the root's child down; () for the root's children).
Choices = Callable[[tuple[int, ...]], tuple[Sequence[float], Sequence[int]]]


def best_first_paths(probs: list[list[float]], tokens: list[list[int]], budget: int) -> TreePaths:
    """The draft tree of at most ``budget`` nodes that accepts the most tokens on average when each block position
    is an independent guess: position j holds ``tokens[j]`` with chances ``probs[j]`` (each list best first).

    A node's chance of being reached and accepted is the product of its path's chances, and the tree's expected
    accepted length is the sum of these over its nodes. Every node's product is at most its parent's, so the
    ``budget`` largest products form a tree (ancestors come first) and no other tree of that size sums to more:
    best-first expansion finds them (``best_first_tree``). Where one position is unsure, the tree spends nodes on its
    alternatives; where the block is sure, on depth (a chain)."""
    if not probs:
        return TreePaths((), (), ())
    return best_first_tree(lambda path: (probs[len(path)], tokens[len(path)]), budget, len(probs))


def best_first_tree(choices: Choices, budget: int, depth: int) -> TreePaths:
    """The tree of at most ``budget`` nodes, at most ``depth`` deep, whose nodes have the largest path chances when
    each node's children are guessed with the chances ``choices`` gives for its own path (a refined tree reads each
    node's path through the refiner; ``best_first_paths`` the same distribution at every node of a depth).

    A heap of frontier nodes: each node added offers its first child and its next sibling. Nodes with chance 0 are
    never added. The order is nested: the tree of a smaller budget is the first nodes of this one's, so one round
    tells what any smaller tree would have accepted."""
    if budget < 1 or depth < 1:
        return TreePaths((), (), ())
    paths: list[tuple[int, ...]] = []  # per node: its tokens from the root's child down
    chances: list[float] = []  # per node: its own chance given its parent's path
    parents: list[int] = []  # per node: parent node (-1 = the root)
    ranks: list[int] = []  # per node: its token's rank among its parent's choices
    push, pop = heapq.heappush, heapq.heappop
    # (-path chance, depth, parent node, rank, parent's path chance, the parent's choices); (parent, rank) is unique,
    # so ties never compare further.
    first = choices(())
    frontier = [(-first[0][0], 0, -1, 0, 1.0, first)]
    while frontier and len(paths) < budget:
        negative, position, parent, rank, above, (probs, tokens) = pop(frontier)
        if negative == 0.0:
            break  # every node left has chance 0
        node = len(paths)
        paths.append((paths[parent] if parent >= 0 else ()) + (tokens[rank],))
        chances.append(probs[rank])
        parents.append(parent)
        ranks.append(rank)
        if rank + 1 < len(probs):  # the next sibling
            push(frontier, (-above * probs[rank + 1], position, parent, rank + 1, above, (probs, tokens)))
        if position + 1 < depth:  # the first child
            below = choices(paths[node])
            push(frontier, (negative * below[0][0], position + 1, node, 0, -negative, below))
    return tree_paths(paths, chances, parents, ranks)


def tree_paths(paths: list, chances: list, parents: list, ranks: list) -> TreePaths:
    """A tree's root-to-leaf paths from its nodes in best-first order (per node: its tokens from the root's child
    down, its own chance, its parent node, -1 the root, and its token's rank among its parent's choices)."""
    # Per node, along its path from the root's child: the nodes, their ranks and their chances, each a tuple built on
    # its parent's (parents come first): a leaf's are then read, not walked up to the root (a (4, 1, 8) tree's 21
    # leaves: 24 us against 14, one thread).
    nodes, orders, own = [], [], []
    for node, parent in enumerate(parents):
        top = parent < 0  # a child of the root
        nodes.append((node,) if top else nodes[parent] + (node,))
        orders.append((ranks[node],) if top else orders[parent] + (ranks[node],))
        own.append((chances[node],) if top else own[parent] + (chances[node],))
    has_child = set(parents)
    # Depth first, each node's better choices first.
    leaves = sorted((n for n in range(len(paths)) if n not in has_child), key=orders.__getitem__)
    return TreePaths(tuple(paths[n] for n in leaves), tuple(own[n] for n in leaves), tuple(nodes[n] for n in leaves))


@dataclass(frozen=True)
class DeviceTree:
    """``best_first_tree``'s nodes, best first, on the device (``best_first_on_device``): what a next refinement
    pass scores without the host reading it. Nodes past the tree's own (path chance 0) fill up a fixed count."""

    tokens: torch.Tensor  # (N,) each node's token
    chances: torch.Tensor  # (N,) fp32, its own chance given its parent's path
    path_chances: torch.Tensor  # (N,) fp64, the product of its path's chances, as the host's heap multiplies them
    parents: torch.Tensor  # (N,) its parent's place in the order, -1 the root
    ranks: torch.Tensor  # (N,) its token's rank among its parent's choices
    depths: torch.Tensor  # (N,) 1 for the root's children
    paths: torch.Tensor  # (N, depth) its tokens from the root's child down, then -1


# Per depth d (0 = the root's children), the chances (n, W) of the children of the (n,) nodes at depth d whose paths
# (n, depth) are given (tokens, then -1), best first, and their tokens (n, W): on the device.
DeviceChoices = Callable[[torch.Tensor, int], tuple[torch.Tensor, torch.Tensor]]


def best_first_on_device(choices: DeviceChoices, budget: int, depth: int, device) -> DeviceTree:
    """``best_first_tree`` with nothing read by the host: the same nodes in the same order.

    The heap pops nodes in the order of (-path chance, depth, parent's place, rank) (a node's children and next
    sibling come after it), and the tree is the first ``budget`` nodes with a chance above 0. A node among them has
    fewer than ``budget`` nodes of its depth before it, and its parent is among them: so level by level, the best
    ``budget`` children of the level above (a stable sort over parents x ranks, by path chance) hold every node of
    the tree, and a stable sort of the levels' nodes by path chance, shallower first among equals, gives its order.
    Path chances in fp64, multiplied root first: the host's products of the same fp32 chances, bit for bit."""
    chance = torch.ones(1, dtype=torch.float64, device=device)  # the root's
    paths = torch.full((1, depth), -1, dtype=torch.long, device=device)
    levels = []  # per depth, its nodes
    for d in range(depth):
        probs, tokens = choices(paths, d)  # (n, W): per parent its children, parent-major as the sort breaks ties
        width = probs.shape[-1]
        every = (chance[:, None] * probs.double()).flatten()
        kept = every.sort(descending=True, stable=True).indices[: min(budget, every.numel())]
        chance, parent, token = every[kept], kept // width, tokens.flatten()[kept]
        paths = paths.index_select(0, parent)
        paths[:, d] = token
        # The parent as an index among all levels' nodes (the root: -1, through ``place``'s last entry)
        above = parent + sum(len(level[0]) for level in levels[:-1]) if d else torch.full_like(parent, -1)
        levels.append((chance, probs.flatten()[kept], token, above, kept % width, torch.full_like(kept, d + 1), paths))
    chances, own, tokens, parents, ranks, depths, paths = (torch.cat(parts) for parts in zip(*levels))
    order = chances.sort(descending=True, stable=True).indices[:budget]  # stable: shallower first among equals
    place = torch.full((len(chances) + 1,), -1, dtype=torch.long, device=device)  # a node's place in the order
    place[order] = torch.arange(len(order), device=device)
    return DeviceTree(
        tokens[order], own[order], chances[order], place[parents[order]], ranks[order], depths[order], paths[order]
    )


def read_trees(trees: list[DeviceTree]) -> list[TreePaths]:
    """Device-built trees as ``TreePaths``, in one transfer from the device (the ids exact in fp64), the nodes of
    path chance 0 left out (the last ones: best first)."""
    fields = [
        [t.tokens.double(), t.chances.double(), t.path_chances, t.parents.double(), t.ranks.double()] for t in trees
    ]
    read = []
    for tokens, chances, path_chances, parents, ranks in torch.stack([torch.stack(f) for f in fields]).tolist():
        size = sum(chance != 0.0 for chance in path_chances)
        parents, paths = [int(p) for p in parents[:size]], []
        for token, parent in zip(tokens, parents):
            paths.append((paths[parent] if parent >= 0 else ()) + (int(token),))
        read.append(tree_paths(paths, chances[:size], parents, [int(r) for r in ranks[:size]]))
    return read


def to_device(rows, device) -> torch.Tensor:
    """Python ints (a list, or rows of equal length) as one long tensor on ``device``, in one copy that does not wait
    for the device (from pinned memory on CUDA): the host goes on queueing work while it travels."""
    host = torch.tensor(rows, dtype=torch.long, pin_memory=torch.device(device).type == "cuda")
    return host.to(device, non_blocking=True)


@dataclass(frozen=True)
class TreeTensors:
    """What a verify forward reads of a tree, on the device, sent in one copy (``tree_tensors``)."""

    ids: torch.Tensor  # (1, N+1) the nodes' tokens
    positions: torch.Tensor  # (1, N+1) past + depth
    ancestors: torch.Tensor  # (depth+1, N+1) ``DraftTree.ancestors``: the mask, and the kept nodes of a commit
    past: int  # target cache length before the forward

    @property
    def depths(self) -> torch.Tensor:
        return self.positions[0] - self.past


def tree_tensors(tree: DraftTree, past: int, device) -> TreeTensors:
    """The tree's tokens, positions and ancestors packed into one host tensor and sent to the device in one copy."""
    packed = to_device([tree.tokens, [past + d for d in tree.depths], *tree.ancestors], device)
    return TreeTensors(packed[0:1], packed[1:2], packed[2:], past)


def tree_attention_mask(tensors: TreeTensors, dtype: torch.dtype) -> torch.Tensor:
    """(1, 1, N+1, past+N+1) additive float mask: every node sees the whole cache, its ancestors and itself.

    A float mask (0 / finfo.min) rather than bool: bool masks are silently misread by some eager attention paths.
    """
    ancestors, past = tensors.ancestors, tensors.past  # column i lists node i, its parent, ..., the root
    n = ancestors.shape[1]
    mask = torch.full((n, past + n), torch.finfo(dtype).min, dtype=dtype, device=ancestors.device)
    mask[:, :past] = 0
    # Row i opened at its ancestors' columns straight from the ancestors' table (the root repeats: written twice),
    # where a boolean matrix of them and a fill cost four more small ops a round.
    mask[:, past:].scatter_(1, ancestors.T, 0)
    return mask[None, None]


def windowed_mask(mask: torch.Tensor, tensors: TreeTensors, window: int) -> torch.Tensor:
    """``tree_attention_mask`` for a sliding-window layer: also hidden, every key ``window`` or more positions before
    the node (positions: the cache's by slot, a node's ``past + depth``), as HF's sliding mask hides them."""
    positions = tensors.positions[0]
    query = positions[:, None]  # (N+1, 1)
    key = torch.cat([torch.arange(tensors.past, device=positions.device), positions])[None]  # (1, past+N+1)
    return mask.masked_fill((query - key >= window)[None, None], torch.finfo(mask.dtype).min)


@dataclass(frozen=True)
class Acceptance:
    path: tuple[int, ...]  # accepted draft nodes, root excluded
    bonus: int  # the token the target drew after the last accepted node
    draft_accept_lens: tuple[int, ...]  # per draft: how many of its tokens lie on the accepted path


def target_draws(
    node_logits: torch.Tensor, cfg: DecodeConfig, noise: TargetNoise, depths: torch.Tensor | None, deepest: int
) -> torch.Tensor:
    """(N+1,) on the device: the token the target draws after each node, every node at once. Greedy: the argmax.
    Sampled: the Gumbel-max draw with the noise of the emitted token the node's depth makes it (a walk reaches a node
    at depth d as the round's d-th draw: docs/DESIGN.md §2.5), read ahead and left for the walk to use
    (``TargetNoise.use``). ``depths``: (N+1,) on the device, at most ``deepest``."""
    if cfg.greedy:
        return node_logits.argmax(-1)
    per_depth = noise.upcoming(deepest + 1)  # (deepest + 1, V)
    return noisy_logits(node_logits, cfg, per_depth.index_select(0, depths)).argmax(-1)


def draws_at_once(device: torch.device) -> bool:
    """Whether the acceptance computes every node's draw at once and reads them in one transfer (a GPU: one wait a
    round), or draws node by node along the walk (a CPU: a read costs nothing there, and every node's draw costs
    (N+1) / (accepted + 1) times the work: greedy, the embedded target's 4,096 logits, one thread, 33 nodes at once
    took 136 us against 51-83 us walking four, on a loaded machine)."""
    return device.type != "cpu"


def accept(
    tree: DraftTree,
    node_logits: torch.Tensor | HeadRows,
    cfg: DecodeConfig,
    noise: TargetNoise,
    depths: torch.Tensor | None = None,
) -> Acceptance:
    """The exact acceptance walk (docs/DESIGN.md §2.4) over (N+1, V) logits (or ``HeadRows``, computed as the walk
    reads them), one target draw per emitted token.

    At node u draw y ~ p_u; if y is a child of u accept it and move there, else emit y and stop. Each emitted token is
    a genuine draw from the target given the emitted prefix, so the output distribution is the target's. On a GPU
    every node's draw is computed at once and read in one transfer (``target_draws``), and the walk uses up the noise
    of the tokens it emits only: the same draws. ``depths``: the nodes' depths on the device (sampling).
    """
    at_once = draws_at_once(node_logits.device)
    if at_once:
        if depths is None and not cfg.greedy:
            depths = to_device(list(tree.depths), node_logits.device)
        draws = target_draws(every_row(node_logits), cfg, noise, depths, max(tree.depths)).tolist()  # one read
    node, path = 0, []
    while True:
        y = draws[node] if at_once else draw_token(node_logits[node], cfg, noise)
        child = tree.children(node).get(y)
        if child is None:
            break
        path.append(child)
        node = child
    if at_once and not cfg.greedy:
        noise.use(len(path) + 1)
    accepted = set(path)
    lens = tuple(next((i for i, n in enumerate(p) if n not in accepted), len(p)) for p in tree.draft_paths)
    return Acceptance(tuple(path), y, lens)


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """The length of the longest common prefix of two token sequences (how far a reply continues a draft path)."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
