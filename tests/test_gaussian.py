"""The gaussian (continuous) drafter: exact output against HF ``generate``, seeded drafts, the noise process."""

from __future__ import annotations

import itertools
import json

import pytest
import torch

from tests.oracles import NEW, PROMPTS, check_invariants, hf_greedy, run
from xpress_core.bench.methods import XPRESS_NONE
from xpress_core.cli import main
from xpress_core.config import DecodeConfig
from xpress_core.data import Prompt
from xpress_core.drafters.diffusion import GaussianDiffusionDrafter, ddim_step, noise_levels
from xpress_core.drafters.diffusion_config import XpressDrafterConfig
from xpress_core.drafters.diffusion_model import add_noise, signal_share
from xpress_core.engine import stop_token_ids
from xpress_core.models import encode_prompt, load_models
from xpress_core.train.evaluate import drafter_scores, evaluate_run


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def family(request, zoo):
    models = load_models(zoo[request.param], zoo[f"gauss_{request.param}"], device="cpu")
    prompts = [encode_prompt(models.tokenizer, p, chat=True) for p in PROMPTS]
    refs = [hf_greedy(models, p) for p in prompts]
    return models, prompts, refs


def test_config_selects_the_gaussian_sampler(zoo):
    assert json.loads((zoo["gauss_llama"] / "config.json").read_text())["noise"] == "gaussian"
    models = load_models(zoo["llama"], zoo["gauss_llama"], device="cpu")
    assert isinstance(models.drafter, GaussianDiffusionDrafter)
    weights = models.drafter.model.state_dict()
    assert "time_embedding.fc_in.weight" in weights and "mask_embedding" not in weights
    with pytest.raises(ValueError, match="noise must be one of"):
        XpressDrafterConfig(noise="uniform")


@pytest.mark.parametrize(
    "k,t,length,refine,verify",
    [
        (k, t, n, r, v)
        for k, (t, n), r, v in itertools.product((1, 3), ((1, 4), (4, 4), (2, 8)), ("parallel",), ("tree",))
    ]
    + [(3, 2, 8, "serial", "tree"), (3, 2, 8, "parallel", "batch")],
)
def test_greedy_equals_generate(family, k, t, length, refine, verify):
    models, prompts, refs = family
    cfg = DecodeConfig(drafts=k, steps=t, block=length, refine=refine, verify=verify, max_new_tokens=NEW)
    for prompt_ids, ref in zip(prompts, refs):
        traces, result = run(models, prompt_ids, cfg)
        assert list(result.token_ids) == ref
        assert all(len(tr.steps) == t for tr in traces[1:])
        check_invariants(traces, prompt_ids.shape[1], result)


def test_same_seed_same_drafts_whatever_the_global_rng(zoo):
    models = load_models(zoo["llama"], zoo["gauss_llama"], device="cpu")
    prompt_ids = encode_prompt(models.tokenizer, PROMPTS[0], chat=True)

    def steps(seed: int, global_seed: int, refine: str = "parallel"):
        torch.manual_seed(global_seed)  # the sampler must not read the global generator
        cfg = DecodeConfig(drafts=4, steps=3, block=8, seed=seed, refine=refine, max_new_tokens=10)
        return [tr.steps for tr in run(models, prompt_ids, cfg)[0][1:]]

    first = steps(seed=5, global_seed=0)
    assert steps(seed=5, global_seed=1) == first
    assert steps(seed=5, global_seed=2, refine="serial") == first  # one noise draw, whichever forward layout
    assert steps(seed=6, global_seed=0) != first


def test_drafts_come_from_independent_noise_and_hold_no_special_tokens(zoo):
    models = load_models(zoo["llama"], zoo["gauss_llama"], device="cpu")
    banned = set(models.tokenizer.all_special_ids) - stop_token_ids(models)
    prompt_ids = encode_prompt(models.tokenizer, PROMPTS[0], chat=True)
    traces, _ = run(models, prompt_ids, DecodeConfig(drafts=4, steps=2, block=6, max_new_tokens=10))
    assert len(traces) > 1
    for tr in traces[1:]:
        assert tr.steps[-1].tokens == tr.drafts
        # every position shows its nearest token and confidence at every step (nothing stays masked)
        assert all(tok >= 0 for step in tr.steps for row in step.tokens for tok in row)
        assert all(0.0 < c <= 1.0 for step in tr.steps for row in step.confidence for c in row)
        assert len(set(tr.steps[0].confidence)) == 4  # four rows, four different noises
        assert not banned & {tok for d in tr.drafts for tok in d}


