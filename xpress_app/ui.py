"""The page: the Chat tab and the Sweep tab, laid out, then wired, on one shared model cache."""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

import gradio as gr
from gradio.route_utils import delete_files_created_by_app

from .chat import LOG_TTL_S
from .chat_tab import chat_layout, settings_column, wire_chat
from .config import QUEUE_SIZE, AppConfig
from .models import ModelCache, serve
from .sweep_tab import sweep_layout, wire_sweep

SIDEBAR_WIDTH = 300  # px


def build_app(config: AppConfig, cache: ModelCache | None = None) -> gr.Blocks:
    """The Gradio app; no model is loaded until a request needs one. Its GPU functions decode with ``cache``, this
    process's (``models.serve``)."""
    cache = serve(cache or ModelCache(config))
    log_dir = Path(tempfile.mkdtemp(prefix="xpress-logs-"))  # the replies' JSONL logs, offered for download
    atexit.register(shutil.rmtree, log_dir, ignore_errors=True)  # nothing left behind when the server stops
    # Gradio's copies of the logs (what the download serves) are deleted as soon as ours are.
    cleanup = (LOG_TTL_S, LOG_TTL_S)
    with gr.Blocks(title="xPress", analytics_enabled=False, delete_cache=cleanup, fill_width=True) as demo:
        # The settings apply to both tabs (the Sweep runs on the chosen preset); a sidebar keeps them off the first
        # screen's width budget and folds away.
        with gr.Sidebar(label="Settings", width=SIDEBAR_WIDTH, elem_id="settings"):
            settings, preset_note = settings_column(list(cache.presets))
        with gr.Tabs():
            with gr.Tab("Chat", id="chat"):
                chat = chat_layout(settings, preset_note)
            with gr.Tab("Sweep", id="sweep") as sweep_block:
                sweep = sweep_layout()
        wire_chat(demo, chat, cache, log_dir, config.budget)
        wire_sweep(demo, sweep, sweep_block, chat, cache, config.budget)
    # api_open=False: queued endpoints are called through the queue only (gradio_client, /call/...), which fills in the
    # page's hidden state; a direct POST to /run/chat gets a 404 that says so instead of a 500.
    demo.queue(default_concurrency_limit=config.concurrency, max_size=QUEUE_SIZE, api_open=False)
    # Gradio deletes its cached copies on a clean shutdown only; a stopped server must leave none either way.
    atexit.register(delete_files_created_by_app, demo, None)
    return demo
