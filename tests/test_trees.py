"""Draft trees against their oracles: every tree of a size enumerated, direct constructions of the trie and its mask,
HF `generate` for tree drafts, and what fewer drafts would have accepted."""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import replace

import pytest
import torch

from tests.oracles import NEW, PROMPTS, check_invariants, hf_greedy, plain_sampling, run
from xpress_core import engine as engine_module
from xpress_core.config import DecodeConfig
from xpress_core.controller import FixedControl
from xpress_core.drafters import base as drafter_base
from xpress_core.drafters.base import DraftRandomness, read_top
from xpress_core.drafters.diffusion_config import XpressDrafterConfig
from xpress_core.engine import stop_token_ids
from xpress_core.models import encode_prompt, load_models
from xpress_core.sampling import TargetNoise
from xpress_core.tree import best_first_paths, best_first_tree, build_tree, tree_attention_mask, tree_tensors


def random_drafts(rng: random.Random) -> tuple[int, list[list[int]]]:
    """A root and K drafts of L tokens over a 3-token vocabulary, so that drafts share prefixes often."""
    k, length = rng.randint(1, 8), rng.randint(1, 8)
    return rng.randrange(3), [[rng.randrange(3) for _ in range(length)] for _ in range(k)]


def prefixes(tree) -> list[tuple[int, ...]]:
    """Each node's draft tokens from the root down (the root's is empty): what identifies a node in a trie."""
    out: list[tuple[int, ...]] = []
    for node, parent in enumerate(tree.parents):
        out.append(() if parent == -1 else out[parent] + (tree.tokens[node],))
    return out


@pytest.mark.parametrize("seed", range(40))
def test_tree_mask_and_children_equal_a_direct_construction_on_random_tries(seed):
    rng = random.Random(seed)
    root, drafts = random_drafts(rng)
    tree = build_tree(root, drafts)
    paths = prefixes(tree)
    assert len(set(paths)) == len(paths) == tree.size + 1  # shared prefixes are one node
    # ... and the trie holds exactly the drafts' prefixes, each draft along its own path from the given root
    assert tree.tokens[0] == root
    assert set(paths) == {tuple(d[:i]) for d in drafts for i in range(len(d) + 1)}
    assert [paths[p[-1]] for p in tree.draft_paths] == [tuple(d) for d in drafts]
    causal = True  # every node sees exactly the nodes before it: the verify may leave the mask to causal attention
    for node, path in enumerate(paths):
        # node j is visible from node i iff j's tokens are a prefix of i's: j is i or one of its ancestors
        expected = {j for j, other in enumerate(paths) if path[: len(other)] == other}
        causal &= expected == set(range(node + 1))
        for past, dtype in ((0, torch.float32), (rng.randint(1, 9), torch.bfloat16)):
            tensors = tree_tensors(tree, past, "cpu")
            row = tree_attention_mask(tensors, dtype)[0, 0, node]
            want = torch.full((past + len(paths),), torch.finfo(dtype).min, dtype=dtype)
            want[:past] = 0
            want[[past + j for j in expected]] = 0
            assert torch.equal(row, want), (seed, node)
            assert tensors.positions[0, node] == past + len(path)
            # the ancestors a commit reads as the kept nodes: the root, then the node's path down to it
            kept = tensors.ancestors[: len(path) + 1, node].flip(0).tolist()
            assert kept == sorted(expected) and [paths[n] for n in kept] == [path[:i] for i in range(len(path) + 1)]
        kids = {tree.tokens[c]: c for c, parent in enumerate(tree.parents) if parent == node}
        assert dict(tree.children(node)) == kids
    assert tree.is_chain == causal
    assert build_tree(root, drafts[:1]).is_chain and build_tree(root, []).is_chain


@pytest.mark.parametrize("vocab", [4096, 151_936])
def test_a_cpus_top_k_reads_as_the_one_transfer_a_gpu_makes(vocab, monkeypatch):
    """``read_top`` on a CPU (each tensor read as it is) gives the one transfer's chances and ids, ints alike."""
    chances = torch.rand(8, vocab).softmax(-1)
    chances[0, :40] = chances[0, 40]  # ties
    top = chances.topk(32, dim=-1)
    mine = read_top(*top)
    monkeypatch.setattr(drafter_base, "one_transfer", lambda device: True)
    assert mine == read_top(*top)
    assert all(type(t) is int for row in mine[1] for t in row) and all(type(p) is float for row in mine[0] for p in row)


