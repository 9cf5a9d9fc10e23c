"""Loading targets and drafters (embedded assets, local directories, Hub ids), with clear errors for mismatches.

Nothing here runs at import time; every loader is called by the CLI, the app, the benchmark or a test.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from .drafters.autoregressive import AutoregressiveDrafter
from .drafters.base import Drafter, NoDrafter
from .drafters.diffusion import DiffusionDrafter
from .drafters.diffusion_model import XpressDrafter, XpressDrafterConfig, default_tapped_layers
from .engine import Models, stop_token_ids
from .errors import XpressError

ASSETS = Path(__file__).resolve().parent.parent / "assets"
EMBEDDED_TARGET = ASSETS / "target"
EMBEDDED_DRAFTER = ASSETS / "drafter"
EMBEDDED_AR_DRAFTER = ASSETS / "ar_drafter"
NO_DRAFTER = "none"


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise XpressError(f"device {device!r} requested but CUDA is not available")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    choices = {
        "float32": torch.float32,
        "fp32": torch.float32,
        "bfloat16": torch.bfloat16,
        "bf16": torch.bfloat16,
        "float16": torch.float16,
        "fp16": torch.float16,
    }
    if dtype not in choices:
        raise XpressError(f"unknown dtype {dtype!r}; choose one of auto, {', '.join(choices)}")
    return choices[dtype]


def looks_like_path(spec: str) -> bool:
    return spec.startswith((".", "/", "~")) or Path(spec).exists()


def _describe_missing(kind: str, spec: str, error: Exception) -> XpressError:
    if looks_like_path(spec) and not Path(spec).expanduser().exists():
        return XpressError(f"{kind} {spec!r}: directory does not exist")
    reason = str(error).splitlines()[0] if str(error) else type(error).__name__
    return XpressError(f"{kind} {spec!r} could not be loaded (not a model directory, nor a reachable Hub id): {reason}")


def load_tokenizer(spec: str):
    try:
        return AutoTokenizer.from_pretrained(spec)
    except (OSError, ValueError) as error:
        raise _describe_missing("tokenizer for", spec, error) from error


def load_causal_lm(kind: str, spec: str, device: torch.device, dtype: torch.dtype):
    try:
        model = AutoModelForCausalLM.from_pretrained(spec, dtype=dtype)
    except (OSError, ValueError) as error:
        raise _describe_missing(kind, spec, error) from error
    return freeze(model.to(device))


def load_target(spec: str | Path, device: torch.device, dtype: torch.dtype):
    spec = str(spec)
    return load_causal_lm("target", spec, device, dtype), load_tokenizer(spec)


def same_vocabulary(a, b) -> bool:
    return a.get_vocab() == b.get_vocab()


def check_tokenizer_match(kind: str, spec: str, target_tokenizer) -> None:
    """A drafter directory that ships a tokenizer must ship the target's."""
    if not (Path(spec) / "tokenizer_config.json").exists() and not (Path(spec) / "tokenizer.json").exists():
        return
    if not same_vocabulary(load_tokenizer(spec), target_tokenizer):
        raise XpressError(f"{kind} {spec!r} uses a different tokenizer than the target: drafts would be meaningless")


def banned_draft_ids(tokenizer, eos: set[int]) -> list[int]:
    """Special tokens never proposed in drafts; the end-of-turn/eos tokens stay draftable."""
    return sorted(set(tokenizer.all_special_ids) - eos)


def is_diffusion_drafter(spec: str) -> bool:
    config = Path(spec) / "config.json"
    return config.exists() and json.loads(config.read_text()).get("model_type") == XpressDrafterConfig.model_type


def load_drafter(spec: str | Path, target, tokenizer, device: torch.device, dtype: torch.dtype) -> Drafter:
    spec = str(spec)
    if spec == NO_DRAFTER:
        return NoDrafter()
    eos = stop_token_ids(Models(target, tokenizer, NoDrafter()))
    banned = banned_draft_ids(tokenizer, eos)
    vocab = target.get_input_embeddings().weight.shape[0]
    if is_diffusion_drafter(spec):
        check_tokenizer_match("drafter", spec, tokenizer)
        model = freeze(XpressDrafter.from_pretrained(spec, dtype=dtype).to(device))
        cfg = model.config
        hidden = target.get_input_embeddings().weight.shape[1]
        if cfg.vocab_size != vocab or cfg.hidden_size != hidden:
            raise XpressError(
                f"drafter {spec!r} was built for vocabulary {cfg.vocab_size} / hidden size {cfg.hidden_size}; "
                f"the target has {vocab} / {hidden}"
            )
        if max(cfg.tapped_layers) >= target.config.num_hidden_layers:
            raise XpressError(
                f"drafter {spec!r} taps layers {cfg.tapped_layers}; the target has only "
                f"{target.config.num_hidden_layers}"
            )
        return DiffusionDrafter(model.bind(target), banned)
    check_tokenizer_match("drafter", spec, tokenizer)
    model = load_causal_lm("drafter", spec, device, dtype)
    if model.config.vocab_size != target.config.vocab_size:
        raise XpressError(
            f"drafter {spec!r} has vocabulary size {model.config.vocab_size}, the target {target.config.vocab_size}"
        )
    return AutoregressiveDrafter(model, banned)


def freeze(model: torch.nn.Module) -> torch.nn.Module:
    """Inference only: no parameter needs a gradient, so no consumer builds autograd graphs, even one that resumes
    the decode generator on another thread (grad mode is per thread; ``torch.no_grad`` does not follow it)."""
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    return model.eval()


def load_models(
    target: str | Path = EMBEDDED_TARGET,
    drafter: str | Path = EMBEDDED_DRAFTER,
    device: str = "auto",
    dtype: str = "auto",
) -> Models:
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    target_model, tokenizer = load_target(target, dev, dt)
    return Models(target_model, tokenizer, load_drafter(drafter, target_model, tokenizer, dev, dt))


def encode_prompt(tokenizer, prompt: str | list[dict[str, str]], chat: bool) -> torch.Tensor:
    """(1, n) ids. ``chat``: the tokenizer's chat template with the generation prompt; else the raw text."""
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
    if not any(m["content"].strip() for m in messages):
        raise XpressError("the prompt is empty")
    if chat:
        if tokenizer.chat_template is None:
            raise XpressError("the target's tokenizer has no chat template; drop --chat to send raw text")
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    else:
        ids = tokenizer("".join(m["content"] for m in messages))["input_ids"]
    return torch.tensor([ids])


def init_drafter(target_spec: str | Path, out: Path, layers: int = 1, block: int = 16, seed: int = 0) -> XpressDrafter:
    """An untrained diffusion drafter sized for any HF causal-LM target (the start of training, and for tests)."""
    target, tokenizer = load_target(target_spec, torch.device("cpu"), torch.float32)
    embed = target.get_input_embeddings().weight
    tcfg = target.config
    heads = tcfg.num_attention_heads
    config = XpressDrafterConfig(
        hidden_size=embed.shape[1],
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=getattr(tcfg, "num_key_value_heads", None) or heads,
        intermediate_size=getattr(tcfg, "intermediate_size", None) or 4 * embed.shape[1],
        vocab_size=embed.shape[0],
        tapped_layers=default_tapped_layers(tcfg.num_hidden_layers),
        block_size=block,
        mask_token_id=tokenizer.mask_token_id,
        target_name_or_path=str(target_spec),
        target_num_layers=tcfg.num_hidden_layers,
        rope_theta=float(getattr(tcfg, "rope_theta", None) or 10000.0),
    )
    torch.manual_seed(seed)
    model = XpressDrafter(config)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return model
