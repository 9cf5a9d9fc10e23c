"""The xPress app (Gradio): chat with a target LM while a drafter speculates, watch every round, sweep settings.

Map: ``config`` (options, presets, command line) · ``models`` (the shared model cache) · ``settings`` (the controls'
values, prompt fitting) · ``chat`` (one reply: the engine's events turned into views) · ``sweep`` (the Sweep tab's
measurements) · ``figures`` (placeholder and scrubbed figures) · ``texts`` (what the page says) · ``chat_tab`` and
``sweep_tab`` (layout and wiring, one module per tab) · ``ui`` (the page) · ``main`` (launch). Decoding is
``xpress_core``'s; nothing here re-implements it.
"""

import os

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # set before Gradio is imported: no telemetry
