"""The app under ZeroGPU's contract (``tests/zerogpu_standin.py``: each GPU call in a forked worker, its arguments
and results pickled), against the same handlers run in-process: the same tokens, Stop and Clear reaching a reply in
the worker, durations from the request, and no CUDA in the web process."""

from __future__ import annotations

import os
import pickle
import re
import threading
import time
from contextlib import contextmanager
from functools import partial

import pytest
import torch
from gradio_client import Client

from tests.app_server import OUTPUT, ROOT, serve_app, zoo_env
from tests.test_app_api import sweep_args
from tests.test_app_server import engine_text, reply_text, request
from tests.zerogpu_standin import CudaInWebProcess, WorkerError, ZeroGPU, web_process
from xpress_app import chat as app_chat
from xpress_app import chat_tab, main, sweep_tab, zerogpu
from xpress_app import models as app_models
from xpress_app import sweep as app_sweep
from xpress_app.budget import Budget
from xpress_app.config import AppConfig
from xpress_app.session import Controls
from xpress_app.settings import Settings
from xpress_app.sweep import CHAT_BOX, SweepRequest
from xpress_app.texts import EMPTY_MESSAGE
from xpress_app.ui import build_app
from xpress_core.config import DecodeConfig
from xpress_core.engine import decode
from xpress_core.models import encode_prompt, load_models
from xpress_core.presets import ModelPreset

TINY, TINY_AR = "tiny · diffusion", "tiny · autoregressive"
REPLY_STATE = 8  # the Reply's place among the chat endpoint's outputs (``ChatTab.outputs``)


@pytest.fixture(scope="module")
def config(zoo):
    return AppConfig(
        presets=(
            ModelPreset(TINY, str(zoo["llama"]), str(zoo["drafter_llama"])),
            ModelPreset(TINY_AR, str(zoo["llama"]), str(zoo["ar_drafter"])),
        ),
        device="cpu",
    )


@pytest.fixture
def zero():
    standin = ZeroGPU()
    yield standin
    standin.close()


@contextmanager
def on_zerogpu(standin: ZeroGPU):
    """This process as ZeroGPU's web process (no CUDA), the app's GPU functions, as the app decorates them, run by
    the stand-in."""
    with pytest.MonkeyPatch.context() as patch, web_process():
        patch.setattr(app_chat, "chat_turn", standin.GPU(app_chat.chat_turn, duration=app_chat.reply_seconds))
        patch.setattr(sweep_tab, "sweep_turn", standin.GPU(app_sweep.sweep_turn, duration=app_sweep.sweep_seconds))
        yield


def handler(demo, api_name: str):
    return next(d for d in demo.fns.values() if d.api_name == api_name)


def chat_args(message: str, **changes) -> dict:
    base = {"preset": TINY, "drafts": 3, "steps": 2, "block": 4, "max_new_tokens": 24, "auto": False}
    return {"message": message, "history": [], **vars(Settings(**{**base, **changes}))}


def settings_of(args: dict) -> Settings:
    return Settings(**{k: v for k, v in args.items() if k not in ("message", "history")})


def reply_of(demo, controls: Controls, args: dict, between=None) -> list[dict]:
    """The chat endpoint's updates for ``args``; ``between(n)`` is called after the n-th update."""
    chat = handler(demo, "chat")
    Controls.arm(controls)
    updates = []
    for update in chat.fn(controls=controls, request=None, **args):
        updates.append(update if isinstance(update, dict) else {})
        if between:
            between(len(updates))
    return [{chat.outputs.index(c): v for c, v in update.items()} for update in updates]


def final_reply(updates: list[dict]):
    return next(u[REPLY_STATE] for u in reversed(updates) if REPLY_STATE in u)


def engine_ids(models, message: str, args: dict) -> tuple[int, ...]:
    prompt = encode_prompt(models.tokenizer, message, chat=True)
    return list(decode(models, prompt, DecodeConfig.from_mapping(args)))[-1].token_ids


CASES = [
    ("Book a table for two.", {}),
    ("Once upon a time", {"temperature": 0.9, "seed": 7, "race": True}),
    ("Find me a train to Cambridge.", {"preset": TINY_AR, "drafts": 2, "block": 5, "steps": 1}),
]


