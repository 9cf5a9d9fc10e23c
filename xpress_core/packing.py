"""Linear layers whose bf16 weights are laid out once, at load, in the blocked format oneDNN's CPU kernels read.

Why: on a CPU every bf16 ``F.linear`` first reorders its weight into that layout, and for the small matrices of a
few-token forward the reorder is a large part of the product (measured on this project's CPU, one thread: 9 x 256 x
640 in 49 us packed against 67 us, 9 x 256 x 4096 in 249 against 327 us). Packed once, the weight is read as it is.
Every layer is checked, when it is packed, to give ``F.linear``'s outputs bit for bit at a few token counts, and one
that does not stays as it was. At other counts the outputs are the same products summed in fp32 and rounded to bf16,
but not always in the same order: oneDNN picks its kernel by row count, and on CPUs with AMX or AVX-512 BF16 (pair
dot products) two kernels can round a sum differently, so an output may differ from ``F.linear``'s by a bf16 ulp
(tests/test_packing.py bounds it). Where the kernels agree (the checked counts; every count on the CPUs without bf16
instructions that pack), the models' outputs and tokens are what they were; only the time changes.

A new row count costs once: oneDNN builds its kernel for every new shape of a product (bf16, one thread: a prompt
forward over a new length took 1.2x one over a length seen before), and a chat's prompt grows every turn. So a packed
product runs over a few row counts only (``bucket_rows``: zero rows added), which ``warm_packed`` builds at load. A
row's outputs do not depend on the values of the rows beside it (a product's rows are computed apart), so the zero
padding changes none.

Only frozen inference models are packed (``models.freeze``), only on a CPU and only in bf16: in fp32 the same CPUs
multiply faster through MKL on the plain layout (5 x 256 x 640: 22 us plain, 37 us packed), and a packed layer has
no backward. The packed copy is kept beside the original weight (tied embeddings and every reader of ``.weight``
still see the parameter), so a packed model holds its linear weights twice.

Projections a layer computes from one input (attention's q, k and v; the MLP's gate and up) are then one packed
product (``fuse_shared_inputs``), where its outputs are each layer's ``F.linear`` outputs bit for bit at the counts
checked: a small product's cost is mostly fixed. Family-agnostic: the layers stay in place (``SharedPart``), and the
first of a group a forward calls computes the group's product, which the others read as long as their input is the
same tensor; any other call computes its own.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterable
from contextlib import contextmanager, nullcontext

import torch
import torch.nn.functional as F
from torch import nn

# Token counts each packed layer is checked at: a one-token step, a verify forward, a prompt, and one padded to its
# bucket (``bucket_rows``).
CHECK_TOKENS = (1, 7, 64, 70)
# oneDNN picks the blocked layout for a batch size; the engine's forwards run 1 to a few dozen tokens.
LAYOUT_TOKENS = 8
# Row counts a packed product runs at exactly: a plain step, every verify width auto chooses (up to 8 x 8 + 1 with the
# embedded drafter) and a drafter's blocks; above, counts round up to an eighth of their power of two (< 12.5 % more
# rows), so that all the shapes of a 1,024-token context are 96, whose kernels oneDNN's cache (1,024 kernels) holds
# for the few distinct layer shapes of a target and its drafter.
EXACT_ROWS = 64


def packing_available(dtype: torch.dtype, device: torch.device) -> bool:
    """bf16 on a CPU whose oneDNN computes in bf16, with the packing operators present in this torch."""
    return (
        device.type == "cpu"
        and dtype == torch.bfloat16
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
        and torch.ops.mkldnn._is_mkldnn_bf16_supported()
    )


class PackedLinear(nn.Module):
    """An ``nn.Linear`` in inference: the product reads the packed weight; ``weight`` and ``bias`` are the original
    parameters (shared, not copied)."""

    def __init__(self, linear: nn.Linear, packed: torch.Tensor):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        self.packed = packed  # an opaque oneDNN tensor: not a parameter or buffer, so never saved or moved

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if unpacked_here(x, self.weight):
            return F.linear(x, self.weight, self.bias)
        return packed_product(x, self.packed, self.bias, self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


# torch's own getter of the oneDNN switch: every packed product reads it, and ``torch.backends.mkldnn.enabled`` (a
# property over it) costs 277 ns against 62 here, about 0.05 ms of a SmolLM2 forward's 211 products.
onednn_enabled = torch._C._get_mkldnn_enabled


def unpacked_here(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether a packed layer computes as ``F.linear`` does: with a gradient (the packed product has no backward), or
    where the caller turned oneDNN off (``aten_kernels``)."""
    return not onednn_enabled() or (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))


