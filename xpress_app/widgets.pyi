"""Widgets both tabs use."""

from __future__ import annotations

import gradio as gr

from .models import ModelCache
from .settings import UI_MAX_BLOCK

from gradio.events import Dependency

class ChatHistory(gr.Chatbot):
    """The chat display, whose value the chat endpoint reads as the history. Gradio checks a Chatbot's input against
    its data model before any handler runs, and a history of the wrong shape from an API client would end in Gradio's
    generic error; here the raw value reaches the handler, which checks it (``settings.history_messages``) and says
    what is wrong. The API page still shows the Chatbot's schema."""

    is_template = True  # Gradio's mark for a subclass that its parent's frontend draws (else it looks for its own)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.api_info()  # computed from the data model now, and cached for the API page
        self.data_model = None

    def preprocess(self, payload):
        return payload
    from typing import Callable, Literal, Sequence, Any, TYPE_CHECKING
    from gradio.blocks import Block
    if TYPE_CHECKING:
        from gradio.components import Timer
        from gradio.components.base import Component


def int_slider(minimum: int, maximum: int, value: int, label: str, elem_id: str, **extra) -> gr.Slider:
    """A whole-number slider (step 1, no decimals): every count the app asks for."""
    return gr.Slider(minimum, maximum, value=value, step=1, precision=0, label=label, elem_id=elem_id, **extra)


def block_slider(cache: ModelCache, preset: str, value) -> dict:
    """The block L slider capped at the preset's limit once its models are loaded (the drafter's trained block size is
    known then); the UI's cap before."""
    limit = cache.get(preset).block_limit if cache.is_loaded(preset) else UI_MAX_BLOCK
    return gr.update(maximum=limit, value=min(int(value), limit))