def test_chat_through_zerogpu_gives_the_in_process_replies_token_for_token(config, zero, zoo, monkeypatch):
    demo = build_app(config)
    in_process = [final_reply(reply_of(demo, Controls(), chat_args(m, **c))) for m, c in CASES]
    demo = build_app(config)  # a fresh web process: nothing loaded, nothing calibrated
    with on_zerogpu(zero):
        forked = [final_reply(reply_of(demo, Controls(), chat_args(m, **c))) for m, c in CASES]
    assert [r.result.token_ids for r in forked] == [r.result.token_ids for r in in_process]
    assert [r.plain_result is not None for r in forked] == [False, True, False]
    assert forked[1].plain_result.token_ids == forked[1].result.token_ids
    oracle = load_models(zoo["llama"], zoo["drafter_llama"], device="cpu")
    assert forked[0].result.token_ids == engine_ids(oracle, CASES[0][0], chat_args(CASES[0][0]))
    # One worker, forked once and reused (as ZeroGPU reuses an idle one): the autoregressive preset was loaded in the
    # web process after the fork, and the worker loaded its own.
    (worker,) = zero.workers
    assert worker.process.pid != os.getpid()
    assert zero.durations == [
        app_chat.reply_seconds(m, [], settings_of(chat_args(m, **c)), Budget(), None) for m, c in CASES
    ]
    # The reply crossed back with a reference to the web process's own tokenizer, not a copy of it.
    assert forked[0].token_text.tokenizer is app_models.served().load(TINY).speculative.tokenizer
    assert len(pickle.dumps(forked[0].token_text)) < 1000
    # The web process kept what the worker measured (never measuring itself): a worker forked later, for another
    # GPU, starts calibrated.
    cache = app_models.served()
    assert cache.is_ready(TINY) and cache.is_ready(TINY_AR)
    assert cache.load(TINY).speculative.costs.draft_work.__self__ is cache.load(TINY).speculative.drafter
    worker.close()

    def no_calibration(*args):
        raise AssertionError("a worker forked after the first calibrated again")

    monkeypatch.setattr(app_models, "calibrated", no_calibration)
    with on_zerogpu(zero):
        again = final_reply(reply_of(demo, Controls(), chat_args(CASES[0][0], auto=True)))
    assert len(zero.workers) == 2
    assert again.result.token_ids == forked[0].result.token_ids  # greedy, auto's settings: the target's tokens


def test_stop_and_clear_end_a_reply_running_in_the_worker(config, zero):
    demo = build_app(config)
    controls = Controls()
    long_reply = chat_args("Once upon a time", max_new_tokens=200, animate=True)  # paced: a frame per denoise step
    with on_zerogpu(zero):
        # An empty message, and a reply stopped while it waited, are answered without a GPU call.
        assert reply_of(demo, controls, chat_args("   "))[-1][2] == EMPTY_MESSAGE
        controls.request_stop()
        assert list(handler(demo, "chat").fn(controls=controls, request=None, **chat_args("Hello"))) == []
        assert zero.durations == []
        stopped = reply_of(demo, controls, long_reply, between=lambda n: n == 3 and controls.request_stop())
        assert "■ Stopped after" in stopped[-1][2]
        assert final_reply(stopped).result is None
        first = final_reply(stopped).traces[-1].new_tokens_total
        assert first < 200
        # Clear from another request while a reply streams: it stops the reply and waits for its last update.
        cleared = {}
        streaming = threading.Thread(target=lambda: cleared.update(updates=reply_of(demo, controls, long_reply)))
        streaming.start()
        while controls.running == 0:
            time.sleep(0.05)
        time.sleep(1.0)
        emptied = clear_handler(demo).fn(controls)
        streaming.join(timeout=30)
        assert not streaming.is_alive()
        assert "■ Stopped after" in cleared["updates"][-1][2]
        assert [] in emptied.values()
        # Send again: the stop is forgotten and the next reply runs to its end.
        assert final_reply(reply_of(demo, controls, chat_args("Hello"))).result is not None


def clear_handler(demo):
    return next(d for d in demo.fns.values() if isinstance(d.fn, partial) and d.fn.func is chat_tab.cleared)


