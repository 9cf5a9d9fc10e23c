"""Smoke run of every training step on a tiny slice: losses go down, checkpoints resume, outputs load and decode."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from itertools import pairwise
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.oracles import hf_greedy, run
from tests.tiny import SENTENCES, make_target
from xpress_core.config import DecodeConfig
from xpress_core.drafters.diffusion_model import XpressDrafter
from xpress_core.engine import decode, decode_to_end
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
        (
            "drafter",
            "drafter",
            [
                *["--block", "8", "--anchors", "8", "--full-share", "0.75", "--root-predicts-next"],
                *["--tau-prompts", "2", "--eval-data", str(data)],
            ],
        ),
        ("gauss", "drafter", ["--block", "8", "--noise", "gaussian", "--soft", "0.5", "--tau-prompts", "0"]),
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
    out["refiner"] = train_cli(
        "refiner",
        *["--target", str(root / "target"), "--drafter", str(root / "drafter"), "--distill-dir", str(root / "distill")],
        *["--workdir", str(root / "refiner_w"), "--out", str(root / "refined"), "--prompt-len", "24"],
        *["--steps", "40", "--batch-size", "8", "--rank", "16", "--anchors", "4", "--lr", "3e-3", "--eval-every", "20"],
        *["--replies-only", "--data", str(root / "corpus"), "--dialogue-rows", "8"],
        *["--co-train", "--drafter-lr", "0.1", "--drafter-weight", "1.5"],
    )
    # A large target's recipe: its features read once into the workdir, the head alone, the result kept in bf16.
    out["refiner_cached"] = train_cli(
        "refiner",
        *["--target", str(root / "target"), "--drafter", str(root / "drafter"), "--distill-dir", str(root / "distill")],
        *["--workdir", str(root / "refiner_c"), "--out", str(root / "refined_c"), "--prompt-len", "24"],
        *["--steps", "30", "--batch-size", "8", "--rank", "16", "--anchors", "4", "--lr", "3e-3", "--eval-every", "30"],
        *["--cache-features", "--soft", "0", "--target-dtype", "bf16", "--save-bf16", "--dialogue-rows", "0"],
    )
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
    assert json.loads((root / "drafter" / "config.json").read_text())["root_predicts_next"] is True
    recipes = [
        json.loads((root / name / "training_summary.json").read_text())["recipe"] for name in ("drafter", "gauss")
    ]
    assert [r["full_share"] for r in recipes] == [0.75, 0.5]
    summary = json.loads((root / "drafter" / "training_summary.json").read_text())
    evals = [
        r for r in map(json.loads, (root / "drafter_w" / "train_log.jsonl").read_text().splitlines()) if "tau" in r
    ]
    for agreement in [summary["heldout_block_agreement_T1_greedy"]] + [r["block_agreement_T1_greedy"] for r in evals]:
        assert len(agreement) == 8 and all(0 <= a <= 1 for a in agreement)
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


def test_soft_label_loss_is_the_kl_to_the_target_and_the_ce_to_the_token():
    import math

    import torch

    from xpress_core.train.drafter import distillation_loss

    target = [[2.0, 0.0, -1.0], [0.5, 0.5, 0.0]]
    drafter = [[0.0, 1.0, 0.0], [1.0, -1.0, 2.0]]
    tokens = [0, 2]

    def log_softmax(row):
        z = math.log(sum(math.exp(x) for x in row))
        return [x - z for x in row]

    kl = [sum(math.exp(a) * (a - b) for a, b in zip(log_softmax(t), log_softmax(d))) for t, d in zip(target, drafter)]
    ce = [-log_softmax(d)[tok] for d, tok in zip(drafter, tokens)]
    args = torch.tensor([drafter]), torch.tensor([tokens]), torch.tensor([target]).log_softmax(-1)
    assert distillation_loss(*args, soft=1.0)[0].tolist() == pytest.approx(kl, rel=1e-5)
    assert distillation_loss(*args, soft=0.0)[0].tolist() == pytest.approx(ce, rel=1e-5)
    mixed = [0.25 * k + 0.75 * c for k, c in zip(kl, ce)]
    assert distillation_loss(*args, soft=0.25)[0].tolist() == pytest.approx(mixed, rel=1e-5)


def test_soft_labels_of_a_block_token_come_from_the_position_before_it():
    import numpy as np
    import torch

    from xpress_core.train.drafter import TargetReading, make_blocks, soft_targets

    seqs = torch.arange(40).reshape(2, 20) % 7
    # The target's logits at position p put all their mass on the id p + 1 (a vocabulary of 21 ids).
    logits = torch.full((2, 20, 21), -30.0)
    logits[:, torch.arange(20), torch.arange(20) + 1] = 30.0
    batch = make_blocks(seqs, 5, 4, 3, np.random.default_rng(0), torch.float32)
    predicted = soft_targets(TargetReading(torch.zeros(2, 20, 1), logits), batch.positions).argmax(-1)
    roots = torch.arange(batch.positions.shape[1]) % 5 == 0
    assert torch.equal(predicted[:, ~roots], batch.positions[:, ~roots])


def test_a_share_of_training_blocks_is_masked_whole():
    import numpy as np
    import torch

    from xpress_core.train.drafter import make_blocks

    seqs = torch.arange(2 * 300).reshape(2, 300) % 50
    for share, low, high in ((1.0, 1.0, 1.0), (0.5, 0.45, 0.65), (0.0, 0.02, 0.25)):
        batch = make_blocks(seqs, 5, 8, 200, np.random.default_rng(0), torch.float32, full_share=share)
        blocks = batch.masked.view(2, 200, 9)
        assert not blocks[..., 0].any()  # the root is always given
        whole = blocks[..., 1:].all(-1).float().mean().item()
        # A block at a ratio drawn from U(0, 1] is masked whole by chance too: E[r^8] = 1/9.
        assert low <= whole <= high, (share, whole)


def test_the_drafter_step_refuses_shares_outside_0_to_1(tmp_path):
    from tests.oracles import cli

    for option in ("--full-share", "--sample-fraction"):
        failed = cli("train", "drafter", option, "1.5", "--distill-dir", str(tmp_path / "never_written"))
        assert failed.returncode != 0 and option in failed.stderr and "1.5" in failed.stderr
    assert not (tmp_path / "never_written").exists()


def test_the_drafter_step_refuses_too_few_sequences_and_a_data_folder_without_tokens(tmp_path):
    from tests.oracles import cli

    never = ("--distill-dir", str(tmp_path / "never_written"))
    failed = cli("train", "drafter", "--sequences", "64", *never)
    assert failed.returncode != 0 and "--sequences 64" in failed.stderr and "held out" in failed.stderr
    (tmp_path / "texts").mkdir()
    failed = cli("train", "drafter", "--data", str(tmp_path / "texts"), *never)
    assert failed.returncode != 0 and "without train.bin" in failed.stderr
    failed = cli("train", "drafter", "--data", str(tmp_path / "absent.txt"), *never)
    assert failed.returncode != 0 and "no such file" in failed.stderr
    failed = cli("train", "drafter", "--cache-features", "--soft", "0.5", *never)
    assert failed.returncode != 0 and "--soft 0" in failed.stderr
    assert not (tmp_path / "never_written").exists()


def test_a_foreign_chat_template_marks_where_replies_start(zoo):
    """A reply opens after the template's generation prompt, whatever the family (ChatML's is 4 tokens for SmolLM2)."""
    import numpy as np
    from transformers import AutoTokenizer

    from xpress_core.train.distill import prompt_ends, reply_marker

    tokenizer = AutoTokenizer.from_pretrained(zoo["tokenizer"])
    marker = reply_marker(tokenizer)
    chat = [{"role": "user", "content": "hello there"}, {"role": "assistant", "content": "hi"}]
    ids = np.asarray(tokenizer.apply_chat_template(chat * 3, tokenize=True, return_dict=False))
    prompted = tokenizer.apply_chat_template(chat[:1], tokenize=True, add_generation_prompt=True, return_dict=False)
    assert marker and list(prompted[-len(marker) :]) == marker
    ends = prompt_ends(ids, tokenizer, 1)
    assert len(ends) == 3 and all(list(ids[e - len(marker) : e]) == marker for e in ends)


def test_turns_keep_each_conversations_first_replies(zoo):
    """``--turns N``: prompts end only at the first N replies of each conversation of the corpus, found by the opening
    the template renders every conversation with (its default system turn for SmolLM2-like templates)."""
    import numpy as np
    from transformers import AutoTokenizer

    from xpress_core.errors import XpressError
    from xpress_core.train.distill import prompt_ends

    tokenizer = AutoTokenizer.from_pretrained(zoo["tokenizer"])
    turn = [{"role": "user", "content": "hello there"}, {"role": "assistant", "content": "hi"}]
    one, two = (list(tokenizer.apply_chat_template(turn * n, tokenize=True, return_dict=False)) for n in (3, 2))
    ids = np.asarray(one + two)  # two conversations: three replies, then two
    every = prompt_ends(ids, tokenizer, 1)
    assert len(every) == 5
    assert list(prompt_ends(ids, tokenizer, 1, turns=1)) == [every[0], every[3]]
    assert list(prompt_ends(ids, tokenizer, 1, turns=2)) == [every[0], every[1], every[3], every[4]]
    with pytest.raises(XpressError, match="--turns"):  # a bad count, or none left, is refused: never every position
        prompt_ends(ids, tokenizer, 1, turns=-1)
    with pytest.raises(XpressError, match="first 1 replies"):
        prompt_ends(ids, tokenizer, len(ids), turns=1)


def test_clean_openings_hold_their_own_conversation_only_and_read_as_it_alone(zoo):
    """``--clean-openings``: a prompt is its own conversation, padded on the left; the target continues it and reads
    it as it reads the conversation alone (the pad masked out), and no drafter block takes the pad as context."""
    import numpy as np
    import torch
    from transformers import AutoTokenizer

    from xpress_core.errors import XpressError
    from xpress_core.train.distill import (
        PAD,
        continue_batch,
        conversation_opening,
        conversation_starts,
        own_starts,
        prompt_ends,
        prompt_windows,
    )
    from xpress_core.train.drafter import make_blocks, read_target

    tokenizer = AutoTokenizer.from_pretrained(zoo["tokenizer"])
    target = AutoModelForCausalLM.from_pretrained(zoo["llama"]).eval()
    long = [
        {"role": "user", "content": "hello there, how are you today my good friend"},
        {"role": "assistant", "content": "hi"},
    ]
    short = [{"role": "user", "content": "a table"}, {"role": "assistant", "content": "yes"}]
    a, b = (list(tokenizer.apply_chat_template(chat, tokenize=True, return_dict=False)) for chat in (long, short))
    ids = np.asarray(a + b + a)
    alone = list(prompt_ends(np.asarray(b), tokenizer, 1, turns=1))
    window = prompt_ends(np.asarray(a), tokenizer, 1, turns=1)[0] - 1  # the long conversation's reply does not fit
    ends = prompt_ends(ids, tokenizer, window, turns=1, clean=True)
    assert list(ends) == [len(a) + alone[0]]
    prompts = prompt_windows(
        ids,
        ends,
        window,
        torch.device("cpu"),
        own_starts(conversation_starts(ids, conversation_opening(tokenizer)), ends),
    )
    pads = window - alone[0]
    assert pads > 0 and (prompts[0, :pads] == PAD).all() and prompts[0, pads:].tolist() == b[: alone[0]]
    rows = continue_batch(target, prompts, 6, 0.0, None)
    assert torch.equal(rows[:, pads:], greedy_without_cache(target, prompts[:, pads:], 6))
    padded, clean = read_target(target, rows, [0]), read_target(target, rows[:, pads:], [0])
    assert torch.allclose(padded.features[:, pads:], clean.features, atol=1e-5)
    assert torch.allclose(padded.logits[:, pads:], clean.logits, atol=1e-4)
    blocks = make_blocks(rows, window - 1, 2, 3, np.random.default_rng(0), torch.float32)
    assert (blocks.attention_mask[0, 0, :, :pads] == torch.finfo(torch.float32).min).all()
    assert (blocks.attention_mask[0, 0, :, pads : window - 1] == 0).all()  # the conversation itself is context
    with pytest.raises(XpressError, match="--turns"):
        prompt_ends(ids, tokenizer, window, clean=True)


def test_held_out_rows_rewritten_greedily_are_the_targets_greedy_continuations(pipeline):
    import torch

    from xpress_core.train.distill import load_distillation
    from xpress_core.train.drafter import greedy_rewritten

    target = AutoModelForCausalLM.from_pretrained(pipeline["root"] / "target").eval()
    rows = load_distillation(pipeline["root"] / "distill")[:3]  # sampled rows (the first chunk)
    rewritten = greedy_rewritten(target, rows, 24)
    assert rewritten.shape == rows.shape and torch.equal(rewritten[:, :24], rows[:, :24])
    assert torch.equal(rewritten, greedy_without_cache(target, rows[:, :24], rows.shape[1] - 24))


def greedy_without_cache(target, prompts, new_tokens: int):
    """The oracle of greedy continuations: the argmax of a full forward over the sequence so far, token by token."""
    import torch

    with torch.no_grad():
        for _ in range(new_tokens):
            prompts = torch.cat([prompts, target(prompts).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return prompts


def test_distillation_seed_and_sample_fraction_shape_the_sequences(pipeline, tmp_path):
    import torch

    from xpress_core.train.distill import DistillConfig, load_distillation, write_distillation

    target = AutoModelForCausalLM.from_pretrained(pipeline["root"] / "target").eval()
    tokenizer = AutoTokenizer.from_pretrained(pipeline["root"] / "target")
    data = [pipeline["root"] / "corpus"]
    a, b = (
        load_distillation(
            write_distillation(
                target,
                tokenizer,
                data,
                tmp_path / str(seed),
                DistillConfig(sequences=16, prompt_len=24, new_tokens=8, batch_size=4, sample_fraction=0.25, seed=seed),
            )
        )
        for seed in (0, 1)
    )
    assert not torch.equal(a[:, :24], b[:, :24])  # another seed draws other prompts
    # One chunk of four sampled, three greedy: the greedy rows are the target's greedy continuations.
    assert torch.equal(a[4:], greedy_without_cache(target, a[4:, :24], 8))


def test_a_distillation_folder_records_its_settings_summaries_keep_them_and_other_settings_are_refused(pipeline):
    from dataclasses import asdict

    from xpress_core.errors import XpressError
    from xpress_core.train.cards import distillation_text
    from xpress_core.train.distill import DistillConfig, distillation_record, write_distillation

    folder = pipeline["root"] / "distill"
    record = distillation_record(folder)
    assert record == asdict(DistillConfig(sequences=128, prompt_len=24, new_tokens=40))
    # Three training steps resumed the same folder with the same settings; each summary says how it was written.
    for name in ("drafter", "gauss", "ar-drafter"):
        summary = json.loads((pipeline["root"] / name / "training_summary.json").read_text())
        assert summary["distillation"] == record
    assert distillation_text({"distillation": record}) == "half sampled at temperature 0.8, the rest greedy"
    third = {"distillation": record | {"sample_fraction": 1 / 3}}
    assert distillation_text(third) == "33% sampled at temperature 0.8, the rest greedy"
    assert "--sample-fraction" in distillation_text({})  # a run from before the record: the command tells
    chunks = sorted(folder.glob("chunk_*.pt"))
    target = AutoModelForCausalLM.from_pretrained(pipeline["root"] / "target").eval()
    tokenizer = AutoTokenizer.from_pretrained(pipeline["root"] / "target")
    other = DistillConfig(sequences=128, prompt_len=24, new_tokens=40, sample_fraction=0.25)
    with pytest.raises(XpressError, match=r"sample_fraction 0.5 -> 0.25"):
        write_distillation(target, tokenizer, [pipeline["root"] / "corpus"], folder, other)
    assert sorted(folder.glob("chunk_*.pt")) == chunks and distillation_record(folder) == record


def test_the_drafter_run_logs_its_learning_curve(pipeline):
    from xpress_core.train.curve import curve_points, learning_curve_figure, parse_run

    log = pipeline["root"] / "drafter_w" / "train_log.jsonl"
    points = curve_points([log, log], seq_len=64)
    evals = [r for r in map(json.loads, log.read_text().splitlines()) if "tau" in r]
    assert len(points) == 2 * len(evals) >= 2
    assert [p["tau"] for p in points] == [r["tau"] for r in evals] * 2
    # A continued run's points go on where the first run stopped.
    assert points[len(evals)]["tokens_seen"] == (evals[-1]["rows_seen"] + evals[0]["rows_seen"]) * 64
    for r in evals:
        shares = r["accepted_at"]
        assert len(shares) == 8 and all(0 <= b <= a <= 1 for a, b in pairwise(shares))
        assert r["tau"] == pytest.approx(1 + sum(shares), abs=1e-3)  # tau = 1 + E[accepted] = 1 + sum P(>= j)
    figure = learning_curve_figure({"run": points, "again": points[:1]}, before_tau=1.5)
    assert list(figure.data[0].y) == [p["tau"] for p in points] and list(figure.data[1].y) == [points[0]["tau"]]
    assert [list(bar.y) for bar in figure.data[2:]] == [p["accepted_at"] for p in (points[0], points[-1], points[0])]
    assert parse_run(f"two stages={log},{log}") == ("two stages", [log, log])
    assert parse_run(str(log)) == ("drafter_w", [log])


def test_training_reads_the_features_and_logits_the_engine_decodes_with(zoo):
    import torch

    from xpress_core.engine import target_forward
    from xpress_core.models import load_models
    from xpress_core.train.drafter import read_target

    models = load_models(zoo["llama"], zoo["drafter_llama"], device="cpu")
    ids = torch.tensor([[5, 9, 14, 3, 27, 8, 11]])
    with torch.no_grad():
        logits, features = target_forward(models, ids, torch.arange(7)[None], None, None)
    reading = read_target(models.target, ids, list(models.drafter.tapped_layers))
    assert torch.equal(reading.features, features) and torch.equal(reading.logits, logits)


def test_training_blocks_get_the_logits_the_engine_drafts_with(zoo, tmp_path):
    """A block drawn in training (context strictly before its root, the token before the root fused into the inputs)
    gets the logits the engine's drafter computes for the same root after the same committed context."""
    import torch

    from xpress_core.drafters.diffusion import diffusion_drafter
    from xpress_core.models import init_drafter, load_target
    from xpress_core.train.drafter import DrafterBatch, block_inputs, context_features, per_block, read_target

    target, _ = load_target(zoo["llama"], torch.device("cpu"), torch.float32)
    drafter = init_drafter(zoo["llama"], tmp_path / "d", layers=2, block=4, fuse_previous=True).bind(target).eval()
    with torch.no_grad():
        drafter.previous_proj.weight.normal_(std=0.5)  # trained-like: the fused input must change the logits
    seq = torch.tensor([[5, 9, 14, 3, 27, 8, 11, 30, 2, 17, 21, 6, 12, 4]])
    reading = read_target(target, seq, drafter.config.tapped_layers)
    engine = diffusion_drafter(drafter, [])
    span, masked = 5, torch.tensor([[False] + [True] * 4])

    def trained_logits(root: int, fused: bool = True) -> torch.Tensor:
        allowed = torch.cat([torch.arange(14)[None] < root, torch.ones(1, span, dtype=torch.bool)], dim=1)
        mask = torch.zeros(1, 1, span, 14 + span).masked_fill(~allowed[:, None], torch.finfo(torch.float32).min)
        positions = torch.arange(root, root + span)[None]
        batch = DrafterBatch(seq[:, root : root + span], masked, masked.float(), positions, mask)
        embeds = block_inputs(drafter, batch, reading, torch.Generator())
        if not fused:
            embeds = drafter.embed_block(batch.block_ids, masked)
        logits = drafter(embeds, positions, context_features(drafter, reading.features), mask)
        return drafter.block_predictions(per_block(logits, span))[0, 0]  # (L, V)

    def drafted_logits(state, root: int) -> torch.Tensor:
        return engine.denoise(state, int(seq[0, root]), torch.zeros(1, 4, dtype=torch.long), ~masked[:, 1:])[0]

    with torch.no_grad():
        state = engine.start(seq[0, :6], reading.features[0, :6])  # the prompt's features; root 6
        assert torch.allclose(trained_logits(6), drafted_logits(state, 6), atol=1e-5)
        engine.commit(state, seq[0, 6:9], reading.features[0, 6:9])  # a round accepted 7 and 8; root 9
        assert torch.allclose(trained_logits(9), drafted_logits(state, 9), atol=1e-5)
        assert not torch.allclose(trained_logits(9), trained_logits(9, fused=False), atol=1e-3)  # really read


