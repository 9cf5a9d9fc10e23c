"""The Sweep tab: its layout and its events (inputs by name, outputs as a dict, as in the Chat tab)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import gradio as gr

from xpress_core.errors import XpressError

from .budget import Budget
from .chat_tab import ChatTab
from .figures import empty_heatmaps
from .log import refusal
from .models import Calibration, ModelCache
from .session import Controls, forget_replaced_blocks
from .settings import UI_MAX_BLOCK, UI_MAX_DRAFTS
from .sweep import (
    HELD_OUT,
    STOPPED_BEFORE_FIRST_RUN,
    SWEEP_MAX_NEW_TOKENS,
    SWEEP_MAX_PROMPTS,
    SWEEP_SOURCES,
    SweepRequest,
    SweepView,
    load_for_sweep,
    sweep_turn,
    values,
)
from .texts import SWEEP_HELP
from .widgets import block_slider, int_slider, whole_number_choices


@dataclass(frozen=True)
class SweepTab:
    """The Sweep tab's components that events read or write."""

    drafts: gr.CheckboxGroup
    steps: gr.CheckboxGroup
    block: gr.Slider
    source: gr.Radio
    count: gr.Slider  # held-out prompts
    max_new_tokens: gr.Slider
    run: gr.Button
    stop: gr.Button
    status: gr.Markdown
    tokens_plot: gr.Plot
    tau_plot: gr.Plot
    table: gr.Markdown
    controls: gr.State  # the session's Controls


def sweep_layout() -> SweepTab:
    """The Sweep tab's components, laid out inside the current tab."""
    defaults = SweepRequest()
    gr.Markdown(SWEEP_HELP)
    with gr.Row():
        drafts = whole_number_choices(
            list(range(1, UI_MAX_DRAFTS + 1)), value=list(defaults.drafts), label="Drafts K", elem_id="sweep-drafts"
        )
        steps = whole_number_choices(
            list(range(1, UI_MAX_BLOCK + 1)),
            value=list(defaults.steps),
            label="Denoise steps T",
            info="Values above L are left out.",
            elem_id="sweep-steps",
        )
    with gr.Row():
        block = int_slider(1, UI_MAX_BLOCK, defaults.block, "Block L", "sweep-block")
        source = gr.Radio(list(SWEEP_SOURCES), value=defaults.source, label="Prompts", elem_id="sweep-source")
        count = int_slider(
            1,
            SWEEP_MAX_PROMPTS,
            defaults.prompts,
            "Held-out prompts",
            "sweep-prompts",
            info="How many, spread over the benchmark's held-out chats and story requests.",
            visible=defaults.source == HELD_OUT,
        )
        max_new_tokens = int_slider(
            1, SWEEP_MAX_NEW_TOKENS, defaults.max_new_tokens, "Max new tokens", "sweep-max-new-tokens"
        )
    with gr.Row():
        run = gr.Button("Run sweep", variant="primary", elem_id="sweep-run")
        stop = gr.Button("Stop", variant="stop", elem_id="sweep-stop")
    status = gr.Markdown(elem_id="sweep-status")
    empty = empty_heatmaps()
    with gr.Column():  # full width each: the heatmaps' titles are long
        tokens_plot = gr.Plot(empty["tokens_per_s"], label="tokens/s", elem_id="sweep-heatmap-tokens")
        tau_plot = gr.Plot(empty["tau"], label="τ", elem_id="sweep-heatmap-tau")
    table = gr.Markdown(elem_id="sweep-table")
    return SweepTab(
        drafts,
        steps,
        block,
        source,
        count,
        max_new_tokens,
        run,
        stop,
        status,
        tokens_plot,
        tau_plot,
        table,
        controls=gr.State(Controls(), delete_callback=Controls.release),
    )


def view_update(tab: SweepTab, view: SweepView) -> dict:
    values = {
        tab.status: view.status,
        tab.tokens_plot: view.tokens_per_s,
        tab.tau_plot: view.tau,
        tab.table: view.table,
    }
    return {component: value for component, value in values.items() if value is not None}


