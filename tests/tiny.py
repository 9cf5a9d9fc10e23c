"""Tiny random models, saved with ``save_pretrained`` the way users' models are, for offline tests.

All share one small byte-level BPE tokenizer (with chat special tokens and a chat template) trained on a few
sentences, so targets, drafters and the app can be combined freely.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import (
    BertConfig,
    BertForMaskedLM,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

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
    return {
        "vocab_size": len(tok),
        "bos_token_id": tok.bos_token_id,
        "eos_token_id": tok.eos_token_id,
        "pad_token_id": tok.pad_token_id,
    }


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
    """tokenizer, three targets, a masked diffusion drafter for each, gaussian ones for llama and qwen3, and an AR
    drafter for the llama target."""
    tok = make_tokenizer(root / "tokenizer")
    zoo = {kind: make_target(kind, tok, root / kind) for kind in ("llama", "gpt2", "qwen3")}
    for kind in ("llama", "gpt2", "qwen3"):
        init_drafter(zoo[kind], root / f"drafter_{kind}", layers=1, block=8)
        zoo[f"drafter_{kind}"] = root / f"drafter_{kind}"
    for kind in ("llama", "qwen3"):
        init_drafter(zoo[kind], root / f"gauss_{kind}", layers=1, block=8, noise="gaussian")
        zoo[f"gauss_{kind}"] = root / f"gauss_{kind}"
    zoo["ar_drafter"] = make_target("llama", tok, root / "ar_drafter", seed=1, layers=1)
    zoo["tokenizer"] = root / "tokenizer"
    return zoo


def make_masked_lm(tok, out: Path, seed: int = 2, vocab_size: int | None = None, with_tokenizer: bool = True) -> Path:
    """A tiny bidirectional masked LM (BERT) sharing the tokenizer, with its mask token: a standalone diffusion-LM
    drafter in the LLaDA/MDLM convention (no logit shift). ``with_tokenizer=False`` ships none, as MDLM does."""
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=vocab_size or len(tok),
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=512,
        pad_token_id=tok.pad_token_id,
    )
    BertForMaskedLM(config).save_pretrained(out)
    if with_tokenizer:
        tok.save_pretrained(out)
    return out


def make_dflash_drafter(target_dir: Path, out: Path, layer_ids=(0, 2), block_size: int = 9, seed: int = 3) -> Path:
    """A DFlash-format drafter checkpoint for a tiny Qwen3 target, written to the published format by hand (config
    fields and parameter names as in z-lab's *-DFlash-b16 releases), not through xPress's own classes.

    head_dim 32 with 4 heads on hidden 64 makes the explicit head_dim matter (as in Qwen3-4B)."""
    target = json.loads((Path(target_dir) / "config.json").read_text())
    hidden, heads, kv_heads, head_dim, inter, layers = 64, 4, 2, 32, 96, 1
    config = {
        "architectures": ["DFlashDraftModel"],
        "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
        "model_type": "qwen3",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "block_size": block_size,
        "dflash_config": {"mask_token_id": _mask_id(target_dir), "target_layer_ids": list(layer_ids)},
        "head_dim": head_dim,
        "hidden_act": "silu",
        "hidden_size": hidden,
        "intermediate_size": inter,
        "layer_types": ["full_attention"] * layers,
        "max_position_embeddings": 512,
        "num_attention_heads": heads,
        "num_hidden_layers": layers,
        "num_key_value_heads": kv_heads,
        "num_target_layers": target["num_hidden_layers"],
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "vocab_size": target["vocab_size"],
        "dtype": "float32",
    }
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape, scale=0.2):
        return torch.randn(*shape, generator=gen) * scale

    def norm(n):
        return 1.0 + rand(n, scale=0.1)

    tensors = {
        "fc.weight": rand(hidden, len(layer_ids) * hidden),
        "hidden_norm.weight": norm(hidden),
        "norm.weight": norm(hidden),
    }
    for i in range(layers):
        p = f"layers.{i}."
        tensors |= {
            p + "input_layernorm.weight": norm(hidden),
            p + "post_attention_layernorm.weight": norm(hidden),
            p + "self_attn.q_proj.weight": rand(heads * head_dim, hidden),
            p + "self_attn.k_proj.weight": rand(kv_heads * head_dim, hidden),
            p + "self_attn.v_proj.weight": rand(kv_heads * head_dim, hidden),
            p + "self_attn.o_proj.weight": rand(hidden, heads * head_dim),
            p + "self_attn.q_norm.weight": norm(head_dim),
            p + "self_attn.k_norm.weight": norm(head_dim),
            p + "mlp.gate_proj.weight": rand(inter, hidden),
            p + "mlp.up_proj.weight": rand(inter, hidden),
            p + "mlp.down_proj.weight": rand(hidden, inter),
        }
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    return out


def _mask_id(target_dir: Path) -> int:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(target_dir).mask_token_id


# Repository code of a toy MDLM-style model: model_type "mdlm", forward(input_ids, timesteps) returning bare logits,
# the mask being one extra last id. It stands in for kuleshov-group/mdlm-owt's own code, which is not vendored here.
TOY_MDLM_CODE = """
import torch
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel


class ToyMDLMConfig(PretrainedConfig):
    model_type = "mdlm"

    def __init__(self, vocab_size=8, hidden_dim=32, model_length=512, **kwargs):
        super().__init__(**kwargs)
        self.vocab_size, self.hidden_dim, self.model_length = vocab_size, hidden_dim, model_length


class ToyMDLM(PreTrainedModel):
    config_class = ToyMDLMConfig

    def __init__(self, config):
        super().__init__(config)
        self.embed = nn.Embedding(config.vocab_size, config.hidden_dim)
        self.position = nn.Embedding(config.model_length, config.hidden_dim)
        self.block = nn.TransformerEncoderLayer(config.hidden_dim, 2, 64, dropout=0.0, batch_first=True)
        self.sigma = nn.Linear(1, config.hidden_dim)
        self.out = nn.Linear(config.hidden_dim, config.vocab_size)
        self.post_init()

    def forward(self, input_ids, timesteps):
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        h = self.embed(input_ids) + self.position(positions) + self.sigma(timesteps[:, None].float())[:, None]
        return self.out(self.block(h))
"""


def make_remote_code_mdlm(tok, out: Path, seed: int = 4) -> Path:
    """A local directory whose model class lives in its own code file (trust_remote_code), MDLM-style: no tokenizer
    shipped, vocabulary = the target's + 1 (the mask)."""
    import importlib.util

    out.mkdir(parents=True, exist_ok=True)
    (out / "modeling_toy_mdlm.py").write_text(TOY_MDLM_CODE)
    spec = importlib.util.spec_from_file_location("toy_mdlm_for_weights", out / "modeling_toy_mdlm.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    torch.manual_seed(seed)
    model = module.ToyMDLM(module.ToyMDLMConfig(vocab_size=len(tok) + 1)).eval()
    save_file(
        {k: v.contiguous() for k, v in model.state_dict().items()}, out / "model.safetensors", metadata={"format": "pt"}
    )
    config = {
        "architectures": ["ToyMDLM"],
        "auto_map": {
            "AutoConfig": "modeling_toy_mdlm.ToyMDLMConfig",
            "AutoModelForMaskedLM": "modeling_toy_mdlm.ToyMDLM",
        },
        "model_type": "mdlm",
        "vocab_size": len(tok) + 1,
        "hidden_dim": 32,
        "model_length": 512,
    }
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out


def make_a2d_drafter(tok, out: Path, seed: int = 5) -> Path:
    """A dllm-style A2D checkpoint: Qwen3 weights and parameter names, config marked ``a2d-qwen3`` (whose class lives
    in the dllm code, named by ``auto_map``; xPress reads it into transformers' Qwen3 with the mask opened)."""
    make_target("qwen3", tok, out, seed=seed, layers=1)
    config = json.loads((out / "config.json").read_text())
    config |= {
        "model_type": "a2d-qwen3",
        "architectures": ["A2DQwen3LMHeadModel"],
        "auto_map": {"AutoModelForMaskedLM": "modeling_qwen3.A2DQwen3LMHeadModel"},
    }
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out
