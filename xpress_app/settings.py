"""The controls' values as the UI (or an API client) sends them, checked; the chat turned into a prompt that fits the
target's context."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from xpress_core.config import REFINE_MODES, VERIFY_MODES, DecodeConfig
from xpress_core.errors import XpressError
from xpress_core.models import encode_prompt

# UI limits: tighter than the engine's (DecodeConfig.validate) so that a CPU Space stays responsive.
UI_MAX_DRAFTS = 8
UI_MAX_BLOCK = 16
UI_MAX_NEW_TOKENS = 512
MAX_TEMPERATURE = 2.0
MAX_SEED = 2**31 - 1
MAX_MESSAGE_CHARS = 8000  # longer messages keep their end (the part a reply follows)


@dataclass(frozen=True)
class Settings:
    """The controls' values as the UI (or an API client) sends them; checked by ``decode_config``."""

    preset: str = ""
    # The fastest fixed setting the benchmark measured on a 2-core CPU with the embedded models (README, Results).
    drafts: int = 1
    steps: int = 1
    block: int = 4
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    max_new_tokens: int = 128
    refine: str = REFINE_MODES[0]
    verify: str = VERIFY_MODES[0]
    race: bool = False
    animate: bool = False
    # The controller picks (K, T, L) before every round for the most expected tokens per second on the hardware at
    # hand (its stage costs are measured when the models load); K, T, L above apply when it is off.
    auto: bool = True

    def decode_config(self) -> DecodeConfig:
        whole = {
            "drafts K": (self.drafts, 1, UI_MAX_DRAFTS),
            "block L": (self.block, 1, UI_MAX_BLOCK),
            "denoise steps T": (self.steps, 1, UI_MAX_BLOCK),
            "max new tokens": (self.max_new_tokens, 1, UI_MAX_NEW_TOKENS),
            "seed": (self.seed, 0, MAX_SEED),
        }
        check_whole_numbers(whole)
        for name, value in (("temperature", self.temperature), ("top-p", self.top_p)):
            if not is_number(value):
                raise XpressError(f"{name} must be a number, got {value!r}")
        return DecodeConfig.from_mapping(asdict(self))


DEFAULTS = Settings()


def is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_whole_numbers(ranges: dict[str, tuple]) -> None:
    """Each ``name: (value, low, high)`` must be a whole number within low..high (UI and API input alike)."""
    for name, (value, low, high) in ranges.items():
        if not (is_number(value) and float(value).is_integer() and low <= value <= high):
            raise XpressError(f"{name} must be a whole number in {low}..{high}, got {value!r}")


def history_messages(history: list[dict] | None) -> list[dict[str, str]]:
    """Chatbot history -> chat-template messages. Gradio 6 sends content as a list of parts; keep the text ones."""
    messages = []
    for message in history or []:
        content = message["content"]
        if not isinstance(content, str):
            parts = content if isinstance(content, list) else [content]
            content = "".join(p.get("text", "") for p in parts if isinstance(p, dict) and p.get("type") == "text")
        messages.append({"role": message["role"], "content": content})
    return messages


@dataclass(frozen=True)
class FittedPrompt:
    ids: torch.Tensor  # (1, n)
    notice: str | None  # what was cut to make it fit, for the user


def fit_prompt(tokenizer, messages: list[dict[str, str]], limit: int | None, max_new_tokens: int) -> FittedPrompt:
    """Encode with the chat template; if too long for the target's context, cut from the left (oldest first).

    The prompt may use the context minus room for the reply (``max_new_tokens``, but at most half the context).
    """
    cuts = []
    last = messages[-1]["content"]
    if len(last) > MAX_MESSAGE_CHARS:
        messages = messages[:-1] + [{"role": "user", "content": last[-MAX_MESSAGE_CHARS:]}]
        cuts.append(f"your message was cut to its last {MAX_MESSAGE_CHARS} characters")
    ids = encode_prompt(tokenizer, messages, chat=True)
    budget = None if limit is None else limit - min(max_new_tokens, limit // 2)
    if budget is not None and ids.shape[1] > budget:
        dropped = 0
        while ids.shape[1] > budget and len(messages) > 1:
            messages = messages[1:]
            dropped += 1
            while len(messages) > 1 and messages[0]["role"] != "user":  # a conversation starts with the user
                messages = messages[1:]
                dropped += 1
            ids = encode_prompt(tokenizer, messages, chat=True)
        if dropped:
            cuts.append(f"the {dropped} oldest messages were left out")
        if ids.shape[1] > budget:
            messages, ids = cut_last_message(tokenizer, messages, budget)
            cuts.append(f"your message was cut to its last {len(messages[-1]['content'])} characters")
    notice = None
    if cuts:
        room = "" if limit is None else f" (the target's context holds {limit} tokens, {budget} of them for the prompt)"
        notice = "Long prompt: " + "; ".join(cuts) + room + "."
    return FittedPrompt(ids, notice)


def cut_last_message(tokenizer, messages: list[dict[str, str]], budget: int):
    """Keep the longest end of the last message whose prompt fits ``budget`` tokens (binary search on characters)."""
    head, text = messages[:-1], messages[-1]["content"]

    def encoded(chars: int):
        return encode_prompt(tokenizer, head + [{"role": "user", "content": text[-chars:]}], chat=True)

    low, high = 1, len(text)  # invariant: the answer is in [low, high] once low fits
    if encoded(low).shape[1] > budget:
        raise XpressError(
            f"the chat template alone does not fit the {budget} prompt tokens the target's context allows"
        )
    while low < high:
        mid = (low + high + 1) // 2
        if encoded(mid).shape[1] <= budget:
            low = mid
        else:
            high = mid - 1
    kept = head + [{"role": "user", "content": text[-low:]}]
    return kept, encode_prompt(tokenizer, kept, chat=True)
