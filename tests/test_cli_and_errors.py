"""Bad input gets a clear error (CLI exit code 2, no traceback); the CLI's JSON contract holds."""

from __future__ import annotations

import json
import subprocess
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

from tests.oracles import cli
from tests.tiny import SENTENCES
from xpress_core import verdict
from xpress_core.config import DecodeConfig
from xpress_core.engine import decode
from xpress_core.errors import XpressError
from xpress_core.models import EMBEDDED_DRAFTER, EMBEDDED_TARGET, encode_prompt, init_drafter, load_models
from xpress_core.records import json_record
from xpress_core.trace import RoundTrace
from xpress_core.train.tokenizer import train_tokenizer

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    "fields,needle",
    [
        ({"drafts": 0}, "drafts K"),
        ({"drafts": 17}, "drafts K"),
        ({"block": 0}, "block L"),
        ({"block": 4, "steps": 5}, "denoise steps T"),
        ({"steps": 0}, "denoise steps T"),
        ({"drafts": 16, "block": 32, "steps": 1}, "exceeds the cap"),
        ({"temperature": -1.0}, "temperature"),
        ({"top_p": 0.0}, "top-p"),
        ({"top_k": -2}, "top-k"),
        ({"max_new_tokens": 0}, "max new tokens"),
        ({"refine": "sideways"}, "refine"),
        ({"verify": "forest"}, "verify"),
        ({"stop": ("",)}, "stop strings"),
    ],
)
def test_out_of_range_settings_are_refused(fields, needle):
    with pytest.raises(XpressError, match=needle):
        DecodeConfig(**fields).validate()


def test_empty_and_oversized_prompts(zoo):
    models = load_models(zoo["llama"], zoo["drafter_llama"], device="cpu")
    for prompt in ("", "   \n "):
        with pytest.raises(XpressError, match="empty"):
            encode_prompt(models.tokenizer, prompt, chat=True)
    long_ids = torch.tensor([[5] * 600])  # the tiny target's context is 512
    with pytest.raises(XpressError, match="context holds 512"):
        next(decode(models, long_ids, DecodeConfig()))
    with pytest.raises(XpressError, match="empty"):
        next(decode(models, torch.zeros((1, 0), dtype=torch.long), DecodeConfig()))


def test_block_longer_than_the_drafter_was_built_for(zoo):
    models = load_models(zoo["llama"], zoo["drafter_llama"], device="cpu")  # built with block 8
    prompt = encode_prompt(models.tokenizer, "hello", chat=True)
    with pytest.raises(XpressError, match="trained block size 8"):
        list(decode(models, prompt, DecodeConfig(block=12)))


def test_drafter_with_another_tokenizer_is_refused(zoo, tmp_path):
    other = train_tokenizer([s.upper() for s in SENTENCES] * 3, 300, tmp_path / "other_tok")
    drafter = tmp_path / "drafter"
    subprocess.run(["cp", "-r", str(zoo["drafter_llama"]), str(drafter)], check=True)
    other.save_pretrained(drafter)
    with pytest.raises(XpressError, match="different tokenizer"):
        load_models(zoo["llama"], drafter, device="cpu")
    ar = tmp_path / "ar"
    subprocess.run(["cp", "-r", str(zoo["ar_drafter"]), str(ar)], check=True)
    other.save_pretrained(ar)
    with pytest.raises(XpressError, match="different tokenizer"):
        load_models(zoo["llama"], ar, device="cpu")


