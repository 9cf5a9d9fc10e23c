"""Packed bf16 linear layers (packing.py): the oracle is the same model unpacked, bit for bit (logits and tokens) where
every product a run made agrees bit for bit with ``F.linear`` at its row count (the counts ``packed_linear`` checks,
and on CPUs whose kernels agree at every count: those without AMX or AVX-512 BF16), and at every row count the exact
product within bf16 rounding (float64), which holds on every CPU."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from transformers import AutoModelForCausalLM

from tests.oracles import hf_greedy
from xpress_app.config import Hardware
from xpress_core.config import DecodeConfig
from xpress_core.drafters.base import NoDrafter
from xpress_core.engine import decode_to_end
from xpress_core.models import EMBEDDED_DRAFTER, EMBEDDED_TARGET, encode_prompt, load_models
from xpress_core.packing import (
    CHECK_TOKENS,
    EXACT_ROWS,
    ONE_TOKEN_ATEN,
    SHARED_INPUT_GROUPS,
    TIMING_TURNS,
    PackedLinear,
    SharedPart,
    aten_kernels,
    bucket_rows,
    fuse_shared_inputs,
    one_token_kernels,
    pack_linears,
    packed_linear,
    packing_available,
    warm_packed,
)

PROMPT = "I want to book a table for two at an Italian restaurant tonight."
BF16_CPU = packing_available(torch.bfloat16, torch.device("cpu"))
needs_bf16_packing = pytest.mark.skipif(not BF16_CPU, reason="this CPU's oneDNN has no bf16 kernels to pack for")


def packed_count(model: nn.Module) -> int:
    """Linear layers whose products are packed: alone, or in a shared product (``fuse_shared_inputs``)."""
    return sum(isinstance(m, PackedLinear | SharedPart) for m in model.modules())


def shared_count(model: nn.Module) -> int:
    return sum(isinstance(m, SharedPart) for m in model.modules())


def unpacked_models(monkeypatch, *args, **kwargs):
    """``load_models`` with packing turned off: the oracle."""
    with monkeypatch.context() as patch:
        patch.setattr("xpress_core.models.pretrained.pack_linears", lambda model: 0)
        return load_models(*args, **kwargs)


@needs_bf16_packing
@pytest.mark.parametrize("pair", ["zoo", "embedded"])
def test_packed_models_decode_the_same_tokens_as_unpacked(zoo, monkeypatch, pair):
    """Every bf16 linear layer of target and drafter is packed, and nothing the models compute changes: the prompt's
    logits, greedy ``generate`` and the engine's speculative and sampled tokens are those of the unpacked models."""
    target, drafter = (zoo["llama"], zoo["drafter_llama"]) if pair == "zoo" else (EMBEDDED_TARGET, EMBEDDED_DRAFTER)
    packed = load_models(target, drafter, device="cpu", dtype="bfloat16")
    # The packed products alone: where this CPU ran one-token forwards faster through ATen, the packed target would
    # compute its plain steps as the unpacked one does with oneDNN off (the test at the end of this file).
    object.__setattr__(packed.target, ONE_TOKEN_ATEN, False)
    plain = unpacked_models(monkeypatch, target, drafter, device="cpu", dtype="bfloat16")
    linears = sum(isinstance(m, nn.Linear) for m in plain.target.modules())
    assert packed_count(packed.target) == linears and packed_count(plain.target) == 0
    # A refiner head runs in fp32 (XpressDrafter.fuse_projections), which is not packed; every bf16 layer is.
    bf16_linears = [
        m for m in plain.drafter.model.modules() if isinstance(m, nn.Linear) and m.weight.dtype == torch.bfloat16
    ]
    assert packed_count(packed.drafter.model) == len(bf16_linears) > 0
    # A prompt of a row count every layer was checked at (``CHECK_TOKENS``): its logits bit for bit on every CPU
    prompt_ids = encode_prompt(packed.tokenizer, PROMPT * 8, chat=True)[:, :CHECKED_PROMPT]
    assert prompt_ids.shape[1] == CHECKED_PROMPT in CHECK_TOKENS
    with torch.no_grad():
        assert torch.equal(packed.target(prompt_ids).logits, plain.target(prompt_ids).logits)
    # Plain steps: the prompt's count, then one row at a time (both checked): the same tokens on every CPU
    assert hf_greedy(packed, prompt_ids) == hf_greedy(plain, prompt_ids)
    for cfg in (
        DecodeConfig(drafts=2, steps=2, block=4, max_new_tokens=24),
        DecodeConfig(drafts=1, steps=1, block=8, max_new_tokens=24, temperature=0.8, seed=3),
    ):
        with ProductsRun([packed.target, packed.drafter.model]) as run:
            got = decode_to_end(packed, prompt_ids, cfg).token_ids
        run.check(lambda got=got, cfg=cfg: got == decode_to_end(plain, prompt_ids, cfg).token_ids)


