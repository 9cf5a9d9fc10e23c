"""``--dtype auto`` on a CPU (precision.py): the choice from injected timings, and the loaders keeping the chosen
models. Real timings are never asserted: the benchmark measures speed."""

from __future__ import annotations

import os

import pytest
import torch

from xpress_core import hub, precision
from xpress_core.models import load_models
from xpress_core.precision import BF16_MARGIN, DtypeTiming, choose_dtype, fastest, load_fastest, time_dtypes


def timing(plain_token_ms: float, round_token_ms: float | None) -> DtypeTiming:
    rounds = None if round_token_ms is None else round_token_ms / 1000
    return DtypeTiming(plain_token_ms / 1000, None if rounds is None else 3 * rounds, plain_token_ms / 1000, rounds)


@pytest.mark.parametrize(
    "fp32,bf16,want,says",
    [
        ((4.0, 2.0), (5.0, 1.5), "bfloat16", "bfloat16 was 1.33x faster per token"),  # the rounds decide, not plain
        ((4.0, 2.0), (3.0, 2.0 / 1.03), "float32", "only 1.03x faster"),  # within the margin
        ((3.0, 1.5), (2.0, 2.0), "float32", "float32 was 1.33x faster per token"),
        ((4.0, None), (3.0, None), "bfloat16", "a plain step: bfloat16 was 1.33x"),  # no drafter: plain decides
        ((3.0, None), (3.1, None), "float32", "a plain step: float32 was 1.03x"),
    ],
)
def test_the_faster_dtype_per_token_is_kept_and_bf16_only_past_the_margin(fp32, bf16, want, says):
    assert 1.03 < 1 + BF16_MARGIN
    choice = choose_dtype({"float32": timing(*fp32), "bfloat16": timing(*bf16)}, threads=2)
    assert choice.dtype == want
    assert says in choice.reason and "measured at load, 2 threads" in choice.reason
    assert f"{want} " in choice.reason.split("(", 1)[1]  # the figures name the kept dtype first
    assert choice.to_json()["timings"]["bfloat16"]["plain_token_s"] == bf16[0] / 1000


def test_fastest_keeps_the_chosen_models_and_says_how_long_choosing_took(monkeypatch):
    loaded = {}

    def load(name):
        loaded[name] = object()
        return loaded[name]

    timings = {"float32": timing(4.0, 2.0), "bfloat16": timing(5.0, 1.0)}
    monkeypatch.setattr(precision, "time_dtypes", lambda candidates: timings)
    models, choice = fastest(load, threads=3)
    assert set(loaded) == {"float32", "bfloat16"} and models is loaded["bfloat16"]
    assert choice.dtype == "bfloat16" and choice.threads == 3 and "loading and timing both took" in choice.reason


def test_load_fastest_times_both_dtypes_on_a_native_bf16_cpu_and_keeps_the_faster(zoo, monkeypatch):
    """The loader's wiring, with the timings injected: each way the choice goes, the target returned is in that
    dtype, and carries the choice; pinned, untimed and emulated-bf16 loads say why."""
    monkeypatch.setattr("xpress_core.models.dtypes.native_bf16", lambda: True)
    for timings, want in (
        ({"float32": timing(4.0, 2.0), "bfloat16": timing(5.0, 1.0)}, torch.bfloat16),
        ({"float32": timing(4.0, 1.0), "bfloat16": timing(5.0, 2.0)}, torch.float32),
    ):
        monkeypatch.setattr(precision, "time_dtypes", lambda candidates, timings=timings: timings)
        precision.cache_file().unlink(missing_ok=True)  # measured afresh each way
        models = load_fastest(zoo["llama"], zoo["drafter_llama"], device="cpu")
        # The drafter drafts in bf16 beside either target on such a CPU (models.drafter_dtype)
        assert models.target.dtype == want and next(models.drafter.model.parameters()).dtype == torch.bfloat16
        assert models.dtype_choice.dtype == str(want).removeprefix("torch.")
        assert models.dtype_choice.reason.startswith("measured at load")
    pinned = load_fastest(zoo["llama"], "none", device="cpu", dtype="float32")
    assert pinned.dtype_choice.reason == "pinned by --dtype float32" and pinned.target.dtype == torch.float32
    untimed = load_models(zoo["llama"], "none", device="cpu")  # the plain loader goes by the CPU's flags
    assert untimed.target.dtype == torch.bfloat16 and "not timed" in untimed.dtype_choice.reason
    monkeypatch.setattr("xpress_core.models.dtypes.native_bf16", lambda: False)
    emulated = load_fastest(zoo["llama"], "none", device="cpu")
    assert emulated.target.dtype == torch.float32 and "no native bf16" in emulated.dtype_choice.reason


def test_time_dtypes_times_plain_steps_and_rounds_of_each_candidate(zoo):
    """The real timing, on tiny models: every figure is there and positive (their sizes are the benchmark's job)."""
    candidates = {
        name: load_models(zoo["llama"], zoo["drafter_llama"], device="cpu", dtype=name) for name in ("float32", "bf16")
    }
    timings = time_dtypes(candidates, turns=1)
    assert set(timings) == {"float32", "bf16"}
    for t in timings.values():
        assert min(t.plain_step_s, t.round_s, t.plain_token_s, t.round_token_s) > 0
        assert t.round_token_s <= t.round_s  # a round emits at least one token