def test_noise_process_and_ddim_ends():
    generator = torch.Generator().manual_seed(0)
    clean, noise = torch.randn(2, 5, 16, generator=generator), torch.randn(2, 5, 16, generator=generator)
    assert signal_share(torch.tensor(0.0)) == 1.0 and signal_share(torch.tensor(1.0)) < 1e-12
    torch.testing.assert_close(add_noise(clean, noise, torch.zeros(2, 5)), clean)
    torch.testing.assert_close(add_noise(clean, noise, torch.ones(2, 5)), noise)
    assert noise_levels(4) == [1.0, 0.75, 0.5, 0.25, 0.0]
    # DDIM with the true clean signal recovers the same noise: stepping t -> t' equals noising clean at t' directly
    x = add_noise(clean, noise, torch.full((2, 5), 0.75))
    torch.testing.assert_close(ddim_step(x, clean, 0.75, 0.25), add_noise(clean, noise, torch.full((2, 5), 0.25)))
    torch.testing.assert_close(ddim_step(x, clean, 0.75, 0.0), clean)


def test_eval_compares_drafters_turn_by_turn_with_their_own_results(zoo):
    models = {name: load_models(zoo["llama"], zoo[name], device="cpu") for name in ("drafter_llama", "gauss_llama")}
    prompts = [Prompt(f"prompt-{i}", p, chat=True) for i, p in enumerate(PROMPTS)]
    measured = evaluate_run(models, prompts, [(2, 2, 4)], max_new_tokens=12)
    scores = drafter_scores(measured, len(prompts))
    cfg = DecodeConfig(drafts=2, steps=2, block=4, max_new_tokens=12)
    plain = [m for m in measured.measurements if m.setting.method == XPRESS_NONE]
    for name, m in models.items():
        alone = [run(m, p.ids(m.tokenizer), cfg)[1] for p in prompts]  # taking turns changes nothing
        rounds = sum(r.rounds for r in alone)
        (score,) = scores[name]
        assert score.tau == pytest.approx(sum(sum(r.accept_lens) + r.rounds for r in alone) / rounds)
        assert (score.drafts, score.steps, score.block, score.prompts) == (2, 2, 4, 2)
        # The timings are the measured calls' own: the engine's draft timer per drafting round, and tokens per second.
        calls = [c for c in measured.measurements if c.setting.drafter == name]
        assert [c.outcome.token_ids for c in calls] == [r.token_ids for r in alone]
        draft_s = sum(c.outcome.draft_s for c in calls)
        assert score.draft_ms_per_round == pytest.approx(1000 * draft_s / rounds)
        assert score.tokens_per_s == pytest.approx(sum(c.new_tokens for c in calls) / sum(c.time_s for c in calls))
        assert score.plain_tokens_per_s == pytest.approx(
            sum(c.new_tokens for c in plain) / sum(c.time_s for c in plain)
        )


def test_eval_cli_wants_one_out_file_per_drafter(capsys):
    assert main(["train", "eval", "--drafter", "a", "b", "--out", "a.json"]) == 2
    assert "one file per drafter" in capsys.readouterr().err


def test_clean_embeddings_have_the_configured_rms(zoo):
    drafter = load_models(zoo["llama"], zoo["gauss_llama"], device="cpu").drafter.model
    tokens = torch.arange(5, 45)[None]
    for rms in (1.0, 0.125):
        drafter.config.clean_rms = rms
        rms_seen = drafter.token_embeddings(tokens).pow(2).mean(-1).sqrt()
        torch.testing.assert_close(rms_seen, torch.full((1, 40), rms), rtol=1e-2, atol=0)  # up to the norm eps
    with pytest.raises(ValueError, match="clean_rms"):
        XpressDrafterConfig(noise="gaussian", clean_rms=0.0)