def test_only_bf16_on_a_cpu_is_packed(zoo):
    """fp32 multiplies faster through MKL on the plain layout: an fp32 model keeps its layers."""
    models = load_models(zoo["llama"], zoo["drafter_llama"], device="cpu", dtype="float32")
    assert packed_count(models.target) == 0 and packed_count(models.drafter.model) == 0
    assert pack_linears(nn.Sequential(nn.Linear(8, 4))) == 0


@needs_bf16_packing
def test_layers_that_accelerate_dispatches_keep_their_forward():
    """A layer with an accelerate hook (offloaded weights come and go through it) is left as it is."""
    hooked, plain = nn.Linear(8, 4).to(torch.bfloat16), nn.Linear(8, 4).to(torch.bfloat16)
    hooked._hf_hook = object()
    model = nn.Sequential(hooked, plain)
    assert pack_linears(model) == 1 and model[0] is hooked and isinstance(model[1], PackedLinear)


@needs_bf16_packing
def test_packed_linear_keeps_the_parameters_and_falls_back_under_autograd():
    """The original parameters stay (tied weights, readers of ``.weight``); with autograd on, the product falls back
    to ``F.linear`` (the packed one has no backward), giving the same gradients."""
    torch.manual_seed(0)
    linear = nn.Linear(16, 8).to(torch.bfloat16)
    packed = packed_linear(linear)
    assert packed is not None and packed.weight is linear.weight and packed.bias is linear.bias
    x = torch.randn(5, 16, dtype=torch.bfloat16, requires_grad=True)
    with torch.enable_grad():  # the premise, whatever mode an earlier test left
        packed(x).sum().backward()
        grad = x.grad.clone()
        x.grad = None
        F.linear(x, linear.weight, linear.bias).sum().backward()
    assert torch.equal(grad, x.grad)


@needs_bf16_packing
def test_a_layer_whose_packed_product_differs_stays_unpacked(monkeypatch):
    """The check at packing time: were oneDNN's packed product ever to differ from ``F.linear``'s, the layer keeps
    its plain product (here the packed weight is made wrong on purpose)."""
    linear = nn.Linear(16, 8, bias=False).to(torch.bfloat16)
    reorder = torch.ops.mkldnn._reorder_linear_weight
    monkeypatch.setattr(torch.ops.mkldnn, "_reorder_linear_weight", lambda w, tokens: reorder(w * 2, tokens))
    assert packed_linear(linear) is None
    model = nn.Sequential(linear)
    assert pack_linears(model) == 0 and type(model[0]) is nn.Linear


def test_generate_through_hf_on_a_packed_model_matches_the_saved_model(zoo):
    """A packed target is still an ordinary transformers model to ``generate``: bf16 tokens equal those of the
    checkpoint loaded by transformers alone (packed or not, depending on the CPU), over a prompt of a checked row
    count and then one row a step, where packed products equal ``F.linear``'s on every CPU."""
    models = load_models(zoo["llama"], "none", device="cpu", dtype="bfloat16")
    raw = AutoModelForCausalLM.from_pretrained(zoo["llama"], dtype=torch.bfloat16).eval()
    prompt_ids = encode_prompt(models.tokenizer, PROMPT * 8, chat=True)[:, :CHECKED_PROMPT]
    with torch.no_grad():
        want = raw.generate(prompt_ids, max_new_tokens=16, do_sample=False)[0, prompt_ids.shape[1] :].tolist()
    assert hf_greedy(models, prompt_ids, new=16) == want


def test_the_apps_memory_budget_counts_packed_weights_twice():
    """A CPU server in bf16 holds each linear layer twice (the parameter and its packed copy), as fp32 holds twice
    the bytes: the app's preset check counts both so."""
    assert Hardware.detect("cpu", "float32", memory_gb=8.0).doubled
    assert Hardware.detect("cpu", "bfloat16", memory_gb=8.0).doubled == BF16_CPU


CHECKED_PROMPT = 64  # a row count each packed layer is checked at (``packing.CHECK_TOKENS``)


