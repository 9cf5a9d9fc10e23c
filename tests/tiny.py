"""Tiny random models, saved with ``save_pretrained`` the way users' models are, for offline tests.

All share one small byte-level BPE tokenizer (with chat special tokens and a chat template) trained on a few
sentences, so targets, drafters and the app can be combined freely.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

from xpress_core.models import init_drafter
from xpress_core.train.tokenizer import train_tokenizer

SENTENCES = [
    "User: I want to book a table for two at an Italian restaurant tonight.",
    "Assistant: What time would you like to book? I can reserve seven or eight.",
    "Once upon a time, a little girl named Lily found a shiny red ball in the park.",
    "The weather in San Jose is sunny with a high of seventy degrees today.",
    "Please find me a flight from New York to Chicago next Friday morning.",
]


def make_tokenizer(out: Path, vocab_size: int = 320):
    return train_tokenizer(SENTENCES * 4, vocab_size, out)


def _common(tok) -> dict:
    return dict(
        vocab_size=len(tok), bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id
    )


def make_target(kind: str, tok, out: Path, seed: int = 0, layers: int = 3):
    """A tiny random target of a given family: 'llama', 'gpt2' or 'qwen3' (hidden 64)."""
    torch.manual_seed(seed)
    if kind == "llama":
        model = LlamaForCausalLM(
            LlamaConfig(
                hidden_size=64,
                num_hidden_layers=layers,
                num_attention_heads=4,
                num_key_value_heads=2,
                intermediate_size=128,
                max_position_embeddings=512,
                **_common(tok),
            )
        )
    elif kind == "qwen3":
        model = Qwen3ForCausalLM(
            Qwen3Config(
                hidden_size=64,
                num_hidden_layers=layers,
                num_attention_heads=4,
                num_key_value_heads=2,
                head_dim=16,
                intermediate_size=128,
                max_position_embeddings=512,
                **_common(tok),
            )
        )
    elif kind == "gpt2":
        model = GPT2LMHeadModel(GPT2Config(n_embd=64, n_layer=layers, n_head=4, n_positions=512, **_common(tok)))
    else:
        raise ValueError(kind)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def build_tiny_zoo(root: Path) -> dict[str, Path]:
    """tokenizer, three targets, a diffusion drafter and an AR drafter for the llama target."""
    tok = make_tokenizer(root / "tokenizer")
    zoo = {kind: make_target(kind, tok, root / kind) for kind in ("llama", "gpt2", "qwen3")}
    for kind in ("llama", "gpt2", "qwen3"):
        init_drafter(zoo[kind], root / f"drafter_{kind}", layers=1, block=8)
        zoo[f"drafter_{kind}"] = root / f"drafter_{kind}"
    zoo["ar_drafter"] = make_target("llama", tok, root / "ar_drafter", seed=1, layers=1)
    zoo["tokenizer"] = root / "tokenizer"
    return zoo
