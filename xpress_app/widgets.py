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
    limit = cache.load(preset).block_limit if cache.is_loaded(preset) else UI_MAX_BLOCK
    return gr.update(maximum=limit, value=min(int(value), limit))


def whole_number_choices(values: list[int], **options) -> gr.CheckboxGroup:
    """A checkbox group of whole numbers, advertised to API clients as a list of integers: the class says strings,
    which the handlers refuse (the validation layer never coerces). Set on the instance: a subclass would make Gradio
    write a type stub into the package."""
    group = gr.CheckboxGroup(values, **options)
    low, high = min(values), max(values)
    group.api_info = lambda: {
        "items": {"type": "integer", "minimum": low, "maximum": high},
        "title": "Checkbox Group",
        "type": "array",
        "description": f"whole numbers in {low}..{high}",
    }
    return group


def history_json(roles: tuple[str, ...], **options) -> gr.JSON:
    """The chat history the endpoint reads: a JSON component (it takes any value; the handler checks it and says what
    is wrong), advertised to API clients as what the handler accepts: a list of {role, content} messages."""
    history = gr.JSON([], **options)
    example = [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi! How can I help?"}]
    history.api_info = lambda: {
        "type": "array",
        "items": {
            "type": "object",
            "properties": {"role": {"enum": list(roles)}, "content": {"type": "string"}},
            "required": ["role", "content"],
        },
        "description": "the chat so far: a list of {role, content} messages (the reply's own history output)",
    }
    history.example_payload = history.example_value = lambda: example
    return history
