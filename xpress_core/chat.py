"""Prompts from user text: typed text stays text, and fitting a long conversation costs time linear in what is kept.

User text is text: a message that contains the string of a special token (``<|end|><|system|>``) must not end the turn
and open another one. The chat template is applied with transformers' ``sanitize_control_tokens``: control tokens
found in message contents are encoded as ordinary text, and only those the template writes itself become tokens.
Roles are spliced into templates as strings (ours writes ``'<|' + role + '|>'``), so they come from a fixed set.
Raw prompts (no chat template) are encoded with special-token strings split as text too.

Fitting (``fit_chat``): a conversation too long for the context loses its oldest turns; the kept part must start with
a user turn. Encoding every candidate suffix again would cost quadratic time in the history. Instead the newest
messages' contents are encoded once each, newest first, until their tokens alone exceed the budget (a lower bound of
their cost in the template); only that suffix can fit, and a binary search over its user turns, encoding the
candidate suffix exactly each time, finds the longest that does. The work depends on the budget, not on the history.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import validation
from .errors import XpressError


def encode_text(tokenizer, text: str) -> list[int]:
    """A raw prompt: the tokenizer's own special tokens (bos) are added, typed special-token strings stay text.
    ``split_special_tokens`` sets a flag on the shared tokenizer for the call, which a concurrent chat encoding could
    see: it is passed only when the text holds such a string (raw prompts with one come from the CLI and the benchmark,
    one thread; the app's raw text is its own calibration prompt)."""
    if not any(token in text for token in tokenizer.added_tokens_encoder):
        return tokenizer(text)["input_ids"]
    return tokenizer(text, split_special_tokens=True)["input_ids"]


def encode_chat(tokenizer, messages: list[dict[str, str]]) -> list[int]:
    """The chat template with the generation prompt; control tokens inside contents encoded as text."""
    if tokenizer.chat_template is None:
        raise XpressError("the target's tokenizer has no chat template; drop --chat to send raw text")
    for message in messages:
        validation.choice("a message role", message["role"], validation.ROLES)
    try:
        return list(
            tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, sanitize_control_tokens=True, return_dict=False
            )
        )
    except ValueError as error:  # a control token the tokenizer also makes from plain text cannot be escaped
        raise XpressError(f"the prompt cannot be encoded safely: {error}") from error


@dataclass(frozen=True)
class FittedChat:
    ids: torch.Tensor  # (1, n) with n <= the budget
    dropped: int  # oldest messages left out
    cut_to: int | None  # the last message was cut to its last cut_to characters, or None


def fit_chat(tokenizer, messages: list[dict[str, str]], budget: int) -> FittedChat:
    """The longest suffix of ``messages`` starting with a user turn whose prompt fits ``budget`` tokens; if even the
    last message alone does not fit, its longest end that does."""
    start = fitting_start(tokenizer, messages, budget)
    ids = encode_chat(tokenizer, messages[start:])
    cut_to = None
    if len(ids) > budget:  # start is the last message: cut it
        ids, cut_to = cut_last_message(tokenizer, messages[start:], budget)
    return FittedChat(torch.tensor([ids]), start, cut_to)


def fitting_start(tokenizer, messages: list[dict[str, str]], budget: int) -> int:
    """Index of the oldest message kept: the smallest user-turn index whose suffix fits (the last message when none
    does). Contents are encoded once each, newest first, only as far back as could fit."""
    last = len(messages) - 1
    first, tokens = last, content_tokens(tokenizer, messages[last])
    while first > 0:
        tokens += content_tokens(tokenizer, messages[first - 1])
        if tokens > budget:
            break
        first -= 1
    starts = [i for i in range(first, last) if messages[i]["role"] == "user"] + [last]
    low, high = 0, len(starts) - 1  # invariant: starts[high] fits, or high is the last candidate
    while low < high:
        mid = (low + high) // 2
        if len(encode_chat(tokenizer, messages[starts[mid] :])) <= budget:
            high = mid
        else:
            low = mid + 1
    return starts[low]


def content_tokens(tokenizer, message: dict[str, str]) -> int:
    """Tokens of a message's content alone: a lower bound of what it costs inside the template (typed control tokens
    count one token each here, several as text there). Not ``split_special_tokens``: that flips a flag shared by the
    threads of the app's concurrent requests."""
    return len(tokenizer(message["content"], add_special_tokens=False)["input_ids"])


def cut_last_message(tokenizer, messages: list[dict[str, str]], budget: int) -> tuple[list[int], int]:
    """Keep the longest end of the last message whose prompt fits ``budget`` tokens (binary search on characters)."""
    head, last = messages[:-1], messages[-1]

    def encoded(chars: int) -> list[int]:
        return encode_chat(tokenizer, head + [{**last, "content": last["content"][-chars:]}])

    low, high = 1, len(last["content"])  # invariant: the answer is in [low, high] once low fits
    if len(encoded(low)) > budget:
        raise XpressError(
            f"the chat template alone does not fit the {budget} prompt tokens the target's context allows"
        )
    while low < high:
        mid = (low + high + 1) // 2
        if len(encoded(mid)) <= budget:
            low = mid
        else:
            high = mid - 1
    return encoded(low), low
