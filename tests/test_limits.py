"""One bound for every way text reaches a model: 2 MB through each entry point (the chat box, the history, the Sweep's
chat-box prompt, a prompt file, the CLI, the benchmark) ends in a fitted prompt or a clear message, and the tokenizer
never sees more than the character caps allow (the oracle: what the tokenizer was given, counted)."""

from __future__ import annotations

import itertools
import json
import time

import pytest
from transformers import PreTrainedTokenizerBase

from xpress_app import budget as budget_module
from xpress_app import chat as app_chat
from xpress_app.budget import Budget
from xpress_app.chat import run_chat
from xpress_app.config import AppConfig, parse_args
from xpress_app.models import ModelCache
from xpress_app.settings import Settings
from xpress_app.sweep import CHAT_BOX, SweepRequest, run_sweep
from xpress_core.chat import MAX_HISTORY_CHARS, MAX_MESSAGE_CHARS, MAX_PROMPT_TOKENS, fit_prompt, prompt_budget
from xpress_core.cli import main
from xpress_core.data import read_prompt_file
from xpress_core.engine import decode
from xpress_core.models import context_limit, encode_prompt, load_models
from xpress_core.presets import ModelPreset

TINY = "tiny"
TWO_MB = 2_000_000
# Text around a message in the chat template, at most (roles, markers): what the tokenizer may see beyond the caps.
TEMPLATE_CHARS = 200


