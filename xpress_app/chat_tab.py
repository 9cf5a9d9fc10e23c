"""The Chat tab: its layout and its events.

Handlers take their inputs by name (``inputs_kwargs``: the names are also the ``/chat`` API's parameter names) and
return a dict of the components they change; the components they leave out stay as they are.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path

import gradio as gr

from xpress_core.config import DIVERSITY, REFINE_MODES, VERIFY_MODES
from xpress_core.errors import XpressError

from .budget import Budget
from .chat import Reply, View, log_file, reply_views, scrub_figure
from .figures import empty_panels
from .log import refusal
from .models import Calibration, ModelCache
from .session import CLEAR_WAIT_S, Controls, forget_replaced_blocks
from .settings import (
    CHAT_ROLES,
    DEFAULTS,
    MAX_SEED,
    MAX_TEMPERATURE,
    UI_MAX_BLOCK,
    UI_MAX_DRAFTS,
    UI_MAX_NEW_TOKENS,
    Settings,
)
from .texts import DEFAULTS_NOTE, EXAMPLES, HELP, INTRO, PANEL_HELP, VERDICT_PENDING
from .widgets import block_slider, history_json, int_slider

CHAT_HEIGHT = 300  # px: with the header, the message box and its buttons, inside a 720-pixel-high first screen


@dataclass(frozen=True)
class ChatTab:
    """The Chat tab's components that events read or write (the settings live in the page's sidebar)."""

    message: gr.Textbox
    chatbot: gr.Chatbot
    history: gr.JSON  # the chatbot's messages, as the endpoint reads them
    status: gr.Markdown
    plain: gr.Textbox  # the Race's plain-decoding reply
    evolution: gr.Plot
    accept: gr.Plot
    latency: gr.Plot
    provenance: gr.Plot
    reply: gr.State  # the last Reply, for scrubbing and the log
    round_slider: gr.Slider
    step_slider: gr.Slider
    download: gr.DownloadButton
    verdict: gr.Markdown  # why the reply was faster or slower than plain decoding
    examples: dict  # example prompt -> the button that sends it
    settings: dict  # Settings field name -> its control
    preset_note: gr.Markdown
    send: gr.Button
    stop: gr.Button
    clear: gr.Button
    controls: gr.State  # the session's Controls

    @property
    def outputs(self) -> list:
        """What the chat endpoint updates, in the order its API returns them."""
        return [
            self.message,
            self.chatbot,
            self.status,
            self.plain,
            self.evolution,
            self.accept,
            self.latency,
            self.provenance,
            self.reply,
            self.round_slider,
            self.step_slider,
            self.download,
            self.verdict,
            self.history,
        ]

    @property
    def inputs(self) -> dict:
        """What the chat endpoint reads, by parameter name: the message, the history and every setting."""
        return {"message": self.message, "history": self.history, **self.settings, "controls": self.controls}


def chat_layout(settings: dict, preset_note: gr.Markdown) -> ChatTab:
    """The Chat tab's components, laid out inside the current tab: the conversation and the draft panel side by side
    (both on the first screen after a reply, down to 1280x720), the other panels below."""
    reply = gr.State(None)
    controls = gr.State(Controls(), delete_callback=Controls.release)  # its stop file goes with the session
    gr.Markdown(INTRO)
    with gr.Row(equal_height=False):
        with gr.Column(scale=4, min_width=320):
            conversation = conversation_column()
        with gr.Column(scale=5, min_width=400):
            drafts = drafts_column()
    panels = panels_below()
    return ChatTab(
        **conversation, **drafts, **panels, reply=reply, settings=settings, preset_note=preset_note, controls=controls
    )


def conversation_column() -> dict:
    chatbot = gr.Chatbot(label="Chat", height=CHAT_HEIGHT, elem_id="chatbot")
    # The history the chat endpoint reads: the chat's messages, kept beside the Chatbot, which would check an API
    # client's history against its data model before any handler runs and answer a wrong shape with Gradio's generic
    # error. JSON takes any value; the handler checks it (settings.history_messages) and says what is wrong.
    history = history_json(CHAT_ROLES, visible=False, elem_id="history")
    message = gr.Textbox(
        show_label=False, placeholder="Type a message and press Enter", lines=1, max_lines=6, elem_id="message"
    )
    with gr.Row():
        send = gr.Button("Send", variant="primary", size="sm", min_width=60, elem_id="send")
        stop = gr.Button("Stop", variant="stop", size="sm", min_width=60, elem_id="stop")
        clear = gr.Button("Clear", size="sm", min_width=60, elem_id="clear")
    with gr.Row():
        examples = {
            text: gr.Button(label, size="sm", min_width=60, elem_id=f"example-{n}")
            for n, (label, text) in enumerate(EXAMPLES.items(), start=1)
        }
    status = gr.Markdown(elem_id="status")
    return {
        "chatbot": chatbot,
        "history": history,
        "message": message,
        "send": send,
        "stop": stop,
        "clear": clear,
        "examples": examples,
        "status": status,
    }


def drafts_column() -> dict:
    """The verdict, the draft-evolution panel and its scrubbers."""
    verdict = gr.Markdown(VERDICT_PENDING, elem_id="verdict")
    evolution = gr.Plot(empty_panels()["evolution"], show_label=False, elem_id="plot-evolution")
    with gr.Row():
        round_slider = int_slider(0, 1, 1, "Round (0 = prefill)", "round-slider")
        step_slider = int_slider(1, 2, 1, "Denoise step", "step-slider")
    return {"verdict": verdict, "evolution": evolution, "round_slider": round_slider, "step_slider": step_slider}


def settings_column(preset_names: list[str]) -> tuple[dict, gr.Markdown]:
    """The decoding controls, by Settings field name, and the note under the preset menu; one above the other (the
    sidebar is narrow)."""
    d = DEFAULTS
    preset = gr.Dropdown(
        preset_names, value=preset_names[0], label="Model preset", info=HELP["preset"], elem_id="preset"
    )
    preset_note = gr.Markdown(elem_id="preset-note")
    gr.Markdown(DEFAULTS_NOTE, elem_id="defaults-note")
    auto = gr.Checkbox(d.auto, label="Auto: the controller picks K and L", info=HELP["auto"], elem_id="auto")
    drafts = int_slider(1, UI_MAX_DRAFTS, d.drafts, "Drafts K", "drafts", info=HELP["drafts"])
    block = int_slider(1, UI_MAX_BLOCK, d.block, "Block L", "block", info=HELP["block"])
    steps = int_slider(1, d.block, d.steps, "Denoise steps T", "steps", info=HELP["steps"])
    race = gr.Checkbox(d.race, label="Race plain decoding", info=HELP["race"], elem_id="race")
    animate = gr.Checkbox(d.animate, label="Animate denoising", info=HELP["animate"], elem_id="animate")
    temperature = gr.Slider(
        0.0,
        MAX_TEMPERATURE,
        value=d.temperature,
        step=0.05,
        label="Temperature",
        info=HELP["temperature"],
        elem_id="temperature",
    )
    top_p = gr.Slider(0.05, 1.0, value=d.top_p, step=0.05, label="Top-p", info=HELP["top_p"], elem_id="top-p")
    seed = gr.Number(d.seed, precision=0, minimum=0, maximum=MAX_SEED, label="Seed", info=HELP["seed"], elem_id="seed")
    max_new_tokens = int_slider(
        1, UI_MAX_NEW_TOKENS, d.max_new_tokens, "Max new tokens", "max-new-tokens", info=HELP["max_new_tokens"]
    )
    diversity = gr.Radio(
        list(DIVERSITY), value=d.diversity, label="Drafts", info=HELP["diversity"], elem_id="diversity"
    )
    refine = gr.Radio(list(REFINE_MODES), value=d.refine, label="Refinement", info=HELP["refine"], elem_id="refine")
    verify = gr.Radio(list(VERIFY_MODES), value=d.verify, label="Verification", info=HELP["verify"], elem_id="verify")
    controls = {
        "preset": preset,
        "drafts": drafts,
        "steps": steps,
        "block": block,
        "temperature": temperature,
        "top_p": top_p,
        "seed": seed,
        "max_new_tokens": max_new_tokens,
        "refine": refine,
        "verify": verify,
        "diversity": diversity,
        "race": race,
        "animate": animate,
        "auto": auto,
    }
    return controls, preset_note


def panels_below() -> dict:
    """Below the first screen: the Race's plain reply, the accepted-length, latency and provenance panels, the log."""
    empty = empty_panels()
    plain = gr.Textbox(
        label="Race: plain decoding (no drafter)",
        lines=3,
        max_lines=8,
        interactive=False,
        visible=DEFAULTS.race,
        elem_id="plain-reply",
    )
    with gr.Row():
        # The figures' own titles name them: Gradio's label would sit over the title's first words.
        accept = gr.Plot(empty["accept"], label="Accepted length", show_label=False, elem_id="plot-accept")
        latency = gr.Plot(empty["latency"], label="Latency", show_label=False, elem_id="plot-latency")
    provenance = gr.Plot(empty["provenance"], label="Token provenance", elem_id="plot-provenance")
    download = gr.DownloadButton("Download the round log (JSONL)", value=None, elem_id="download-log")
    with gr.Accordion("How to read the panels", open=False):
        gr.Markdown(PANEL_HELP)
    return {"plain": plain, "accept": accept, "latency": latency, "provenance": provenance, "download": download}


