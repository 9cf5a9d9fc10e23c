"""What xPress measures once per machine and models and keeps (the dtype, ``precision.py``; auto's setting,
``engine.chosen_setting``): the identities that key a measured choice, and the JSON files under ``hub.cache_folder``
that keep them, one entry per key."""

from __future__ import annotations

import hashlib
import json
import platform
from pathlib import Path

import torch

from .hub import cache_folder, is_local


def cpu_identity() -> dict:
    """What makes one CPU's timings another's: its model name and flags (Linux's /proc/cpuinfo), the machine."""
    fields: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            name, _, value = line.partition(":")
            fields.setdefault(name.strip(), value.strip())  # the first CPU's
    except OSError:
        pass
    model = fields.get("model name") or platform.processor()
    flags = fields.get("flags") or fields.get("Features", "")
    return {"cpu": model, "flags": hashlib.sha256(flags.encode()).hexdigest()[:16], "machine": platform.machine()}


def model_identity(name: str, local: bool, config) -> dict:
    """A model as a choice depends on it: its name, its config, and for a folder its weight files' names, sizes and
    modification times (new weights in the same folder are another model)."""
    weights = []
    if local and Path(name).is_dir():
        for path in sorted(Path(name).iterdir()):
            if path.suffix in (".safetensors", ".bin", ".pt"):
                stat = path.stat()
                weights.append([path.name, stat.st_size, stat.st_mtime_ns])
    config = json.dumps(dict(config or {}), sort_keys=True, default=str)
    return {"name": name, "config": hashlib.sha256(config.encode()).hexdigest(), "weights": weights}


def loaded_identity(model) -> dict:
    """A loaded model as a cached choice depends on it (``model_identity``), its dtype included."""
    if model is None:
        return {}
    name = str(getattr(model, "name_or_path", "") or "")
    config = model.config.to_dict() if hasattr(model.config, "to_dict") else vars(model.config)
    return model_identity(name, is_local(name), config) | {"dtype": str(model.dtype)}


def machine_key(threads: int, **parts) -> str:
    """The cache key of a choice: this machine (``cpu_identity``), the thread count, torch's version and ``parts``
    (the models, as ``model_identity`` gives them)."""
    parts |= {"machine": cpu_identity(), "threads": threads, "torch": torch.__version__}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def cache_file(name: str) -> Path:
    """A JSON file of measured choices: under ``$XPRESS_CACHE_DIR``, else ``$XDG_CACHE_HOME/xpress``, else
    ``~/.cache/xpress``."""
    return cache_folder() / name


def cached_entry(path: Path, key: str):
    """The entry kept for ``key`` in the JSON file ``path``, or None (no file, another key, an unreadable file)."""
    try:
        return json.loads(path.read_text()).get(key)
    except (OSError, ValueError, AttributeError):
        return None


def store_entry(path: Path, key: str, entry: dict) -> None:
    """Keep a measured choice for the next load on this machine and these models (a cache that cannot be written is
    left: the next load measures again)."""
    try:
        entries = json.loads(path.read_text()) if path.exists() else {}
    except (OSError, ValueError):
        entries = {}
    entries[key] = entry
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(entries, indent=1))
    except OSError:
        pass