def test_drafter_with_another_vocabulary_size_is_refused(zoo, tmp_path):
    model = LlamaForCausalLM(
        LlamaConfig(vocab_size=400, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
    )
    model.save_pretrained(tmp_path / "ar400")  # no tokenizer shipped: only the vocabulary size can be checked
    with pytest.raises(XpressError, match="vocabulary size 400"):
        load_models(zoo["llama"], tmp_path / "ar400", device="cpu")
    # A diffusion drafter built for a target with a larger (resized) vocabulary.
    wide = tmp_path / "wide"
    model = AutoModelForCausalLM.from_pretrained(zoo["llama"])
    model.resize_token_embeddings(model.config.vocab_size + 7)
    model.save_pretrained(wide)
    AutoTokenizer.from_pretrained(zoo["llama"]).save_pretrained(wide)
    init_drafter(wide, tmp_path / "wide_drafter")
    with pytest.raises(XpressError, match="built for vocabulary"):
        load_models(zoo["llama"], tmp_path / "wide_drafter", device="cpu")


def test_cli_errors_exit_2_without_traceback(zoo):
    cases = [
        (["--prompt", "", "--target", str(zoo["llama"]), "--drafter", "none"], "prompt is empty"),
        (["--prompt", "hi", "--target", "/no/such/dir", "--drafter", "none"], "does not exist"),
        (["--prompt", "hi", "--target", str(zoo["llama"]), "--drafter", "./missing_drafter"], "does not exist"),
        (["--prompt", "hi", "--target", str(zoo["llama"]), "--drafter", "none", "-L", "4", "-T", "9"], "denoise steps"),
        (["--prompt", "hi", "--target", str(zoo["llama"]), "--drafter", "none", "-K", "0"], "drafts K"),
    ]
    for args, needle in cases:
        proc = cli("generate", *args)
        assert proc.returncode == 2, proc.stderr
        assert needle in proc.stderr and "Traceback" not in proc.stderr


def test_cli_generate_json_equals_generate(zoo, tmp_path):
    log = tmp_path / "rounds.jsonl"
    proc = cli(
        "generate",
        "--prompt",
        "book a table",
        "--chat",
        "--target",
        str(zoo["llama"]),
        "--drafter",
        str(zoo["drafter_llama"]),
        "-K",
        "3",
        "-T",
        "2",
        "-L",
        "4",
        "--max-new-tokens",
        "16",
        "--dtype",
        "float32",
        "--json",
        "--log",
        str(log),
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1
    out = json.loads(lines[0])
    for key in (
        "text",
        "token_ids",
        "new_tokens",
        "rounds",
        "tau",
        "mean_accept_len",
        "accept_lens",
        "tokens_per_s",
        "time_s",
        "draft_s",
        "verify_s",
        "peak_mem_mb",
    ):
        assert key in out
    assert out["mean_accept_len"] == out["tau"] == round((sum(out["accept_lens"]) + out["rounds"]) / out["rounds"], 4)
    models = load_models(zoo["llama"], "none", device="cpu")
    prompt = encode_prompt(models.tokenizer, "book a table", chat=True)
    ref = models.target.generate(prompt, max_new_tokens=16, do_sample=False)[0, prompt.shape[1] :].tolist()
    assert out["token_ids"] == ref and out["new_tokens"] == len(ref) == 16 and out["dtype"] == "float32"
    assert out["settings"] == [[3, 2, 4]] * out["rounds"]
    assert len(out["accept_lens"]) == out["rounds"]
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(records) == out["rounds"] + 1  # the prefill round too
    assert sum(len(r["emitted_tokens"]) for r in records) == 16
    assert [t for r in records for t in r["emitted_tokens"]] == out["token_ids"]  # the log replays the reply
    assert [r["accept_len"] for r in records[1:]] == out["accept_lens"]
    assert {"round", "draft_time", "verify_time", "accept_len", "accepted_tokens", "tokens_per_s", "memory_mb"} <= set(
        records[1]
    )
    # A drafter without a refiner head: T = 2 is two denoise steps, no refinement passes to account for.
    assert out["refinement"] is None and all(r["refinement"] is None for r in records)
    assert out["over_fastest_plain"] is None  # a pinned dtype timed no plain decoding to compare with


def test_cli_generate_says_what_the_refinement_passes_bought(tmp_path):
    """The shipped drafter has a refiner head: at T = 3 the JSON, the summary line and the round log carry what its
    passes did, as ``verdict.refinement_gain`` computes it from the engine's own rounds."""
    args = ["generate", "--prompt", "Find me a flight to Boston.", "--chat", "-K", "1", "-T", "3", "-L", "8"]
    args += ["--diversity", "none", "--max-new-tokens", "48", "--dtype", "float32"]
    log = tmp_path / "rounds.jsonl"
    as_json, as_text = cli(*args, "--json", "--log", str(log)), cli(*args)
    assert as_json.returncode == 0 and as_text.returncode == 0, as_json.stderr + as_text.stderr
    models = load_models(EMBEDDED_TARGET, str(EMBEDDED_DRAFTER), device="cpu")
    prompt = encode_prompt(models.tokenizer, "Find me a flight to Boston.", chat=True)
    cfg = DecodeConfig(drafts=1, steps=3, block=8, diversity="none", max_new_tokens=48)
    traces = [e for e in decode(models, prompt, cfg) if isinstance(e, RoundTrace)]
    gain = verdict.refinement_gain(traces)
    assert json.loads(as_json.stdout)["refinement"] == json_record(asdict(gain))
    assert f"[{verdict.refinement_line(gain)}]" in as_text.stderr
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["refinement"] for r in records] == [None] + [json_record(asdict(t.refinement)) for t in traces[1:]]


def test_cli_init_drafter_writes_a_loadable_drafter(zoo, tmp_path):
    proc = cli(
        "init-drafter", "--target", str(zoo["gpt2"]), "--out", str(tmp_path / "d"), "--layers", "2", "--block", "6"
    )
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert info["block_size"] == 6
    models = load_models(zoo["gpt2"], tmp_path / "d", device="cpu")
    assert models.drafter.model.config.num_hidden_layers == 2
