"""Loading targets and drafters (embedded assets, local directories, Hub ids), with clear errors for mismatches.

Nothing here runs at import time; every loader is called by the CLI, the app, the benchmark or a test.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForMaskedLM, AutoTokenizer
from transformers.models.auto.modeling_auto import MODEL_FOR_MASKED_LM_MAPPING_NAMES

from . import validation
from .attention import IMPLEMENTATION as ATTENTION_IMPLEMENTATION
from .attention import use_grouped_attention
from .cache import check_target_layers
from .chat import encode_chat, encode_text
from .controller import CostModel
from .drafters.autoregressive import AutoregressiveDrafter
from .drafters.base import Drafter, NoDrafter, logits_kept
from .drafters.dflash_format import (
    DFLASH_KEY_MAPPING,
    dflash_drafter_config,
    dflash_export,
    export_refusals,
    is_dflash_config,
    serving_taps,
)
from .drafters.diffusion import TargetConditionedDrafter, diffusion_drafter
from .drafters.diffusion_lm import FAMILIES, DiffusionLMDrafter, family_convention, resolve_mask_token_id
from .drafters.diffusion_model import XpressDrafter, XpressDrafterConfig, default_tapped_layers
from .errors import XpressError
from .head import ROWS_HEAD
from .hub import ModelSpec, frozen_config, is_local, read_config_json
from .needs import check_loadable
from .packing import fp32_rows_linear, fuse_shared_inputs, pack_linears, packed_linear, warm_packed
from .presets import Access, check_known, remote_code_allowed
from .records import json_record
from .trace import cuda_devices

ASSETS = Path(__file__).resolve().parent.parent / "assets"
EMBEDDED_TARGET = ASSETS / "target"
EMBEDDED_DRAFTER = ASSETS / "drafter"
EMBEDDED_GAUSS_DRAFTER = ASSETS / "drafter_gauss"
EMBEDDED_AR_DRAFTER = ASSETS / "ar_drafter"
NO_DRAFTER = "none"
# How a drafter is loaded: "auto" reads its config.json. xpress = our target-conditioned drafter; dflash = a published
# DFlash checkpoint loaded into it; diffusion-lm = a standalone masked-diffusion LM; autoregressive = a small causal LM.
DRAFTER_KINDS = ("auto", "xpress", "dflash", "diffusion-lm", "autoregressive")
CAUSAL_LM = "causal-lm"  # the kind of a target (and of the benchmark's AR drafter)


@dataclass(frozen=True)
class DtypeTiming:
    """One dtype's speed on these models: seconds per token of plain decoding and of speculative decoding's rounds
    (the prefill excluded), and seconds per plain step and per round."""

    plain_step_s: float
    round_s: float | None  # None without a drafter
    plain_token_s: float
    round_token_s: float | None


@dataclass(frozen=True)
class DtypeChoice:
    """The dtype the models run in, and why: measured (``timings``), pinned by the user, or the device's."""

    dtype: str
    reason: str
    threads: int
    timings: dict[str, DtypeTiming] | None = None

    def to_json(self) -> dict:
        timings = {name: json_record(vars(t)) for name, t in (self.timings or {}).items()}
        return {"dtype": self.dtype, "reason": self.reason, "threads": self.threads, "timings": timings}


def unmeasured(requested: str, dtype: torch.dtype, device: torch.device) -> DtypeChoice:
    """The choice where nothing is timed: a dtype the user pinned, or ``auto`` by the device: bf16 on CUDA, fp32 on a
    CPU without native bf16 (there bf16 is emulated, far slower), bf16 on one with it (``load_models``;
    ``precision.load_fastest`` times both there)."""
    if requested != "auto":
        why = f"pinned by --dtype {requested}"
    elif device.type == "cpu" and not native_bf16():
        why = "auto: this CPU has no native bf16 arithmetic"
    elif device.type == "cpu":
        why = "auto: this CPU computes bf16 natively (not timed: precision.load_fastest times both dtypes)"
    else:
        why = f"auto on {device.type}: bf16 (a verify forward over many tokens costs barely more than one)"
    return DtypeChoice(str(dtype).removeprefix("torch."), why, torch.get_num_threads())


