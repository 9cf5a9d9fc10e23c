"""The controls' values as the UI (or an API client) sends them, checked; the message and the history read as chat
messages (``xpress_core.chat.fit_prompt`` bounds them, as it bounds every prompt)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from xpress_core import validation
from xpress_core.config import DIVERSITY, REFINE_MODES, VERIFY_MODES, DecodeConfig
from xpress_core.errors import XpressError

# UI limits: tighter than the engine's (DecodeConfig.validate) so that a CPU Space stays responsive.
UI_MAX_DRAFTS = 8
UI_MAX_BLOCK = 16
UI_MAX_NEW_TOKENS = 512
MAX_TEMPERATURE = 2.0
MAX_SEED = validation.MAX_SEED
UI_LIMITS = validation.Limits(
    max_drafts=UI_MAX_DRAFTS, max_block=UI_MAX_BLOCK, max_new_tokens=UI_MAX_NEW_TOKENS, max_temperature=MAX_TEMPERATURE
)
CHAT_ROLES = ("user", "assistant")  # the roles the app itself writes: a history with any other is refused


@dataclass(frozen=True)
class Settings:
    """The controls' values as the UI (or an API client) sends them, unchecked; ``decode_config`` checks them."""

    preset: str = ""
    # The fastest fixed setting in the benchmark's latest runs on a 2-core CPU, on SmolLM2 and on the embedded models
    # (README, Latest results): one draft tree of 8 nodes, as the command line pins it.
    drafts: int = 1
    steps: int = 1
    block: int = 8
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    max_new_tokens: int = 128
    refine: str = REFINE_MODES[0]
    verify: str = VERIFY_MODES[0]
    diversity: str = DIVERSITY[0]  # a draft tree, or K drafts refined together
    race: bool = False
    animate: bool = False
    # The controller picks (K, T, L) before every round for the most expected tokens per second on the hardware at
    # hand (its stage costs are measured when the models load); K, T, L above apply when it is off.
    auto: bool = True

    def decode_config(self) -> DecodeConfig:
        """Every control checked by the shared validation layer (types first: API clients send any JSON)."""
        validation.text("model preset", self.preset)
        validation.flag("race", self.race)
        validation.flag("animate", self.animate)
        fields = {name: value for name, value in asdict(self).items() if name not in ("preset", "race", "animate")}
        return validation.decode_config(fields, UI_LIMITS)


DEFAULTS = Settings()


def check_whole_numbers(ranges: dict[str, tuple]) -> None:
    """Each ``name: (value, low, high)`` must be a whole number within low..high (UI and API input alike)."""
    for name, (value, low, high) in ranges.items():
        validation.whole(name, value, low, high)


def user_message(message) -> str:
    """The message box's text, stripped ("" when blank or missing); wrong types and invalid text are refused."""
    return "" if message is None else validation.text("the message", message).strip()


def history_messages(history) -> list[dict[str, str]]:
    """Chatbot history -> chat-template messages, checked: a list of {role, content} with the app's roles; content a
    string or Gradio 6's list of parts, of which the text ones are kept."""
    if history is None:
        return []
    if not isinstance(history, list):
        raise XpressError(f"history must be a list of messages, got {type(history).__name__} {history!r:.60}")
    messages = []
    for i, message in enumerate(history):
        if not (isinstance(message, dict) and "role" in message and "content" in message):
            raise XpressError(f'history: message {i} must be an object with "role" and "content", got {message!r:.60}')
        messages.append(
            {
                "role": validation.choice(f"history: the role of message {i}", message["role"], CHAT_ROLES),
                "content": message_text(i, message["content"]),
            }
        )
    return messages


def message_text(index: int, content) -> str:
    if isinstance(content, str):
        return validation.text(f"history: message {index}", content)
    parts = content if isinstance(content, list) else [content]
    if not all(isinstance(p, dict) and isinstance(p.get("type"), str) for p in parts):
        raise XpressError(f"history: message {index} must hold text or a list of parts, got {content!r:.60}")
    texts = [p.get("text") for p in parts if p["type"] == "text"]
    return "".join(validation.text(f"history: message {index}", t) for t in texts)