@contextmanager
def aten_kernels():
    """oneDNN off for the forwards inside: packed layers compute as ``F.linear`` does, through ATen's own kernels.

    Why: on a CPU with AVX-512 BF16 and no AMX, SmolLM2's one-token bf16 forward ran in 28.0 ms through ATen against
    35.6 ms through the packed oneDNN products (HF's unpacked model: 27.2 ms ATen, 44.9 ms oneDNN; medians of 120
    forwards in turns, 2 threads), while a forward over 9 tokens took about twice as long through ATen: one token is
    a matrix-vector product, memory-bound, which ATen's kernel streams faster. ``one_token_kernels`` measures it per
    model. The flag is the process's: a forward on another thread meanwhile computes through ATen too (the same
    products, summed in another order: bf16 outputs may differ by rounding, as between oneDNN's kernels)."""
    before = torch.backends.mkldnn.enabled
    torch.backends.mkldnn.enabled = False
    try:
        yield
    finally:
        torch.backends.mkldnn.enabled = before


# Set on a target at load (``one_token_kernels``): its one-token forwards (plain steps) run in ``aten_kernels``.
ONE_TOKEN_ATEN = "_xpress_one_token_aten"
# ATen must be this much faster to be kept: the two sum in another order, so a choice that flipped with the machine's
# noise would change bf16 plain decoding's rounding from one load to the next for nothing.
ATEN_MARGIN = 1.05
TIMING_TURNS = 6


def kernels_for(model: nn.Module, ids: torch.Tensor):
    """The kernels a forward of ``ids`` through ``model`` runs with: ATen's (``aten_kernels``) for one token (one row)
    where ``one_token_kernels`` kept them on the model, else the packed products (a context either way)."""
    return aten_kernels() if ids.numel() == 1 and getattr(model, ONE_TOKEN_ATEN, False) else nullcontext()


def one_token_kernels(model: nn.Module) -> bool:
    """Time ``model``'s one-token forward through its packed products and through ATen (``aten_kernels``), in turns
    after one of each that warms up, and keep ATen on the model (``ONE_TOKEN_ATEN``) where its median is
    ``ATEN_MARGIN`` faster; whether it was. Nothing timed where nothing is packed (off a CPU, outside bf16)."""
    if not any(isinstance(m, PackedLinear | SharedPart) for m in model.modules()):
        return False
    ids = torch.zeros(1, 1, dtype=torch.long, device=model.device)
    times: dict[bool, list[float]] = {False: [], True: []}
    with torch.no_grad():
        for turn in range(TIMING_TURNS + 1):
            for aten, seconds in times.items():
                with aten_kernels() if aten else nullcontext():
                    start = time.perf_counter()
                    model(input_ids=ids, use_cache=False)
                    if turn:
                        seconds.append(time.perf_counter() - start)
    faster = statistics.median(times[False]) > ATEN_MARGIN * statistics.median(times[True])
    object.__setattr__(model, ONE_TOKEN_ATEN, faster)  # not a module attribute a state dict or a move would see
    return faster


def packed_product(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, out_features: int) -> torch.Tensor:
    """(..., in) rows times a packed weight (``_reorder_linear_weight``) plus ``bias`` -> (..., out_features), at the
    row count ``bucket_rows`` says."""
    in_features = x.shape[-1]
    count = x.numel() // in_features
    if count <= EXACT_ROWS and x.is_contiguous():
        # The op takes (..., in) as it is and flattens it itself, the same product: the rows' own reshape, slice
        # and view cost a tensor call each, a third of a small product (1 x 256 x 256: 24 against 15 us).
        return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
    rows = x.reshape(-1, in_features)
    padded = bucket_rows(count)
    if padded > count:
        rows = torch.cat([rows, rows.new_zeros(padded - count, in_features)])
    out = torch.ops.mkldnn._linear_pointwise(rows, packed, bias, "none", [], "")
    return out[:count].reshape(*x.shape[:-1], out_features)


