"""Real-model formats, offline: tiny random models saved the way the Hub ones are, each pair against HF ``generate``.

- a DFlash-format drafter checkpoint (published config fields and parameter names) for a Qwen3 target, checked
  against an independent implementation of the published forward;
- standalone diffusion-LM drafters: a bidirectional masked LM with its mask token (no logit shift, LLaDA/MDLM
  convention), one whose mask is an extra last id (MDLM), a toy MDLM-style model loaded through remote code
  (``forward(input_ids, timesteps)``, bare logits), and a causal LM read with the shifted convention (Dream);
- the opt-ins for unknown Hub ids and remote code, and the errors for mismatched tokenizers and vocabularies.
"""

from __future__ import annotations

import json
import shutil
from collections import Counter

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from transformers import AutoTokenizer

from tests.oracles import check_invariants, hf_greedy, run
from tests.tiny import SENTENCES, make_a2d_drafter, make_dflash_drafter, make_masked_lm, make_remote_code_mdlm
from xpress_core.cli import main
from xpress_core.config import DecodeConfig
from xpress_core.drafters.diffusion import DiffusionDrafter
from xpress_core.drafters.diffusion_lm import DiffusionLMDrafter
from xpress_core.errors import XpressError
from xpress_core.hub import ModelSpec
from xpress_core.models import DrafterOptions, banned_draft_ids, encode_prompt, load_models, pretrained, resolve_drafter
from xpress_core.presets import Access, check_known, find_preset, hub_presets, known_hub_ids
from xpress_core.train.tokenizer import train_tokenizer

PROMPTS = ["I want to book a table", "Once upon a time"]
NEW = 20
SETTINGS = [
    {"drafts": 1, "steps": 1, "block": 4},
    {"drafts": 3, "steps": 2, "block": 6, "verify": "batch"},
    {"drafts": 2, "steps": 3, "block": 3, "refine": "serial", "schedule": "left-to-right"},
]


@pytest.fixture(scope="module")
def real(zoo, tmp_path_factory):
    """Drafters in the published formats, next to the session zoo's targets and tokenizer."""
    root = tmp_path_factory.mktemp("real")
    tok = AutoTokenizer.from_pretrained(zoo["tokenizer"])
    return {
        "dflash": make_dflash_drafter(zoo["qwen3"], root / "dflash"),
        "mlm": make_masked_lm(tok, root / "mlm"),
        # MDLM-style: no tokenizer shipped, one more id than the target's vocabulary, the mask being that last id.
        "mlm_extra_mask": make_masked_lm(tok, root / "mlm_extra_mask", vocab_size=len(tok) + 1, with_tokenizer=False),
        "remote_mdlm": make_remote_code_mdlm(tok, root / "remote_mdlm"),
        "a2d": make_a2d_drafter(tok, root / "a2d"),
        "root": root,
    }


PAIRS = {
    "qwen3+dflash": ("qwen3", "dflash", DrafterOptions(), DiffusionDrafter),
    "llama+masked-lm": ("llama", "mlm", DrafterOptions(), DiffusionLMDrafter),
    "qwen3+masked-lm": ("qwen3", "mlm", DrafterOptions(), DiffusionLMDrafter),
    "gpt2+masked-lm-extra-mask-id": ("gpt2", "mlm_extra_mask", "last-id", DiffusionLMDrafter),
    "llama+a2d-qwen3": ("llama", "a2d", DrafterOptions(), DiffusionLMDrafter),
    "gpt2+remote-code-mdlm": ("gpt2", "remote_mdlm", "trust", DiffusionLMDrafter),
    "llama+shifted-causal-lm": (
        "llama",
        "llama",
        DrafterOptions(kind="diffusion-lm", logit_shift=True),
        DiffusionLMDrafter,
    ),
}


def load_pair(zoo, real, name):
    target, drafter, options, drafter_class = PAIRS[name]
    drafter_dir = real[drafter] if drafter in real else zoo[drafter]
    access = Access(trust_remote_code=options == "trust")
    if options == "last-id":
        options = DrafterOptions(mask_token_id=len(AutoTokenizer.from_pretrained(zoo["tokenizer"])))
    elif options == "trust":  # MDLM's family rules: the mask is the last id, forward takes timesteps
        options = DrafterOptions()
    models = load_models(zoo[target], drafter_dir, device="cpu", drafter_options=options, access=access)
    assert type(models.drafter) is drafter_class
    return models


