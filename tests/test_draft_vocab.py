"""A drafter's draft vocabulary (drafters/draft_vocab.py, ``train draft-vocab``): drafts hold its tokens only, the
output stays the target's (HF ``generate``, plain sampling with the same seed), and the step counts the tokens the
target wrote, not the prompts' or the held-out rows'."""

from __future__ import annotations

import json

import pytest
import torch

from tests.oracles import NEW, PROMPTS, check_invariants, cli, hf_greedy, plain_sampling, run
from tests.test_refiner import with_head
from xpress_core.config import DecodeConfig
from xpress_core.drafters.diffusion_model import XpressDrafter
from xpress_core.drafters.draft_vocab import frequent_tokens, with_draft_vocab
from xpress_core.models import encode_prompt, load_models


@pytest.fixture(scope="module")
def cut(zoo, tmp_path_factory):
    """The zoo's drafter with a refiner head, drafting from every other token id only (a vocabulary that leaves out
    many of the target's own tokens, so rounds meet tokens no draft can hold)."""
    root = tmp_path_factory.mktemp("vocab")
    drafter = XpressDrafter.from_pretrained(with_head(zoo["drafter_llama"], root / "head"))
    ids = torch.arange(0, drafter.config.vocab_size, 2)
    with_draft_vocab(drafter, ids).save_pretrained(root / "cut")
    models = load_models(zoo["llama"], root / "cut", device="cpu")
    prompts = [encode_prompt(models.tokenizer, p, chat=True) for p in PROMPTS]
    return models, prompts, [hf_greedy(models, p) for p in prompts], set(ids.tolist())


@pytest.mark.parametrize("k,t,diversity", [(1, 1, "tree"), (4, 1, "tree"), (2, 3, "tree"), (3, 2, "none")])
def test_greedy_with_a_draft_vocabulary_equals_generate_and_drafts_only_its_tokens(cut, k, t, diversity):
    models, prompts, refs, vocabulary = cut
    assert models.drafter.model.config.draft_vocab == len(vocabulary)
    cfg = DecodeConfig(drafts=k, steps=t, block=6, diversity=diversity, max_new_tokens=NEW)
    for prompt_ids, ref in zip(prompts, refs):
        traces, result = run(models, prompt_ids, cfg)
        assert list(result.token_ids) == ref
        check_invariants(traces, prompt_ids.shape[1], result)
        drafted = {token for r in traces[1:] for token in r.tree_tokens[1:]}
        assert drafted and drafted <= vocabulary


@pytest.mark.parametrize("temperature,seed", [(0.8, 0), (1.2, 3)])
def test_sampled_with_a_draft_vocabulary_gives_plain_samplings_tokens_with_the_same_seed(cut, temperature, seed):
    models, prompts, _, vocabulary = cut
    cfg = DecodeConfig(temperature=temperature, seed=seed, drafts=3, steps=2, block=4, max_new_tokens=NEW)
    traces, result = run(models, prompts[1], cfg)
    assert list(result.token_ids) == plain_sampling(models, prompts[1], cfg, NEW)
    assert {token for r in traces[1:] for token in r.tree_tokens[1:]} <= vocabulary


def test_the_most_frequent_tokens_are_kept_ties_to_the_lower_id():
    written = torch.tensor([[5, 5, 5, 2, 2, 9, 9, 1]])
    assert frequent_tokens(written, 3, 12).tolist() == [2, 5, 9]
    assert frequent_tokens(written, 2, 12).tolist() == [2, 5]
    assert frequent_tokens(written, 5, 12).tolist() == [0, 1, 2, 5, 9]  # then the unseen, lowest first


def test_the_step_counts_what_the_target_wrote_outside_the_held_out_rows(zoo, tmp_path):
    """Rows of 4 prompt + 4 written tokens: the first 64 rows (held out) and every prompt hold token 7 only, which
    the training rows' written tokens hold 8 times against 3's 96 and 11's 24: the two kept are 3 and 11, and the
    held-out rows' coverage is none."""
    rows = torch.full((96, 8), 7, dtype=torch.int32)
    rows[64:, 4:] = torch.tensor([3, 3, 3, 11], dtype=torch.int32)
    rows[64:, 7] = torch.tensor([11] * 24 + [7] * 8, dtype=torch.int32)
    folder = tmp_path / "distill"
    folder.mkdir()
    torch.save(rows, folder / "chunk_00000.pt")
    (folder / "distill.json").write_text(json.dumps({"prompt_len": 4, "new_tokens": 4, "sequences": 96}))
    done = cli("train", "draft-vocab", "--drafter", str(zoo["drafter_llama"]), "--distill-dir", str(folder))
    assert done.returncode != 0 and "--size" in done.stderr  # the default 16,384 is more than this vocabulary
    out = tmp_path / "cut"
    done = cli(
        *["train", "draft-vocab", "--drafter", str(zoo["drafter_llama"]), "--distill-dir", str(folder)],
        *["--size", "2", "--out", str(out)],
    )
    assert done.returncode == 0, done.stderr[-2000:]
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    assert figures["counted_tokens"] == 32 * 4 and figures["held_out_coverage"] == 0.0
    cut_drafter = XpressDrafter.from_pretrained(out)
    assert cut_drafter.config.draft_vocab == 2 and cut_drafter.draft_ids.tolist() == [3, 11]
    assert (out / "tokenizer.json").exists() or (out / "tokenizer_config.json").exists()
