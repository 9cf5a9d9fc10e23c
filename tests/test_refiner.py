"""The refiner head and its refinement passes (drafters/refiner.py, train/refiner.py) against their oracles: HF
``generate`` and plain sampling for the output, a scripted perfect head for the passes' meaning, a hand computation
for the training loss."""

from __future__ import annotations

import math

import pytest
import torch

from tests.oracles import NEW, PROMPTS, check_invariants, hf_greedy, plain_sampling, run
from xpress_core.config import DecodeConfig
from xpress_core.controller import CostModel, RoundSetting
from xpress_core.costs import fit_draft_costs, round_draft_work
from xpress_core.counting import AutoControl
from xpress_core.drafters import diffusion
from xpress_core.drafters.base import DraftRandomness
from xpress_core.drafters.diffusion_model import XpressDrafter
from xpress_core.engine import decode
from xpress_core.models import encode_prompt, load_models
from xpress_core.sampling import gumbel
from xpress_core.train.drafter import DrafterBatch, read_target
from xpress_core.train.refiner import RefinerRecipe, attach_refiner, pass_gains, refiner_loss

RANK = 16


def with_head(drafter_dir, out, seed: int = 7, scale: float = 1.0):
    """The zoo's drafter with a refiner head of random weights (its projection back scaled by ``scale``; 0 = the
    head a new drafter starts with), saved like a trained one."""
    drafter = attach_refiner(XpressDrafter.from_pretrained(drafter_dir), RANK)
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in drafter.refiner.named_parameters():
            p.copy_(torch.randn_like(p) * (0.3 if name != "out.weight" else scale))
    drafter.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def refining(zoo, tmp_path_factory):
    models = load_models(zoo["llama"], with_head(zoo["drafter_llama"], tmp_path_factory.mktemp("head")), device="cpu")
    prompts = [encode_prompt(models.tokenizer, p, chat=True) for p in PROMPTS]
    return models, prompts, [hf_greedy(models, p) for p in prompts]


def test_a_head_makes_steps_refinement_passes_and_a_checkpoint_without_one_drafts_as_before(zoo, refining):
    models, _, _ = refining
    assert models.drafter.step_kind == "pass" and models.drafter.auto_steps == (1, 2, 3)
    assert models.drafter.refine_passes(RoundSetting(4, 3, 8)) == 2
    assert models.drafter.draft_work(RoundSetting(4, 3, 8)) == (1, 9)  # one forward, one row, whatever T and K
    plain = load_models(zoo["llama"], zoo["drafter_llama"], device="cpu").drafter
    assert (
        plain.model.refiner is None and plain.step_kind == "denoise" and plain.refine_passes(RoundSetting(1, 3, 8)) == 0
    )


@pytest.mark.parametrize("refine", ["parallel", "serial"])
@pytest.mark.parametrize("diversity", ["tree", "none", "branch-first", "branch-uncertain"])
@pytest.mark.parametrize("k,t,length", [(1, 2, 4), (1, 4, 4), (3, 3, 8), (3, 8, 8)])
def test_greedy_equals_generate_for_every_number_of_passes(refining, diversity, k, t, length, refine):
    models, prompts, refs = refining
    cfg = DecodeConfig(drafts=k, steps=t, block=length, diversity=diversity, refine=refine, max_new_tokens=NEW)
    for prompt_ids, ref in zip(prompts, refs):
        traces, result = run(models, prompt_ids, cfg)
        assert list(result.token_ids) == ref
        check_invariants(traces, prompt_ids.shape[1], result)
        assert all(1 <= len(r.steps) <= cfg.steps + (diversity == "tree" and t > 1) for r in traces[1:])


@pytest.mark.parametrize("diversity", ["tree", "gumbel", "branch-first"])
@pytest.mark.parametrize("temperature,seed", [(0.8, 0), (1.2, 3)])
def test_sampled_passes_give_plain_samplings_tokens_with_the_same_seed(refining, diversity, temperature, seed):
    models, prompts, _ = refining
    cfg = DecodeConfig(
        temperature=temperature, seed=seed, drafts=3, steps=3, block=4, diversity=diversity, max_new_tokens=NEW
    )
    ref = plain_sampling(models, prompts[1], cfg, NEW)
    _, result = run(models, prompts[1], cfg)
    assert list(result.token_ids) == ref