def bucket_rows(count: int) -> int:
    """The row count a packed product of ``count`` rows runs at: itself up to ``EXACT_ROWS``, else rounded up to a
    multiple of an eighth of the power of two at or above it."""
    if count <= EXACT_ROWS:
        return count
    step = 1 << ((count - 1).bit_length() - 4)
    return -(-count // step) * step


def packed_linear(linear: nn.Linear) -> PackedLinear | None:
    """``linear`` packed, or None where packing is unavailable or would change any output."""
    if not packing_available(linear.weight.dtype, linear.weight.device):
        return None
    return checked_packing(linear, torch.equal)


def checked_packing(linear: nn.Linear, agree) -> PackedLinear | None:
    """``linear``'s weight packed for oneDNN, kept where ``agree(packed output, F.linear's)`` at every row count of
    ``CHECK_TOKENS`` (random rows in the weight's dtype), else None."""
    packed = PackedLinear(linear, torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), LAYOUT_TOKENS))
    probe = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for tokens in CHECK_TOKENS:
            x = torch.randn(tokens, linear.in_features, generator=probe).to(linear.weight.dtype)
            # ``forward``, not a module call: a check of the op on CPU weights at load, which no GPU runs (a ZeroGPU
            # web process runs no model forward; tests/zerogpu_standin.py watches module calls).
            if not agree(packed.forward(x), F.linear(x, linear.weight, linear.bias)):
                return None
    return packed


def pack_linears(model: nn.Module) -> int:
    """Replace every ``nn.Linear`` of a frozen model by its ``PackedLinear`` where that keeps its outputs; the number
    replaced (0 off a CPU or outside bf16)."""
    count = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            # A layer accelerate dispatches (its ``_hf_hook`` moves weights in and out) keeps its own forward.
            if type(child) is not nn.Linear or hasattr(child, "_hf_hook"):
                continue
            packed = packed_linear(child)
            if packed is not None:
                setattr(parent, name, packed)
                count += 1
    return count


def warm_packed(models: Iterable[nn.Module], rows: int) -> int:
    """Build oneDNN's kernels for every row count up to ``rows`` (``bucket_rows``) of every distinct packed product
    shape in ``models`` (packed layers', and shared products', ``fuse_shared_inputs``), so that no forward pays for a
    first shape later: at load, before any request. Returns the products run (0 where nothing is packed)."""
    shapes = {}  # (in, out, bias or not) -> (packed weight, bias, weights' dtype)
    for model in models:
        for module in model.modules():
            if isinstance(module, PackedLinear | SharedPart):
                product = module.product if isinstance(module, SharedPart) else module
                key = (module.in_features, product.out_features, module.bias is not None)
                shapes.setdefault(key, (product.packed, product.bias, module.weight.dtype))
    counts = sorted({bucket_rows(count) for count in range(1, rows + 1)})
    with torch.no_grad():
        for (features, out_features, _), (packed, bias, dtype) in shapes.items():
            for count in counts:
                packed_product(torch.zeros(count, features, dtype=dtype), packed, bias, out_features)
    return len(shapes) * len(counts)


# Sibling projections of one module that a family computes from the same input, in the names transformers' families
# give them (llama, qwen2/3, mistral, gemma, ...); a family that names them otherwise, or already fuses them, keeps its
# products.
SHARED_INPUT_GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


