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

One bound for every way text reaches a model (``fit_prompt``: the app's chat and Sweep, the CLI, the benchmark and
its prompt files): characters first, before any tokenizer work, then tokens, then the target's context. However much
text a client sends, the tokenizer sees a bounded amount of it (docs/DESIGN.md §4).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from . import validation
from .errors import XpressError

# Characters, checked before any tokenizer work. The newest message keeps its end (the part a reply follows); earlier
# messages are kept newest first while each and all of them stay within the caps.
MAX_MESSAGE_CHARS = 8000
MAX_HISTORY_MESSAGES = 200
MAX_HISTORY_CHARS = 200_000
# Tokens: the prompt's prefill and cache stay bounded on targets with long contexts too.
MAX_PROMPT_TOKENS = 4096


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
    """Keep the longest end of the last message whose prompt fits ``budget`` tokens."""
    head, last = messages[:-1], messages[-1]

    def encoded(chars: int) -> list[int]:
        return encode_chat(tokenizer, head + [{**last, "content": last["content"][-chars:]}])

    return longest_end(encoded, len(last["content"]), budget, "the chat template alone")


def longest_end(encoded: Callable[[int], list[int]], chars: int, budget: int, what: str) -> tuple[list[int], int]:
    """The ids of the longest end of a text (``encoded(n)``: its last n characters encoded) within ``budget`` tokens,
    and n: a binary search on characters."""
    low, high = 1, chars  # invariant: the answer is in [low, high] once low fits
    if len(encoded(low)) > budget:
        raise XpressError(f"{what} does not fit the {budget} prompt tokens the target's context allows")
    while low < high:
        mid = (low + high + 1) // 2
        if len(encoded(mid)) <= budget:
            low = mid
        else:
            high = mid - 1
    return encoded(low), low


@dataclass(frozen=True)
class Capped:
    """A prompt within the character caps, and what the caps left out (for the notice)."""

    prompt: str | tuple[dict[str, str], ...]  # raw text, or chat messages
    cuts: tuple[str, ...]


def cap_chars(prompt: str | list[dict[str, str]] | tuple[dict[str, str], ...]) -> Capped:
    """The character caps, no tokenizer involved: the last message (or raw text) keeps its last ``MAX_MESSAGE_CHARS``;
    earlier messages are kept newest first, up to ``MAX_HISTORY_MESSAGES`` and ``MAX_HISTORY_CHARS`` in all (one
    longer than ``MAX_MESSAGE_CHARS`` ends the kept part), starting with a user turn. Work linear in what is kept."""
    if isinstance(prompt, str):
        if len(prompt) <= MAX_MESSAGE_CHARS:
            return Capped(prompt, ())
        return Capped(prompt[-MAX_MESSAGE_CHARS:], (f"the prompt was cut to its last {MAX_MESSAGE_CHARS} characters",))
    *history, last = prompt
    cuts = []
    if len(last["content"]) > MAX_MESSAGE_CHARS:
        last = {**last, "content": last["content"][-MAX_MESSAGE_CHARS:]}
        cuts.append(f"your message was cut to its last {MAX_MESSAGE_CHARS} characters")
    kept, chars = [], 0
    for past in reversed(history[-MAX_HISTORY_MESSAGES:]):
        chars += len(past["content"])
        if chars > MAX_HISTORY_CHARS or len(past["content"]) > MAX_MESSAGE_CHARS:
            break
        kept.append(past)
    kept.reverse()
    while kept and kept[0]["role"] != "user":  # a conversation starts with the user
        kept.pop(0)
    if len(kept) < len(history):
        cuts.append(
            f"the chat keeps its last {len(kept)} messages (at most {MAX_HISTORY_MESSAGES}, "
            f"{MAX_HISTORY_CHARS} characters, {MAX_MESSAGE_CHARS} a message)"
        )
    return Capped((*kept, last), tuple(cuts))


@dataclass(frozen=True)
class FittedPrompt:
    ids: torch.Tensor  # (1, n), n <= the token budget
    notice: str | None  # what was cut to make it fit, for the user; None when nothing was


def prompt_budget(limit: int | None, max_new_tokens: int) -> int:
    """The prompt's tokens: at most ``MAX_PROMPT_TOKENS``, and the target's context minus room for the reply
    (``max_new_tokens``, but at most half the context)."""
    if limit is None:
        return MAX_PROMPT_TOKENS
    return min(MAX_PROMPT_TOKENS, limit - min(max_new_tokens, limit // 2))


def fit_prompt(
    tokenizer,
    prompt: str | list[dict[str, str]] | tuple[dict[str, str], ...],
    chat: bool,
    limit: int | None,
    max_new_tokens: int,
    cuts: tuple[str, ...] = (),
) -> FittedPrompt:
    """The one prompt fitter: raw text or chat messages, checked, then cut to the character caps, to
    ``MAX_PROMPT_TOKENS`` and to the target's context (``limit``; None: no limit) with room for the reply.

    Chat: the oldest messages go first, then the last message keeps its end (``fit_chat``). Raw text keeps its end.
    ``cuts``: what the caller's own caps already left out, for the same notice."""
    if isinstance(prompt, str):
        prompt = validation.text("the prompt", prompt)
        messages = [{"role": "user", "content": prompt}]
    else:
        messages = validation.messages("the prompt", prompt)
    if not any(m["content"].strip() for m in messages):
        raise XpressError("the prompt is empty")
    capped = cap_chars(messages if chat else "".join(m["content"] for m in messages))
    cuts = [*cuts, *capped.cuts]
    budget = prompt_budget(limit, max_new_tokens)
    if chat:
        fitted = fit_chat(tokenizer, list(capped.prompt), budget)
        ids = fitted.ids
        if fitted.dropped:
            cuts.append(f"the {fitted.dropped} oldest messages were left out")
    else:
        ids, cut_to = fit_text(tokenizer, capped.prompt, budget)
        fitted = FittedChat(ids, 0, cut_to)
    if fitted.cut_to is not None:
        what = "your message" if chat else "the prompt"
        cuts.append(f"{what} was cut to its last {fitted.cut_to} characters")
    if not cuts:
        return FittedPrompt(ids, None)
    room = f" (the prompt may hold {budget} tokens"
    room += ")" if limit is None else f" of the {limit} the target's context holds)"
    return FittedPrompt(ids, "Long prompt: " + "; ".join(cuts) + room + ".")


def fit_text(tokenizer, text: str, budget: int) -> tuple[torch.Tensor, int | None]:
    """A raw prompt within ``budget`` tokens: whole, or its longest end that fits."""
    ids = encode_text(tokenizer, text)
    if len(ids) <= budget:
        return torch.tensor([ids]), None
    ids, kept = longest_end(
        lambda n: encode_text(tokenizer, text[-n:]), len(text), budget, "the prompt's last character"
    )
    return torch.tensor([ids]), kept
