"""The training steps' ``--device`` and ``--max-minutes``, and the prepared device run (scripts/device_run.py) as far
as a CPU can check them: a missing CUDA is refused before anything loads, the time limit stops the loop at a
checkpoint that a rerun resumes, and the script's stages and files hold together (its toy mode end to end is a manual
check, README: it takes a few minutes, too long for the suite)."""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.oracles import cli
from xpress_core.errors import XpressError
from xpress_core.train.loop import TrainConfig, out_of_time, train, training_device

ROOT = Path(__file__).resolve().parent.parent


def device_run():
    spec = importlib.util.spec_from_file_location("device_run", ROOT / "scripts" / "device_run.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses resolve their annotations there
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: --device cuda is valid here")
@pytest.mark.parametrize("step", ["refiner", "drafter", "ar-drafter"])
def test_training_on_a_missing_cuda_is_refused_before_anything_loads(step, tmp_path):
    result = cli("train", step, "--device", "cuda", "--distill-dir", str(tmp_path / "none"), "--data", str(tmp_path))
    assert result.returncode != 0
    assert "CUDA is not available" in result.stderr
    assert not (tmp_path / "none").exists()  # refused before the distillation folder was made


def test_a_training_device_is_cpu_cuda_or_cuda_n():
    assert training_device("cpu") == torch.device("cpu")
    for wrong in ("auto", "mps", "gpu", ""):
        with pytest.raises(XpressError, match="cpu, cuda or cuda:N"):
            training_device(wrong)


def test_the_loop_runs_where_the_config_says_and_stops_at_its_time_limit_with_a_checkpoint(tmp_path):
    model = torch.nn.Linear(4, 1)
    seen = []

    def loss_fn(rng):
        x = torch.from_numpy(rng.normal(size=(8, 4))).float()
        seen.append(x.device.type)
        time.sleep(0.05)
        return model(x).pow(2).mean()

    cfg = TrainConfig(steps=10_000, warmup=1, max_minutes=0.3 / 60, bf16=False)
    summary = train(model, loss_fn, cfg, tmp_path)
    assert 0 < summary["steps"] < 10_000 and set(seen) == {"cpu"}
    assert torch.load(tmp_path / "ckpt.pt", weights_only=True)["step"] == summary["steps"]  # a rerun resumes there
    assert json.loads((tmp_path / "train_config.json").read_text())["device"] == "cpu"
    resumed = train(model, loss_fn, TrainConfig(steps=summary["steps"] + 2, warmup=1, bf16=False), tmp_path)
    assert resumed["resumed_from"] == summary["steps"] and resumed["steps"] == summary["steps"] + 2
    assert not out_of_time(TrainConfig(steps=1), 0.0)  # no limit, no stop


def test_the_device_run_sizes_fit_its_budget_and_the_toy_run_is_small():
    module = device_run()
    args = module.parse_args([])
    assert args.device == "cuda" and args.budget <= 8 * 60
    full, toy = module.FULL, module.TOY
    assert full.train_s + full.tests_s < args.budget  # the bench gets what is left
    assert toy.sequences > 64 + toy.batch_size  # the held-out rows (train/loop.py HELD_OUT) and one batch besides
    assert toy.steps <= 10 and "2" in toy.bench


def test_the_device_run_skips_training_without_the_carried_corpus_and_says_how_to_get_it(tmp_path):
    module = device_run()
    args = module.parse_args(["--out", str(tmp_path / "out"), "--data", str(tmp_path / "missing"), "--toy"])
    run = module.Run(args)
    result = module.training(run, module.TOY)
    assert result["status"] == "skipped" and "--prepare" in result["reason"] and "runs/device_data" in result["reason"]
    run.record("train", result)
    assert json.loads((tmp_path / "out" / "results.json").read_text())["stages"]["train"]["status"] == "skipped"


def test_a_stage_past_its_limit_is_ended_and_reported(tmp_path):
    module = device_run()
    run = module.Run(module.parse_args(["--out", str(tmp_path)]))
    began = time.monotonic()
    result = run.command("sleep", ["sleep", "60"], 10.5)
    assert result["rc"] == "timeout" and result["status"] == "failed" and time.monotonic() - began < 30
    assert "== sleep" in (tmp_path / "device_run.log").read_text()