@pytest.mark.parametrize("name", PAIRS)
def test_pairs_greedy_equal_generate(zoo, real, name):
    models = load_pair(zoo, real, name)
    for prompt in PROMPTS:
        prompt_ids = encode_prompt(models.tokenizer, prompt, chat=True)
        ref = hf_greedy(models, prompt_ids, new=NEW)
        for setting in SETTINGS:
            traces, result = run(models, prompt_ids, DecodeConfig(max_new_tokens=NEW, **setting))
            assert list(result.token_ids) == ref, setting
            check_invariants(traces, prompt_ids.shape[1], result)
            vocab = models.target.get_input_embeddings().weight.shape[0]
            assert all(0 <= t < vocab for tr in traces for d in tr.drafts for t in d)


@pytest.fixture
def config_reads(monkeypatch) -> Counter:
    """How often the loaders read each config.json (the one reader of ``hub.py``, as ``models.pretrained`` calls it)."""
    reads: Counter = Counter()
    read = pretrained.read_config_json

    def counted(spec: str):
        reads[spec] += 1
        return read(spec)

    monkeypatch.setattr(pretrained, "read_config_json", counted)
    return reads


@pytest.mark.parametrize("name", PAIRS)
def test_loading_a_pair_reads_each_config_once(zoo, real, name, config_reads):
    """A spec is resolved once (where it lives, its kind, its config.json) and the loaders use that value: an A2D
    drafter's config is read once although it is loaded into another class than its own."""
    target, drafter, _, _ = PAIRS[name]
    load_pair(zoo, real, name)
    drafter_dir = real[drafter] if drafter in real else zoo[drafter]
    assert config_reads == Counter([str(zoo[target]), str(drafter_dir)])


def test_a_resolved_spec_says_where_what_and_its_config(zoo, real, config_reads):
    spec = resolve_drafter(real["dflash"])
    assert isinstance(spec, ModelSpec) and spec.local and spec.kind == "dflash" and spec.role == "drafter"
    assert spec.config["dflash_config"]["target_layer_ids"] == [0, 2]
    with pytest.raises(TypeError):  # read-only: loaders sharing the spec cannot change it
        spec.config["hidden_size"] = 1
    assert resolve_drafter(spec) is spec and config_reads == Counter([str(real["dflash"])])
    assert resolve_drafter("none").kind == "none" and sum(config_reads.values()) == 1


def test_logit_shift_convention(zoo, real):
    """A causal LM read with the shifted convention, left to right with T = L, drafts the target's own greedy
    continuation when it is the target: every round but the last accepts all L tokens. Read unshifted, it does not."""
    for shift in (True, False):
        models = load_models(
            zoo["llama"], zoo["llama"], device="cpu", drafter_options=DrafterOptions("diffusion-lm", logit_shift=shift)
        )
        prompt_ids = encode_prompt(models.tokenizer, PROMPTS[1], chat=True)
        cfg = DecodeConfig(drafts=1, steps=4, block=4, schedule="left-to-right", max_new_tokens=NEW)
        _, result = run(models, prompt_ids, cfg)
        assert list(result.token_ids) == hf_greedy(models, prompt_ids, new=NEW)
        full_rounds = [n == 4 for n in result.accept_lens[:-1]]
        assert all(full_rounds) if shift else not any(full_rounds)


def test_a2d_drafter_loads_without_remote_code_and_attends_both_ways(zoo, real, monkeypatch):
    """dllm's A2D config names its own class (auto_map), yet xPress reads it into transformers' Qwen3 without remote
    code; the attention must then be bidirectional: changing the last token changes the first position's logits."""
    monkeypatch.delenv("XPRESS_TRUST_REMOTE_CODE", raising=False)
    models = load_models(zoo["llama"], real["a2d"], device="cpu", access=Access())
    drafter = models.drafter
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    with torch.no_grad():
        before, after = drafter.forward(ids)[0, 0], drafter.forward(ids.index_fill(1, torch.tensor([4]), 10))[0, 0]
    assert not torch.allclose(before, after)