def test_extended_drafter_drafts_exactly_as_before_and_the_root_can_predict_the_first_token(zoo, tmp_path):
    import torch

    from xpress_core.models import init_drafter, load_target
    from xpress_core.train.drafter import extend_drafter

    target, _ = load_target(zoo["llama"], torch.device("cpu"), torch.float32)
    old = init_drafter(zoo["llama"], tmp_path / "d", layers=1, block=8, tapped_layers=[0, 2]).bind(target).eval()
    new = extend_drafter(old, [0, 1, 2], block=4, layers=3, fuse_previous=True).bind(target).eval()
    assert (new.config.tapped_layers, new.config.num_hidden_layers, new.config.block_size) == ([0, 1, 2], 3, 4)
    assert new.config.fuse_previous and not new.previous_proj.weight.any()
    h = old.config.hidden_size
    tapped = {layer: torch.randn(1, 6, h) for layer in (0, 1, 2)}  # what the target's layers would say
    features = torch.cat([tapped[0], tapped[2]], dim=-1)
    wide = torch.cat([tapped[0], tapped[1], tapped[2]], dim=-1)
    embeds = old.embed_block(torch.tensor([[4, 0, 0, 0, 0]]), torch.tensor([[False, True, True, True, True]]))
    positions = torch.arange(6, 11)[None]
    with torch.no_grad():
        before = old(embeds, positions, old.context_kv(features, torch.arange(6)[None]))
        after = new(new.with_previous(embeds, wide[:, -1:]), positions, new.context_kv(wide, torch.arange(6)[None]))
    assert torch.allclose(before, after, atol=1e-5)
    logits = torch.arange(3 * 5 * 2.0).view(3, 5, 2)  # (blocks, [root, 1..4], V)
    assert torch.equal(new.block_predictions(logits), logits[:, 1:])
    new.config.root_predicts_next = True
    assert torch.equal(new.block_predictions(logits), torch.cat([logits[:, :1], logits[:, 2:]], dim=1))