# --- handlers ------------------------------------------------------------------------------------------------------


def view_update(tab: ChatTab, log_dir: Path, view: View) -> dict:
    """One View as component updates; once the reply is done, sliders spanning its rounds and steps, and its log."""
    if view.notice:
        gr.Warning(view.notice)
    values = {
        tab.message: view.message,
        tab.chatbot: view.history,
        tab.history: view.history,
        tab.status: view.status,
        tab.plain: view.plain,
        tab.evolution: view.evolution,
        tab.accept: view.accept,
        tab.latency: view.latency,
        tab.provenance: view.provenance,
        tab.reply: view.reply,
        tab.verdict: view.verdict,
    }
    update = {component: value for component, value in values.items() if value is not None}
    if view.done and view.reply is not None:
        update |= finished(tab, view.reply, log_dir)
    return update or gr.skip()


def finished(tab: ChatTab, reply: Reply, log_dir: Path) -> dict:
    return {
        tab.round_slider: gr.update(maximum=max(1, reply.rounds), value=reply.rounds),
        tab.step_slider: gr.update(maximum=max(2, reply.max_steps), value=reply.max_steps),  # a slider needs min < max
        tab.download: gr.update(value=log_file(reply, log_dir)),
    }


def reply_updates(
    tab: ChatTab, cache: ModelCache, log_dir: Path, budget: Budget, message, history, controls: Controls, settings: dict
):
    """The chat endpoint's stream: the reply's views (``chat.reply_views``) as component updates."""
    chosen = Settings(**settings)
    controls.running += 1
    try:
        with cache.in_flight.serving():
            for view in reply_views(cache, message, history, chosen, budget, controls.ticket):
                if isinstance(view, XpressError):
                    raise view
                if isinstance(view, Calibration):
                    cache.adopt(view)
                    continue
                yield view_update(tab, log_dir, view)
    except XpressError as error:
        raise refusal("/chat", error) from None
    finally:
        controls.running -= 1


