"""Step 3 of the training pipeline: the chat target, a plain ``LlamaForCausalLM`` so any tool can load it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

from .corpus import load_tokens
from .loop import TrainConfig, save_trained, train
from .tokenizer import SPECIAL


@dataclass(frozen=True)
class TargetShape:
    hidden_size: int = 256
    layers: int = 6
    heads: int = 4
    kv_heads: int = 2
    intermediate_size: int = 640
    max_positions: int = 1024


def make_target(tokenizer, shape: TargetShape) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=shape.hidden_size,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        intermediate_size=shape.intermediate_size,
        max_position_embeddings=shape.max_positions,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=[
            tokenizer.convert_tokens_to_ids(SPECIAL.end_of_turn),
            tokenizer.convert_tokens_to_ids(SPECIAL.eos),
        ],
        pad_token_id=tokenizer.pad_token_id,
    )
    return LlamaForCausalLM(config)


def random_windows(tokens: np.ndarray, rng: np.random.Generator, batch: int, length: int) -> torch.Tensor:
    starts = rng.integers(0, tokens.size - length - 1, size=batch)
    return torch.from_numpy(np.stack([tokens[s : s + length + 1] for s in starts]).astype(np.int64))


def lm_loss(model, windows: torch.Tensor) -> torch.Tensor:
    logits = model(input_ids=windows[:, :-1]).logits
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), windows[:, 1:].reshape(-1))


@torch.no_grad()
def validation_loss(model, val: np.ndarray, seq_len: int, max_windows: int | None = None) -> float:
    """Mean loss per token over consecutive windows of the held-out tokens."""
    n = (val.size - 1) // seq_len
    if max_windows is not None:
        n = min(n, max_windows)
    total, count = 0.0, 0
    for start in range(0, n, 16):
        rows = [val[i * seq_len : i * seq_len + seq_len + 1] for i in range(start, min(n, start + 16))]
        windows = torch.from_numpy(np.stack(rows).astype(np.int64))
        total += lm_loss(model, windows).item() * windows[:, 1:].numel()
        count += windows[:, 1:].numel()
    return total / count


def train_target(
    tokenizer, corpus_dir: Path, workdir: Path, out_dir: Path, cfg: TrainConfig, shape: TargetShape
) -> dict:
    torch.manual_seed(cfg.seed)
    model = make_target(tokenizer, shape)
    train_tokens = load_tokens(corpus_dir / "train.bin")
    val_tokens = load_tokens(corpus_dir / "val.bin")
    if cfg.steps == 0:  # export: the latest checkpoint as it is, without training
        state = torch.load(workdir / "ckpt.pt", map_location="cpu", weights_only=True)
        model.load_state_dict(state["model"])
        model.eval()
        summary = {"steps": state["step"], "wall_s": round(state["wall_s"], 1), "exported_checkpoint": True}
        return save_target(model, tokenizer, out_dir, summary, val_tokens, cfg, state["step"])
    summary = train(
        model,
        lambda rng: lm_loss(model, random_windows(train_tokens, rng, cfg.batch_size, cfg.seq_len)),
        cfg,
        workdir,
        eval_fn=lambda: {"val_loss": round(validation_loss(model, val_tokens, cfg.seq_len, max_windows=64), 4)},
        desc="target",
    )
    return save_target(model, tokenizer, out_dir, summary, val_tokens, cfg, cfg.steps)


def save_target(model, tokenizer, out_dir: Path, summary: dict, val_tokens, cfg: TrainConfig, steps: int) -> dict:
    summary["val_loss_sgd_dev"] = round(validation_loss(model, val_tokens, cfg.seq_len), 4)
    summary["tokens_seen"] = steps * cfg.batch_size * cfg.seq_len
    model.generation_config = GenerationConfig(
        bos_token_id=model.config.bos_token_id,
        eos_token_id=model.config.eos_token_id,
        pad_token_id=model.config.pad_token_id,
    )
    return save_trained(model, tokenizer, out_dir, summary)