def test_the_sharpness_fit_counts_what_the_engine_accepts_round_by_round():
    """The fit's accepted tokens at each round start against the oracle, the engine's own rounds at the same
    (K, 1, L) and sharpness: wherever a round of the engine starts, the fit's count there is what it accepted.
    The embedded pair (fp32, greedy): its trained drafter gets tokens accepted, so the counts are not all zero."""
    from xpress_core.data import story_prompts
    from xpress_core.train.sharpness import FIT_BLOCK, FIT_DRAFTS, accepted_at_round_starts

    models = load_models(device="cpu")
    cfg = DecodeConfig(drafts=FIT_DRAFTS, block=FIT_BLOCK, max_new_tokens=24)
    grid, seen = (1.0, 1.5, 2.5), 0
    for prompt in story_prompts(2):
        ids = prompt.ids(models.tokenizer)
        counts = accepted_at_round_starts(models, ids, 24, cfg, grid)
        for sharpness in grid:
            models.drafter.tree_sharpness = sharpness
            traces = list(decode(models, ids, cfg))[1:-1]
            position = 0  # new tokens before the round's root
            for trace in traces:
                if position < len(counts):
                    assert counts[position][sharpness] == len(trace.accepted), (prompt.name, sharpness, position)
                    seen += len(trace.accepted)
                position += len(trace.emitted)
    assert seen > 0