def scripted_perfect_head(models, full: list[int], monkeypatch):
    """A drafter and head that know the target's greedy continuation ``full`` (prompt + output). The drafter's first
    block position is right (the head never corrects it: it reads only the root); at each later position whose
    earlier tokens (as the pass reads them) are the continuation's, the head puts all its weight on the next true
    token, elsewhere it leaves the drafter's logits. A causal head that is always right where it can be."""
    drafter, model = models.drafter, models.drafter.model
    seen = {}
    draft, raw_logits = drafter.draft, model.raw_logits

    def remembering(state, *args):
        seen["root"] = state.committed  # the root's index in ``full``
        return draft(state, *args)

    def first_right(hidden):
        logits = raw_logits(hidden).clone()
        if seen["root"] + 1 < len(full):
            logits[..., 0, :] = -1e4
            logits[..., 0, full[seen["root"] + 1]] = 1e4
        return logits

    def pass_logits(inputs, previous, first):
        logits = model.processed(inputs.raw).expand(previous.shape[0], -1, -1).clone()
        start = seen["root"]
        for row in range(previous.shape[0]):
            for j in range(1, previous.shape[1]):
                if start + j + 1 < len(full) and previous[row, : j + 1].tolist() == full[start : start + j + 1]:
                    logits[row, j] = -1e4
                    logits[row, j, inputs.candidates[j] == full[start + j + 1]] = 1e4
        return logits[:, first:]

    # Every token a candidate of every pass: the head can pick the true one wherever the drafter ranks it.
    monkeypatch.setattr(diffusion, "PASS_CANDIDATES", model.config.vocab_size)
    monkeypatch.setattr(drafter, "draft", remembering)
    monkeypatch.setattr(model, "raw_logits", first_right)
    monkeypatch.setattr(drafter.passes, "logits", pass_logits)


@pytest.mark.parametrize("t", [1, 2, 3, 5])
def test_a_head_that_is_always_right_settles_one_more_position_each_pass(refining, monkeypatch, t):
    """After p passes the first p + 1 positions are the target's (the first the drafter's own): every round that the
    reply's end does not cut accepts at least T draft tokens, and the output stays the target's."""
    models, prompts, refs = refining
    length = 6
    for prompt_ids, ref in zip(prompts, refs):
        scripted_perfect_head(models, prompt_ids[0].tolist() + ref, monkeypatch)
        cfg = DecodeConfig(drafts=1, steps=t, block=length, diversity="none", max_new_tokens=NEW)
        _, result = run(models, prompt_ids, cfg)
        assert list(result.token_ids) == ref
        full_rounds = result.accept_lens[:-1]  # the last round may be cut by the reply's end
        assert full_rounds and min(full_rounds) >= t


def test_passes_at_a_fixed_point_change_nothing(zoo, tmp_path, monkeypatch):
    """A head that corrects nothing (its projection back at zero, as a new head starts): every T drafts what T = 1
    drafts, and the passes stop at the first one that changes no token (a tree: that builds the same tree; every
    token a candidate, so that a node's chances are the marginals')."""
    monkeypatch.setattr(diffusion, "PASS_CANDIDATES", 10**6)
    models = load_models(zoo["llama"], with_head(zoo["drafter_llama"], tmp_path / "zero", scale=0.0), device="cpu")
    prompt_ids = encode_prompt(models.tokenizer, PROMPTS[0], chat=True)
    for diversity in ("none", "branch-first", "tree"):
        one = run(models, prompt_ids, DecodeConfig(drafts=3, steps=1, block=8, diversity=diversity))[0]
        many = run(models, prompt_ids, DecodeConfig(drafts=3, steps=6, block=8, diversity=diversity))[0]
        assert [t.drafts for t in one] == [t.drafts for t in many]
        assert [t.tree_parents for t in one] == [t.tree_parents for t in many]
        if diversity == "tree":  # pass 0's tree, and no second: the first pass built it again
            assert {len(t.steps) for t in many[1:]} == {1} and all(t.steps[0].kind == "tree" for t in many[1:])
            continue
        assert {len(t.steps) for t in many[1:]} == {2}  # pass 0 and the one pass that found nothing to change
        assert all(t.steps[0].tokens == t.steps[1].tokens for t in many[1:])