class ProductsRun:
    """``with ProductsRun(models) as run: ...`` records every packed product the models make (its input and output),
    then ``run.check(equal)``: each product within bf16 rounding of the exact one (every CPU); and ``equal()`` (the
    run's results against the unpacked models') asserted where it is guaranteed: every product was made at a row
    count where each packed layer gives ``F.linear``'s outputs bit for bit (the same kernel: probed as
    ``packed_linear`` probes), so that the unpacked run computes the same numbers. Returns whether it was."""

    def __init__(self, models):
        self.layers = [m for model in models for m in model.modules() if isinstance(m, PackedLinear | SharedPart)]
        self.products: list[tuple[PackedLinear | SharedPart, torch.Tensor, torch.Tensor]] = []

    def __enter__(self):
        record = lambda layer, args, out: self.products.append((layer, args[0].detach(), out.detach()))
        self.hooks = [layer.register_forward_hook(record) for layer in self.layers]
        return self

    def __exit__(self, *exc):
        for hook in self.hooks:
            hook.remove()

    def check(self, equal) -> bool:
        assert self.products
        counts = set()
        for layer, x, out in self.products:
            rows = x.reshape(-1, layer.in_features)
            counts.add(rows.shape[0])
            assert within_bf16_rounding(out.reshape(rows.shape[0], layer.out_features), rows, layer)
        probe = torch.Generator().manual_seed(1)
        with torch.no_grad():
            agree = all(
                torch.equal(layer(x), F.linear(x, layer.weight, layer.bias))
                for count in sorted(counts)
                for layer in self.layers
                for x in [torch.randn(count, layer.in_features, generator=probe).to(layer.weight.dtype)]
            )
        if agree:
            assert equal()
        return agree


BF16_UNIT = 2.0**-8  # bf16's unit roundoff (8 significant bits, round to nearest)
FP32_UNIT = 2.0**-24


def bf16_error_bound(x: torch.Tensor, linear: nn.Linear) -> tuple[torch.Tensor, torch.Tensor]:
    """The exact product (float64) of bf16 ``x`` and ``linear``, and how far any bf16 kernel's result may lie from it:
    the products of two bf16 numbers are exact in fp32, their sum (bias included, n terms) in fp32 in any order lies
    within gamma_n = n u / (1 - n u) of the sum of their magnitudes (u = 2^-24), and the result rounds to bf16 once or,
    where the bias is added after the product was rounded, twice (2^-8 of each value rounded). The bound holds
    whichever kernel a row count gets and whatever its order of accumulation (AMX or AVX-512 BF16 pair dot products
    included), and a wrongly laid out or scaled weight lies far outside it."""
    x64, w64 = x.double(), linear.weight.double()
    b64 = linear.bias.double() if linear.bias is not None else torch.zeros(linear.out_features, dtype=torch.float64)
    product = x64 @ w64.T
    terms = x64.abs() @ w64.abs().T + b64.abs()
    n = linear.in_features + 1
    gamma = n * FP32_UNIT / (1 - n * FP32_UNIT)
    return product + b64, 1.01 * BF16_UNIT * ((product + b64).abs() + product.abs()) + 2 * gamma * terms


def within_bf16_rounding(out: torch.Tensor, x: torch.Tensor, linear: nn.Linear) -> bool:
    exact, bound = bf16_error_bound(x, linear)
    return bool(((out.double() - exact).abs() <= bound).all())


def test_the_bf16_rounding_bound_admits_any_order_of_accumulation_and_refuses_a_wrong_product():
    """The oracle of the packed products, checked where they do not run: ``F.linear`` and an fp32 sum in another
    order are within it; a product with a doubled or transposed-then-cut weight, or without its bias, is not."""
    torch.manual_seed(0)
    linear = nn.Linear(256, 640).to(torch.bfloat16)
    x = torch.randn(9, 256).to(torch.bfloat16)
    assert within_bf16_rounding(F.linear(x, linear.weight, linear.bias), x, linear)
    reversed_sum = (x.float().flip(-1) @ linear.weight.float().flip(-1).T + linear.bias.float()).to(torch.bfloat16)
    assert within_bf16_rounding(reversed_sum, x, linear)
    assert not within_bf16_rounding(F.linear(x, linear.weight * 2, linear.bias), x, linear)
    assert not within_bf16_rounding(F.linear(x, linear.weight.T.reshape(640, 256), linear.bias), x, linear)
    assert not within_bf16_rounding(F.linear(x, linear.weight), x, linear)