def test_sweep_through_zerogpu_measures_what_the_in_process_sweep_measures(config, zero):
    args = {"drafts": [1, 2], "steps": [1, 2], "block": 4, "source": CHAT_BOX, "count": 1, "max_new_tokens": 8}
    progress, controls, stop_at = [], Controls(), [None]

    def sweep(demo):
        fn = handler(demo, "sweep").fn
        Controls.arm(controls)
        update = fn(TINY, message="Book a table for two.", controls=controls, request=None, progress=record, **args)
        return {getattr(c, "elem_id", None): v for c, v in update.items()}

    def record(value, desc=None, unit=None):
        progress.append(value)
        if value and value[0] == stop_at[0]:
            controls.request_stop()  # the Stop button, pressed while the sweep runs

    in_process = sweep(build_app(config))
    progress.clear()
    demo = build_app(config)
    with on_zerogpu(zero), app_models.served().in_flight.serving():  # a reply in the web process meanwhile
        forked = sweep(demo)
    assert "Every output equals plain decoding's" in forked["sweep-status"]
    assert "1 other request in the app at once" in forked["sweep-status"]  # counted across the fork
    assert forked["sweep-heatmap-tau"].data[0].z == in_process["sweep-heatmap-tau"].data[0].z
    assert progress[-1][0] == progress[-1][1] > 0  # the runs' progress crossed back as they went
    request = SweepRequest(TINY, (1, 2), (1, 2), 4, CHAT_BOX, 1, 8)
    assert zero.durations == [app_sweep.sweep_seconds(request, "Book a table for two.", Budget(), None)]
    stop_at[0] = 2
    with on_zerogpu(zero):
        stopped = sweep(demo)
    # The worker reads the stop after its next run at the latest (it may check before the request lands).
    done, total = map(int, re.match(r"■ Sweep stopped after (\d+) of (\d+) runs", stopped["sweep-status"]).groups())
    assert 2 <= done <= 3 < total


def test_a_sweep_stopped_while_it_waits_runs_none_of_its_grid(config, zero):
    """Stop pressed while the sweep is queued (after Run armed it): the handler answers before loading or asking for
    a GPU; a stop that lands as the GPU is attached ends the sweep in the worker before its first run."""
    args = {"drafts": [1, 2], "steps": [1], "block": 4, "source": CHAT_BOX, "count": 1, "max_new_tokens": 8}
    demo, controls, progress = build_app(config), Controls(), []
    fn = handler(demo, "sweep").fn
    Controls.arm(controls)
    controls.request_stop()  # the Stop button, while the sweep waits in the queue
    with on_zerogpu(zero):
        update = fn(TINY, message="Book a table.", controls=controls, request=None, progress=progress.append, **args)
    shown = {getattr(c, "elem_id", None): v for c, v in update.items()}
    assert shown["sweep-status"] == app_sweep.STOPPED_BEFORE_FIRST_RUN and zero.durations == [] and progress == []
    request = SweepRequest(TINY, (1, 2), (1,), 4, CHAT_BOX, 1, 8)
    with on_zerogpu(zero):
        app_sweep.load_for_sweep(app_models.served(), request, "Book a table.")
        items = list(sweep_tab.sweep_turn(request, "Book a table.", Budget(), controls.ticket))
    assert len(zero.durations) == 1  # the worker ran it, and measured nothing
    assert [i.status for i in items if isinstance(i, app_sweep.SweepView)] == [app_sweep.STOPPED_BEFORE_FIRST_RUN]
    assert not [i for i in items if isinstance(i, tuple)]  # no run's progress


def test_a_sessions_stop_file_goes_when_the_session_ends(config):
    """Both tabs' Controls are deleted with their session (Gradio's ``delete_callback``), and with them the file a
    Stop made in the temporary folder."""
    demo = build_app(config)
    states = [b for b in demo.blocks.values() if isinstance(getattr(b, "value", None), Controls)]
    assert len(states) == 2 and all(state.delete_callback == Controls.release for state in states)
    controls = Controls()
    controls.request_stop()
    assert os.path.exists(controls.ticket.path)
    controls.release()
    assert not os.path.exists(controls.ticket.path) and not controls.ticket.requested()
    Controls().release()  # a session that never made a ticket


def test_the_standin_refuses_what_zerogpu_cannot_pickle():
    zero = ZeroGPU()
    try:
        with pytest.raises((AttributeError, TypeError), match="pickle"):
            zero.GPU(lambda check: check())(lambda: True)  # an argument: the call fails before the worker runs
        with pytest.raises(WorkerError, match="does not pickle"):
            list(zero.GPU(unpicklable_values)())
        with pytest.raises(WorkerError, match="holds a tensor of shape"):
            zero.GPU(lambda: {"logits": torch.zeros(2, 3)})()
        with web_process():  # what would initialise CUDA, or run a model, raises in the web process
            with pytest.raises(CudaInWebProcess):
                torch.cuda.synchronize()
            with pytest.raises(CudaInWebProcess, match="Linear forward"):
                torch.nn.Linear(2, 2)(torch.zeros(1, 2))
    finally:
        zero.close()


