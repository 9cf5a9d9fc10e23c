"""Launch: parse the options, prepare the model cache, serve the page."""

from __future__ import annotations

import signal
import sys
import threading

from starlette.middleware import Middleware

from xpress_core.errors import XpressError

from .config import MAX_UPLOAD, parse_args
from .log import log_to_stderr
from .models import ModelCache
from .routes import RouteGuard
from .ui import build_app
from .zerogpu import is_zero_gpu


def warm_first_preset(cache: ModelCache, name: str) -> None:
    """Load and calibrate ``name`` ahead of the first request; a failure is left for that request to report."""
    try:
        cache.get(name)
    except Exception as error:  # noqa: BLE001 (the page stays up; the preset's own message comes with its first use)
        print(f"xPress: preparing {name!r} failed: {error!r}", file=sys.stderr)


def main(argv: list[str] | None = None) -> None:
    config = parse_args(argv)
    log_to_stderr()
    cache = ModelCache(config)
    if is_zero_gpu():
        # ZeroGPU forks a worker for GPU calls: the first preset's weights are loaded here, placed on CUDA by spaces'
        # own bookkeeping, so that every worker inherits them. Only loaded: running them would initialise CUDA in this
        # process, which ZeroGPU forbids; the first GPU call calibrates. Whatever fails, the page still comes up.
        try:
            cache.load(config.presets[0].name)
        except XpressError as error:
            print(f"xPress: {error}", file=sys.stderr)  # the page says it again when the preset is used
        except Exception as error:  # noqa: BLE001 (a Hub outage or a broken checkpoint must not keep the page down)
            print(f"xPress: loading {config.presets[0].name!r} failed: {error!r}", file=sys.stderr)
    else:
        # The first preset loads and calibrates while the page comes up, so a newcomer's first message waits for its
        # reply only (SmolLM2: seconds, where loading, timing the dtypes and choosing auto's setting take longer).
        threading.Thread(target=warm_first_preset, args=(cache, config.presets[0].name), daemon=True).start()
    demo = build_app(config, cache)
    # A stop request (SIGTERM: a Space restarting, a test ending) shuts down like Ctrl-C: Gradio closes the server
    # and the exit handlers remove the temporary files.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    demo.launch(
        server_name=config.host,
        server_port=config.port,
        share=False,
        max_file_size=MAX_UPLOAD,
        app_kwargs={"middleware": [Middleware(RouteGuard, blocks=demo)]},
    )