@pytest.mark.parametrize("passes", [1, 2])
def test_a_refined_tree_scores_each_node_given_its_own_path(refining, monkeypatch, passes):
    """The oracle: the head's slow path (``refined_logits``: the hidden states corrected, every token) on each path
    as a row. Pass 0's tree is the T = 1 tree; in the refined tree a node whose parent a pass read (a node of a tree
    before) has its token's chance under the head given its own path, the others the marginal's; and the tree is best
    first on those chances (``best_first_tree``)."""
    from xpress_core.tree import best_first_tree

    monkeypatch.setattr(diffusion, "PASS_CANDIDATES", 10**6)
    models, prompts, _ = refining
    drafter, model = models.drafter, models.drafter.model
    # The zoo's drafter is near uniform: sharpened, its trees go deep enough for the head's corrections to matter.
    monkeypatch.setattr(drafter, "tree_sharpness", 8.0)
    randomness = DraftRandomness(torch.Generator().manual_seed(0))
    refined_somewhere = False
    for prompt_ids, root in [(prompts[0], 5), (prompts[1], 17), (prompts[1], 40)]:
        state = drafter.start(prompt_ids, *first_features(models, prompt_ids))
        one = drafter.draft(state, root, DecodeConfig(drafts=3, steps=1, block=8), randomness, watch=False)
        drafts = drafter.draft(state, root, DecodeConfig(drafts=3, steps=1 + passes, block=8), randomness, watch=True)
        trees = [step.tokens for step in drafts.steps]
        assert trees[0] == one.tokens and trees[-1] == drafts.tokens and len(trees) <= 1 + passes
        hidden = drafter.block_hidden(state, model.embed_block(*masked(root, 8)))
        sharp = drafter.tree_sharpness
        marginal = (sharp * (model.head_logits(hidden)[0] + drafter.banned)).softmax(-1)
        read = {path[:j] for tree in trees[:-1] for path in tree for j in range(1, len(path) + 1)}

        def chances(path, hidden=hidden, marginal=marginal, read=read, root=root, sharp=sharp):
            if path not in read:
                return marginal[len(path)]
            row = torch.tensor([[root, *path, *[path[-1]] * (7 - len(path))]])
            return (sharp * (model.refined_logits(hidden, row)[0, len(path)] + drafter.banned)).softmax(-1)

        for path, got in zip(drafts.tokens, drafts.steps[-1].confidence):
            assert got == pytest.approx([float(chances(path[:j])[path[j]]) for j in range(len(path))], abs=1e-4)

        def best(path, chances=chances):
            top = chances(path).topk(24)
            return top.values.tolist(), top.indices.tolist()

        assert best_first_tree(best, 24, 8).tokens == drafts.tokens
        refined_somewhere |= drafts.tokens != one.tokens
    assert refined_somewhere


def test_parallel_and_serial_passes_make_the_same_drafts(refining):
    models, prompts, _ = refining
    for diversity in ("branch-first", "gumbel"):
        cfg = DecodeConfig(drafts=3, steps=4, block=8, diversity=diversity, temperature=0.8, seed=2)
        parallel, _ = run(models, prompts[0], cfg)
        serial, _ = run(models, prompts[0], DecodeConfig(**{**cfg.__dict__, "refine": "serial"}))
        assert [t.drafts for t in parallel] == [t.drafts for t in serial]