@needs_bf16_packing
def test_a_packed_product_runs_over_few_row_counts_and_gives_every_count_its_own_outputs():
    """Any number of rows runs padded to its bucket (``bucket_rows``). What holds on every CPU: a row's outputs do not
    depend on the rows beside it (the padding rows' values change nothing), and at every count they are within bf16
    rounding of the exact product, as ``F.linear``'s are. Not bit for bit with ``F.linear`` at every count: the
    kernels a row count gets may accumulate in another order (AMX and AVX-512 BF16 CPUs), so that the two round
    differently; a layer is packed only where the two agree bit for bit at the counts ``packed_linear`` checks."""
    torch.manual_seed(0)
    packed_layers = 0
    for linear in (nn.Linear(256, 640), nn.Linear(48, 24, bias=True), nn.Linear(640, 256, bias=False)):
        linear = linear.to(torch.bfloat16)
        packed = packed_linear(linear)
        if packed is None:  # the packing check found a difference: the layer keeps F.linear (checked above)
            continue
        packed_layers += 1
        x = torch.randn(1, 420, linear.in_features).to(torch.bfloat16)  # (batch, tokens, features), as in a model
        noise = torch.randn(bucket_rows(420), linear.in_features).to(torch.bfloat16)
        with torch.no_grad():
            for count in [*range(1, 150), *range(150, 421, 9)]:
                out = packed(x[:, :count])
                assert out.shape == (1, count, linear.out_features) and within_bf16_rounding(
                    out[0], x[0, :count], linear
                )
                beside = torch.cat([x[0, :count], noise[: bucket_rows(count) - count]])  # other rows in the padding
                raw = torch.ops.mkldnn._linear_pointwise(beside, packed.packed, packed.bias, "none", [], "")
                assert torch.equal(out[0], raw[:count])
    assert packed_layers >= 1  # the 256 x 640 layer's shape is one every packed model here has


def test_bucket_rows_pads_less_than_an_eighth_over_a_few_dozen_counts():
    buckets = [bucket_rows(count) for count in range(1, 2049)]
    assert buckets[:EXACT_ROWS] == list(range(1, EXACT_ROWS + 1))  # a plain step, verify widths, blocks: exact
    assert all(count <= b < count * 1.125 for count, b in enumerate(buckets, start=1))
    assert buckets == sorted(buckets) and all(bucket_rows(b) == b for b in buckets)
    assert len(set(buckets[:1024])) == 96  # every shape of a 1,024-token context (oneDNN keeps 1,024 kernels)


@needs_bf16_packing
def test_a_long_prompt_padded_to_its_bucket_decodes_the_tokens_of_the_unpacked_models(zoo, monkeypatch):
    """A prompt of a length no bucket holds (its forwards run padded): the same prompt logits, the same speculative
    tokens as the unpacked models; after ``warm_packed`` too (it builds kernels, it changes no weight)."""
    packed = load_models(zoo["llama"], zoo["drafter_llama"], device="cpu", dtype="bfloat16")
    plain = unpacked_models(monkeypatch, zoo["llama"], zoo["drafter_llama"], device="cpu", dtype="bfloat16")
    prompt_ids = encode_prompt(packed.tokenizer, PROMPT * 4, chat=False)[:, : EXACT_ROWS + 13]
    assert bucket_rows(prompt_ids.shape[1]) > prompt_ids.shape[1]
    layers = [m for m in packed.target.modules() if isinstance(m, PackedLinear | SharedPart)]
    widths = [m.product.out_features if isinstance(m, SharedPart) else m.out_features for m in layers]
    shapes = {(m.in_features, width, m.bias is not None) for m, width in zip(layers, widths)}
    assert warm_packed([packed.target], 100) == len(shapes) * len({bucket_rows(c) for c in range(1, 101)})
    with ProductsRun([packed.target]) as run, torch.no_grad():
        logits = packed.target(prompt_ids).logits
    run.check(lambda: torch.equal(logits, plain.target(prompt_ids).logits))
    cfg = DecodeConfig(drafts=2, steps=1, block=4, max_new_tokens=16)
    with ProductsRun([packed.target, packed.drafter.model]) as run:
        got = decode_to_end(packed, prompt_ids, cfg).token_ids
    run.check(lambda: got == decode_to_end(plain, prompt_ids, cfg).token_ids)


