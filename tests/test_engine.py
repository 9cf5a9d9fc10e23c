"""The engine against its oracles: HF ``generate`` (greedy), plain sampling with the same seed, exact logits."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace

import pytest
import torch

from tests.fakes import GradSpy, ScriptedDrafter
from tests.oracles import NEW, PROMPTS, check_invariants, cli, hf_greedy, plain_sampling, run
from xpress_core import cache as kv
from xpress_core.config import DecodeConfig
from xpress_core.drafters.base import DraftRandomness, NoDrafter
from xpress_core.drafters.diffusion import DiffusionState, diffusion_drafter, grown
from xpress_core.drafters.diffusion_model import Rotary, XpressDrafter, rotate
from xpress_core.engine import Models, decode, stop_token_ids
from xpress_core.models import encode_prompt, load_models, load_target, native_bf16, resolve_dtype, target_banned_ids
from xpress_core.sampling import TargetNoise, draw_token, gumbel
from xpress_core.tree import build_tree, tree_attention_mask, tree_tensors

DETECTED_NATIVE_BF16 = native_bf16()  # read at import, before the tests' fp32 default replaces it (conftest.py)


GRID = [
    (k, t, length, refine, verify)
    for k, length, refine, verify in itertools.product((1, 3), (1, 4, 8), ("parallel", "serial"), ("tree", "batch"))
    for t in sorted({1, length})
]


@pytest.mark.parametrize("k,t,length,refine,verify", GRID)
def test_greedy_equals_generate_untrained_diffusion_drafter(family, k, t, length, refine, verify):
    models, prompts, refs = family
    cfg = DecodeConfig(drafts=k, steps=t, block=length, refine=refine, verify=verify, max_new_tokens=NEW)
    for prompt_ids, ref in zip(prompts, refs):
        traces, result = run(models, prompt_ids, cfg)
        assert list(result.token_ids) == ref
        check_invariants(traces, prompt_ids.shape[1], result)


@pytest.mark.parametrize("mode", ["oracle", "wrong"])
@pytest.mark.parametrize("k,length,verify", [(1, 1, "tree"), (1, 4, "batch"), (3, 8, "tree"), (3, 8, "batch")])
def test_greedy_equals_generate_scripted_drafters(family, mode, k, length, verify):
    models, prompts, refs = family
    scripted = Models(models.target, models.tokenizer, ScriptedDrafter(models.target, mode))
    cfg = DecodeConfig(drafts=k, steps=1, block=length, verify=verify, max_new_tokens=NEW)
    for prompt_ids, ref in zip(prompts, refs):
        traces, result = run(scripted, prompt_ids, cfg)
        assert list(result.token_ids) == ref
        check_invariants(traces, prompt_ids.shape[1], result)
        if mode == "wrong":
            assert set(result.accept_lens) == {0}
        else:
            # The oracle's continuation is accepted whole: one round yields L + 1 tokens (except at the end).
            assert max(result.accept_lens) == length
            assert result.rounds <= -(-(NEW - 1) // (length + 1)) + 1


def test_rounds_run_without_autograd_and_the_consumer_keeps_its_own(zoo):
    """Between events the consumer's autograd mode is its own (a suspended round leaves nothing switched off), while
    every round runs with autograd off, and a consumer that abandons the stream leaves the mode as it was."""
    models = load_models(zoo["llama"], "none", device="cpu")
    probe = Models(models.target, models.tokenizer, GradSpy())
    prompt_ids = encode_prompt(models.tokenizer, PROMPTS[0], chat=True)
    with torch.enable_grad():
        events = decode(probe, prompt_ids, DecodeConfig(max_new_tokens=6))
        modes = [torch.is_grad_enabled() for _ in events]
        assert torch.is_grad_enabled()
    assert len(modes) == 7 and all(modes)
    assert len(probe.drafter.grad_enabled) == 5 and not any(probe.drafter.grad_enabled)
    with torch.enable_grad():
        abandoned = decode(probe, prompt_ids, DecodeConfig(max_new_tokens=6))
        next(abandoned)
        assert torch.is_grad_enabled()  # while the consumer still holds the stream it no longer reads
        del abandoned
        assert torch.is_grad_enabled()


def test_eos_and_max_new_tokens_inside_an_accepted_path(zoo):
    target, tokenizer = load_target(zoo["llama"], torch.device("cpu"), torch.float32)
    prompt_ids = encode_prompt(tokenizer, PROMPTS[0], chat=True)
    plain = hf_greedy(Models(target, tokenizer, NoDrafter()), prompt_ids, new=40)
    # Make a token of the greedy continuation the end-of-sequence token: generate stops there, mid-draft for us.
    target.generation_config.eos_token_id = plain[13]
    models = Models(target, tokenizer, ScriptedDrafter(target, "oracle"))
    ref = hf_greedy(models, prompt_ids, new=40)
    assert len(ref) < 40 and ref[-1] == plain[13]
    for length in (4, 8):
        _, result = run(models, prompt_ids, DecodeConfig(drafts=2, block=length, max_new_tokens=40))
        assert list(result.token_ids) == ref and result.stop_reason == "eos"
    target.generation_config.eos_token_id = tokenizer.eos_token_id
    for new in (1, 2, 5, 9, 10):  # the limit falls inside accepted paths of length 8
        ref = hf_greedy(models, prompt_ids, new=new)
        _, result = run(models, prompt_ids, DecodeConfig(drafts=1, block=8, max_new_tokens=new))
        assert list(result.token_ids) == ref and result.stop_reason == "max_new_tokens"


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.7, 20, 1.0), (1.3, 0, 0.9), (0.8, 10, 0.8)])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sampling_same_seed_same_tokens_as_plain_sampling(zoo, temperature, top_k, top_p, seed):
    models = load_models(zoo["llama"], zoo["drafter_llama"], device="cpu")
    scripted = Models(models.target, models.tokenizer, ScriptedDrafter(models.target, "oracle"))
    prompt_ids = encode_prompt(models.tokenizer, PROMPTS[1], chat=True)
    cfg = DecodeConfig(
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        seed=seed,
        max_new_tokens=NEW,
        drafts=3,
        steps=2,
        block=4,
        diversity="gumbel",
    )
    ref = plain_sampling(models, prompt_ids, cfg, NEW)
    for m in (models, scripted):
        for verify in ("tree", "batch"):
            _, result = run(m, prompt_ids, DecodeConfig(**{**cfg.__dict__, "verify": verify}))
            assert list(result.token_ids) == ref


def test_reading_the_noise_ahead_leaves_every_token_its_own():
    """The j-th emitted token gets the j-th noise vector whether or not a drafter read it ahead: the Gumbel transform
    of the j-th vector of uniforms the seeded generator gives."""
    rng = torch.Generator().manual_seed(5)
    expected = [gumbel(torch.rand(50, generator=rng)) for _ in range(5)]
    ahead = TargetNoise(torch.Generator().manual_seed(5), 50)
    first = ahead.upcoming(3)
    assert torch.equal(ahead.upcoming(2), first[:2])
    drawn = [ahead.next() for _ in range(5)]
    assert all(torch.equal(a, b) for a, b in zip(drawn, expected))
    assert all(torch.equal(a, b) for a, b in zip(drawn[:3], first))


def test_sampled_masked_drafts_are_the_targets_draws_from_the_same_logits(zoo):
    """When sampling, a masked drafter's token at each position is the Gumbel-max draw the target makes with the
    noise of that position (the oracle: ``draw_token`` on the same logits); the other branches differ from it."""
    drafter = load_models(zoo["llama"], zoo["drafter_llama"], device="cpu").drafter
    vocab = drafter.banned.shape[0]
    cfg = DecodeConfig(temperature=0.8, top_p=0.9, drafts=3, block=4, diversity="branch-first")
    logits = torch.randn(1, 4, vocab, generator=torch.Generator().manual_seed(1)) * 3 + drafter.banned
    for seed in range(5):
        noise = TargetNoise(torch.Generator().manual_seed(seed), vocab)
        candidates, _, forced = drafter.choose_tokens(
            logits.expand(3, -1, -1), cfg, 1, DraftRandomness(torch.Generator().manual_seed(0), noise.upcoming(4))
        )
        assert candidates[0].tolist() == [draw_token(logits[0, i], cfg, noise) for i in range(4)]
        assert len(set(candidates[:, 0].tolist())) == 3 and forced[:, 0].all()


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_a_choice_nobody_ranks_skips_the_softmax_and_picks_the_same_tokens(zoo, temperature):
    """Where no confidence is read (the last denoise step, unwatched) a masked drafter picks the logits' maximum with
    no softmax: the tokens of the softmax path (the oracle), greedy and sampled, on bf16 logits (where ties are likelier)."""
    drafter = load_models(zoo["llama"], zoo["drafter_llama"], device="cpu").drafter
    vocab = drafter.banned.shape[0]
    cfg = DecodeConfig(temperature=temperature, top_p=0.9 if temperature else 1.0, drafts=1, block=6)
    for seed in range(8):
        logits = (torch.randn(1, 6, vocab, generator=torch.Generator().manual_seed(seed)) * 3).bfloat16()
        upcoming = TargetNoise(torch.Generator().manual_seed(seed), vocab).upcoming(6) if temperature else None
        randomness = DraftRandomness(torch.Generator().manual_seed(0), upcoming)
        ranked, conf, _ = drafter.choose_tokens(logits, cfg, 1, randomness, ranked=True)
        unranked, no_conf, _ = drafter.choose_tokens(logits, cfg, 1, randomness, ranked=False)
        assert torch.equal(unranked, ranked) and conf is not None and no_conf is None
        # and both are what the drafter means to draft, computed apart: its most likely allowed token, or the target's
        # own draw with that position's noise
        if temperature:
            noise = TargetNoise(torch.Generator().manual_seed(seed), vocab)
            want = [draw_token(logits[0, i].float() + drafter.banned, cfg, noise) for i in range(6)]
        else:
            want = logits[0].float().masked_fill(drafter.banned.isinf(), float("-inf")).softmax(-1).argmax(-1).tolist()
        assert unranked[0].tolist() == want


def test_sampled_drafts_of_the_target_itself_are_accepted(zoo):
    """A drafter that is the target (an autoregressive drafter loaded from the target's own files) drafts, when
    sampling, the very tokens the target then draws: nearly every draft token is accepted, where drafting its most
    likely tokens is accepted only as often as the target happens to draw them. Output: plain sampling's, both ways."""
    models = load_models(zoo["llama"], zoo["llama"], device="cpu")
    prompt_ids = encode_prompt(models.tokenizer, PROMPTS[1], chat=True)
    cfg = DecodeConfig(temperature=0.7, drafts=1, block=4, max_new_tokens=NEW, seed=3)
    ref = plain_sampling(models, prompt_ids, cfg, NEW)

    def draft_acceptance(sampled_drafts: str) -> float:
        rounds, result = run(models, prompt_ids, replace(cfg, sampled_drafts=sampled_drafts))
        assert list(result.token_ids) == ref
        drafted = [r for r in rounds if r.index > 0 and r.drafts]
        return sum(len(r.accepted) for r in drafted) / sum(len(r.drafts[0]) for r in drafted)

    coupled, most_likely = draft_acceptance("coupled"), draft_acceptance("most-likely")
    assert coupled >= 0.95 and most_likely < 0.6, (coupled, most_likely)


def hf_warped_probs(logits: torch.Tensor, cfg: DecodeConfig) -> torch.Tensor:
    """The oracle law: transformers' own temperature, top-k and top-p warpers, in generate's order."""
    from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    scores = logits.float()[None]
    warpers = [TemperatureLogitsWarper(cfg.temperature)]
    warpers += [TopKLogitsWarper(cfg.top_k)] if cfg.top_k > 0 else []
    warpers += [TopPLogitsWarper(cfg.top_p)] if cfg.top_p < 1.0 else []
    for warper in warpers:
        scores = warper(None, scores)
    return scores.softmax(-1)[0]


@pytest.mark.parametrize(
    "temperature,top_k,top_p", [(1.0, 0, 1.0), (0.7, 20, 1.0), (1.3, 0, 0.9), (0.8, 10, 0.8), (3.0, 2, 1.0)]
)
def test_processed_distribution_equals_transformers_warpers(temperature, top_k, top_p):
    from xpress_core.sampling import processed_logits

    cfg = DecodeConfig(temperature=temperature, top_k=top_k, top_p=top_p)
    logits = torch.randn(100, 64, generator=torch.Generator().manual_seed(0)) * 3
    for row in logits:
        torch.testing.assert_close(processed_logits(row, cfg).softmax(-1), hf_warped_probs(row, cfg), atol=1e-6, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_greedy_draw_is_argmaxs_first_maximum(dtype):
    """``draw_token`` greedy (max's index) picks argmax's token, ties to the first maximum, -inf and NaN included."""
    rows = torch.randn(64, 4096).to(dtype)
    rows[1, [7, 900, 4095]] = 50.0  # ties
    rows[2] = float("-inf")
    rows[2, 3000] = 0.0
    rows[3, [10, 20]] = float("nan")
    rows[4] = rows[4].round()  # many ties
    cfg, noise = DecodeConfig(), TargetNoise(torch.Generator().manual_seed(0), 4096)
    assert [draw_token(row, cfg, noise) for row in rows] == rows.argmax(-1).tolist()


def test_sampling_distribution_matches_target(zoo):
    """Empirical law of the first two sampled tokens vs the exact target law (top-k 2: four outcomes)."""
    models = load_models(zoo["llama"], "none", device="cpu")
    scripted = Models(models.target, models.tokenizer, ScriptedDrafter(models.target, "oracle"))
    prompt_ids = encode_prompt(models.tokenizer, PROMPTS[0], chat=True)
    base = DecodeConfig(temperature=3.0, top_k=2, max_new_tokens=2, drafts=2, block=2)
    with torch.no_grad():
        p1 = hf_warped_probs(models.target(input_ids=prompt_ids).logits[0, -1], base)
        exact = {}
        for a in torch.nonzero(p1).flatten().tolist():
            ids = torch.cat([prompt_ids, torch.tensor([[a]])], dim=1)
            p2 = hf_warped_probs(models.target(input_ids=ids).logits[0, -1], base)
            for b in torch.nonzero(p2).flatten().tolist():
                exact[(a, b)] = float(p1[a] * p2[b])
    n = 600
    counts: dict[tuple[int, int], int] = {}
    for seed in range(n):
        _, result = run(scripted, prompt_ids, DecodeConfig(**{**base.__dict__, "seed": 10_000 + seed}))
        key = tuple(result.token_ids)
        counts[key] = counts.get(key, 0) + 1
    assert set(counts) <= set(exact)
    chi2 = sum((counts.get(k, 0) - n * p) ** 2 / (n * p) for k, p in exact.items())
    assert chi2 < 16.3  # 3 degrees of freedom, p = 0.001


def test_tree_logits_equal_sequential_logits(zoo):
    """One tree forward gives, at every node, the logits of running that node's path sequentially."""
    target, tokenizer = load_target(zoo["qwen3"], torch.device("cpu"), torch.float32)
    prompt = encode_prompt(tokenizer, PROMPTS[0], chat=True)
    drafts = [[5, 6, 7, 8], [5, 6, 9], [10, 11], [5, 12, 13, 14]]
    root = 4
    tree = build_tree(root, drafts)
    assert tree.size == 10  # 5 is shared by three drafts, 5-6 by two
    with torch.no_grad():
        cache = kv.new_cache(target)
        target(input_ids=prompt, cache=cache, use_cache=True)
        past = prompt.shape[1]
        tensors = tree_tensors(tree, past, "cpu")
        assert tensors.ids.tolist() == [list(tree.tokens)]
        logits = target(
            input_ids=tensors.ids,
            position_ids=tensors.positions,
            attention_mask=tree_attention_mask(tensors, torch.float32),
            cache=cache,
            use_cache=True,
        ).logits[0]
        for draft, path in zip(drafts, tree.draft_paths):
            seq = torch.cat([prompt, torch.tensor([[root] + draft])], dim=1)
            ref = target(input_ids=seq).logits[0, past:]
            torch.testing.assert_close(logits[[0, *path]], ref, atol=1e-4, rtol=1e-4)


def test_parallel_and_serial_refinement_make_identical_drafts(zoo):
    models = load_models(zoo["llama"], zoo["drafter_llama"], device="cpu")
    prompt_ids = encode_prompt(models.tokenizer, PROMPTS[0], chat=True)
    for diversity in ("branch-first", "branch-uncertain", "gumbel"):
        cfgs = [
            DecodeConfig(drafts=4, steps=3, block=8, refine=r, diversity=diversity, seed=3, max_new_tokens=12)
            for r in ("parallel", "serial")
        ]
        (par, _), (ser, _) = (run(models, prompt_ids, c) for c in cfgs)
        assert [t.drafts for t in par] == [t.drafts for t in ser]
        assert len(par) > 1 and all(len(t.steps) == 3 for t in par[1:])


def test_drafts_differ_and_never_hold_special_tokens(zoo):
    models = load_models(zoo["llama"], zoo["drafter_llama"], device="cpu")
    banned = set(models.tokenizer.all_special_ids) - stop_token_ids(models)
    prompt_ids = encode_prompt(models.tokenizer, PROMPTS[0], chat=True)
    for diversity in ("branch-first", "branch-uncertain", "gumbel"):
        traces, _ = run(
            models, prompt_ids, DecodeConfig(drafts=4, steps=2, block=6, diversity=diversity, max_new_tokens=10)
        )
        assert len(traces) > 1  # drafting rounds, not the prefill alone
        for t in traces[1:]:
            assert len(set(t.drafts)) == 4, diversity
            assert not banned & {tok for d in t.drafts for tok in d}
            final = t.steps[-1].tokens
            assert final == t.drafts and all(tok >= 0 for d in final for tok in d)


def test_schedules_commit_ceil_l_s_over_t_positions(zoo):
    models = load_models(zoo["llama"], zoo["drafter_llama"], device="cpu")
    prompt_ids = encode_prompt(models.tokenizer, PROMPTS[0], chat=True)
    for schedule in ("confidence", "left-to-right"):
        traces, _ = run(
            models,
            prompt_ids,
            DecodeConfig(drafts=2, steps=3, block=8, schedule=schedule, diversity="branch-first", max_new_tokens=6),
        )
        assert len(traces) > 1
        for t in traces[1:]:
            committed = [sum(tok >= 0 for tok in step.tokens[0]) for step in t.steps]
            assert committed == [3, 6, 8]
            if schedule == "left-to-right":
                assert all(tok >= 0 for tok in t.steps[0].tokens[0][:3])


@pytest.mark.parametrize("k, t", [(3, 2), (1, 1), (1, 2)])
def test_unwatched_requests_draft_the_same_without_denoise_steps(zoo, k, t):
    """Without a watcher the drafters build no per-step lists; the drafts and the output do not change."""
    for drafter in (zoo["drafter_llama"], zoo["gauss_llama"], zoo["ar_drafter"]):
        models = load_models(zoo["llama"], drafter, device="cpu")
        prompt_ids = encode_prompt(models.tokenizer, PROMPTS[0], chat=True)
        cfg = DecodeConfig(drafts=k, steps=t, block=4, max_new_tokens=NEW)
        watched, result = run(models, prompt_ids, cfg)
        events = list(decode(models, prompt_ids, cfg))
        unwatched, plain_result = events[:-1], events[-1]
        assert plain_result.token_ids == result.token_ids
        assert [t.drafts for t in unwatched] == [t.drafts for t in watched]
        assert all(t.steps for t in watched[1:]) and not any(t.steps for t in unwatched)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_projections_draft_what_the_checkpoints_layers_draft(zoo, dtype):
    """Loading fuses each drafter layer's q/k/v products into one and gate/up into another (``fuse_projections``):
    whole requests draft the same tokens, round by round, as the checkpoint's separate layers (the oracle, loaded as
    training loads it), greedy and sampled, with the drafter's context taking committed tokens in along the way."""
    models = load_models(zoo["llama"], zoo["drafter_llama"], device="cpu", dtype=str(dtype).removeprefix("torch."))
    assert all(
        layer.attn.qkv_proj is not None and layer.gate_up_proj is not None for layer in models.drafter.model.layers
    )
    assert not any(
        hasattr(layer, "gate_proj") or hasattr(layer.attn, "q_proj") for layer in models.drafter.model.layers
    )
    separate = XpressDrafter.from_pretrained(zoo["drafter_llama"], dtype=dtype).bind(models.target).eval()
    oracle = Models(
        models.target, models.tokenizer, diffusion_drafter(separate, target_banned_ids(models.target, models.tokenizer))
    )
    prompt_ids = encode_prompt(models.tokenizer, PROMPTS[1], chat=True)
    for cfg in (
        DecodeConfig(drafts=2, steps=2, block=4, max_new_tokens=NEW),
        DecodeConfig(drafts=1, block=6, temperature=0.8, seed=4, max_new_tokens=NEW),
    ):
        fused, result = run(models, prompt_ids, cfg)
        unfused, oracle_result = run(oracle, prompt_ids, cfg)
        assert [t.drafts for t in fused] == [t.drafts for t in unfused] and len(fused) > 3
        assert result.token_ids == oracle_result.token_ids


def test_drafter_context_buffers_hold_what_concatenation_would():
    """The drafter's context grows in place; past its capacity the buffers double and keep every slot."""
    chunks = [torch.randn(1, 2, n, 4) for n in (3, 2, 4, 1)]
    state = DiffusionState([(grown(chunks[0], 4), grown(-chunks[0], 4))], 3, previous=torch.zeros(8))
    for chunk in chunks[1:]:
        state.append([(chunk, -chunk)])
    ((keys, values),) = state.context
    assert state.length == 10 and state.buffers[0][0].shape[2] >= 10
    assert torch.equal(keys, torch.cat(chunks, dim=2)) and torch.equal(values, -torch.cat(chunks, dim=2))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_drafts_read_their_rotary_angles_from_the_requests_table_as_computed(zoo, dtype, monkeypatch):
    """A draft slices its positions' rotary angles from its request's table (``rotary_angles``): the slices equal
    ``Rotary`` on the positions themselves bit for bit, and whole requests draft the same tokens, round by round, as
    drafts that compute them, the context buffers (and with them the table) growing along the way."""
    monkeypatch.setattr("xpress_core.drafters.diffusion.CONTEXT_HEADROOM", 2)
    models = load_models(zoo["llama"], zoo["drafter_llama"], device="cpu", dtype=str(dtype).removeprefix("torch."))
    drafter = models.drafter
    state = drafter.start(None, torch.zeros(5, len(drafter.tapped_layers) * drafter.model.config.hidden_size))
    for start, end in ((0, 1), (3, 12), (5, 40), (100, 109)):
        positions = torch.arange(start, end)[None]
        for mine, computed in zip(
            drafter.rotary_angles(state, start, end, dtype), drafter.model.rotary(positions, dtype)
        ):
            assert torch.equal(mine, computed)
    prompt_ids = encode_prompt(models.tokenizer, PROMPTS[1], chat=True)
    cfg = DecodeConfig(drafts=2, steps=2, block=4, max_new_tokens=NEW)
    tabled, result = run(models, prompt_ids, cfg)

    def computed(self, state, start, end, dtype):
        return self.model.rotary(torch.arange(start, end)[None], dtype)

    monkeypatch.setattr(type(drafter), "rotary_angles", computed)
    oracle, oracle_result = run(models, prompt_ids, cfg)
    assert [t.drafts for t in tabled] == [t.drafts for t in oracle] and len(tabled) > 3
    assert result.token_ids == oracle_result.token_ids


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_drafters_rotation_is_the_textbook_one_bit_for_bit(dtype):
    """``rotate`` with ``Rotary``'s signed sine (one roll a rotation) gives ``x cos + cat(-x2, x1) sin`` with the
    usual sine, bit for bit, signed zeros included: at the first positions (sine 0), late ones, several head dims."""
    for head_dim, start, length in ((16, 0, 1), (64, 0, 9), (64, 70, 13), (128, 1000, 33), (64, 30000, 5)):
        rotary = Rotary(head_dim, 10000.0)
        positions = torch.arange(start, start + length)[None].expand(2, -1)
        x = (3 * torch.randn(2, 4, length, head_dim)).to(dtype)
        x[0, 0, 0, :4], x[0, 0, 0, 4] = 0.0, -0.0
        freqs = positions[..., None].float() * rotary.inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)[:, None]
        cos, sin = emb.cos().to(dtype), emb.sin().to(dtype)
        half = head_dim // 2
        textbook = x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin
        mine_cos, signed_sin = rotary(positions, dtype)
        bits = torch.int16 if dtype == torch.bfloat16 else torch.int32
        assert torch.equal(mine_cos, cos)
        assert torch.equal(rotate(x, mine_cos, signed_sin).view(bits), textbook.view(bits))


def test_autoregressive_drafter_and_none_equal_generate(zoo):
    for drafter in (zoo["ar_drafter"], zoo["llama"], "none"):
        models = load_models(zoo["llama"], drafter, device="cpu")
        prompt_ids = encode_prompt(models.tokenizer, PROMPTS[1], chat=True)
        ref = hf_greedy(models, prompt_ids)
        for k, verify, refine in [(1, "tree", "parallel"), (3, "batch", "serial"), (3, "tree", "parallel")]:
            traces, result = run(
                models,
                prompt_ids,
                DecodeConfig(drafts=k, block=5, steps=5, verify=verify, refine=refine, max_new_tokens=NEW),
            )
            assert list(result.token_ids) == ref
            check_invariants(traces, prompt_ids.shape[1], result)
        if drafter == zoo["llama"]:  # the target drafting for itself is always right
            assert result.tau > 4


def test_stop_strings_trim_text_and_tokens(zoo):
    models = load_models(zoo["llama"], "none", device="cpu")
    prompt_ids = encode_prompt(models.tokenizer, PROMPTS[0], chat=True)
    _, full = run(models, prompt_ids, DecodeConfig(max_new_tokens=NEW))
    stop = full.text[len(full.text) // 2 : len(full.text) // 2 + 2]
    assert stop.strip()
    _, cut = run(models, prompt_ids, DecodeConfig(max_new_tokens=NEW, stop=(stop,)))
    assert cut.stop_reason == "stop_string"
    assert cut.text == full.text[: full.text.find(stop)]
    assert list(cut.token_ids) == list(full.token_ids[: cut.new_tokens])


def test_bfloat16_runs_and_plain_decoding_equals_generate(zoo):
    """bf16: plain decoding through the engine is HF's computation exactly; with a drafter, tree verification
    rounds differently from one-token steps in bf16, so only the prefill token is compared."""
    for drafter in ("none", zoo["drafter_llama"]):
        models = load_models(zoo["llama"], drafter, device="cpu", dtype="bfloat16")
        assert models.target.dtype == torch.bfloat16
        prompt_ids = encode_prompt(models.tokenizer, PROMPTS[0], chat=True)
        ref = hf_greedy(models, prompt_ids)
        traces, result = run(models, prompt_ids, DecodeConfig(drafts=3, steps=2, block=4, max_new_tokens=NEW))
        check_invariants(traces, prompt_ids.shape[1], result)
        if drafter == "none":
            assert list(result.token_ids) == ref
        else:
            assert result.token_ids[0] == ref[0] and result.new_tokens == NEW


def test_auto_dtype_is_bf16_on_cuda_and_measured_on_cpus_with_native_bf16(zoo, monkeypatch):
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    for native, want in ((True, torch.bfloat16), (False, torch.float32)):
        monkeypatch.setattr("xpress_core.models.dtypes.native_bf16", lambda native=native: native)
        assert resolve_dtype("auto", cpu) == want and resolve_dtype("auto", cuda) == torch.bfloat16
        assert resolve_dtype("float32", cpu) == torch.float32 and resolve_dtype("bf16", cpu) == torch.bfloat16
    # The CLI's default on this machine, unpatched (a new process): the dtype that ran is in the result, and why.
    args = ["generate", "--prompt", "hello", "--target", str(zoo["llama"]), "--drafter", "none", "--json"]
    out = json.loads(cli(*args, "--max-new-tokens", "4").stdout)
    assert out["dtype"] == out["dtype_choice"]["dtype"]
    if DETECTED_NATIVE_BF16:  # both dtypes timed at the process's threads, the faster kept
        assert out["dtype_choice"]["reason"].startswith("measured at load")
        assert set(out["dtype_choice"]["timings"]) == {"float32", "bfloat16"}
    else:
        assert out["dtype"] == "float32" and "no native bf16" in out["dtype_choice"]["reason"]
    pinned = json.loads(cli(*args, "--max-new-tokens", "4", "--dtype", "bf16").stdout)
    assert pinned["dtype"] == "bfloat16" and pinned["dtype_choice"]["reason"] == "pinned by --dtype bf16"