def test_passes_run_through_on_a_gpu_make_the_drafts_of_passes_stopped_at_a_fixed_point(refining, monkeypatch):
    """A GPU runs every pass rather than read whether the one before changed a token (``reads_between_passes``):
    the same drafts, greedy and sampled, as a CPU's passes that stop at a fixed point."""
    models, prompts, _ = refining
    for cfg in (
        DecodeConfig(drafts=3, steps=5, block=8, diversity="branch-first"),
        DecodeConfig(drafts=3, steps=4, block=8, diversity="gumbel", temperature=0.8, seed=2),
        DecodeConfig(drafts=2, steps=6, block=6, diversity="none", max_new_tokens=NEW),
    ):
        stopping = list(decode(models, prompts[1], cfg))[:-1]  # unwatched: watching reads every pass anyway
        with monkeypatch.context() as patch:
            patch.setattr(diffusion, "reads_between_passes", lambda device: False)
            through = list(decode(models, prompts[1], cfg))[:-1]
        assert len(stopping) > 2 and [t.drafts for t in stopping] == [t.drafts for t in through]
        assert [t.refinement for t in stopping] == [t.refinement for t in through]


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_a_tree_refined_on_a_gpu_is_the_tree_the_host_builds(refining, monkeypatch, temperature):
    """A GPU builds the refined tree on the device and reads it once (``refined_trees_on_device``): the same
    drafts, node order, refinement and watched trees as the host's heap (``refined_trees``), with trees of every
    depth (sharpened: deep ones) and blocks whose candidates are fewer than the tree's nodes. The chances agree to
    fp32 rounding only: the device scores every node of the tree before as one batch, the host the new ones, and the
    head's products round by batch size (sampled: one node in 19 off by an ulp; the builder itself is exact:
    test_gpu_round)."""
    models, prompts, _ = refining
    drafter = models.drafter
    compared = refined = 0
    for sharpness, candidates, cfg in [
        (8.0, 64, DecodeConfig(drafts=3, steps=3, block=8, temperature=temperature, seed=3)),
        (1.0, 64, DecodeConfig(drafts=4, steps=2, block=6, temperature=temperature, seed=4)),
        (8.0, 5, DecodeConfig(drafts=2, steps=4, block=5, temperature=temperature, seed=5)),
    ]:
        monkeypatch.setattr(drafter, "tree_sharpness", sharpness)
        monkeypatch.setattr(diffusion, "PASS_CANDIDATES", candidates)
        for prompt_ids, root in [(prompts[0], 5), (prompts[1], 17), (prompts[1], 40)]:
            state = drafter.start(prompt_ids, *first_features(models, prompt_ids))
            for watch in (False, True):
                made = []
                for on_device in (False, True):
                    with monkeypatch.context() as patch:
                        patch.setattr(diffusion, "reads_between_passes", lambda device, host=not on_device: host)
                        rng = torch.Generator().manual_seed(cfg.seed)
                        upcoming = gumbel(torch.rand((cfg.block, drafter.banned.shape[0]), generator=rng))
                        randomness = DraftRandomness(rng, None if cfg.greedy else upcoming)
                        made.append(drafter.draft(state, root, cfg, randomness, watch=watch))
                host, device = made
                assert (device.tokens, device.order, device.refinement) == (host.tokens, host.order, host.refinement)
                assert [s.tokens for s in device.steps] == [s.tokens for s in host.steps]
                for got, want in zip(
                    [device.chances, *(s.confidence for s in device.steps)],
                    [host.chances, *(s.confidence for s in host.steps)],
                ):
                    assert [list(row) for row in got] == [pytest.approx(row, rel=1e-5) for row in want]
                compared += 1
                refined += host.refinement.before != host.refinement.after
    assert compared == 18 and refined > 0