def rms(x, weight, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rope(x, positions, theta=10000.0):
    """Rotate-half rotary embedding; x (S, H, D)."""
    d = x.shape[-1]
    freqs = positions[:, None].float() / theta ** (torch.arange(0, d, 2).float() / d)
    cos, sin = torch.cat([freqs, freqs], -1).cos()[:, None], torch.cat([freqs, freqs], -1).sin()[:, None]
    return x * cos + torch.cat([-x[..., d // 2 :], x[..., : d // 2]], -1) * sin


def dflash_reference_logits(w: dict, config: dict, target, prompt_ids: torch.Tensor, root: int, length: int):
    """The published DFlash forward written out from the checkpoint tensors: context features from the tapped target
    layers fused by fc + hidden_norm; a block [root, mask x L] embedded by the target; per layer, queries from the
    block, keys/values from [context features, block], per-head q/k norms, rotary at absolute positions, attention
    over everything; target LM head on the final norm, block position j predicting token j."""
    n, dflash = prompt_ids.shape[1], config["dflash_config"]
    hidden_states = target(input_ids=prompt_ids, output_hidden_states=True).hidden_states
    features = torch.cat([hidden_states[i + 1][0] for i in dflash["target_layer_ids"]], -1)
    context = rms(features @ w["fc.weight"].T, w["hidden_norm.weight"])
    block = torch.tensor([root] + [dflash["mask_token_id"]] * length)
    h = target.get_input_embeddings()(block)
    d, heads, kv = config["head_dim"], config["num_attention_heads"], config["num_key_value_heads"]
    q_pos, k_pos = torch.arange(n, n + length + 1), torch.arange(n + length + 1)
    for i in range(config["num_hidden_layers"]):
        p = f"layers.{i}."
        x = rms(h, w[p + "input_layernorm.weight"])
        both = torch.cat([context, x])
        q = rope(
            rms((x @ w[p + "self_attn.q_proj.weight"].T).view(-1, heads, d), w[p + "self_attn.q_norm.weight"]), q_pos
        )
        k = rope(
            rms((both @ w[p + "self_attn.k_proj.weight"].T).view(-1, kv, d), w[p + "self_attn.k_norm.weight"]), k_pos
        )
        v = (both @ w[p + "self_attn.v_proj.weight"].T).view(-1, kv, d)
        k, v = k.repeat_interleave(heads // kv, 1), v.repeat_interleave(heads // kv, 1)
        attn = torch.softmax(torch.einsum("qhd,khd->hqk", q, k) / d**0.5, -1)
        h = h + torch.einsum("hqk,khd->qhd", attn, v).reshape(len(block), -1) @ w[p + "self_attn.o_proj.weight"].T
        x = rms(h, w[p + "post_attention_layernorm.weight"])
        h = (
            h
            + (F.silu(x @ w[p + "mlp.gate_proj.weight"].T) * (x @ w[p + "mlp.up_proj.weight"].T))
            @ w[p + "mlp.down_proj.weight"].T
        )
    return target.get_output_embeddings()(rms(h, w["norm.weight"]))[1:]


def test_dflash_checkpoint_computes_the_published_forward(zoo, real):
    models = load_pair(zoo, real, "qwen3+dflash")
    config = json.loads((real["dflash"] / "config.json").read_text())
    drafter = models.drafter
    assert drafter.tapped_layers == (0, 2) and drafter.model.config.block_size == config["block_size"] - 1
    prompt_ids = encode_prompt(models.tokenizer, PROMPTS[0], chat=True)
    root, length = 17, 8
    with torch.no_grad():
        ref = dflash_reference_logits(
            load_file(real["dflash"] / "model.safetensors"), config, models.target, prompt_ids, root, length
        )
        features = models.target(input_ids=prompt_ids, output_hidden_states=True).hidden_states
        state = drafter.start(prompt_ids, torch.cat([features[i + 1][0] for i in drafter.tapped_layers], -1))
        masked = torch.full((1, length), -1)
        ours = drafter.denoise(state, root, masked, torch.zeros_like(masked, dtype=torch.bool))[0]
    torch.testing.assert_close(ours, ref, atol=1e-4, rtol=1e-4)


def test_dflash_block_size_counts_the_root(zoo, real):
    models = load_pair(zoo, real, "qwen3+dflash")  # block_size 9 in config.json: 8 drafted positions
    prompt_ids = encode_prompt(models.tokenizer, PROMPTS[0], chat=True)
    with pytest.raises(XpressError, match="trained block size 8"):
        run(models, prompt_ids, DecodeConfig(block=9, max_new_tokens=4))


def test_masked_drafters_of_every_format_keep_their_fitted_tree_sharpness(zoo, real, tmp_path):
    """The sharpness fit runs on a DFlash checkpoint and a diffusion LM as on our drafter (leaving the drafter's own
    sharpness as it was), ``--write`` keeps it in the folder's config.json and both read it when loaded (1 when
    absent); a value that is not a number > 0 is refused by name, and so is a folder without a config.json."""
    from xpress_core.train.sharpness import fit_sharpness, write_sharpness

    for target, name in (("qwen3", "dflash"), ("llama", "mlm")):
        folder = tmp_path / name
        shutil.copytree(real[name], folder)
        models = load_models(zoo[target], folder, device="cpu")
        assert models.drafter.tree_sharpness == 1.0
        fit = fit_sharpness(models, [encode_prompt(models.tokenizer, PROMPTS[0], chat=True)], (1.0, 2.0), 6)
        assert fit.rounds == 6 and fit.sharpness in (1.0, 2.0) and models.drafter.tree_sharpness == 1.0
        write_sharpness(folder, 1.4)
        assert load_models(zoo[target], folder, device="cpu").drafter.tree_sharpness == 1.4
        config = json.loads((folder / "config.json").read_text())
        for bad in (0, -1.0, float("inf"), "sharp", True):
            (folder / "config.json").write_text(json.dumps({**config, "tree_sharpness": bad}))
            with pytest.raises(XpressError, match="tree_sharpness"):
                load_models(zoo[target], folder, device="cpu")
    with pytest.raises(XpressError, match="local drafter folder"):
        write_sharpness(tmp_path / "nowhere", 1.5)


def test_embedding_rows_beyond_the_tokenizer_are_never_drafted(zoo):
    """Qwen3's embedding has padding rows past its tokenizer, and DFlash's mask token is one of them."""
    tok = AutoTokenizer.from_pretrained(zoo["tokenizer"])
    banned = banned_draft_ids(tok, {tok.eos_token_id}, len(tok) + 5)
    assert set(range(len(tok), len(tok) + 5)) <= set(banned)
    assert tok.mask_token_id in banned and tok.eos_token_id not in banned


def test_mismatched_tokenizer_or_vocabulary_is_refused(zoo, real, tmp_path):
    other = train_tokenizer([s.upper() for s in SENTENCES] * 3, 300, tmp_path / "other_tok")
    mlm = tmp_path / "mlm_other_tok"
    shutil.copytree(real["mlm"], mlm)
    other.save_pretrained(mlm)
    with pytest.raises(XpressError, match="different tokenizer"):
        load_models(zoo["llama"], mlm, device="cpu")
    tok = AutoTokenizer.from_pretrained(zoo["tokenizer"])
    small = make_masked_lm(tok, tmp_path / "mlm_small", vocab_size=len(tok) - 10, with_tokenizer=False)
    with pytest.raises(XpressError, match=f"vocabulary size {len(tok) - 10}"):
        load_models(zoo["llama"], small, device="cpu", drafter_options=DrafterOptions(mask_token_id=tok.mask_token_id))
    wide = tmp_path / "dflash_wide"
    shutil.copytree(real["dflash"], wide)
    config = json.loads((wide / "config.json").read_text())
    (wide / "config.json").write_text(json.dumps({**config, "vocab_size": config["vocab_size"] + 7}))
    with pytest.raises(XpressError, match="built for vocabulary"):
        load_models(zoo["qwen3"], wide, device="cpu")


def test_dflash_variants_the_drafter_does_not_compute_are_refused(zoo, real, tmp_path):
    config = json.loads((real["dflash"] / "config.json").read_text())
    for change, needle in [
        ({"architectures": ["DFlash3DraftModel"]}, "loads DFlashDraftModel and DFlash2DraftModel"),
        ({"architectures": ["DFlash2DraftModel"]}, "without conv_kernel_size, conv_group_size, selector_rank"),
        ({"layer_types": ["chunked_attention"]}, r"layer_types \['chunked_attention'\]"),
        ({"output_multiplier": "2"}, "output_multiplier in its config.json must be a finite number"),
        ({"dflash_config": {"mask_token_id": 3}}, "without target_layer_ids"),
    ]:
        variant = tmp_path / f"variant{len(list(tmp_path.iterdir()))}"
        shutil.copytree(real["dflash"], variant)
        (variant / "config.json").write_text(json.dumps({**config, **change}))
        with pytest.raises(XpressError, match=needle):
            load_models(zoo["qwen3"], variant, device="cpu")


def test_unknown_hub_ids_and_remote_code_need_opt_in(zoo, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("XPRESS_ALLOW_UNKNOWN_MODELS", raising=False)
    monkeypatch.delenv("XPRESS_TRUST_REMOTE_CODE", raising=False)
    with pytest.raises(XpressError, match="--allow-unknown-models"):
        load_models("someone/unknown-model", "none", device="cpu")
    with pytest.raises(XpressError, match="--allow-unknown-models"):
        load_models(zoo["llama"], "someone/unknown-drafter", device="cpu")
    check_known("target", "someone/unknown-model", Access(allow_unknown=True))  # allowed: no error
    for preset in hub_presets():
        check_known("target", preset.target, Access())
    assert "z-lab/Qwen3-8B-DFlash-b16" in known_hub_ids() and "kuleshov-group/mdlm-owt" in known_hub_ids()
    # A local MDLM-style directory: its model code would come from the repository.
    remote = tmp_path / "remote"
    remote.mkdir()
    (remote / "config.json").write_text(
        json.dumps({"model_type": "mdlm", "auto_map": {"AutoModelForMaskedLM": "modeling_mdlm.MDLM"}, "vocab_size": 9})
    )
    with pytest.raises(XpressError, match="--trust-remote-code"):
        load_models(zoo["llama"], remote, device="cpu")
    with pytest.raises(XpressError, match="could not be loaded"):  # opted in: warned, then its code file is missing
        load_models(zoo["llama"], remote, device="cpu", access=Access(trust_remote_code=True))
    assert "WARNING: running model code" in capsys.readouterr().err
    with pytest.raises(XpressError, match="unknown preset"):
        find_preset("No such preset")
    assert find_preset("qwen3-8b-dflash") == find_preset("Qwen3-8B · DFlash drafter")
    assert len({p.key for p in hub_presets()}) == len(hub_presets())


def test_cli_refuses_an_unknown_hub_id_and_lists_presets(capsys, monkeypatch):
    monkeypatch.delenv("XPRESS_ALLOW_UNKNOWN_MODELS", raising=False)
    assert main(["generate", "--prompt", "hi", "--target", "someone/unknown-model", "--drafter", "none"]) == 2
    assert "--allow-unknown-models" in capsys.readouterr().err
    assert main(["generate", "--prompt", "hi", "--preset", "No such preset"]) == 2
    assert "unknown preset" in capsys.readouterr().err
    assert main(["presets"]) == 0
    listed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(p["name"], p["target"], p["drafter"]) for p in listed] == [
        (p.name, p.target, p.drafter) for p in hub_presets()
    ]


def test_device_map_auto_and_bfloat16_load(zoo, real):
    """The big-target loading path, on a CPU-only machine: accelerate's device_map puts the whole model on the CPU
    (one device: no dispatch hooks), and the drafter follows the target's device."""
    models = load_models(zoo["qwen3"], real["dflash"], device="cpu", device_map="auto")
    assert models.target.device.type == "cpu" and models.drafter.device == models.target.device
    prompt_ids = encode_prompt(models.tokenizer, PROMPTS[0], chat=True)
    _, result = run(models, prompt_ids, DecodeConfig(drafts=2, steps=1, block=4, max_new_tokens=NEW))
    assert list(result.token_ids) == hf_greedy(models, prompt_ids, new=NEW)
    bf16 = load_models(zoo["qwen3"], real["dflash"], device="cpu", dtype="bfloat16")
    assert bf16.target.dtype == torch.bfloat16 and bf16.drafter.model.dtype == torch.bfloat16
