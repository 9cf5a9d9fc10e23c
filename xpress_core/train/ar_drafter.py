"""Step 5: the classic autoregressive drafter, a 1-2 layer ``LlamaForCausalLM`` with the target's tokenizer.

Distilled on the same target-written sequences as the diffusion drafter (sequence-level distillation), starting
from the target's token embedding, so the baseline gets the same data and the same head start.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from .drafter import distillation_loss
from .loop import TrainConfig, draw_rows, save_trained, split_held_out, train
from .target import lm_loss


def make_ar_drafter(target, layers: int) -> LlamaForCausalLM:
    tcfg = target.config
    hidden = target.get_input_embeddings().weight.shape[1]
    heads = tcfg.num_attention_heads
    model = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=tcfg.vocab_size,
            hidden_size=hidden,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=getattr(tcfg, "num_key_value_heads", None) or heads,
            intermediate_size=getattr(tcfg, "intermediate_size", None) or 4 * hidden,
            max_position_embeddings=getattr(tcfg, "max_position_embeddings", None)
            or getattr(tcfg, "n_positions", 2048),
            tie_word_embeddings=True,
            bos_token_id=tcfg.bos_token_id,
            eos_token_id=tcfg.eos_token_id,
            pad_token_id=tcfg.pad_token_id,
        )
    )
    with torch.no_grad():
        model.get_input_embeddings().weight.copy_(target.get_input_embeddings().weight)
    model.generation_config.eos_token_id = target.generation_config.eos_token_id
    model.generation_config.pad_token_id = target.generation_config.pad_token_id
    return model


def soft_lm_loss(model, target, rows: torch.Tensor, soft: float) -> torch.Tensor:
    """Next-token loss against the target's distribution at every position (KL, mixed with the CE by ``soft``),
    the same soft labels the diffusion drafter learns from."""
    with torch.no_grad():
        target_logp = target(input_ids=rows[:, :-1]).logits.float().log_softmax(-1)
    logits = model(input_ids=rows[:, :-1]).logits
    return distillation_loss(logits, rows[:, 1:], target_logp, soft).mean()


def train_ar_drafter(
    model,
    seqs: torch.Tensor,
    cfg: TrainConfig,
    workdir: Path,
    out_dir: Path,
    tokenizer,
    target=None,
    soft: float = 0.0,
    distillation: dict | None = None,
) -> dict:
    """``soft`` > 0 (with the frozen ``target``): learn the target's distributions, not only its tokens.
    ``distillation``: the settings that wrote ``seqs`` (``distill.distillation_record``), kept in the summary."""
    held_out, train_seqs = split_held_out(seqs)

    def loss_fn(rng: np.random.Generator) -> torch.Tensor:
        rows = draw_rows(train_seqs, rng, cfg.batch_size)
        return soft_lm_loss(model, target, rows, soft) if soft > 0 else lm_loss(model, rows)

    def eval_fn() -> dict:
        with torch.no_grad():
            return {"heldout_loss": round(lm_loss(model, held_out).item(), 4)}

    summary = train(model, loss_fn, cfg, workdir, eval_fn=eval_fn, desc="ar-drafter")
    summary |= eval_fn()
    summary["recipe"] = {"soft": soft, "batch_size": cfg.batch_size}
    summary["distillation"] = distillation
    return save_trained(model, tokenizer, out_dir, summary)