def wire_sweep(
    demo: gr.Blocks, tab: SweepTab, tab_block: gr.Tab, chat: ChatTab, cache: ModelCache, budget: Budget
) -> None:
    """The Sweep tab's events; the preset, the chat box and the chat's block L slider are the Chat tab's; ``budget``:
    what each sweep may use, its whole grid included."""
    private = {"queue": False, "api_visibility": "private"}
    started = tab.run.click(Controls.arm, tab.controls, None, **private)
    # One sweep at a time: two at once would each measure the other's load.
    finished = started.then(
        sweep_handler(demo, tab, cache, budget),
        inputs_kwargs=sweep_inputs(tab, chat),
        outputs=[tab.status, tab.tokens_plot, tab.tau_plot, tab.table],
        api_name="sweep",
        preprocess=False,  # raw values: checked by SweepRequest.grid, with its own messages
        concurrency_limit=1,
        concurrency_id="sweep",
    )
    tab.stop.click(Controls.request_stop, tab.controls, None, **private)
    tab.source.change(lambda chosen: gr.update(visible=chosen == HELD_OUT), tab.source, tab.count, **private)
    wire_block_caps(demo, tab, tab_block, chat, cache, finished)


def sweep_inputs(tab: SweepTab, chat: ChatTab) -> dict:
    """The sweep endpoint's inputs by name (its API's parameters)."""
    return {
        "preset": chat.settings["preset"],
        "drafts": tab.drafts,
        "steps": tab.steps,
        "block": tab.block,
        "source": tab.source,
        "count": tab.count,
        "max_new_tokens": tab.max_new_tokens,
        "message": chat.message,
        "controls": tab.controls,
    }


def sweep_handler(demo: gr.Blocks, tab: SweepTab, cache: ModelCache, budget: Budget):
    """The sweep endpoint: the request checked and its models loaded here, the grid run by the GPU function
    (``sweep_turn``), its progress relayed; a sweep stopped while it waited in the queue ends before loading."""

    def sweep(
        preset,
        drafts,
        steps,
        block,
        source,
        count,
        max_new_tokens,
        message,
        controls: Controls,
        request: gr.Request,
        progress=gr.Progress(),  # noqa: B008 (Gradio finds the progress tracker by this default value)
    ):
        forget_replaced_blocks(demo, request)
        if controls.ticket.requested():  # Stop pressed while the sweep waited for its turn
            return view_update(tab, SweepView(STOPPED_BEFORE_FIRST_RUN))
        progress(0, desc="Loading the models and the prompts…")
        try:
            request = SweepRequest(
                preset,
                values("drafts K", drafts),
                values("denoise steps T", steps),
                block,
                source,
                count,
                max_new_tokens,
            )
            load_for_sweep(cache, request, message)
            view = relayed(sweep_turn(request, message, budget, controls.ticket), cache, progress)
        except XpressError as error:
            raise refusal("/sweep", error) from None
        return view_update(tab, view)

    return sweep


def relayed(items, cache: ModelCache, progress) -> SweepView:
    """The GPU function's items as they come: progress to the bar, a calibration to the cache, its view returned,
    its refusal raised."""
    for item in items:
        if isinstance(item, XpressError):
            raise item
        if isinstance(item, Calibration):
            cache.adopt(item)
        elif isinstance(item, SweepView):
            view = item
        else:
            done, total, label = item
            progress((done, total), desc=f"runs · last: {label}", unit="runs")
    return view


def wire_block_caps(demo: gr.Blocks, tab: SweepTab, tab_block: gr.Tab, chat: ChatTab, cache: ModelCache, finished):
    """Both block L sliders are capped once a sweep has loaded the models; this one also whenever the tab is opened (a
    reply may have loaded them)."""
    private = {"queue": False, "api_visibility": "private"}
    preset = chat.settings["preset"]
    cap = partial(block_slider, cache)
    for slider in (tab.block, chat.settings["block"]):
        finished.then(cap, [preset, slider], slider, **private)
    for cap_trigger in (tab_block.select, preset.change, demo.load):
        cap_trigger(cap, [preset, tab.block], tab.block, **private)
