"""Widgets both tabs use."""

from __future__ import annotations

import gradio as gr

from .models import ModelCache
from .settings import UI_MAX_BLOCK


def chat_history(**kwargs) -> gr.Chatbot:
    """The chat display, whose value the chat endpoint reads as the history. Gradio checks a Chatbot's input against
    its data model before any handler runs, and a history of the wrong shape from an API client would end in Gradio's
    generic error; this one hands the raw value to the handler, which checks it (``settings.history_messages``) and
    says what is wrong. Changed on the instance, not in a subclass: the page draws components by class name. The API
    page still shows the Chatbot's schema (computed now, cached)."""
    chatbot = gr.Chatbot(**kwargs)
    chatbot.api_info()
    chatbot.data_model = None
    chatbot.preprocess = lambda payload: payload
    return chatbot


def int_slider(minimum: int, maximum: int, value: int, label: str, elem_id: str, **extra) -> gr.Slider:
    """A whole-number slider (step 1, no decimals): every count the app asks for."""
    return gr.Slider(minimum, maximum, value=value, step=1, precision=0, label=label, elem_id=elem_id, **extra)


def block_slider(cache: ModelCache, preset: str, value) -> dict:
    """The block L slider capped at the preset's limit once its models are loaded (the drafter's trained block size is
    known then); the UI's cap before."""
    limit = cache.get(preset).block_limit if cache.is_loaded(preset) else UI_MAX_BLOCK
    return gr.update(maximum=limit, value=min(int(value), limit))