def tree_value(nodes, probs) -> float:
    """Expected accepted length of a tree of independent block positions: each node's path chances multiplied,
    summed over the nodes (a node is a tuple of candidate ranks, one per position down to it)."""
    return sum(math.prod(probs[j][r] for j, r in enumerate(node)) for node in nodes)


@pytest.mark.parametrize("seed", range(12))
def test_best_first_tree_is_the_best_tree_of_its_size(seed):
    """Against every tree of the same size (all ancestor-closed sets of nodes, enumerated): none expects more
    accepted tokens than ``best_first_paths``'s, which is a tree of distinct root-to-leaf paths of that size."""
    rng = random.Random(seed)
    length, width = 3, 2
    probs = []
    for _ in range(length):
        p = sorted((rng.random() for _ in range(width)), reverse=True)
        total = sum(p) + rng.random()
        probs.append([x / total for x in p])  # best first, summing to at most 1
    tokens = [[10 * j + r for r in range(width)] for j in range(length)]
    every_node = [n for d in range(1, length + 1) for n in itertools.product(range(width), repeat=d)]
    for budget in range(1, 7):
        tree = best_first_paths(probs, tokens, budget)
        paths = tree.tokens
        nodes = {p[:i] for p in paths for i in range(1, len(p) + 1)}
        assert len(nodes) == budget
        assert not any(a != b and b[: len(a)] == a for a in paths for b in paths)  # leaves only
        ranks = {tuple(tokens[j].index(t) for j, t in enumerate(n)) for n in nodes}
        assert tree.chances == tuple(tuple(probs[j][tokens[j].index(t)] for j, t in enumerate(p)) for p in paths)
        # The order is nested: the first b nodes of this tree are the tree of budget b.
        ordered = {p[: i + 1]: o for p, orders in zip(paths, tree.order) for i, o in enumerate(orders)}
        assert sorted(ordered.values()) == list(range(budget))
        for smaller in range(1, budget):
            first = {n for n, o in ordered.items() if o < smaller}
            assert first == {
                p[:i] for p in best_first_paths(probs, tokens, smaller).tokens for i in range(1, len(p) + 1)
            }
        trees = [s for s in itertools.combinations(every_node, budget) if all(n[:-1] in s or len(n) == 1 for n in s)]
        best = max(tree_value(t, probs) for t in trees)
        assert tree_value(ranks, probs) == pytest.approx(best, rel=1e-12)
    # A sure block is a chain; chance 0 candidates are never nodes.
    sure = best_first_paths([[1.0, 0.0]] * 3, [[1, 2]] * 3, 5)
    assert (sure.tokens, sure.chances, sure.order) == (((1, 1, 1),), ((1.0, 1.0, 1.0),), ((0, 1, 2),))


@pytest.mark.parametrize("seed", range(8))
def test_a_tree_whose_nodes_each_guess_their_children_is_the_best_of_its_size(seed):
    """``best_first_tree`` when each node has its own distribution over its children (a refined tree: the head
    reads the node's path), against every ancestor-closed set of nodes of the same size: none expects more
    accepted tokens (a node's value: its path's chances multiplied, each under its parent's distribution)."""
    rng = random.Random(seed)
    length, width = 3, 2
    every_node = [n for d in range(1, length + 1) for n in itertools.product(range(width), repeat=d)]
    law = {}  # per parent (a tuple of candidate ranks; () the root): its children's chances, best first
    for parent in [(), *every_node]:
        p = sorted((rng.random() for _ in range(width)), reverse=True)
        total = sum(p) + rng.random()
        law[parent] = [x / total for x in p]

    def token_path(ranks):  # a node's tokens: the rank at each depth, told apart by depth
        return tuple(10 * j + r for j, r in enumerate(ranks))

    def choices(path):
        ranks = tuple(t - 10 * j for j, t in enumerate(path))
        return law[ranks], [10 * len(path) + r for r in range(width)]

    def value(nodes):
        return sum(math.prod(law[n[:j]][n[j]] for j in range(len(n))) for n in nodes)

    for budget in range(1, 8):
        tree = best_first_tree(choices, budget, length)
        nodes = {tuple(t - 10 * j for j, t in enumerate(p[:i])) for p in tree.tokens for i in range(1, len(p) + 1)}
        assert len(nodes) == budget and all(token_path(n) in {p[: len(n)] for p in tree.tokens} for n in nodes)
        assert tree.chances == tuple(
            tuple(law[n[:j]][n[j]] for j in range(len(n)))
            for n in (tuple(t - 10 * j for j, t in enumerate(p)) for p in tree.tokens)
        )
        trees = [s for s in itertools.combinations(every_node, budget) if all(n[:-1] in s or len(n) == 1 for n in s)]
        assert value(nodes) == pytest.approx(max(value(t) for t in trees), rel=1e-12)


