"""The transformers methods (``generate``, assisted generation, prompt lookup), with the per-round facts read from
forward hooks: transformers yields no per-round events, and one target forward is one verify round there."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from itertools import pairwise
from typing import TYPE_CHECKING

import torch

from ..config import DecodeConfig
from ..errors import XpressError
from ..trace import peak_memory_mb
from .methods import HF_ASSISTED, HF_LOOKUP, BenchModels, Outcome, Setting

if TYPE_CHECKING:
    from typing_extensions import Self


@dataclass
class ForwardCall:
    cache_len: int  # tokens in the KV cache before the forward
    input_len: int
    seconds: float = 0.0


class ForwardProbe:
    """Records a module's forward calls (cache length, input length, time): transformers' ``generate`` yields no
    per-round events, and one target forward is one verify round there.

    Only calls from the thread that opened the probe count: in the app, other requests share the target.
    """

    def __init__(self, module: torch.nn.Module | None, now: Callable[[], float]):
        self.module, self.now = module, now
        self.calls: list[ForwardCall] = []
        self.handles = []
        self.started = 0.0
        self.thread = threading.get_ident()

    def __enter__(self) -> Self:
        if self.module is not None:
            self.handles = [
                self.module.register_forward_pre_hook(self.before, with_kwargs=True),
                self.module.register_forward_hook(self.after, with_kwargs=True),
            ]
        return self

    def __exit__(self, *exc) -> None:
        for handle in self.handles:
            handle.remove()

    def before(self, module, args, kwargs) -> None:
        if threading.get_ident() != self.thread:
            return
        cache = kwargs.get("cache")
        ids = kwargs.get("input_ids", args[0] if args else None)
        if cache is None or ids is None:
            raise XpressError(
                "transformers called the model without `cache`/`input_ids` keywords: the bench's "
                "forward probe needs updating for this transformers version"
            )
        self.calls.append(ForwardCall(cache.get_seq_length(), ids.shape[1]))
        self.started = self.now()

    def after(self, module, args, kwargs, output) -> None:
        if threading.get_ident() == self.thread:
            self.calls[-1].seconds = self.now() - self.started

    @property
    def seconds(self) -> float:
        return sum(c.seconds for c in self.calls)


def hf_rounds(calls: list[ForwardCall], prompt_len: int, new_tokens: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(accepted, verified) draft tokens per round, from the target's forwards.

    Between rounds the cache holds every committed token but the last, so the tokens a round emitted are the growth
    of the cache length from its forward to the next one (the prompt's last token plays the cache's first "root").
    The first forward is the prefill; it counts as a round only when it verified candidates too (assisted).
    """
    starts = [prompt_len - 1] + [c.cache_len for c in calls[1:]] + [prompt_len + new_tokens - 1]
    emitted = [b - a for a, b in pairwise(starts)]
    verified = [calls[0].input_len - prompt_len] + [c.input_len - 1 for c in calls[1:]]
    rounds = [(e - 1, v) for i, (e, v) in enumerate(zip(emitted, verified)) if i > 0 or v > 0]
    return tuple(a for a, _ in rounds), tuple(v for _, v in rounds)


def configure_assistant(assistant: torch.nn.Module, draft_tokens: int | None) -> None:
    """transformers reads the draft length from the assistant's generation config; set it before each call so no
    call inherits what an earlier one adapted (the heuristic schedule and the confidence threshold persist)."""
    config = assistant.generation_config
    if draft_tokens is None:
        defaults = config._get_default_generation_params()
        for key in ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold"):
            setattr(config, key, defaults[key])
    else:
        config.num_assistant_tokens = draft_tokens
        config.num_assistant_tokens_schedule = "constant"
        config.assistant_confidence_threshold = 0.0  # off: exactly draft_tokens candidates every round


def run_hf(
    models: BenchModels, setting: Setting, ids: torch.Tensor, cfg: DecodeConfig, now: Callable[[], float]
) -> Outcome:
    """transformers ``generate`` with the same sampler as the engine (temperature, top-k, top-p; nothing else)."""
    pad = models.tokenizer.pad_token_id
    kwargs = {
        "max_new_tokens": cfg.max_new_tokens,
        "do_sample": not cfg.greedy,
        "pad_token_id": models.tokenizer.eos_token_id if pad is None else pad,
    }
    if not cfg.greedy:
        kwargs.update(temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p)
        torch.manual_seed(cfg.seed)  # generate samples from torch's global generator
    assistant = models.assistant if setting.method == HF_ASSISTED else None
    if assistant is not None:
        configure_assistant(assistant, setting.draft_tokens)
        kwargs["assistant_model"] = assistant
    if setting.method == HF_LOOKUP:
        kwargs["prompt_lookup_num_tokens"] = setting.draft_tokens
    target = models.target_of(setting)
    with ForwardProbe(target, now) as verify, ForwardProbe(assistant, now) as draft:
        out = target.generate(ids, attention_mask=torch.ones_like(ids), **kwargs)
    tokens = tuple(out[0, ids.shape[1] :].tolist())
    accepted, verified = hf_rounds(verify.calls, ids.shape[1], len(tokens))
    return Outcome(
        tokens,
        verify.calls[0].seconds,
        draft.seconds,
        verify.seconds - verify.calls[0].seconds,
        accepted,
        verified,
        len(verify.calls),
        peak_memory_mb(models.cuda_devices),
    )