class SharedProduct:
    """The packed product of a group of linear layers side by side, over the input the group was last given: the
    first of them a forward calls computes it, the others read their columns. Not a module: its weight is no
    parameter of the model (the layers keep theirs; the side-by-side copy is the packed one alone)."""

    def __init__(self, packed: torch.Tensor, bias: torch.Tensor | None, out_features: int, parts: int):
        self.packed, self.bias, self.out_features, self.parts = packed, bias, out_features, parts
        # (input, its version, output, the parts that read this output): one tuple, swapped whole, so that a part
        # reads an output with the input it was computed from even with forwards on several threads
        self.last: tuple | None = None

    def output(self, x: torch.Tensor, part: int) -> torch.Tensor:
        last = self.last
        if last is not None and last[0] is x and last[1] == version(x) and part not in last[3]:
            read = last[3] | {part}
            # Once every part read it, the group lets go of input and output (a long prompt's are large).
            self.last = None if len(read) == self.parts else (x, last[1], last[2], read)
            return last[2]
        out = packed_product(x, self.packed, self.bias, self.out_features)
        self.last = (x, version(x), out, frozenset((part,)))
        return out


def version(x: torch.Tensor) -> int:
    """The tensor's version counter (bumped by an in-place change), 0 for an inference tensor (it has none)."""
    return 0 if x.is_inference() else x._version


class SharedPart(nn.Module):
    """One layer of a ``SharedProduct``'s group: its columns of the group's product; ``weight`` and ``bias`` are the
    layer's original parameters (shared, not copied)."""

    def __init__(self, linear: nn.Module, product: SharedProduct, part: int, start: int):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        self.product, self.part, self.start = product, part, start

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if unpacked_here(x, self.weight):
            return F.linear(x, self.weight, self.bias)
        return self.product.output(x, self.part)[..., self.start : self.start + self.out_features]

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, part={self.part}"


def shared_product(layers: list[PackedLinear]) -> SharedProduct | None:
    """``layers`` (packed, one input width, all with a bias or none) as one ``SharedProduct``, or None where its
    columns differ from any layer's ``F.linear`` outputs at a row count of ``CHECK_TOKENS`` (random rows in the
    weights' dtype)."""
    first = layers[0]
    if any(layer.in_features != first.in_features or (layer.bias is None) != (first.bias is None) for layer in layers):
        return None
    weight = torch.cat([layer.weight.detach() for layer in layers])
    bias = None if first.bias is None else torch.cat([layer.bias.detach() for layer in layers])
    product = SharedProduct(
        torch.ops.mkldnn._reorder_linear_weight(weight, LAYOUT_TOKENS), bias, weight.shape[0], len(layers)
    )
    probe = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for tokens in CHECK_TOKENS:
            x = torch.randn(tokens, first.in_features, generator=probe).to(weight.dtype)
            out = packed_product(x, product.packed, bias, product.out_features)
            parts = out.split([layer.out_features for layer in layers], dim=-1)
            if not all(torch.equal(part, F.linear(x, l.weight, l.bias)) for part, l in zip(parts, layers)):
                return None
    return product


def fuse_shared_inputs(model: nn.Module) -> int:
    """Replace each group of packed sibling layers (``SHARED_INPUT_GROUPS``) by ``SharedPart``s of one product where
    that keeps every output; the number of groups fused."""
    count = 0
    for parent in list(model.modules()):
        for names in SHARED_INPUT_GROUPS:
            layers = [getattr(parent, name, None) for name in names]
            if not all(type(layer) is PackedLinear for layer in layers):
                continue
            product = shared_product(layers)
            if product is None:
                continue
            start = 0
            for part, (name, layer) in enumerate(zip(names, layers)):
                setattr(parent, name, SharedPart(layer, product, part, start))
                start += layer.out_features
            count += 1
    return count


def fp32_rows_linear(linear: nn.Linear) -> PackedLinear | None:
    """An fp32 ``linear`` packed for oneDNN's kernels, or None where they are missing or stray past fp32 rounding
    from ``F.linear`` at the counts checked. Not bit for bit ``F.linear``'s (another summation order), so only for
    products no plain step runs: the tree walk's LM-head rows (head.py), where a CPU whose fp32 products through MKL
    run at a third of oneDNN's speed at a few rows (measured: 9 x 256 x 4096 in 455 us against 190 us) gains."""
    usable = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    if not usable or linear.weight.dtype != torch.float32 or linear.weight.device.type != "cpu":
        return None
    return checked_packing(linear, lambda got, want: torch.allclose(got, want, rtol=1e-5, atol=1e-5))