@dataclass(frozen=True)
class Models:
    """Read-only models shared by every request."""

    target: torch.nn.Module
    tokenizer: object
    drafter: Drafter
    costs: CostModel | None = None  # stage costs the controller auto plans with; None: measured for each request
    dtype_choice: DtypeChoice | None = None  # the dtype they run in and why

    @cached_property  # transformers finds a model's device by its parameters: each round asks
    def device(self) -> torch.device:
        return self.target.device

    @cached_property
    def cuda_devices(self) -> tuple[torch.device, ...]:
        """The GPUs target and drafter are on: what peak memory sums and a wait waits for (none on a CPU)."""
        return cuda_devices(self.target, getattr(self.drafter, "model", None))


def context_limit(target) -> int | None:
    return getattr(target.config, "max_position_embeddings", None) or getattr(target.config, "n_positions", None)


def eos_ids(target, tokenizer) -> set[int]:
    """End-of-sequence ids as the target's generation config states them (what HF ``generate`` stops on)."""
    eos = getattr(target.generation_config, "eos_token_id", None)
    if eos is None:
        eos = tokenizer.eos_token_id
    return set([eos] if isinstance(eos, int) else (eos or []))


@dataclass(frozen=True)
class DrafterOptions:
    kind: str = "auto"
    logit_shift: bool | None = None  # diffusion-lm: None = the family's convention (Dream shifts, others do not)
    mask_token_id: int | None = None  # diffusion-lm: None = its tokenizer's / config's / family's


