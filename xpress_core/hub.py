"""Where a model spec points: a local directory or a Hugging Face Hub repository. Read by the loaders, the presets and
the format readers alike, so it imports none of them."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from huggingface_hub import hf_hub_download


@dataclass(frozen=True)
class ModelSpec:
    """A model spec (a folder or a Hub id, as given or as a preset names it) resolved once: where the model lives, what
    kind it is and its config.json, read once (``models.resolve_model``). The loaders take it, so no step asks again."""

    role: str  # how messages name it: "target", "drafter", "AR drafter"
    name: str  # the folder or Hub id
    local: bool  # a folder on this machine (or a path meant to be one), else a Hub repository
    kind: str  # "causal-lm" for a target; a drafter's kind (models.DRAFTER_KINDS, resolved) or "none"
    config: Mapping[str, Any] | None  # config.json, read-only; None when absent or unreadable

    def __str__(self) -> str:
        return self.name


def frozen_config(config: dict | None) -> Mapping[str, Any] | None:
    """A read-only view of a config.json, so a resolved spec cannot change under the loaders that share it."""
    return None if config is None else MappingProxyType(config)


def is_local(spec: str) -> bool:
    if spec.startswith((".", "/", "~")):
        return True
    try:
        return Path(spec).expanduser().exists()
    except (OSError, ValueError):  # a name no file system holds (too long, a NUL byte): not a local directory
        return False


def read_config_json(spec: str) -> dict | None:
    """config.json of a local directory or a Hub repository (from the local cache when offline); None if absent."""
    local = Path(spec) / "config.json"
    if local.exists():
        return json.loads(local.read_text())
    if is_local(spec):
        return None
    try:
        return json.loads(Path(hf_hub_download(spec, "config.json")).read_text())
    except Exception:  # noqa: BLE001 - any Hub failure means "not readable here"; the loader reports it properly
        return None


CACHE_ENV = "XPRESS_CACHE_DIR"  # the folder of what xPress derives from models once per machine (else the XDG default)


def cache_folder() -> Path:
    """Where measured choices and converted models are kept: ``$XPRESS_CACHE_DIR``, else ``$XDG_CACHE_HOME/xpress``,
    else ``~/.cache/xpress``."""
    folder = os.environ.get(CACHE_ENV)
    if not folder:
        folder = str(Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "xpress")
    return Path(folder)