def projection_group(bias: bool = False) -> nn.Module:
    """A module with a family's sibling projections (``SHARED_INPUT_GROUPS``), bf16, packed."""
    torch.manual_seed(0)
    module = nn.Module()
    for name, out in (("q_proj", 256), ("k_proj", 128), ("v_proj", 128), ("gate_proj", 640), ("up_proj", 640)):
        setattr(module, name, nn.Linear(256, out, bias=bias).to(torch.bfloat16))
    assert pack_linears(module) == 5
    return module


@needs_bf16_packing
@pytest.mark.parametrize("bias", [False, True])
def test_sibling_projections_read_one_product_with_each_layers_outputs(bias):
    """q, k and v (and gate and up) become parts of one packed product where its columns are each layer's
    ``F.linear`` outputs bit for bit at the counts checked (``shared_product``); then every part gives exactly its
    layer's outputs, whichever part a forward calls first, for a new input, after the input changed in place, and
    under autograd (``F.linear`` itself, for gradients)."""
    module = projection_group(bias)
    layers = {name: getattr(module, name) for group in SHARED_INPUT_GROUPS for name in group}
    if fuse_shared_inputs(module) == 0:
        pytest.skip("this CPU's kernels round the fused products otherwise: the layers stay as they were (checked)")
    assert all(isinstance(getattr(module, name), SharedPart) for name in layers)
    assert module.q_proj.weight is layers["q_proj"].weight  # the parameters stay, shared

    def separate(name: str, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, layers[name].weight, layers[name].bias)

    with torch.no_grad():
        for count in CHECK_TOKENS:
            x = torch.randn(1, count, 256).to(torch.bfloat16)
            for order in (("q_proj", "k_proj", "v_proj"), ("v_proj", "q_proj", "k_proj", "q_proj")):
                for name in order:
                    assert torch.equal(getattr(module, name)(x), separate(name, x))
            x.mul_(2)  # in place: the product of the input before no longer applies
            assert torch.equal(module.k_proj(x), separate("k_proj", x))
            assert torch.equal(module.q_proj(x), separate("q_proj", x))
            y = torch.randn(1, count, 256).to(torch.bfloat16)  # another input between two parts' calls
            assert torch.equal(module.gate_proj(x), separate("gate_proj", x))
            assert torch.equal(module.up_proj(y), separate("up_proj", y))
            assert torch.equal(module.up_proj(x), separate("up_proj", x))
    x = torch.randn(3, 256).to(torch.bfloat16).requires_grad_()
    with torch.enable_grad():
        module.up_proj(x).float().sum().backward()
        grad, x.grad = x.grad, None
        separate("up_proj", x).float().sum().backward()
    assert grad is not None and torch.equal(grad, x.grad)


@needs_bf16_packing
def test_a_group_whose_shared_product_differs_keeps_its_layers(monkeypatch):
    """The check at fusing time: were the fused product's columns ever to differ from a layer's ``F.linear`` outputs,
    the group keeps its own packed products (here the fused weight is made wrong on purpose)."""
    module = projection_group()
    reorder = torch.ops.mkldnn._reorder_linear_weight
    wrong = lambda w, tokens: reorder(w * 2 if w.shape[0] in (512, 1280) else w, tokens)  # the fused weights only
    monkeypatch.setattr(torch.ops.mkldnn, "_reorder_linear_weight", wrong)
    assert fuse_shared_inputs(module) == 0
    assert all(type(getattr(module, name)) is PackedLinear for group in SHARED_INPUT_GROUPS for name in group)


@needs_bf16_packing
def test_under_aten_kernels_packed_layers_give_f_linears_own_outputs_and_onednn_comes_back_on(monkeypatch):
    """``aten_kernels``: alone and in shared products, a packed layer computes what ``F.linear`` computes with
    oneDNN off (ATen's kernels), bit for bit, at one row and at several, and no packed product runs; oneDNN is on
    again afterwards, an error inside included."""
    module = projection_group(bias=True)
    layers = {name: getattr(module, name) for group in SHARED_INPUT_GROUPS for name in group}
    fuse_shared_inputs(module)

    def refused(*args):
        raise AssertionError("a packed product ran with oneDNN off")

    with torch.no_grad():
        for count in (1, 7):
            x = torch.randn(1, count, 256).to(torch.bfloat16)
            with aten_kernels(), monkeypatch.context() as patch:
                patch.setattr("xpress_core.packing.packed_product", refused)
                assert not torch.backends.mkldnn.enabled
                for name, layer in layers.items():
                    assert torch.equal(getattr(module, name)(x), F.linear(x, layer.weight, layer.bias))
    assert torch.backends.mkldnn.enabled
    with pytest.raises(RuntimeError), aten_kernels():
        raise RuntimeError("a forward that failed")
    assert torch.backends.mkldnn.enabled