def test_fitting_prompts_are_not_the_benchmarks(tmp_path):
    from xpress_core.data import FITTING_STORIES, HELD_OUT_STORIES, default_prompts, fitting_prompts

    (tmp_path / "sgd").mkdir()
    dialogues = [f"User: I need a table for {n} people.\nAssistant: For when?\nUser: Tonight.\n" for n in range(230)]
    (tmp_path / "sgd" / "sgd_dev.txt").write_text("\n".join(dialogues))
    fitting = fitting_prompts(tmp_path, chats=30, stories=4)
    names = [p.name for p in fitting]
    assert len(names) == len(set(names)) == 34 and not set(names) & {p.name for p in default_prompts(tmp_path)}
    assert [p.content[0][1] for p in fitting[30:]] == list(FITTING_STORIES[:4])
    assert not set(FITTING_STORIES) & set(HELD_OUT_STORIES)
    picked = sorted(int(n.split("-")[1]) for n in names[:30])
    assert picked[0] < 20 and picked[-1] > 200  # spread over the file, which is grouped by domain


def test_train_sharpness_writes_the_best_into_the_drafter_and_refuses_other_drafters(pipeline, tmp_path):
    import shutil

    from tests.oracles import cli

    root = pipeline["root"]
    drafter = tmp_path / "drafter"
    shutil.copytree(root / "drafter", drafter)
    common = ["--target", str(root / "target"), "--data", str(root / "data"), "--max-new-tokens", "16"]
    fit = train_cli("sharpness", *common, "--drafter", str(drafter), "--stories", "2", "--grid", "1", "3", "--write")
    assert fit["sharpness"] in (1.0, 3.0) and fit["prompts"] == 2 and fit["rounds"] > 0
    assert fit["sharpness"] == max((1.0, 3.0), key=lambda s: (fit["accepted_per_round"][str(s)], -s))
    assert json.loads((drafter / "config.json").read_text())["tree_sharpness"] == fit["sharpness"]
    assert load_models(root / "target", drafter, device="cpu").drafter.tree_sharpness == fit["sharpness"]
    for other, needle in (("gauss", "not a GaussianDiffusionDrafter"), ("ar-drafter", "AutoregressiveDrafter")):
        failed = cli("train", "sharpness", *common, "--drafter", str(root / other), "--stories", "1")
        assert failed.returncode != 0 and needle in failed.stderr, failed.stderr[-500:]
    for grid in (["0", "1"], ["1", "inf"]):
        failed = cli("train", "sharpness", *common, "--drafter", str(drafter), "--grid", *grid)
        assert failed.returncode != 0 and "--grid" in failed.stderr
    # --write needs a local folder's config.json, and says so before the fit runs
    failed = cli("train", "sharpness", *common, "--drafter", str(tmp_path / "elsewhere"), "--write")
    assert failed.returncode != 0 and "local drafter folder" in failed.stderr
    own = tmp_path / "prompts.jsonl"
    own.write_text(json.dumps({"prompt": "Once upon a time"}) + "\n" + json.dumps({"prompt": "I want to book"}) + "\n")
    fit = train_cli("sharpness", *common, "--drafter", str(drafter), "--prompts", str(own), "--grid", "1", "2")
    assert fit["prompts"] == 2 and fit["written"] is None