def unpicklable_values():
    yield lambda: None


def hub_down(*args, **kwargs):
    raise OSError("Hub down")


def test_zerogpu_start_loads_the_first_preset_without_running_it_and_survives_a_failed_load(zoo, monkeypatch, capsys):
    launched = []
    monkeypatch.setattr("gradio.Blocks.launch", lambda demo, **options: launched.append(options))
    monkeypatch.setattr(zerogpu, "spaces", ZeroGPU())
    monkeypatch.setenv("SPACES_ZERO_GPU", "true")
    for name, value in {"XPRESS_TARGET": zoo["llama"], "XPRESS_DRAFTER": zoo["drafter_llama"]}.items():
        monkeypatch.setenv(name, str(value))
    monkeypatch.setenv("XPRESS_DEVICE", "cpu")
    with web_process():  # a forward at start would raise (and be reported)
        main.main([])
        assert "xPress:" not in capsys.readouterr().err
        cache = app_models.served()
        first = next(iter(cache.presets))
        assert cache.is_loaded(first) and not cache.load(first).ready
        monkeypatch.setattr(app_models, "load_target", hub_down)
        main.main([])  # the page comes up all the same
        assert "Hub down" in capsys.readouterr().err
    assert len(launched) == 2


def test_app_py_on_zerogpu_answers_chat_and_sweep_and_a_cancelled_reply_frees_the_worker(zoo):
    """``python app.py`` as a ZeroGPU Space runs it: ``spaces`` imported first (the stand-in package), the first
    preset loaded at start, every reply and sweep in a forked worker, driven through the API."""
    env = zoo_env(zoo) | {
        "SPACES_ZERO_GPU": "true",
        "PYTHONPATH": os.pathsep.join([str(ROOT / "tests" / "zerogpu_spaces"), str(ROOT)]),
    }
    models = load_models(zoo["llama"], zoo["drafter_llama"], device="cpu")
    with serve_app(env, "app-zerogpu") as url:
        client = Client(url, verbose=False)
        for args in (request("Book a table for two."), request("Once upon a time", temperature=0.8, seed=3)):
            assert reply_text(client.predict(api_name="/chat", **args)) == engine_text(models, args)
        status = client.predict(api_name="/sweep", **sweep_args(drafts=[1, 2]))[0]
        assert "Every output equals plain decoding's" in status
        job = client.submit(api_name="/chat", **request("Once upon a time", animate=True, max_new_tokens=400))
        deadline = time.monotonic() + 60
        while len(job.outputs()) < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
        job.cancel()  # Gradio closes the stream: the stand-in, as spaces, tells the worker to stop
        args = request("hello")
        assert reply_text(client.predict(api_name="/chat", **args)) == engine_text(models, args)
    log = (OUTPUT / "app-zerogpu.log").read_text(encoding="utf-8", errors="replace")
    assert "Traceback" not in log and "CudaInWebProcess" not in log
    # The replies and the sweep ran in workers (one each, reused), not in the web process.
    assert [line.split()[-1] for line in log.splitlines() if "ZeroGPU stand-in: worker" in line] == [
        "reply_on_gpu",
        "sweep_on_gpu",
    ]


def test_a_gpu_call_asks_for_the_time_its_request_needs_within_the_budget():
    def reply(**changes):
        return app_chat.reply_seconds("hi", [], Settings(**{"max_new_tokens": 100, **changes}), Budget(), None)

    assert reply(max_new_tokens=200) - zerogpu.GPU_SETUP_S == 2 * (reply() - zerogpu.GPU_SETUP_S) > 0
    assert reply(race=True) == reply(max_new_tokens=200)  # the Race decodes the tokens twice
    assert reply(animate=True, auto=False, steps=4) > reply(animate=True, auto=False, steps=1) > reply()
    capped = app_chat.reply_seconds("hi", [], Settings(max_new_tokens=512, animate=True), Budget(wall_s=30.0), None)
    assert capped == zerogpu.GPU_SETUP_S + 30.0  # the request's budget ends it there anyway

    def sweep(**changes):
        request = SweepRequest(**{"preset": TINY, "drafts": (1,), "steps": (1,), "max_new_tokens": 8, **changes})
        return app_sweep.sweep_seconds(request, None, Budget(), None)

    assert sweep(drafts=(1, 2, 4)) > sweep(drafts=(1, 2)) > sweep()  # settings and repeats (within 48 runs)
    assert sweep(max_new_tokens=64) > sweep() and sweep(prompts=4) > sweep(prompts=2)