@pytest.mark.parametrize("k,t,length", [(1, 1, 4), (3, 1, 8), (2, 2, 6)])
def test_tree_drafts_hold_k_times_l_nodes_and_equal_generate(family, k, t, length):
    """Diversity "tree": one row refined over T steps, then a tree of K x L draft tokens from the last step's
    distributions; the output is the target's (greedy, both verifiers)."""
    models, prompts, refs = family
    banned = set(models.tokenizer.all_special_ids) - stop_token_ids(models)
    for verify in ("tree", "batch"):
        cfg = DecodeConfig(drafts=k, steps=t, block=length, diversity="tree", verify=verify, max_new_tokens=NEW)
        for prompt_ids, ref in zip(prompts, refs):
            traces, result = run(models, prompt_ids, cfg)
            assert list(result.token_ids) == ref
            check_invariants(traces, prompt_ids.shape[1], result)
            for trace in traces[1:]:
                nodes = {d[:i] for d in trace.drafts for i in range(1, len(d) + 1)}
                assert len(nodes) == k * length  # the vocabulary holds enough candidates for every budget here
                assert max(len(d) for d in trace.drafts) <= length
                assert not banned & {tok for d in trace.drafts for tok in d}
                assert len(trace.steps) == t and trace.steps[-1].tokens == trace.drafts
                assert all(len(step.tokens) == 1 for step in trace.steps[:-1])  # earlier steps refine one row
                if t > 1:  # a position committed before the last step holds its token in every path
                    held = {j: tok for j, tok in enumerate(trace.steps[-2].tokens[0]) if tok >= 0}
                    assert held and all(d[j] == tok for d in trace.drafts for j, tok in held.items() if j < len(d))


def test_a_greedy_tree_reads_the_sharpened_distribution_and_a_sampled_one_the_coupled_scores(zoo):
    """Greedy: the tree of softmax(sharpness x allowed logits) (the oracle: ``best_first_paths`` on that distribution's
    top tokens, itself checked against every tree by enumeration); a sharper distribution gives another tree here.
    Sampling: the coupled scores as they are, whatever the sharpness."""
    drafter = load_models(zoo["llama"], zoo["drafter_llama"], device="cpu").drafter
    assert drafter.tree_sharpness == 1.0  # a config without the field: the drafter's distribution as it is
    assert load_models(device="cpu").drafter.tree_sharpness == 1.5  # the shipped config's (``train sharpness``)
    for bad in (0.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="tree_sharpness"):
            XpressDrafterConfig(tree_sharpness=bad)
    vocab, length = drafter.banned.shape[0], 4
    tokens, committed = torch.full((length,), -1), torch.zeros(length, dtype=torch.bool)
    greedy, sampled = DecodeConfig(drafts=3, block=length), DecodeConfig(drafts=3, block=length, temperature=0.8)
    trees = {}
    for seed in range(4):
        logits = torch.randn(length, vocab, generator=torch.Generator().manual_seed(seed)) * 2
        upcoming = TargetNoise(torch.Generator().manual_seed(seed), vocab).upcoming(length)
        for sharpness in (1.0, 1.5, 3.0):
            drafter.tree_sharpness = sharpness
            got = drafter.tree_drafts(logits, tokens, committed, greedy, DraftRandomness(None), [], False)
            top = (sharpness * (logits + drafter.banned)).softmax(-1).topk(3 * length, -1)
            assert got.tokens == best_first_paths(top.values.tolist(), top.indices.tolist(), 3 * length).tokens
            trees[seed, sharpness] = got.tokens
            drawn = drafter.tree_drafts(logits, tokens, committed, sampled, DraftRandomness(None, upcoming), [], False)
            trees[seed, sharpness, "sampled"] = drawn.tokens
        assert trees[seed, 1.0, "sampled"] == trees[seed, 1.5, "sampled"] == trees[seed, 3.0, "sampled"]
    assert any(trees[seed, 1.0] != trees[seed, 3.0] for seed in range(4))


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.7, 20, 0.9)])
def test_tree_drafts_sample_the_targets_tokens_with_the_same_seed(zoo, temperature, top_k, top_p):
    models = load_models(zoo["llama"], zoo["drafter_llama"], device="cpu")
    prompt_ids = encode_prompt(models.tokenizer, PROMPTS[1], chat=True)
    for seed in (0, 1):
        cfg = DecodeConfig(
            temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, max_new_tokens=NEW, drafts=3, block=4
        )
        ref = plain_sampling(models, prompt_ids, cfg, NEW)
        for verify, steps in (("tree", 1), ("batch", 2)):
            _, result = run(models, prompt_ids, replace(cfg, diversity="tree", verify=verify, steps=steps))
            assert list(result.token_ids) == ref