def test_a_refiner_head_trains_logs_a_curve_per_pass_and_decodes_exactly(pipeline):
    """``train refiner --replies-only --co-train`` on the pipeline's drafter: the loss goes down, every evaluation
    logs each pass's agreement per position (on held-out dialogues too), the config keeps the head and its measured
    pass gains, the summary the recipe it ran, and decoding with passes is the target's."""
    root = pipeline["root"]
    log = losses(root / "refiner_w")
    assert log[-1] < log[0]
    curves = [json.loads(line) for line in (root / "refiner_w" / "train_log.jsonl").read_text().splitlines()]
    evaluated = [c for c in curves if "greedy" in c]
    assert [c["step"] for c in evaluated] == [20, 40]
    passes = evaluated[-1]["greedy"]["passes"]
    assert len(passes) == 5 and all(len(p["agreement"]) == 8 and len(p["leading"]) == 8 for p in passes)
    # The ceiling: blocks' leading positions all right under teacher forcing, at most the per-position shares' sum.
    forced = evaluated[-1]["greedy"]
    assert 0 <= forced["teacher_forced_accepted"] <= sum(forced["teacher_forced"]) + 1e-3
    # The held-out dialogues' replies (from the corpus's val.bin): a curve of its own, per pass.
    assert all(len(c["dialogue_replies"]["passes"]) == 5 for c in evaluated)
    assert all(0 <= p["accepted"] <= 8 for p in evaluated[-1]["dialogue_replies"]["passes"])
    config = json.loads((root / "refined" / "config.json").read_text())
    assert config["refiner_rank"] == 16 and len(config["refiner_gains"]) == 4
    assert pipeline["refiner"]["continued_from"]["recipe"]["anchors"] == 8  # the drafter's own run, for the card
    recipe = pipeline["refiner"]["refiner_recipe"]  # co-trained: the drafter's own loss at the weight asked
    assert recipe["co_train"] and recipe["drafter_weight"] == 1.5 and recipe["drafter_lr"] == 0.1
    models = load_models(root / "target", root / "refined", device="cpu")
    prompt_ids = encode_prompt(models.tokenizer, "I want to book a table", chat=True)
    reference = models.target.generate(prompt_ids, max_new_tokens=20, do_sample=False)[0, prompt_ids.shape[1] :]
    for diversity in ("tree", "none"):
        cfg = DecodeConfig(drafts=2, steps=3, block=8, diversity=diversity, max_new_tokens=20)
        assert list(decode_to_end(models, prompt_ids, cfg).token_ids) == reference.tolist()