class SleepingModel(nn.Module):
    """A stand-in target whose forward takes ``seconds[aten]``, with one (never run) packed layer."""

    device = torch.device("cpu")

    def __init__(self, packed_s: float, aten_s: float, packed: bool = True):
        super().__init__()
        self.layer = PackedLinear(nn.Linear(2, 2), None) if packed else nn.Linear(2, 2)
        self.seconds = {False: packed_s, True: aten_s}
        self.calls = 0

    def forward(self, input_ids, use_cache):
        assert input_ids.shape == (1, 1) and not use_cache
        self.calls += 1
        time.sleep(self.seconds[not torch.backends.mkldnn.enabled])


def test_one_token_forwards_go_through_aten_only_where_timed_faster_by_the_margin():
    """``one_token_kernels`` times a one-token forward both ways in turns, and keeps ATen on the model where it was
    ``ATEN_MARGIN`` faster; a model with nothing packed is not timed."""
    for packed_s, aten_s, kept in ((0.006, 0.003, True), (0.003, 0.006, False), (0.004, 0.004, False)):
        model = SleepingModel(packed_s, aten_s)
        assert one_token_kernels(model) is kept and getattr(model, ONE_TOKEN_ATEN) is kept
        assert model.calls == 2 * (TIMING_TURNS + 1)
    unpacked = SleepingModel(0.006, 0.003, packed=False)
    assert one_token_kernels(unpacked) is False and unpacked.calls == 0 and not hasattr(unpacked, ONE_TOKEN_ATEN)


@pytest.mark.parametrize("aten", [True, False])
def test_the_engines_one_token_forwards_run_where_the_target_was_timed_fastest(zoo, monkeypatch, aten):
    """Plain steps (one token) run through ATen where the target keeps it, every wider forward (the prompt, the
    verify of a draft) through the packed products, and oneDNN is on after the request: the flag is read off every
    target forward of a plain and a speculative decode."""
    models = load_models(zoo["llama"], zoo["drafter_llama"], device="cpu", dtype="bfloat16")
    object.__setattr__(models.target, ONE_TOKEN_ATEN, aten)
    seen, forward = [], models.target.forward

    def spy(*args, **kwargs):
        seen.append((kwargs["input_ids"].shape[-1], torch.backends.mkldnn.enabled))
        return forward(*args, **kwargs)

    monkeypatch.setattr(models.target, "forward", spy)
    ids = encode_prompt(models.tokenizer, PROMPT, chat=True)
    decode_to_end(replace(models, drafter=NoDrafter()), ids, DecodeConfig(max_new_tokens=6))
    decode_to_end(models, ids, DecodeConfig(drafts=2, steps=1, block=4, max_new_tokens=12))
    widths = {width for width, _ in seen}
    assert 1 in widths and any(width > 1 for width in widths)
    assert all(enabled is (width > 1 or not aten) for width, enabled in seen)
    assert torch.backends.mkldnn.enabled


@pytest.mark.parametrize("aten", [True, False])
def test_an_autoregressive_drafters_one_token_forwards_run_where_it_was_timed_fastest(zoo, monkeypatch, aten):
    """A chain drafted token by token: its one-token forwards through ATen where the drafter keeps it, its forwards
    over several tokens (the prompt, a round's committed tokens) and over several rows (K drafts) through oneDNN."""
    models = load_models(zoo["llama"], zoo["ar_drafter"], device="cpu", dtype="bfloat16")
    model = models.drafter.model
    object.__setattr__(model, ONE_TOKEN_ATEN, aten)
    seen, forward = [], model.forward

    def spy(*args, **kwargs):
        seen.append((kwargs["input_ids"].numel(), torch.backends.mkldnn.enabled))
        return forward(*args, **kwargs)

    monkeypatch.setattr(model, "forward", spy)
    ids = encode_prompt(models.tokenizer, PROMPT, chat=True)
    for drafts in (1, 2):
        decode_to_end(models, ids, DecodeConfig(drafts=drafts, steps=1, block=4, max_new_tokens=12))
    assert {1} < {tokens for tokens, _ in seen}
    assert all(enabled is (tokens > 1 or not aten) for tokens, enabled in seen)
    assert torch.backends.mkldnn.enabled
