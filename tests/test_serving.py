"""Our DFlash-format drafter served by vLLM (scripts/serve_vllm.py), against HF ``generate`` and xPress.

vLLM lives in a venv of its own (README, "Serving at scale"), which the project never needs: these tests run where
``XPRESS_VLLM_PYTHON`` names that venv's python, and are skipped, saying so, elsewhere (CI among them: the venv is
3.5 GB and the run minutes long). The shipped drafter's serving-safe shape is checked everywhere.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

from scripts.round_stages import ROUND_EVENT, round_stages
from scripts.serve_vllm import group_ended, process_group
from xpress_core import engine as engine_module
from xpress_core import verify as verify_module
from xpress_core.config import DecodeConfig
from xpress_core.drafters.base import NoDrafter
from xpress_core.models import Models, encode_prompt, load_models
from xpress_core.tree import build_tree

ROOT = Path(__file__).resolve().parent.parent
DRAFTER = ROOT / "assets" / "drafter_dflash"
VLLM_PYTHON = os.environ.get("XPRESS_VLLM_PYTHON")
needs_vllm = pytest.mark.skipif(
    not VLLM_PYTHON,
    reason="vLLM is not installed here: set XPRESS_VLLM_PYTHON to the python of its venv (README, Serving at scale)",
)


def test_the_shipped_dflash_drafter_is_read_alike_by_both_engines():
    """What vLLM reads differently from transformers is kept out of the shipped drafter: it does not tap the
    target's last layer, and its layers' key norms are one (vLLM's CPU backend applies the first layer's to all)."""
    config = json.loads((DRAFTER / "config.json").read_text())
    target_layers = json.loads((ROOT / "assets" / "target" / "config.json").read_text())["num_hidden_layers"]
    assert config["architectures"] == ["DFlashDraftModel"]
    assert target_layers - 1 not in config["dflash_config"]["target_layer_ids"]
    weights = load_file(DRAFTER / "model.safetensors")
    norms = [weights[f"layers.{i}.self_attn.k_norm.weight"] for i in range(config["num_hidden_layers"])]
    assert len(norms) >= 2 and all(n.equal(norms[0]) for n in norms)


def test_group_ended_waits_for_a_process_that_outlives_its_group_leader():
    """vLLM's side is timed against only once its whole process group is gone: a child left running by the group's
    leader (as an engine-core process could be) is waited for, and counted."""
    leader = subprocess.Popen(["sh", "-c", "sleep 1.5 & exit 0"], start_new_session=True)
    assert leader.wait() == 0
    assert group_ended(leader.pid) == 1
    assert not [p for p in Path("/proc").iterdir() if p.name.isdigit() and process_group(p) == leader.pid]


def test_group_ended_kills_what_outlives_the_grace():
    leader = subprocess.Popen(["sh", "-c", "sleep 60 & exit 0"], start_new_session=True)
    leader.wait()
    assert group_ended(leader.pid, grace_s=0.5) == 1


def test_round_stages_account_for_the_round_and_leave_the_engine_as_it_was():
    """The stages of a round (each wrapped function's wall time) lie within the round's own trace time, a plain step
    spends most of its time in the target's forward, the drafter's round drafts; the wrappers are gone afterwards."""
    models = load_models(device="cpu", dtype="float32")
    prompts = [encode_prompt(models.tokenizer, text, chat=True) for text in ("Tell me a story.", "Book a table.")]
    cfg = DecodeConfig(drafts=1, steps=1, block=4, diversity="none", max_new_tokens=12)
    plain = Models(models.target, models.tokenizer, NoDrafter())
    found = round_stages({"plain": (plain, cfg), "chain": (models, cfg)}, prompts)
    for stages in found.values():
        whole = stages.pop("round (its trace's draft + verify + other)")
        rest = stages.pop("not wrapped")
        stages.pop(ROUND_EVENT)
        assert whole > 0 and rest >= -0.05 * whole and sum(stages.values()) <= 1.05 * whole, stages
        assert stages["verify forward"] > 0.3 * whole, stages
    assert found["chain"]["drafter draft"] > 20 * found["plain"]["drafter draft"], found
    assert "draft" not in vars(models.drafter) and "commit" not in vars(models.drafter)
    assert engine_module.build_tree is build_tree and verify_module.target_forward.__name__ == "target_forward"


@needs_vllm
def test_vllm_cpu_key_norm_bug_is_still_there():
    """vLLM's CPU ``rms_norm`` over stacked layers applies the first layer's weight to every layer
    (scripts/vllm_key_norm_bug.py). When this fails, vLLM fixed it: the tied key norms of ``train drafter --format
    dflash`` (``tie_key_norms``) are no longer needed for a CPU."""
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu"}
    proc = subprocess.run(
        [VLLM_PYTHON, str(ROOT / "scripts" / "vllm_key_norm_bug.py")],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert found["max_error"] > 1.0 and found["max_error_against_first_layers_weight"] < 1e-5, found


@needs_vllm
def test_vllm_serves_our_drafter_with_generates_outputs_and_xpress_acceptance(tmp_path):
    """Greedy fp32 on held-out chats: vLLM plain, vLLM with the drafter and xPress give ``generate``'s tokens, and one
    chain of the drafter's drafts get as many tokens accepted a round in both engines (within 5 %, per position too),
    scored by one rule against the reply (vLLM's own counter also counts what a last round accepted past the stop)."""
    out = tmp_path / "serve.json"
    cmd = [sys.executable, "-m", "scripts.serve_vllm", "--vllm-python", VLLM_PYTHON, "--prompts", "8"]
    cmd += ["--max-new-tokens", "48", "--concurrency", "1", "--out", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1800, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    # fp32 engines give generate's tokens exactly; xPress's default runs in the dtype --dtype auto chose here, which
    # in bf16 gives them up to rounding (docs/DESIGN.md §2.5)
    exact = result["default_dtype"]["dtype"] == "float32"
    equal = {name: same for name, same in result["outputs_equal_generate"].items() if exact or name != "xpress default"}
    assert all(equal.values()), result["prompts_that_differ"]
    # equal terms: one thread each (the command's --threads default), no process of vLLM's left while xPress is timed
    assert result["threads"] == {"xpress": 1, "vllm": 1}
    assert result["vllm_processes_outlived_its_side"] == 0
    per_round, per_position = result["accepted_per_round"], result["accepted_per_position"]
    ours, theirs = per_round["xpress, one rule"], per_round["vllm, one rule"]
    assert abs(theirs - ours) <= 0.05 * ours, per_round
    # On a CPU with native bf16 xPress's drafter runs in bf16 beside the fp32 target (models.drafter_dtype) where
    # vLLM's runs in fp32: a few rounds draft other tokens, so each engine's share of a position may move by one of
    # its own rounds
    one_round = 1 / result["rounds"]["xpress"] + 1 / result["rounds"]["vllm"]
    for a, b in zip(per_position["xpress, one rule"], per_position["vllm, one rule"], strict=True):
        assert abs(a - b) <= max(0.05 * max(a, 0.05), one_round + 1e-9), per_position