def test_a_refiner_head_trains_on_cached_features_and_is_stored_in_bf16(pipeline):
    """``train refiner --cache-features --soft 0 --target-dtype bf16 --save-bf16`` (SmolLM2's recipe): the training
    rows' features are read once into the workdir, the loss goes down, only the head moves, the drafter is stored in
    bf16, and decoding with passes is the target's."""
    root = pipeline["root"]
    assert json.loads((root / "refiner_c" / "features" / "features.json").read_text())["rows"] == 128 - 64
    log = losses(root / "refiner_c")
    assert log[-1] < log[0]
    assert pipeline["refiner_cached"]["refiner_recipe"]["cached_features"] is True
    refined = XpressDrafter.from_pretrained(root / "refined_c")
    assert next(refined.parameters()).dtype == torch.bfloat16 and refined.refiner is not None
    before = XpressDrafter.from_pretrained(root / "drafter", dtype=torch.bfloat16).state_dict()
    assert all(torch.equal(before[name], w) for name, w in refined.state_dict().items() if name in before)
    models = load_models(root / "target", root / "refined_c", device="cpu", dtype="float32")
    prompt_ids = encode_prompt(models.tokenizer, "I want to book a table", chat=True)
    reference = models.target.generate(prompt_ids, max_new_tokens=20, do_sample=False)[0, prompt_ids.shape[1] :]
    cfg = DecodeConfig(drafts=1, steps=3, block=8, max_new_tokens=20)
    assert list(decode_to_end(models, prompt_ids, cfg).token_ids) == reference.tolist()


