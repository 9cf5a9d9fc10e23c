"""Smoke run of every training step on a tiny slice: losses go down, checkpoints resume, outputs load and decode."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from xpress_core.config import DecodeConfig
from xpress_core.engine import decode
from xpress_core.models import encode_prompt, load_models
from xpress_core.train.corpus import render_chat

ROOT = Path(__file__).resolve().parent.parent

DIALOGUE = """User: I want to book a table for two at an Italian restaurant tonight.
Assistant: What time would you like to book?
User: Seven thirty please.
Assistant: Your table for two is booked at seven thirty.
"""
CHAT = """A: Do you like football?
B: Yes, I watch every game on Sunday.
"""
STORY = "Once upon a time, a little dog named Max found a red ball. He played with it all day and was happy."


def make_data(root: Path) -> Path:
    for folder, name, text in [
        ("sgd", "sgd_train.txt", (DIALOGUE + "\n") * 40),
        ("sgd", "sgd_dev.txt", (DIALOGUE + "\n") * 5),
        ("topical_chat", "topical_chat_AB.txt", (CHAT + "\n") * 40),
        ("tinystories", "tinystories_a.txt", (STORY + "<|endoftext|>") * 30),
        ("tinystories", "tinystories_b.txt", (STORY + "\n\n") * 10),
    ]:
        (root / folder).mkdir(parents=True, exist_ok=True)
        (root / folder / name).write_text(text)
    return root


def train_cli(*args: str) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "xpress_core", "train", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,  # the assertion below shows stderr
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def losses(workdir: Path, key: str = "loss") -> list[float]:
    return [r[key] for r in map(json.loads, (workdir / "train_log.jsonl").read_text().splitlines()) if key in r]


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    root = tmp_path_factory.mktemp("pipeline")
    data = make_data(root / "data")
    out = {"root": root}
    out["tokenizer"] = train_cli("tokenizer", "--data", str(data), "--vocab-size", "400", "--out", str(root / "tok"))
    out["corpus"] = train_cli(
        "corpus", "--data", str(data), "--tokenizer", str(root / "tok"), "--out", str(root / "corpus")
    )
    common = [
        "--tokenizer",
        str(root / "tok"),
        "--corpus",
        str(root / "corpus"),
        "--workdir",
        str(root / "tw"),
        "--out",
        str(root / "target"),
        "--batch-size",
        "8",
        "--seq-len",
        "64",
        "--hidden-size",
        "64",
        "--layers",
        "2",
        "--intermediate-size",
        "128",
        "--lr",
        "3e-3",
    ]
    out["target_half"] = train_cli("target", *common, "--steps", "40")  # stops at 40: a checkpoint to resume from
    out["target"] = train_cli("target", *common, "--steps", "80")
    for name, step, extra in (
        ("drafter", "drafter", ["--block", "8"]),
        ("gauss", "drafter", ["--block", "8", "--noise", "gaussian"]),
        ("ar-drafter", "ar-drafter", []),
    ):
        args = [
            "--target",
            str(root / "target"),
            "--data",
            str(root / "corpus"),
            "--distill-dir",
            str(root / "distill"),
            "--workdir",
            str(root / f"{name}_w"),
            "--out",
            str(root / name),
            "--sequences",
            "128",
            "--prompt-len",
            "24",
            "--new-tokens",
            "40",
            "--steps",
            "60",
            "--batch-size",
            "8",
            "--lr",
            "3e-3",
        ]
        out[name] = train_cli(step, *args, *extra)
    return out


def test_tokenizer_round_trips_and_renders_the_chat_template(pipeline):
    tok = AutoTokenizer.from_pretrained(pipeline["root"] / "tok")
    text = "User asked: book 2 tables at 7:30pm, café Ünïcode!"
    assert tok.decode(tok(text, add_special_tokens=False)["input_ids"]) == text
    chat = [{"role": "user", "content": "Hi there"}, {"role": "assistant", "content": "Hello!"}]
    assert tok.apply_chat_template(chat, tokenize=False) == render_chat(chat)
    rendered = tok.apply_chat_template(chat[:1], tokenize=False, add_generation_prompt=True)
    assert rendered == "<|bos|><|user|>Hi there<|end|><|assistant|>"
    ids = tok(rendered, add_special_tokens=False)["input_ids"]
    assert ids[0] == tok.bos_token_id and tok.convert_ids_to_tokens(ids[-1]) == "<|assistant|>"


def test_corpus_holds_out_the_dev_split(pipeline):
    stats = pipeline["corpus"]
    assert stats["train_tokens"] > 5 * stats["val_tokens"] > 0
    assert stats["documents"] == 40 + 40 + 30 + 10


def test_target_loss_goes_down_and_resumes(pipeline):
    root = pipeline["root"]
    assert pipeline["target_half"]["steps"] == 40 and pipeline["target"]["resumed_from"] == 40
    log = losses(root / "tw")
    assert log[-1] < log[0] - 1.0
    assert pipeline["target"]["val_loss_sgd_dev"] < 5.0
    model = AutoModelForCausalLM.from_pretrained(root / "target")
    assert model.config.architectures == ["LlamaForCausalLM"]


def test_drafters_train_and_decode_exactly(pipeline):
    root = pipeline["root"]
    for name in ("drafter", "gauss", "ar-drafter"):
        assert losses(root / f"{name}_w")[-1] < losses(root / f"{name}_w")[0], name
    assert json.loads((root / "gauss" / "config.json").read_text())["noise"] == "gaussian"
    for drafter in (root / "drafter", root / "gauss", root / "ar-drafter"):
        models = load_models(root / "target", drafter, device="cpu")
        prompt = encode_prompt(models.tokenizer, "I want to book a table", chat=True)
        ref = models.target.generate(prompt, max_new_tokens=20, do_sample=False)[0, prompt.shape[1] :].tolist()
        result = list(decode(models, prompt, DecodeConfig(drafts=2, steps=2, block=8, max_new_tokens=20)))[-1]
        assert list(result.token_ids) == ref


def test_card_counts_every_training_stage_of_a_continued_drafter():
    from xpress_core.train.cards import training_time

    first = {"steps": 2400, "wall_s": 1800.0}
    assert training_time(first) == "2400 steps, 30 min of wall time"
    continued = {"steps": 2000, "wall_s": 1200.0, "continued_from": first}
    assert training_time(continued) == "4400 steps in 2 runs (2400 + 2000), 50 min of wall time"
