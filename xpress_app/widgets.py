"""Widgets both tabs use."""

from __future__ import annotations

import gradio as gr

from .models import ModelCache
from .settings import UI_MAX_BLOCK


def int_slider(minimum: int, maximum: int, value: int, label: str, elem_id: str, **extra) -> gr.Slider:
    """A whole-number slider (step 1, no decimals): every count the app asks for."""
    return gr.Slider(minimum, maximum, value=value, step=1, precision=0, label=label, elem_id=elem_id, **extra)


def block_slider(cache: ModelCache, preset: str, value) -> dict:
    """The block L slider capped at the preset's limit once its models are loaded (the drafter's trained block size is
    known then); the UI's cap before."""
    limit = cache.get(preset).block_limit if cache.is_loaded(preset) else UI_MAX_BLOCK
    return gr.update(maximum=limit, value=min(int(value), limit))