def test_k_rows_refined_as_one_batch_equal_rows_refined_alone(refining):
    """The K drafts go through each pass as one batch: the same drafts as K passes of one row each (the head reads
    each row's own tokens only)."""
    models, prompts, _ = refining
    drafter = models.drafter
    state = drafter.start(prompts[0], *first_features(models, prompts[0]))
    cfg = DecodeConfig(drafts=3, steps=4, block=8, diversity="branch-first")
    drafts = drafter.draft(state, 5, cfg, DraftRandomness(torch.Generator().manual_seed(0)), watch=True)
    hidden = drafter.block_hidden(state, drafter.model.embed_block(*masked(5, 8)))
    outside = pass_candidates_only(drafter, hidden)
    for row in range(3):
        tokens = torch.tensor([drafts.steps[0].tokens[row]])
        for _ in range(3):
            previous = torch.cat([torch.tensor([[5]]), tokens[:, :-1]], dim=1)
            chosen = drafter.model.refined_logits(hidden, previous)
            chosen = (chosen[..., : drafter.banned.shape[0]] + drafter.banned + outside).argmax(-1)
            chosen[0, 0] = tokens[0, 0]  # the branch token stays
            tokens = chosen
        assert tuple(tokens[0].tolist()) == drafts.tokens[row]


def test_a_pass_over_the_later_positions_gives_the_full_passs_logits_there(refining):
    """``RefinementPasses.logits`` (the LM head fused with the head's projection back, positions from ``start`` on, candidate
    tokens only) against ``refined_logits`` (the hidden states corrected, then the LM head over every position and
    token), for every start."""
    models, prompts, _ = refining
    drafter, model = models.drafter, models.drafter.model
    state = drafter.start(prompts[0], *first_features(models, prompts[0]))
    hidden = drafter.block_hidden(state, model.embed_block(*masked(5, 8)))
    candidates = torch.randint(0, model.config.vocab_size, (8, 16), generator=torch.Generator().manual_seed(0))
    inputs = drafter.passes.inputs(hidden, model.raw_logits(hidden), candidates)
    previous = torch.randint(10, model.config.vocab_size, (3, 8), generator=torch.Generator().manual_seed(1))
    full = model.refined_logits(hidden.expand(3, -1, -1), previous).float()
    assert (full[:, 1:] - model.head_logits(hidden)[:, 1:]).abs().max() > 1e-3  # the head corrects something
    full = full.gather(-1, candidates.expand(3, -1, -1))
    for start in range(1, 8):
        torch.testing.assert_close(
            drafter.passes.logits(inputs, previous, start), full[:, start:], atol=1e-4, rtol=1e-4
        )


def pass_candidates_only(drafter, hidden):
    """(1, L, V) 0 at each position's ``PASS_CANDIDATES`` best tokens of pass 0, -inf elsewhere: what a pass
    chooses among."""
    allowed = drafter.model.head_logits(hidden)[..., : drafter.banned.shape[0]] + drafter.banned
    outside = torch.full_like(allowed, float("-inf"))
    return outside.scatter(-1, allowed.topk(diffusion.PASS_CANDIDATES).indices, 0.0)


def first_features(models, prompt_ids):
    from xpress_core.models import tapped_forward

    _, features = tapped_forward(models.target, list(models.drafter.tapped_layers), input_ids=prompt_ids)
    return (features[0],)