def test_the_refiner_step_refuses_cached_features_with_soft_labels(tmp_path):
    from tests.oracles import cli

    failed = cli("train", "refiner", "--cache-features", "--soft", "0.5", "--distill-dir", str(tmp_path / "none"))
    assert failed.returncode != 0 and "--soft 0" in failed.stderr


def test_a_target_without_a_chat_template_trains_a_drafter_written_in_the_dflash_format(zoo, tmp_path):
    """``train drafter`` for a story model (no chat template) on a text file: the learning curve reads raw-text
    prompts (the distillation's held-out rows) instead of chats, and ``--format dflash`` writes the DFlash format,
    which xPress loads and decodes exactly with. For serving engines: the default taps leave out the target's last
    layer (engines read it differently), a last-layer tap is refused before any training, and the layers' key norms
    are one (vLLM's CPU backend applies the first layer's to all)."""
    from tests.oracles import cli

    tok = AutoTokenizer.from_pretrained(zoo["tokenizer"])
    tok.chat_template = None
    target = make_target("llama", tok, tmp_path / "story_target", layers=3)
    stories = tmp_path / "stories.txt"
    stories.write_text("\n".join(SENTENCES * 20))
    out, work = tmp_path / "drafter", tmp_path / "work"
    args = ["--target", str(target), "--data", str(stories), "--distill-dir", str(tmp_path / "distill")]
    args += ["--workdir", str(work), "--out", str(out), "--sequences", "72", "--prompt-len", "16"]
    args += ["--new-tokens", "16", "--steps", "3", "--batch-size", "4", "--block", "4", "--anchors", "4"]
    refused = cli("train", "drafter", *args, "--layers", "2", "--format", "dflash", "--taps", "0", "2")
    assert refused.returncode == 2 and "taps the target's last layer (2)" in refused.stderr, refused.stderr[-2000:]
    assert not (work / "ckpt.pt").exists()
    train_cli("drafter", *args, "--layers", "2", "--tau-prompts", "2", "--format", "dflash")
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"] and config["dflash_config"]["target_layer_ids"] == [1]
    weights = load_file(out / "model.safetensors")
    assert torch.equal(weights["layers.0.self_attn.k_norm.weight"], weights["layers.1.self_attn.k_norm.weight"])
    assert not torch.equal(weights["layers.0.self_attn.q_norm.weight"], weights["layers.1.self_attn.q_norm.weight"])
    assert any("tau" in r for r in map(json.loads, (work / "train_log.jsonl").read_text().splitlines()))
    models = load_models(target, out, device="cpu", dtype="float32")
    prompt_ids = encode_prompt(models.tokenizer, "Once upon a time", chat=False)
    _, result = run(models, prompt_ids, DecodeConfig(block=4, max_new_tokens=16))
    assert list(result.token_ids) == hf_greedy(models, prompt_ids, new=16)


def test_a_drafter_of_ours_starts_a_servable_drafter_in_the_dflash_layout(zoo):
    """``train drafter --format dflash --init`` on a drafter of ours (a learned mask, no query and key norms, the
    target's last layer tapped): the DFlash-layout drafter keeps its layers and the fusion slices of the layers both
    tap, leaves out the last layer, and is one the DFlash format holds."""
    from xpress_core.drafters.dflash_format import export_refusals, serving_taps
    from xpress_core.drafters.diffusion_model import XpressDrafter
    from xpress_core.train.drafter import in_dflash_layout

    source = XpressDrafter.from_pretrained(zoo["drafter_llama"])
    with torch.no_grad():
        for p in source.parameters():
            p.normal_()
    assert source.config.tapped_layers == [0, 1, 2] and export_refusals(source.config)
    relaid = in_dflash_layout(source, serving_taps(3))
    assert relaid.config.tapped_layers == [1] and export_refusals(relaid.config) == []
    ours, theirs = source.state_dict(), relaid.state_dict()
    assert all(torch.equal(theirs[k], v) for k, v in ours.items() if k.startswith("layers."))
    hidden = source.config.hidden_size
    assert torch.equal(theirs["fc.weight"], ours["fc.weight"][:, hidden : 2 * hidden])
    assert "mask_embedding" not in theirs and relaid.refiner is None