def resolve_device(device: str) -> torch.device:
    if validation.device(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


# CPU flags of native bf16 arithmetic (AVX-512 BF16, AMX): there a multi-token forward costs barely more than a
# one-token forward in bf16, while fp32 pays for every token (docs/DESIGN.md §5.1; lab/profile_round.py).
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def native_bf16() -> bool:
    """Whether this CPU computes in bf16 natively (Linux: its /proc/cpuinfo flags; elsewhere: assume not)."""
    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False
    return any(flag in flags for flag in NATIVE_BF16_FLAGS)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """``auto``: bf16 on CUDA and on CPUs with native bf16, else fp32; where ``measures_dtype``, only a first guess
    (``precision.fastest`` times both). Exactness: fp32 gives plain decoding's tokens exactly; bf16 gives plain bf16
    decoding's up to rounding, which differs between forward shapes (docs/DESIGN.md §2.5)."""
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" or native_bf16() else torch.float32
    choices = {
        "float32": torch.float32,
        "fp32": torch.float32,
        "bfloat16": torch.bfloat16,
        "bf16": torch.bfloat16,
        "float16": torch.float16,
        "fp16": torch.float16,
    }
    if dtype not in choices:
        raise XpressError(f"unknown dtype {dtype!r}; choose one of auto, {', '.join(choices)}")
    return choices[dtype]


def _describe_missing(kind: str, spec: str, error: Exception) -> XpressError:
    if is_local(spec) and not Path(spec).expanduser().exists():
        return XpressError(f"{kind} {spec!r}: directory does not exist")
    reason = str(error).splitlines()[0] if str(error) else type(error).__name__
    return XpressError(f"{kind} {spec!r} could not be loaded (not a model directory, nor a reachable Hub id): {reason}")


def load_tokenizer(spec: str):
    try:
        return AutoTokenizer.from_pretrained(spec)
    except (OSError, ValueError) as error:
        raise _describe_missing("tokenizer for", spec, error) from error


def resolve_model(role: str, spec: str | Path | ModelSpec, access: Access, kind: str = CAUSAL_LM) -> ModelSpec:
    """``spec`` resolved once: a Hub id must be known or allowed, and its config.json is read here, once."""
    if isinstance(spec, ModelSpec):
        return spec
    name = str(spec)
    check_known(role, name, access)
    check_loadable(role, name)
    return ModelSpec(role, name, is_local(name), kind, frozen_config(read_config_json(name)))


def load_pretrained(
    auto_class, spec: ModelSpec, device: torch.device, dtype: torch.dtype, device_map=None, access=None, config=None
):
    """Any HF model class from a resolved spec, after the remote-code opt-in; frozen, on ``device`` or spread over the
    GPUs by accelerate (``device_map="auto"``, for a model larger than one GPU). ``config``: read the weights into
    transformers' own class for this config (no remote code runs then)."""
    access = access or Access.from_env()
    trust = config is None and remote_code_allowed(spec.role, spec.name, spec.config, access)
    extra = {"device_map": device_map} if device_map else {}
    if config is not None:
        extra["config"] = config
    try:
        model = auto_class.from_pretrained(spec.name, dtype=dtype, trust_remote_code=trust, **extra)
    except (OSError, ValueError) as error:
        raise _describe_missing(spec.role, spec.name, error) from error
    return freeze(model if device_map else model.to(device))


def load_causal_lm(
    kind: str, spec: str | Path | ModelSpec, device: torch.device, dtype: torch.dtype, device_map=None, access=None
):
    access = access or Access.from_env()
    return load_pretrained(AutoModelForCausalLM, resolve_model(kind, spec, access), device, dtype, device_map, access)


def load_target(spec: str | Path | ModelSpec, device: torch.device, dtype: torch.dtype, device_map=None, access=None):
    access = access or Access.from_env()
    spec = resolve_model("target", spec, access)
    target = load_causal_lm("target", spec, device, dtype, device_map, access)
    check_target_layers(target.config)
    check_tree_attention(target.config)
    use_grouped_attention(target)  # a CPU's verify forwards (attention.py)
    if target.dtype == torch.float32 and target.device.type == "cpu" and native_bf16():
        keep_rows_head(target)
    return target, load_tokenizer(spec.name)


def keep_rows_head(target) -> None:
    """On a CPU with native bf16 (AVX-512: oneDNN's kernels use it, where MKL's fp32 products at a few rows did not,
    measured on such an EPYC), the fp32 head the tree walk computes its rows with (head.py ``ROWS_HEAD``): packed for
    oneDNN (``packing.fp32_rows_linear``). Plain steps and ``generate`` keep the head itself."""
    head = target.get_output_embeddings()
    rows = fp32_rows_linear(head) if type(head) is torch.nn.Linear else None
    if rows is not None:
        object.__setattr__(target, ROWS_HEAD, rows)  # not a submodule: never saved, moved or counted


# Attention implementations that apply a custom 4-D additive mask: the tree mask (docs/DESIGN.md §2.3). Others
# (flash_attention_2/3, paged variants, kernels from the Hub) take a causal or padding mask at most and would verify
# every node against its siblings without a word.
TREE_MASK_ATTENTION = ("sdpa", "eager", ATTENTION_IMPLEMENTATION)


def check_tree_attention(config) -> None:
    """Refuse a target whose attention implementation would ignore the tree attention mask."""
    for part in {id(c): c for c in (config, getattr(config, "get_text_config", lambda: config)())}.values():
        implementation = getattr(part, "_attn_implementation", None)
        if implementation is not None and implementation not in TREE_MASK_ATTENTION:
            raise XpressError(
                f"the target's attention implementation {implementation!r} ignores the tree attention mask that "
                f"verification needs; load it with one of {', '.join(TREE_MASK_ATTENTION)} (attn_implementation)"
            )


def same_vocabulary(a, b) -> bool:
    return a.get_vocab() == b.get_vocab()


def ships_tokenizer(spec: str) -> bool:
    return (Path(spec) / "tokenizer_config.json").exists() or (Path(spec) / "tokenizer.json").exists()


def check_tokenizer_match(kind: str, spec: str, target_tokenizer) -> None:
    """A drafter directory that ships a tokenizer must ship the target's."""
    if ships_tokenizer(spec) and not same_vocabulary(load_tokenizer(spec), target_tokenizer):
        raise XpressError(f"{kind} {spec!r} uses a different tokenizer than the target: drafts would be meaningless")


def check_tokenizer_extends(spec: ModelSpec, target_tokenizer):
    """A diffusion LM may add tokens (its mask) to the target's tokenizer, but every target token must keep its id.
    Returns the drafter's tokenizer, or None when it has none (MDLM: its vocabulary size is still checked)."""
    if spec.local and not ships_tokenizer(spec.name):
        return None
    try:
        tokenizer = load_tokenizer(spec.name)
    except XpressError:  # a Hub repository without a tokenizer
        return None
    vocab = tokenizer.get_vocab()
    if any(vocab.get(token) != i for token, i in target_tokenizer.get_vocab().items()):
        raise XpressError(
            f"{spec.role} {spec.name!r} uses a different tokenizer than the target: drafts would be meaningless"
        )
    return tokenizer


def tapped_forward(target, tapped, last_only: bool = False, **inputs) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One target forward -> (B, Q, V) logits and (B, Q, F) the tapped layers' hidden states (None when none are
    tapped): what the engine verifies with and what drafter training reads, by one definition. ``last_only``: the
    logits of the last position only, (B, 1, V), the LM head run there alone where the model can (a prefill).

    ``output_hidden_states`` takes the indices of the hidden states to keep, so only the tapped layers' outputs are
    collected (index i + 1 is decoder layer i's output; index 0 is the embeddings).
    """
    kept = logits_kept(target, 1) if last_only else {}
    out = target(**inputs, **kept, output_hidden_states=[i + 1 for i in tapped] if tapped else False)
    features = torch.cat([out.hidden_states[i + 1] for i in tapped], dim=-1) if tapped else None
    return (out.logits[:, -1:] if last_only else out.logits), features


def target_banned_ids(target, tokenizer) -> list[int]:
    """``banned_draft_ids`` for a target: its stop tokens stay draftable, its embedding rows bound the vocabulary."""
    return banned_draft_ids(tokenizer, eos_ids(target, tokenizer), target.get_input_embeddings().weight.shape[0])


def banned_draft_ids(tokenizer, eos: set[int], vocab_size: int) -> list[int]:
    """Never proposed in drafts: special tokens (the end-of-turn/eos tokens stay draftable), and the padding rows of an
    embedding larger than the tokenizer (Qwen3: 151,936 rows for 151,669 tokens; DFlash's mask is one of them)."""
    return sorted((set(tokenizer.all_special_ids) - eos) | set(range(len(tokenizer), vocab_size)))


def drafter_kind(config: dict | None) -> str:
    """The drafter kind its config.json implies (``DRAFTER_KINDS``); a causal LM when nothing else fits."""
    if config is None:
        return "autoregressive"  # unreadable: the causal-LM loader reports what is wrong
    model_type = config.get("model_type")
    if model_type == XpressDrafterConfig.model_type:
        return "xpress"
    if is_dflash_config(config):
        return "dflash"
    masked = any(a.endswith("ForMaskedLM") for a in config.get("architectures") or [])
    if model_type in FAMILIES or masked or "AutoModelForMaskedLM" in (config.get("auto_map") or {}):
        return "diffusion-lm"
    return "autoregressive"


def resolve_drafter(
    spec: str | Path | ModelSpec, options: DrafterOptions = DrafterOptions(), access: Access | None = None
) -> ModelSpec:
    """The drafter spec resolved once: its kind from ``options`` or, for ``auto``, from its config.json."""
    if isinstance(spec, ModelSpec):
        return spec
    name = str(spec)
    if name == NO_DRAFTER:
        return ModelSpec("drafter", name, True, NO_DRAFTER, None)
    if options.kind not in DRAFTER_KINDS:
        raise XpressError(f"drafter kind must be one of {DRAFTER_KINDS}, got {options.kind!r}")
    resolved = resolve_model("drafter", name, access or Access.from_env(), options.kind)
    if options.kind == "auto":
        resolved = replace(resolved, kind=drafter_kind(resolved.config))
    if resolved.kind == "dflash" and resolved.config is None:
        raise XpressError(f"drafter {name!r} has no readable config.json, so it cannot be read as a DFlash checkpoint")
    return resolved


def load_drafter(
    spec: str | Path | ModelSpec,
    target,
    tokenizer,
    device: torch.device,
    dtype: torch.dtype,
    options: DrafterOptions = DrafterOptions(),
    access: Access | None = None,
) -> Drafter:
    access = access or Access.from_env()
    spec = resolve_drafter(spec, options, access)
    if spec.kind == NO_DRAFTER:
        return NoDrafter()
    banned = target_banned_ids(target, tokenizer)
    if spec.kind == "xpress":  # its config class holds the tree sharpness
        return load_conditioned_drafter(spec.name, None, target, tokenizer, device, dtype, banned)
    if spec.kind in ("dflash", "diffusion-lm"):  # their configs are not ours: the field rides along in config.json
        if spec.kind == "dflash":
            drafter = load_conditioned_drafter(spec.name, spec.config, target, tokenizer, device, dtype, banned)
        else:
            drafter = load_diffusion_lm(spec, options, target, tokenizer, device, dtype, banned, access)
        drafter.tree_sharpness = tree_sharpness(spec.config, spec.name)
        return drafter
    check_tokenizer_match("drafter", spec.name, tokenizer)
    model = load_causal_lm("drafter", spec, device, dtype, access=access)
    if model.config.vocab_size != target.config.vocab_size:
        raise XpressError(
            f"drafter {spec.name!r} has vocabulary size {model.config.vocab_size}, the target {target.config.vocab_size}"
        )
    return AutoregressiveDrafter(model, banned)


def tree_sharpness(config: dict | None, spec: str) -> float:
    """A masked drafter's ``tree_sharpness`` (greedy draft trees, DESIGN 2.2) from its config.json, where
    ``train sharpness --write`` keeps it; 1 when absent (the drafter's distribution as it is)."""
    value = (config or {}).get("tree_sharpness", 1.0)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise XpressError(f"drafter {spec!r}: tree_sharpness in its config.json must be a number > 0, got {value!r}")
    return float(value)


def load_conditioned_drafter(
    spec, dflash: dict | None, target, tokenizer, device, dtype, banned
) -> TargetConditionedDrafter:
    """Our target-conditioned drafter, from its own checkpoint or (``dflash`` = its config.json) a DFlash one."""
    check_tokenizer_match("drafter", spec, tokenizer)
    extra = {} if dflash is None else {"config": dflash_drafter_config(dflash, spec), "key_mapping": DFLASH_KEY_MAPPING}
    dtype = drafter_dtype(dtype, device)
    try:
        model = freeze(XpressDrafter.from_pretrained(spec, dtype=dtype, **extra).fuse_projections().to(device))
    except (OSError, ValueError) as error:
        raise _describe_missing("drafter", spec, error) from error
    cfg = model.config
    vocab, hidden = target.get_input_embeddings().weight.shape
    if cfg.vocab_size != vocab or cfg.hidden_size != hidden:
        raise XpressError(
            f"drafter {spec!r} was built for vocabulary {cfg.vocab_size} / hidden size {cfg.hidden_size}; "
            f"the target has {vocab} / {hidden}"
        )
    if max(cfg.tapped_layers) >= target.config.num_hidden_layers:
        raise XpressError(
            f"drafter {spec!r} taps layers {cfg.tapped_layers}; the target has only {target.config.num_hidden_layers}"
        )
    return diffusion_drafter(model.bind(target, drafter_head(target, dtype)), banned)


def drafter_dtype(target_dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """The dtype a target-conditioned drafter runs in: bf16 beside an fp32 target on a CPU with native bf16, else the
    target's. Why: a draft's precision never reaches the output (the target's walk decides every token, §2.4), and
    its products over a dozen rows cost a half to a third in packed bf16 there (packing.py: 13 x 256 x 1280 in 55 us
    against 138 us in fp32, the head over 9 rows 106 against 368 us), where the fp32 target keeps plain
    decoding's tokens exactly."""
    if target_dtype == torch.float32 and device.type == "cpu" and native_bf16():
        return torch.bfloat16
    return target_dtype


def drafter_head(target, dtype: torch.dtype) -> torch.nn.Module | None:
    """The target's LM head for a drafter in ``dtype``: None (the head itself) where its dtype is the same, else a
    frozen copy in ``dtype``, packed where that keeps its outputs (packing.py)."""
    head = target.get_output_embeddings()
    if head is None or head.weight.dtype == dtype:
        return None
    bias = getattr(head, "bias", None)
    rows, columns = head.weight.shape
    copy = torch.nn.Linear(columns, rows, bias=bias is not None, device=head.weight.device, dtype=dtype)
    copy.requires_grad_(False)
    with torch.no_grad():
        copy.weight.copy_(head.weight)
        if bias is not None:
            copy.bias.copy_(bias)
    return packed_linear(copy) or copy.eval()


def read_conditioned_drafter(spec: str | Path, dtype: torch.dtype = torch.float32) -> XpressDrafter:
    """Our target-conditioned drafter module, unbound and unfused, from its own format or a DFlash checkpoint (for
    training on and for export)."""
    spec = str(spec)
    config = read_config_json(spec)
    if config is None:
        raise _describe_missing("drafter", spec, OSError("no readable config.json"))
    extra = {}
    if drafter_kind(config) == "dflash":
        extra = {"config": dflash_drafter_config(config, spec), "key_mapping": DFLASH_KEY_MAPPING}
    elif drafter_kind(config) != "xpress":
        raise XpressError(f"drafter {spec!r} is neither an xPress drafter nor a DFlash checkpoint")
    try:
        return XpressDrafter.from_pretrained(spec, dtype=dtype, **extra)
    except (OSError, ValueError) as error:
        raise _describe_missing("drafter", spec, error) from error


def export_dflash(spec: str | Path, out: Path) -> dict:
    """Write a drafter of ours in the DFlash format (config.json, model.safetensors, the tokenizer it ships): what
    the reference classes and the serving engines that read z-lab's checkpoints load. Returns the written config."""
    model = read_conditioned_drafter(spec)
    config, weights = dflash_export(model, str(spec))
    out.mkdir(parents=True, exist_ok=True)
    for stale in ("config.json", "model.safetensors", "model.safetensors.index.json"):
        (out / stale).unlink(missing_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_file(weights, out / "model.safetensors", metadata={"format": "pt"})
    if ships_tokenizer(str(spec)) and Path(spec).resolve() != out.resolve():
        load_tokenizer(str(spec)).save_pretrained(out)
    return config


def diffusion_lm_class(config: dict | None):
    """The auto class a diffusion LM's repository registers (LLaDA and Dream: AutoModel; MDLM, dllm: masked LM)."""
    auto_map = (config or {}).get("auto_map") or {}
    if "AutoModelForMaskedLM" in auto_map:
        return AutoModelForMaskedLM
    if "AutoModel" in auto_map:
        return AutoModel
    if (config or {}).get("model_type") in MODEL_FOR_MASKED_LM_MAPPING_NAMES:
        return AutoModelForMaskedLM
    return AutoModelForCausalLM  # a causal LM read with the shifted convention (what Dream inherits)


def load_diffusion_lm(
    spec: ModelSpec, options: DrafterOptions, target, tokenizer, device, dtype, banned, access
) -> DiffusionLMDrafter:
    drafter_tokenizer = check_tokenizer_extends(spec, tokenizer)
    config = spec.config
    convention = family_convention((config or {}).get("model_type", ""), options.logit_shift)
    if convention.architecture:  # an A2D model: its weights in transformers' class of the causal original
        fields = {k: v for k, v in config.items() if k not in ("model_type", "auto_map", "architectures")}
        own = AutoConfig.for_model(convention.architecture, **fields)
        model = load_pretrained(AutoModelForCausalLM, spec, device, dtype, access=access, config=own)
    else:
        model = load_pretrained(diffusion_lm_class(config), spec, device, dtype, access=access)
    width = model.config.vocab_size
    if width < len(tokenizer):
        raise XpressError(
            f"drafter {spec.name!r} has vocabulary size {width}; the target's tokenizer has {len(tokenizer)} tokens"
        )
    mask_id = resolve_mask_token_id(convention, options.mask_token_id, drafter_tokenizer, model.config)
    if not 0 <= mask_id < width:
        raise XpressError(f"drafter {spec.name!r}: mask token id {mask_id} is outside its vocabulary of {width}")
    # Drafts hold only ids the target can verify (its embedding rows); the drafter may know more (its mask).
    vocab = min(width, target.get_input_embeddings().weight.shape[0])
    return DiffusionLMDrafter(model, convention, mask_id, vocab, banned)


def freeze(model: torch.nn.Module) -> torch.nn.Module:
    """Inference only: no parameter needs a gradient, so no caller builds autograd graphs through it, whatever its
    grad mode. On a CPU in bf16 its linear layers are packed for oneDNN, and sibling projections of one input become
    one product (``packing.py``: the same outputs, sooner)."""
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    pack_linears(model)
    fuse_shared_inputs(model)
    return model.eval()


def load_models(
    target: str | Path | ModelSpec = EMBEDDED_TARGET,
    drafter: str | Path | ModelSpec = EMBEDDED_DRAFTER,
    device: str = "auto",
    dtype: str = "auto",
    device_map: str | None = None,
    drafter_options: DrafterOptions = DrafterOptions(),
    access: Access | None = None,
) -> Models:
    """``device_map="auto"`` spreads the target over the GPUs (accelerate); the drafter goes where its input is.
    ``dtype="auto"`` here goes by the device (``resolve_dtype``); ``precision.load_fastest`` times both dtypes."""
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    access = access or Access.from_env()
    for role, spec in (("target", target), ("drafter", drafter)):  # both, before either's config.json is read
        check_loadable(role, str(spec))
    target_spec = resolve_model("target", target, access)
    drafter_spec = resolve_drafter(drafter, drafter_options, access)
    target_model, tokenizer = load_target(target_spec, dev, dt, device_map, access)
    drafter_device = target_model.device if device_map else dev
    drafter_model = load_drafter(drafter_spec, target_model, tokenizer, drafter_device, dt, drafter_options, access)
    return Models(target_model, tokenizer, drafter_model, dtype_choice=unmeasured(dtype, dt, dev))


def measures_dtype(dtype: str, device: torch.device) -> bool:
    """Whether ``auto`` times the dtypes (``precision.py``): on a CPU that computes bf16 natively (elsewhere the
    answer is known: bf16 on CUDA, fp32 on a CPU that would emulate bf16)."""
    return dtype == "auto" and device.type == "cpu" and native_bf16()


# Row counts whose kernels ``warm_kernels`` builds at load: every plain step, verify and draft, and prompts of up to
# this many tokens (a chat's first turns; longer prompts pay once for each new bucket, packing.py).
WARM_ROWS = 256


def warm_kernels(models: Models, rows: int = WARM_ROWS) -> int:
    """Build the packed layers' kernels of target and drafter for every row count a forward of up to ``rows`` tokens
    runs at (``packing.warm_packed``), so that no reply pays for a first shape; the products run (0 outside bf16 on a
    CPU, where nothing is packed). For a server or a benchmark: a single request would pay more than it saves."""
    drafter = getattr(models.drafter, "model", None)
    modules = [models.target] + ([drafter] if isinstance(drafter, torch.nn.Module) else [])
    return warm_packed(modules, min(rows, context_limit(models.target) or rows))


def encode_prompt(tokenizer, prompt: str | list[dict[str, str]], chat: bool) -> torch.Tensor:
    """(1, n) ids. ``chat``: the tokenizer's chat template with the generation prompt; else the raw text. Typed
    special-token strings stay text either way (``chat.py``)."""
    if isinstance(prompt, str):
        messages = [{"role": "user", "content": validation.text("the prompt", prompt)}]
    else:
        messages = validation.messages("the prompt", prompt)
    if not any(m["content"].strip() for m in messages):
        raise XpressError("the prompt is empty")
    if chat:
        return torch.tensor([encode_chat(tokenizer, messages)])
    return torch.tensor([encode_text(tokenizer, "".join(m["content"] for m in messages))])


def init_drafter(
    target_spec: str | Path,
    out: Path,
    layers: int = 1,
    block: int = 16,
    seed: int = 0,
    noise: str = "mask",
    clean_rms: float = 1.0,
    tapped_layers: list[int] | None = None,
    fuse_previous: bool = False,
    dflash_layout: bool = False,
) -> XpressDrafter:
    """An untrained diffusion drafter sized for any HF causal-LM target (the start of training, and for tests).
    ``dflash_layout``: the architecture the DFlash format holds (per-head query/key norms, masked positions embedded
    as the target's mask token), so that the trained drafter can be exported (``export_dflash``).

    ``noise``: "mask" or "gaussian"; ``clean_rms``: the gaussian drafter's clean-embedding scale (see its config);
    ``tapped_layers``: the target layers it reads (default ``default_tapped_layers``, ``serving_taps`` in the DFlash
    layout: engines read the last layer differently); ``fuse_previous``: block
    inputs also read the features of the token before the root (see its config)."""
    target, tokenizer = load_target(target_spec, torch.device("cpu"), torch.float32)
    taps_for = serving_taps if dflash_layout else default_tapped_layers
    if dflash_layout and (noise != "mask" or fuse_previous or tokenizer.mask_token_id is None):
        raise XpressError(
            "the DFlash layout needs a masked drafter without fuse_previous, and a target tokenizer with a mask token"
        )
    embed = target.get_input_embeddings().weight
    tcfg = target.config
    heads = tcfg.num_attention_heads
    config = XpressDrafterConfig(
        hidden_size=embed.shape[1],
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=getattr(tcfg, "num_key_value_heads", None) or heads,
        intermediate_size=getattr(tcfg, "intermediate_size", None) or 4 * embed.shape[1],
        vocab_size=embed.shape[0],
        tapped_layers=tapped_layers or taps_for(tcfg.num_hidden_layers),
        block_size=block,
        mask_token_id=tokenizer.mask_token_id,
        target_name_or_path=str(target_spec),
        target_num_layers=tcfg.num_hidden_layers,
        rope_theta=float(getattr(tcfg, "rope_theta", None) or 10000.0),
        noise=noise,
        clean_rms=clean_rms,
        fuse_previous=fuse_previous,
        qk_norm=dflash_layout,
        learned_mask=not dflash_layout,
    )
    if dflash_layout and (refusals := export_refusals(config)):  # before anything is written
        raise XpressError(f"the drafter could not be written in the DFlash format: {'; '.join(refusals)}")
    torch.manual_seed(seed)
    model = XpressDrafter(config)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return model
