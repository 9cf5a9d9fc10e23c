"""Where a model spec points: a local directory or a Hugging Face Hub repository. Read by the loaders, the presets and
the format readers alike, so it imports none of them."""

from __future__ import annotations

import json
from pathlib import Path

from huggingface_hub import hf_hub_download


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