def cleared(tab: ChatTab, controls: Controls) -> dict:
    """Clear: stop the running reply, wait for its last update to go out, then empty the chat and the panels."""
    controls.request_stop()
    controls.wait_idle(CLEAR_WAIT_S)
    empty = empty_panels()
    return {
        tab.message: "",
        tab.chatbot: [],
        tab.history: [],
        tab.status: "",
        tab.plain: "",
        tab.evolution: empty["evolution"],
        tab.accept: empty["accept"],
        tab.latency: empty["latency"],
        tab.provenance: empty["provenance"],
        tab.reply: None,
        tab.round_slider: gr.update(maximum=1, value=1),
        tab.step_slider: gr.update(maximum=2, value=1),
        tab.download: gr.update(value=None),
        tab.verdict: VERDICT_PENDING,
    }


# --- wiring --------------------------------------------------------------------------------------------------------


def wire_chat(demo: gr.Blocks, tab: ChatTab, cache: ModelCache, log_dir: Path, budget: Budget) -> None:
    """The Chat tab's events; ``budget``: what each reply may use."""
    private = {"queue": False, "api_visibility": "private"}
    preset, block, steps, race = (tab.settings[name] for name in ("preset", "block", "steps", "race"))

    def respond(message, history, controls: Controls, request: gr.Request, **settings):
        forget_replaced_blocks(demo, request)
        yield from reply_updates(tab, cache, log_dir, budget, message, history, controls, settings)

    def answer(armed, **api):
        """The reply to the message box, once ``armed`` (the event that forgot an earlier Stop) has run."""
        return armed.then(
            respond,
            inputs_kwargs=tab.inputs,
            outputs=tab.outputs,
            show_progress="minimal",
            preprocess=False,  # raw values: every input is checked by the validation layer, with its own message
            **api,
        )

    sent = gr.on([tab.message.submit, tab.send.click], Controls.arm, tab.controls, None, **private)
    replies = [answer(sent, api_name="chat")]
    for text, button in tab.examples.items():  # an example fills the message box and is sent at once
        filled = button.click(lambda text=text: text, None, tab.message, **private)
        replies.append(answer(filled.then(Controls.arm, tab.controls, None, **private), api_visibility="private"))
    tab.stop.click(Controls.request_stop, tab.controls, None, **private)
    tab.clear.click(partial(cleared, tab), tab.controls, tab.outputs, **private)
    for slider in (tab.round_slider, tab.step_slider):
        slider.input(
            scrub_figure,
            [tab.reply, tab.round_slider, tab.step_slider],
            tab.evolution,
            trigger_mode="always_last",
            concurrency_limit=None,
            show_progress="hidden",
            api_visibility="private",
        )
    block.change(lambda length, t: gr.update(maximum=length, value=min(t, length)), [block, steps], steps, **private)
    race.change(lambda on: gr.update(visible=on), race, tab.plain, **private)
    preset.change(cache.describe, preset, tab.preset_note, **private)
    demo.load(cache.describe, preset, tab.preset_note, **private)
    for reply in replies:  # once a reply has loaded the models, the note says which dtype they run in and why
        reply.then(cache.describe, preset, tab.preset_note, **private)
    # Block L never offers more than the drafter was trained for: capped whenever the preset's models may have just
    # loaded (a reply, a page load, another preset).
    for cap_trigger in (*(reply.then for reply in replies), preset.change, demo.load):
        cap_trigger(partial(block_slider, cache), [preset, block], block, **private)