def masked(root: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One row's ``[root, MASK x L]``: (1, L+1) token ids and (1, L+1) masked flags (``embed_block``'s inputs)."""
    block = torch.full((1, length + 1), root)
    flags = torch.ones((1, length + 1), dtype=torch.bool)
    flags[:, 0] = False
    return block, flags


@pytest.mark.parametrize("learned_mask", [True, False])
def test_a_drafts_first_block_is_the_embedded_root_and_masks(zoo, learned_mask):
    """``first_block`` (a draft's first forward) gives ``embed_block``'s embeddings of ``[root, MASK x L]`` bit for
    bit: a learned mask vector (ours), or the target's row of the mask token scaled (DFlash's)."""
    from xpress_core.models import load_target

    target, _ = load_target(zoo["llama"], torch.device("cpu"), torch.float32)
    drafter = XpressDrafter.from_pretrained(zoo["drafter_llama"]).bind(target).eval()
    if not learned_mask:
        drafter.mask_embedding, drafter.config.input_embedding_scale = None, 1.5
    with torch.no_grad():
        for root, length in ((5, 4), (0, 1), (41, 8)):
            assert torch.equal(drafter.first_block(root, length), drafter.embed_block(*masked(root, length)))


def test_the_training_loss_is_the_hand_computed_one(zoo):
    """One block, L = 2, greedy soft labels off (CE on the tokens): the teacher-forced pass, one free pass and its
    weights, computed position by position."""
    from xpress_core.models import load_target

    target, _ = load_target(zoo["llama"], torch.device("cpu"), torch.float32)
    drafter = with_head_in_memory(zoo["drafter_llama"], block=2).bind(target)
    seqs = torch.tensor([[5, 9, 12, 7, 30, 41]])
    reading = read_target(target, seqs, drafter.config.tapped_layers)
    span, anchor = 3, 2  # the block [x_2, x_3, x_4]
    positions = torch.tensor([[anchor, anchor + 1, anchor + 2]])
    mask = torch.zeros(1, 1, span, seqs.shape[1] + span)
    mask[..., anchor : seqs.shape[1]] = float("-inf")  # the context strictly before the anchor
    batch = DrafterBatch(
        seqs.gather(1, positions), torch.tensor([[False, True, True]]), torch.zeros(1, span), positions, mask
    )
    recipe = RefinerRecipe(rank=RANK, passes=1, free_weight=0.3, decay=2.0, soft=0.0)
    loss = refiner_loss(drafter, reading, batch, recipe)

    embeds = drafter.embed_block(batch.block_ids, batch.masked)
    context = drafter.context_kv(reading.features, torch.arange(seqs.shape[1])[None])
    hidden = drafter.hidden(embeds, positions, context, mask)[:, 1:]  # (1, 2, H): positions 1 and 2 predict x_3, x_4
    truth = [7, 30]  # the block's tokens after its root x_2 = 12
    weights = [1.0, math.exp(-1 / 2.0)]

    def ce(previous: list[int]) -> float:
        logits = drafter.refined_logits(hidden, torch.tensor([previous]))[0].float()
        logp = logits.log_softmax(-1)
        return sum(w * -logp[j, truth[j]].item() for j, w in enumerate(weights)) / sum(weights)

    first = drafter.head_logits(hidden)[0].argmax(-1).tolist()
    expected = ce([12, 7]) + 0.3 * ce([12, first[0]])
    assert loss.item() == pytest.approx(expected, rel=1e-5)


def with_head_in_memory(drafter_dir, block: int):
    plain = XpressDrafter.from_pretrained(drafter_dir)
    plain.config.block_size = block
    drafter = attach_refiner(plain, RANK)
    torch.manual_seed(1)
    with torch.no_grad():
        for p in drafter.refiner.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    return drafter


def test_pass_gains_are_ratios_of_conditional_acceptance():
    passes = [{"leading": [0.8, 0.4, 0.2]}, {"leading": [0.8, 0.6, 0.45]}]
    # conditional: 0.8, 0.5, 0.5 -> 0.8, 0.75, 0.75
    assert pass_gains(passes) == [[1.0, 1.5, 1.5]]


def test_passes_are_priced_and_fitted_and_auto_refines_when_the_measured_gain_pays():
    costs = CostModel(
        1e-3,
        0.05e-3,
        3e-3,
        0.1e-3,
        0.4e-3,
        draft_work=lambda s: (1, s.block + 1),
        pass_s=0.2e-3,
        refine_passes=lambda s: max(0, s.steps - 1),
    )
    assert costs.round_s(RoundSetting(1, 3, 8)) - costs.round_s(RoundSetting(1, 1, 8)) == pytest.approx(0.4e-3)

    class Work:
        def draft_work(self, s):
            return 1, s.block + 1

        def refine_passes(self, s):
            return s.steps - 1

    settings = [RoundSetting(1, 1, 4), RoundSetting(1, 1, 8), RoundSetting(1, 2, 8), RoundSetting(4, 3, 8)]
    seconds = {s: 2e-3 + 5e-5 * (s.block + 1) + 3e-4 * (s.steps - 1) for s in settings}
    assert fit_draft_costs(round_draft_work(Work()), seconds) == pytest.approx((2e-3, 5e-5, 3e-4))

    flat = AutoControl(costs, max_block=8, steps=(1, 2, 3))
    gained = AutoControl(
        costs, max_block=8, steps=(1, 2, 3), pass_gains={2: (1.0,) + (1.3,) * 7, 3: (1.0,) + (1.5,) * 7}
    )
    assert flat.choose(100).steps == 1  # no measured gain: a pass only costs
    first = gained.choose(100)
    assert first.steps == 3
    pair = (first.drafts, first.steps)
    prior = gained.acceptance(pair)[1]
    for _ in range(6):  # rounds at this setting that accept nothing teach auto that it does not pay
        gained.observe(first, 0)
    assert gained.acceptance(pair)[0] < 0.3 < prior
    assert gained.choose(100) != first


def test_the_draft_panel_marks_what_each_pass_changed(refining):
    from xpress_core.plots import draft_evolution_figure

    models, prompts, _ = refining
    traces, _ = run(models, prompts[0], DecodeConfig(drafts=3, steps=4, block=8, diversity="branch-first"))
    changed_somewhere = False
    for trace in traces[1:]:
        for shown in range(1, len(trace.steps)):
            before, now = trace.steps[shown - 1].tokens, trace.steps[shown].tokens
            expected = {(k, j) for k in range(3) for j in range(8) if before[k][j] != now[k][j]}
            fig = draft_evolution_figure(trace, lambda t: f"t{t}", step=shown)
            assert f"refinement pass {shown}/{len(trace.steps) - 1}" in fig.layout.title.text
            hovers = fig.data[1].customdata
            marked = {(k, j) for k in range(3) for j in range(8) if "changed by this pass" in hovers[k][j]}
            assert marked == expected
            if shown < len(trace.steps) - 1:  # before the verdict: a blue frame on each changed cell
                assert len(fig.layout.shapes) == len(expected)
            changed_somewhere |= bool(expected)
    assert changed_somewhere


def test_a_refined_tree_shows_each_passs_tree_with_its_own_chances(refining, monkeypatch):
    from xpress_core.plots import draft_evolution_figure
    from xpress_core.plots.evolution import MAX_ROWS

    models, prompts, _ = refining
    monkeypatch.setattr(models.drafter, "tree_sharpness", 8.0)  # deep trees (as above)
    traces, _ = run(models, prompts[1], DecodeConfig(drafts=1, steps=3, block=8))
    new_somewhere = False
    for trace in traces[1:]:
        assert all(step.kind == "tree" for step in trace.steps) and trace.steps[-1].tokens == trace.drafts
        for step in trace.steps:
            assert [len(c) for c in step.confidence] == [len(t) for t in step.tokens]
            assert all(0.0 <= c <= 1.0 for row in step.confidence for c in row)
        for shown in range(1, len(trace.steps)):  # marked: the cells whose node the tree before did not hold
            held = {p[: j + 1] for p in trace.steps[shown - 1].tokens for j in range(len(p))}
            now = trace.steps[shown].tokens
            expected = {(k, j) for k, p in enumerate(now) for j in range(len(p)) if p[: j + 1] not in held}
            fig = draft_evolution_figure(trace, str, step=shown)
            assert f"draft tree after refinement pass {shown}/{len(trace.steps) - 1}" in fig.layout.title.text
            hovers = fig.data[1].customdata
            marked = {
                (r, j) for r, row in enumerate(hovers) for j, hover in enumerate(row) if "new in this pass" in hover
            }
            assert len(now) > MAX_ROWS or marked == expected  # past MAX_ROWS paths the panel shows some rows only
            new_somewhere |= len(now) <= MAX_ROWS and bool(expected)
    assert new_somewhere