def two_mb(word: str = "flight ") -> str:
    return (word * (TWO_MB // len(word) + 1))[:TWO_MB]


@pytest.fixture(scope="module")
def cache(zoo):
    return ModelCache(AppConfig((ModelPreset(TINY, str(zoo["llama"]), str(zoo["drafter_llama"])),), device="cpu"))


@pytest.fixture(scope="module")
def models(zoo):
    return load_models(zoo["llama"], zoo["drafter_llama"], device="cpu")


@pytest.fixture
def seen(monkeypatch):
    """The most characters one tokenizer call was given (text, or a chat template's message contents)."""
    most = [0]
    call, template = PreTrainedTokenizerBase.__call__, PreTrainedTokenizerBase.apply_chat_template

    def counted_call(self, text=None, *args, **kwargs):
        most[0] = max(most[0], len(text) if isinstance(text, str) else 0)
        return call(self, text, *args, **kwargs)

    def counted_template(self, conversation, *args, **kwargs):
        most[0] = max(most[0], sum(len(m["content"]) for m in conversation))
        return template(self, conversation, *args, **kwargs)

    monkeypatch.setattr(PreTrainedTokenizerBase, "__call__", counted_call)
    monkeypatch.setattr(PreTrainedTokenizerBase, "apply_chat_template", counted_template)
    return most


def timed(what: str, started: float) -> None:
    print(f"{what}: {time.perf_counter() - started:.2f} s")


def ends_text(models, ids, text: str) -> bool:
    kept = models.tokenizer.decode(ids[0], skip_special_tokens=True).strip()
    return bool(kept) and text.endswith(kept)


def test_a_2_mb_chat_box_message_is_fitted(cache, models, seen):
    text = two_mb()
    started = time.perf_counter()
    views = list(run_chat(cache, text, [], Settings(preset=TINY, max_new_tokens=8, auto=False, block=4)))
    timed("2 MB chat box", started)
    assert f"your message was cut to its last {MAX_MESSAGE_CHARS} characters" in views[-1].status
    assert views[-1].done and views[-1].reply.result.new_tokens > 0
    assert seen[0] <= MAX_MESSAGE_CHARS + TEMPLATE_CHARS


def test_a_2_mb_history_is_fitted(cache, seen):
    one_message = [{"role": "user", "content": two_mb()}, {"role": "assistant", "content": "Which city?"}]
    many = [{"role": "user", "content": "book " * 200}, {"role": "assistant", "content": "sure " * 200}] * 1000
    assert sum(len(m["content"]) for m in many) >= TWO_MB
    for history in (one_message, many):
        started = time.perf_counter()
        views = list(run_chat(cache, "hello", history, Settings(preset=TINY, max_new_tokens=8)))
        timed(f"2 MB history of {len(history)} messages", started)
        assert "the chat keeps its last" in views[-1].status and views[-1].done
    assert seen[0] <= MAX_HISTORY_CHARS + TEMPLATE_CHARS


def test_a_2_mb_sweep_prompt_is_fitted(cache, models, seen):
    text = two_mb("Tell me a story. ")
    request = SweepRequest(preset=TINY, drafts=(1,), steps=(1,), block=4, source=CHAT_BOX, max_new_tokens=4)
    started = time.perf_counter()
    view = run_sweep(cache, request, text)
    timed("2 MB sweep prompt", started)
    assert f"your message was cut to its last {MAX_MESSAGE_CHARS} characters" in view.status
    assert view.run is not None and view.run.mismatches == ()
    budget = prompt_budget(context_limit(models.target), 4)
    assert {m.prompt_tokens for m in view.run.measurements} <= set(range(1, budget + 1))
    assert seen[0] <= MAX_MESSAGE_CHARS + TEMPLATE_CHARS


def test_a_2_mb_prompt_file_is_fitted(models, tmp_path, seen):
    path = tmp_path / "prompts.jsonl"
    text = two_mb()
    lines = [{"prompt": text, "name": "raw"}, {"messages": [{"role": "user", "content": text}], "name": "chat"}]
    path.write_text("\n".join(json.dumps(line) for line in lines))
    started = time.perf_counter()
    raw, chat = read_prompt_file(path)
    limit = context_limit(models.target)
    for prompt in (raw, chat):
        fitted = prompt.fitted(models.tokenizer, limit, 16)
        assert fitted.ids.shape[1] <= prompt_budget(limit, 16) and ends_text(models, fitted.ids, text)
        assert f"cut to its last {MAX_MESSAGE_CHARS} characters" in fitted.notice
    timed("2 MB prompt file, read and fitted", started)
    assert seen[0] <= MAX_MESSAGE_CHARS + TEMPLATE_CHARS


def test_the_cli_fits_a_2_mb_prompt_and_says_so(zoo, capsys, seen):
    times = []
    for chat in ([], ["--chat"]):
        started = time.perf_counter()
        argv = ["generate", "--prompt", two_mb(), "--target", str(zoo["llama"]), "--drafter", str(zoo["drafter_llama"])]
        assert main([*argv, "--max-new-tokens", "4", "--json", *chat]) == 0
        captured = capsys.readouterr()
        times.append(time.perf_counter() - started)
        assert captured.err.startswith("note: Long prompt:") and "cut to its last" in captured.err
        assert json.loads(captured.out)["new_tokens"] > 0
    print(f"2 MB CLI prompt, raw and chat (models loaded each time): {times[0]:.2f} s, {times[1]:.2f} s")
    assert seen[0] <= MAX_MESSAGE_CHARS + TEMPLATE_CHARS


def test_the_bench_fits_a_2_mb_prompt_file(zoo, tmp_path, capsys, seen):
    path = tmp_path / "prompts.jsonl"
    path.write_text(json.dumps({"messages": [{"role": "user", "content": two_mb()}], "name": "huge"}))
    out = tmp_path / "bench.json"
    argv = ["bench", "--target", str(zoo["llama"]), "--drafter", str(zoo["drafter_llama"]), "--prompts", str(path)]
    options = ["--methods", "hf-generate,xpress", "--grid", "K=1 T=1 L=4", "--max-new-tokens", "4", "--repeats", "1"]
    options += ["--temperatures", "0", "--search-prompts", "0", "--json", str(out), "--no-progress"]
    started = time.perf_counter()
    assert main([*argv, *options]) == 0
    err = capsys.readouterr().err
    timed("2 MB bench prompt", started)
    assert "note: prompt huge: Long prompt: your message was cut" in err
    assert seen[0] <= MAX_MESSAGE_CHARS + TEMPLATE_CHARS


def test_the_token_cap_holds_without_a_context_limit(models):
    """A target that states no context still gets at most MAX_PROMPT_TOKENS prompt tokens."""
    text = " ".join(str(i) for i in range(MAX_MESSAGE_CHARS))[-MAX_MESSAGE_CHARS:]
    assert len(models.tokenizer(text)["input_ids"]) > MAX_PROMPT_TOKENS
    fitted = fit_prompt(models.tokenizer, text, False, None, 16)
    assert MAX_PROMPT_TOKENS - 2 <= fitted.ids.shape[1] <= MAX_PROMPT_TOKENS
    assert "the prompt was cut" in fitted.notice and ends_text(models, fitted.ids, text)


# --- the budget per request ------------------------------------------------------------------------------------------


@pytest.fixture
def growing_memory(monkeypatch):
    """The server's memory as the budget reads it: 100 MB more at every reading."""
    readings = itertools.count()
    monkeypatch.setattr(budget_module, "rss_mb", lambda: 1000.0 + 100.0 * next(readings))


def full_reply(models, text: str, settings: Settings) -> list[int]:
    prompt = encode_prompt(models.tokenizer, [{"role": "user", "content": text}], chat=True)
    return list(list(decode(models, prompt, settings.decode_config()))[-1].token_ids)


def test_a_reply_past_its_time_budget_ends_with_a_message_and_the_next_is_served(cache, models, monkeypatch):
    monkeypatch.setattr(app_chat, "ANIMATION_FRAME_S", 0.05)  # animation paces the reply: it outlasts the budget
    slow = Settings(preset=TINY, auto=False, drafts=2, steps=3, block=4, max_new_tokens=400, animate=True)
    started = time.perf_counter()
    views = list(run_chat(cache, "Once upon a time", [], slow, budget=Budget(wall_s=0.5)))
    timed("a reply with a 0.5 s budget", started)
    status = views[-1].status
    assert "■ Stopped after" in status and "the request's time budget is spent" in status and "s of 0.5 s)" in status
    emitted = [token for trace in views[-1].reply.traces for token in trace.emitted]
    full = full_reply(models, "Once upon a time", slow)
    assert 0 < len(emitted) < len(full) and full[: len(emitted)] == emitted  # what it had, as the engine writes it
    views = list(run_chat(cache, "hello", [], Settings(preset=TINY, max_new_tokens=8)))
    assert views[-1].done and "✓" in views[-1].status


def test_a_reply_past_its_memory_budget_ends_with_a_message(cache, models, growing_memory):
    chosen = Settings(preset=TINY, auto=False, drafts=2, steps=1, block=4, max_new_tokens=64)
    views = list(run_chat(cache, "Once upon a time", [], chosen, budget=Budget(memory_mb=250)))
    assert "the server's memory grew 300 MB during the request (its budget: 250 MB)" in views[-1].status
    emitted = [token for trace in views[-1].reply.traces for token in trace.emitted]
    assert full_reply(models, "Once upon a time", chosen)[: len(emitted)] == emitted


def test_a_sweep_past_its_budget_ends_between_runs_with_a_message(cache, growing_memory):
    request = SweepRequest(preset=TINY, drafts=(1, 2), steps=(1,), block=4, source=CHAT_BOX, max_new_tokens=4)
    view = run_sweep(cache, request, "Book a table.", budget=Budget(memory_mb=150))
    assert view.status == (
        "■ Sweep stopped after 2 of 12 runs: the server's memory grew 200 MB during the request (its budget: 150 MB): "
        "nothing measured to show."
    )


def test_the_budget_is_set_by_flags_and_environment(monkeypatch, capsys):
    assert parse_args([]).budget == Budget()
    monkeypatch.setenv("XPRESS_REQUEST_S", "5")
    assert parse_args(["--request-memory-mb", "100"]).budget == Budget(wall_s=5.0, memory_mb=100.0)
    for bad in (["--request-seconds", "0"], ["--request-memory-mb", "nan"], ["--request-seconds", "soon"]):
        with pytest.raises(SystemExit):
            parse_args(bad)
    assert "error:" in capsys.readouterr().err