def bf16_cpu_with_counted_timings(monkeypatch, tmp_path) -> list:
    """A CPU with native bf16 whose timings favour bf16, a cache of the test's own; returns the list each timing of
    the dtypes appends to."""
    monkeypatch.setattr("xpress_core.models.dtypes.native_bf16", lambda: True)
    monkeypatch.setenv(hub.CACHE_ENV, str(tmp_path / "cache"))
    calls = []

    def timed(candidates):
        calls.append(sorted(candidates))
        return {"float32": timing(4.0, 2.0), "bfloat16": timing(5.0, 1.0)}

    monkeypatch.setattr(precision, "time_dtypes", timed)
    return calls


def test_the_choice_is_cached_per_machine_and_models_and_a_changed_model_is_measured_again(zoo, monkeypatch, tmp_path):
    """The second load reads the cache and times nothing, says so and keeps the figures that chose; another drafter,
    or new weights of the same target folder, are measured again; the cache lives where the environment says."""
    calls = bf16_cpu_with_counted_timings(monkeypatch, tmp_path)
    first = load_fastest(zoo["llama"], zoo["drafter_llama"], device="cpu")
    again = load_fastest(zoo["llama"], zoo["drafter_llama"], device="cpu")
    assert len(calls) == 1 and precision.cache_file() == tmp_path / "cache" / "dtype_choice.json"
    assert first.dtype_choice.dtype == again.dtype_choice.dtype == "bfloat16" and again.target.dtype == torch.bfloat16
    assert "cached in" in again.dtype_choice.reason and again.dtype_choice.reason.startswith("measured at load")
    assert again.dtype_choice.timings["bfloat16"].round_token_s == pytest.approx(1.0e-3)
    load_fastest(zoo["llama"], "none", device="cpu")  # another drafter: another key
    assert len(calls) == 2
    weights = next(p for p in sorted(zoo["llama"].iterdir()) if p.suffix == ".safetensors")
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 10**9))  # new weights
    load_fastest(zoo["llama"], zoo["drafter_llama"], device="cpu")
    assert len(calls) == 3


def test_the_app_the_cli_and_the_benchmark_run_in_one_cached_choice(zoo, monkeypatch, tmp_path):
    """Measured once, then every load of the same models at the same threads reads it: a second app process (a new
    ModelCache), the CLI's loader and the benchmark's dtype all run in the dtype the first load chose, without
    timing again (issue 48: loads timed afresh flipped between the dtypes on one quiet machine)."""
    import argparse

    from xpress_app.config import AppConfig
    from xpress_app.models import ModelCache
    from xpress_core.bench.cli import bench_dtype
    from xpress_core.presets import ModelPreset

    calls = bf16_cpu_with_counted_timings(monkeypatch, tmp_path)
    preset = ModelPreset("tiny", str(zoo["llama"]), str(zoo["drafter_llama"]))
    first = ModelCache(AppConfig((preset,), device="cpu")).get("tiny").speculative
    again = ModelCache(AppConfig((preset,), device="cpu")).get("tiny").speculative
    cli = load_fastest(zoo["llama"], zoo["drafter_llama"], device="cpu")
    args = argparse.Namespace(dtype="auto", target=str(zoo["llama"]), drafter=str(zoo["drafter_llama"]))
    bench = bench_dtype(args, torch.device("cpu"))
    assert len(calls) == 1
    assert first.target.dtype == again.target.dtype == cli.target.dtype == torch.bfloat16
    assert bench.dtype == "bfloat16" and all("cached in" in m.reason for m in (again.dtype_choice, bench))
    assert again.dtype_choice.timings["bfloat16"].round_token_s == pytest.approx(1.0e-3)


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
def test_an_fp32_target_on_a_native_bf16_cpu_drafts_in_bf16_and_decodes_generates_tokens(zoo, monkeypatch, kind):
    """models.drafter_dtype: the drafter (and its copy of the target's head) in bf16, the target in fp32; the walk's
    head rows through oneDNN (models.keep_rows_head); and the output still fp32 generate's, token for token, in a tree
    and in a chain."""
    from tests.oracles import PROMPTS, hf_greedy, run
    from xpress_core.config import DecodeConfig
    from xpress_core.head import HeadRows
    from xpress_core.models import encode_prompt
    from xpress_core.packing import PackedLinear

    monkeypatch.setattr("xpress_core.models.dtypes.native_bf16", lambda: True)
    models = load_models(zoo[kind], zoo[f"drafter_{kind}"], device="cpu", dtype="float32")
    drafter = models.drafter.model
    assert models.target.dtype == torch.float32 and drafter.dtype == torch.bfloat16
    head = drafter.shared[1]
    assert head is not models.target.get_output_embeddings() and head.weight.dtype == torch.bfloat16
    assert torch.equal(head.weight, models.target.get_output_embeddings().weight.bfloat16())
    # The walk's rows through oneDNN's fp32 kernels (models.keep_rows_head): the head's logits within fp32 rounding
    hidden = torch.randn(9, models.target.config.hidden_size, generator=torch.Generator().manual_seed(0))
    rows = HeadRows(models.target, hidden, first=5)
    assert isinstance(rows.head, PackedLinear)
    with torch.no_grad():
        expected = models.target.get_output_embeddings()(hidden)
    got = torch.stack([rows[node] for node in range(9)])
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    for prompt in PROMPTS:
        ids = encode_prompt(models.tokenizer, prompt, chat=True)
        for drafts in (4, 1):
            _, result = run(models, ids, DecodeConfig(drafts=drafts, steps=1, block=8, max_new_tokens=24))
            assert list(result.token_ids) == hf_greedy(models, ids)