def test_each_parameter_learns_at_its_own_rate_and_a_resumed_run_keeps_the_rates_asked_now(tmp_path):
    """Co-training's slower drafter (``train(..., lr_scale=...)``): a part at scale 0 is left as it was, weight decay
    included, while the rest trains; resumed from the checkpoint with other scales, the new ones hold."""
    from torch import nn

    from xpress_core.train.loop import TrainConfig, train

    torch.manual_seed(0)
    model = nn.ModuleDict({"head": nn.Linear(4, 4), "body": nn.Linear(4, 4)})
    x = torch.randn(8, 4)

    def loss_fn(rng) -> torch.Tensor:
        return model["head"](model["body"](x)).pow(2).mean()

    def weights(part: str) -> list[torch.Tensor]:
        return [p.detach().clone() for p in model[part].parameters()]

    body, head = weights("body"), weights("head")
    cfg = TrainConfig(steps=3, lr=1e-2, warmup=1, bf16=False, eval_every=100)
    train(model, loss_fn, cfg, tmp_path, lr_scale=lambda name: 0.0 if name.startswith("body.") else 1.0)
    assert all(torch.equal(a, b) for a, b in zip(weights("body"), body))
    assert not any(torch.equal(a, b) for a, b in zip(weights("head"), head))
    body, head = weights("body"), weights("head")
    train(
        model, loss_fn, replace(cfg, steps=5), tmp_path, lr_scale=lambda name: 0.0 if name.startswith("head.") else 1.0
    )
    assert all(torch.equal(a, b) for a, b in zip(weights("head"), head))
    assert not any(torch.equal(a, b) for a, b in zip(weights("body"), body))


def test_reply_positions_are_those_after_the_assistant_role_up_to_the_end_of_turn():
    """``in_replies`` against a token-by-token walk over random rows; blocks open only where a reply's next token
    is drafted, and a block's positions past the turn's end weigh nothing."""
    import numpy as np

    from xpress_core.train.drafter import ReplyTokens, drafted_weights, in_replies, make_blocks, per_block

    replies = ReplyTokens(opens=3, closes=7)
    rows = torch.randint(0, 10, (6, 80), generator=torch.Generator().manual_seed(0))

    def walked(row: list[int]) -> list[bool]:
        inside, out = False, []
        for token in row:
            out.append(inside)  # a token is in a reply when one was open before it (the closing token too)
            inside = True if token == replies.opens else False if token == replies.closes else inside
        return out

    drafted = in_replies(rows, replies)
    assert drafted.tolist() == [walked(row) for row in rows.tolist()]
    blocks = make_blocks(rows, 4, 8, 5, np.random.default_rng(0), torch.float32, 1.0, drafted)
    ids = per_block(blocks.positions, 9)  # (B, M, 9): root and block positions
    assert drafted.gather(1, ids[..., 1]).all()  # every block's first token is drafted
    weights = drafted_weights(drafted, blocks.positions, 9)
    for b, m, j in np.ndindex(*weights.shape):
        expected = all(walked(rows[b].tolist())[p] for p in ids[b, m, 1 : j + 2].tolist())
        assert weights[b, m, j].item() == float(expected)


def test_reply_tokens_come_from_the_role_tokens_and_a_tokenizer_without_them_has_none():
    from types import SimpleNamespace

    from xpress_core.train.drafter import ReplyTokens, reply_tokens

    vocab = {"<|assistant|>": 6, "<|end|>": 7, "<|user|>": 5, "a": 9}
    assert reply_tokens(SimpleNamespace(get_vocab=lambda: vocab)) == ReplyTokens(opens=6, closes=7)
    plain = {"a": 0, "b": 1, "<|endoftext|>": 2}  # a raw-text target: every target-written token is drafted text
    assert reply_tokens(SimpleNamespace(get_vocab=lambda: plain)) is None


def test_no_held_out_dialogue_rows_are_continued_when_none_are_asked_or_there_is_no_validation_split(tmp_path):
    from xpress_core.train.distill import DistillConfig, held_out_dialogue_rows

    (tmp_path / "val.bin").write_bytes(b"\x01\x00" * 10)
    # Neither case reaches the target (None here): nothing to continue.
    assert held_out_dialogue_rows(None, None, [tmp_path], 0, DistillConfig()) is None
    assert held_out_dialogue_rows(None, None, [tmp_path / "elsewhere"], 8, DistillConfig()) is None


def test_a_card_says_which_distillation_a_co_training_run_read():
    """A refiner run that co-trained the drafter on other rows (``--turns 2``) is named on the card; one on the
    drafter's own rows, or a head trained on the frozen drafter, adds nothing."""
    from xpress_core.train.cards import later_distillation_text, prompts_text, refiner_stages

    own_rows = {"sequences": 64, "prompt_len": 24, "new_tokens": 8, "sample_fraction": 0.5, "temperature": 0.8}
    opening = own_rows | {"seed": 3, "turns": 2, "chunks": 4}
    drafter = {"steps": 10, "distillation": own_rows}
    head = {"steps": 5, "refiner_recipe": {"co_train": False}, "distillation": own_rows, "continued_from": drafter}

    def co_trained(rows, below):
        return {"steps": 5, "refiner_recipe": {"co_train": True}, "distillation": rows, "distilled_sequences": 64} | {
            "continued_from": below
        }

    assert prompts_text(own_rows) == "24-token prompts ending at its reply marker"
    assert prompts_text(opening) == "24-token prompts ending at one of a conversation's first 2 replies"
    assert later_distillation_text(refiner_stages(head), drafter) == ""
    assert later_distillation_text(refiner_stages(co_trained(own_rows | {"chunks": 4}, head)), drafter) == ""
    twice = co_trained(opening, co_trained(opening, head))
    text = later_distillation_text(refiner_stages(twice), drafter)
    assert text.startswith(" The last 2 refiner runs co-trained") and "first 2 replies" in text and "seed 3" in text
