"""The training steps' ``--device`` and ``--max-minutes``, and the prepared device run (scripts/device_run.py) as far
as a CPU can check them: a missing CUDA is refused before anything loads, the time limit stops the loop at a
checkpoint that a rerun resumes, and the script's stages and files hold together: the smoke stage first, each stage's
results written as it ends (its dry run end to end runs in CI, .ci/run: about 70 s of CPU, too long for the suite)."""

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


def test_the_device_run_sizes_fit_its_budget_and_the_toy_and_dry_runs_are_small():
    module = device_run()
    args = module.parse_args([])
    assert args.device == "cuda" and args.budget <= 8 * 60 and module.sizes_of(args) is module.FULL
    full, toy, dry = module.FULL, module.TOY, module.DRY
    assert full.decode_s + full.tests_s <= 100  # the smoke stage reports within its first minute or two
    assert full.decode_s + full.tests_s + full.bench_s + full.train_s <= args.budget
    for small in (toy, dry):  # the held-out rows (train/loop.py HELD_OUT) and one batch besides
        assert small.sequences > 64 + small.batch_size and small.steps <= 10
    dry_args = module.parse_args(["--dry-run"])
    assert dry_args.device == "cpu" and dry_args.budget == module.DRY_BUDGET_S and module.sizes_of(dry_args) is dry


def test_the_smoke_stage_runs_first_and_every_stage_is_written_as_it_ends(tmp_path, monkeypatch):
    """The stages in their order (the exact decode and the CUDA tests, then bench, then training), results.json
    holding each finished stage before the next starts; a failed one is reported and the run's exit code says so."""
    module = device_run()
    seen = []

    def command(run, stage, cmd, limit):
        done = json.loads((tmp_path / "out" / "results.json").read_text())["stages"]
        seen.append((stage, list(done)))
        return {"status": "failed" if stage == "decode" else "ok", "rc": 0, "wall_s": 0.0}

    monkeypatch.setattr(module.Run, "command", command)
    out, work = tmp_path / "out", tmp_path / "work"
    assert module.main(["--dry-run", "--out", str(out), "--work", str(work)]) == 1
    assert seen == [
        ("decode", ["environment"]),
        ("tests", ["environment", "decode"]),
        ("bench", ["environment", "decode", "tests"]),
        ("train", ["environment", "decode", "tests", "bench"]),
    ]
    assert (work / "dry_corpus" / "train.bin").stat().st_size > 0  # the dry run trains on random ids
    assert json.loads((out / "results.json").read_text())["stages"]["decode"]["status"] == "failed"


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