@pytest.mark.parametrize("diversity", ["branch-first", "branch-uncertain"])
@pytest.mark.parametrize("steps", [1, 2, 3])
def test_one_branched_draft_is_the_first_of_k_branched_drafts(embedded, diversity, steps):
    """K = 1 drafts the first row of any K (what ``accepted_with_fewer`` counts fewer drafts by), at every T: the
    embedded drafter on several round starts of a reply."""
    models = embedded
    prompt_ids = encode_prompt(models.tokenizer, "Write a short story about a lost cat.", chat=True)
    reply = hf_greedy(models, prompt_ids, 24)
    for cut in (0, 8, 16):
        ids = torch.cat([prompt_ids, torch.tensor([reply[:cut]], dtype=prompt_ids.dtype)], dim=1)
        firsts = []
        for k in (1, 4):
            cfg = DecodeConfig(drafts=k, steps=steps, block=6, diversity=diversity)
            state, _ = engine_module.prefill(models, ids, cfg)
            setting = engine_module.FixedControl(cfg).setting
            firsts.append(engine_module.draft(models, state, cfg, setting, False).tokens[0])
        assert firsts[0] == firsts[1], (cut, firsts)


@pytest.mark.parametrize("diversity,steps", [("tree", 1), ("tree", 2), ("branch-first", 1), ("branch-first", 2)])
def test_a_round_tells_what_fewer_drafts_would_have_accepted(embedded, monkeypatch, diversity, steps):
    """What the controller learns fewer drafts from (``accepted_with_fewer``) against the oracle: the same first
    round drafted with k drafts (the drafter's state is the same, so is each smaller tree or set of drafts).
    The embedded pair: its trained drafter gets tokens accepted, so the counts are not all zero."""
    seen = []

    class Recording(FixedControl):
        counts_fewer = True

        def observe(self, setting, accepted, with_fewer=()):
            seen.append((accepted, with_fewer))

    monkeypatch.setattr(engine_module, "FixedControl", Recording)
    models = embedded
    counts = []
    for text in ("I need a hotel in the centre for two nights.", "Write a short story about a lost cat."):
        prompt_ids = encode_prompt(models.tokenizer, text, chat=True)
        first = []
        for k in (4, 1, 2, 3):
            seen.clear()
            cfg = DecodeConfig(drafts=k, steps=steps, block=6, diversity=diversity, max_new_tokens=8)
            run(models, prompt_ids, cfg)
            first.append(seen[0])
        (accepted, fewer), others = first[0], first[1:]
        if diversity == "tree" and steps > 1:  # refined along its paths: a smaller tree is not its first nodes
            assert fewer == ()
            continue
        assert len(fewer) == 4 and fewer[-1] == accepted
        assert list(fewer[:3]) == [accepted_k for accepted_k, _ in others]
        counts += fewer
    assert any(counts) or (diversity == "tree" and steps > 1)
