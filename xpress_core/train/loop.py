"""The one training loop every pipeline step uses: cosine schedule, bf16 autocast, resumable checkpoints, a log.

A step's batch is drawn from a generator seeded by ``(seed, step)``, so a run resumed from a checkpoint sees exactly
the batches the uninterrupted run would have seen.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from .. import validation
from ..errors import XpressError

# Distilled sequences kept out of drafter training, for the held-out figures (the same rows for both drafters).
HELD_OUT = 64


@dataclass(frozen=True)
class TrainConfig:
    steps: int
    batch_size: int = 32
    seq_len: int = 256
    lr: float = 2e-3
    min_lr_ratio: float = 0.1
    warmup: int = 100
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    checkpoint_minutes: float = 3.0
    eval_every: int = 250
    seed: int = 0
    bf16: bool = True
    max_minutes: float | None = None  # stop this invocation after so long (checkpointed: a rerun resumes)
    device: str = "cpu"  # where the models and batches live: cpu, cuda or cuda:N (``training_device``)


def drafter_training(args, eval_every: int) -> TrainConfig:
    """The schedule a drafter or refiner command's options ask for (``--steps``, ``--batch-size``, ``--lr``,
    ``--no-bf16``, ``--device``): warm-up over a tenth of the steps, at most 100."""
    return TrainConfig(
        steps=args.steps,
        batch_size=args.batch_size,
        lr=args.lr,
        warmup=min(100, args.steps // 10 + 1),
        bf16=not args.no_bf16,
        eval_every=eval_every,
        device=str(training_device(args.device)),
        max_minutes=args.max_minutes,
    )


def training_device(spec: str) -> torch.device:
    """``--device`` of a training step: cpu (the default), cuda or cuda:N, refused before anything loads when this
    machine has no such device. No ``auto``: a training run says where it runs, so a resumed run stays there."""
    if spec not in ("cpu", "cuda") and not spec.startswith("cuda:"):
        raise XpressError(f"--device of a training step is cpu, cuda or cuda:N, got {spec!r}")
    validation.device(spec)  # a missing CUDA, or a cuda:N past the machine's count, is refused here
    return torch.device(spec)


def cosine_lr(cfg: TrainConfig, step: int) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    progress = min(1.0, (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup))
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def save_checkpoint(path: Path, model: torch.nn.Module, opt: torch.optim.Optimizer, step: int, wall_s: float) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step, "wall_s": wall_s}, tmp)
    os.replace(tmp, path)  # atomic: a kill mid-save never leaves a broken checkpoint


def train(
    model: torch.nn.Module,
    loss_fn: Callable[[np.random.Generator], torch.Tensor],
    cfg: TrainConfig,
    workdir: Path,
    eval_fn: Callable[[], dict] | None = None,
    desc: str = "train",
    lr_scale: Callable[[str], float] | None = None,
) -> dict:
    """Run (or resume) ``cfg.steps`` optimizer steps; ``loss_fn(rng)`` draws one batch and returns its loss.
    ``lr_scale(name)``: a parameter's learning rate over the schedule's (default 1).

    Every ``eval_every`` steps ``eval_fn()`` returns named figures, logged with the rows seen so far and the wall
    time: the run's learning curve."""
    workdir.mkdir(parents=True, exist_ok=True)
    ckpt_path = workdir / "ckpt.pt"
    log_path = workdir / "train_log.jsonl"
    params = [p for p in model.parameters() if p.requires_grad]
    groups = param_groups(model, cfg, lr_scale)
    opt = torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.95))
    step = 0
    prior_wall = 0.0  # training seconds spent before a resume, so the model card reports the whole run
    if ckpt_path.exists():
        state = torch.load(ckpt_path, map_location="cpu", weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        for group, ours in zip(opt.param_groups, groups):  # the scales asked for now, not the checkpoint's
            group["scale"] = ours["scale"]
        step = state["step"]
        prior_wall = state.get("wall_s", 0.0)
    (workdir / "train_config.json").write_text(json.dumps(asdict(cfg), indent=2))
    model.train()
    last_save = time.time()
    started = time.time()
    start_step = step
    bar = tqdm(total=cfg.steps, initial=step, desc=desc, mininterval=5)
    with log_path.open("a") as log:
        while step < cfg.steps and not out_of_time(cfg, started):
            for group in opt.param_groups:
                group["lr"] = cosine_lr(cfg, step) * group["scale"]
            rng = np.random.default_rng([cfg.seed, step])
            with torch.autocast(torch.device(cfg.device).type, dtype=torch.bfloat16, enabled=cfg.bf16):
                loss = loss_fn(rng)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
            opt.step()
            opt.zero_grad(set_to_none=True)
            step += 1
            bar.update(1)
            record = {"step": step, "loss": round(loss.item(), 4), "lr": opt.param_groups[0]["lr"]}
            last = step == cfg.steps or out_of_time(cfg, started)  # the curve ends with a point where the run stops
            evaluated = eval_fn is not None and (step % cfg.eval_every == 0 or last)
            if evaluated:
                model.eval()
                record |= {"rows_seen": step * cfg.batch_size, **eval_fn()}
                model.train()
            if step % 10 == 0 or evaluated:
                record["elapsed_s"] = round(prior_wall + time.time() - started, 1)
                log.write(json.dumps(record) + "\n")
                log.flush()
                bar.set_postfix(loss=record["loss"])
            if time.time() - last_save > cfg.checkpoint_minutes * 60 or last:
                save_checkpoint(ckpt_path, model, opt, step, prior_wall + time.time() - started)
                last_save = time.time()
    bar.close()
    model.eval()
    return {"steps": step, "resumed_from": start_step, "wall_s": round(prior_wall + time.time() - started, 1)}


def param_groups(model: torch.nn.Module, cfg: TrainConfig, lr_scale: Callable[[str], float] | None) -> list[dict]:
    """AdamW's groups of the trained parameters: weight decay on matrices only, each group at its learning-rate
    scale (co-training: the trained drafter slower than its new head). Matrices first, as checkpoints hold them."""
    groups: dict[tuple[float, float], list[torch.nn.Parameter]] = {}
    for name, p in model.named_parameters():
        if p.requires_grad:
            key = (cfg.weight_decay if p.dim() >= 2 else 0.0, lr_scale(name) if lr_scale else 1.0)
            groups.setdefault(key, []).append(p)
    ordered = sorted(groups.items(), key=lambda item: (-item[0][0], -item[0][1]))
    return [{"params": ps, "weight_decay": decay, "scale": scale} for (decay, scale), ps in ordered]


def out_of_time(cfg: TrainConfig, started: float) -> bool:
    """``max_minutes`` of this invocation spent: the loop stops at a checkpoint, and the step writes the model as it
    is (a rerun of the same command resumes towards ``steps``)."""
    return cfg.max_minutes is not None and time.time() - started > cfg.max_minutes * 60


def save_trained(model, tokenizer, out_dir: Path, summary: dict) -> dict:
    """Every pipeline step's output: the model and its tokenizer in HF format, and ``training_summary.json`` (with
    the parameter count) that the model cards read."""
    summary["parameters"] = sum(p.numel() for p in model.parameters())
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    (out_dir / "training_summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def split_held_out(seqs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(held-out, training) distilled sequences: the first ``HELD_OUT`` are never trained on."""
    return seqs[:HELD_OUT], seqs[HELD_OUT:]


def draw_indices(seqs: torch.Tensor, rng: np.random.Generator, batch_size: int) -> torch.Tensor:
    """A batch's distinct row indices, drawn from the step's seeded rng (so a resumed run draws the same batches)."""
    return torch.from_numpy(rng.choice(seqs.shape[0], size=batch_size, replace=False)).to(seqs.device)


def draw_rows(seqs: torch.Tensor, rng: np.random.Generator, batch_size: int) -> torch.Tensor:
    return seqs[draw_indices(seqs, rng, batch_size)]
