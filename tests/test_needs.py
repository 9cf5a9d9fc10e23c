"""What loading needs beyond the installed packages (xpress_core/needs.py): the transformers floor, the same in
requirements.txt and in the code, and a Hub model's extra packages, named with how to install them before anything
downloads. (The floors themselves are run by scripts/oldest_deps.sh in CI.)"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest
import transformers
from packaging.version import Version
from transformers.utils import import_utils

from xpress_core import needs
from xpress_core.cli import main
from xpress_core.errors import XpressError
from xpress_core.models import load_models, pretrained
from xpress_core.presets import Access, hub_presets

ROOT = Path(__file__).resolve().parent.parent


def floor(name: str) -> str:
    found = re.search(rf"^{name}>=([0-9][0-9a-z.]*)", (ROOT / "requirements.txt").read_text(), re.MULTILINE)
    assert found, f"requirements.txt names no floor for {name}"
    return found.group(1)


def test_the_transformers_floor_is_the_same_in_requirements_and_in_the_code_and_admits_the_installed_one():
    assert Version(floor("transformers")) == Version(needs.TRANSFORMERS_FLOOR)
    assert Version(transformers.__version__) >= Version(needs.TRANSFORMERS_FLOOR)
    needs.check_transformers()
    # transformers treats an older accelerate as absent (device_map then fails): the floor is at least its own.
    assert Version(floor("accelerate")) >= Version(import_utils.ACCELERATE_MIN_VERSION)


def test_a_transformers_below_the_floor_is_refused_with_what_to_install():
    with pytest.raises(XpressError, match=r"transformers>=5\.24\.0 \(found 5\.23\.0\).*pip install"):
        needs.check_transformers("5.23.0")
    needs.check_transformers("5.24.0")


def without(monkeypatch, *modules: str, having: tuple[str, ...] = ()) -> None:
    """``modules`` cannot be imported and ``having`` can, whatever this machine has installed."""
    real = importlib.util.find_spec
    found = {**dict.fromkeys(modules), **dict.fromkeys(having, object())}
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: found[name] if name in found else real(name, *a))


def test_every_extra_belongs_to_a_preset_and_the_presets_listing_names_them(capsys):
    preset_models = {name for p in hub_presets() for name in (p.target, p.drafter)}
    assert set(needs.MODEL_EXTRAS) <= preset_models
    assert main(["presets"]) == 0
    listed = {p["key"]: p["extras"] for p in map(json.loads, capsys.readouterr().out.splitlines())}
    assert listed["gpt2-mdlm"] == ["flash-attn", "einops"] and listed["qwen3-4b-dflash"] == []


def test_a_missing_extra_is_named_with_how_to_install_it_before_any_download(monkeypatch):
    without(monkeypatch, "flash_attn", "einops")
    reads = []
    monkeypatch.setattr(pretrained, "read_config_json", lambda name: reads.append(name))
    with pytest.raises(
        XpressError, match=r"'kuleshov-group/mdlm-owt' needs flash-attn, einops.*pip install flash-attn"
    ):
        load_models("openai-community/gpt2", "kuleshov-group/mdlm-owt", device="cpu", access=Access())
    assert reads == []  # refused before either model's config.json was read


def test_the_preset_is_refused_on_the_command_line_in_one_line(monkeypatch, capsys):
    without(monkeypatch, "einops", having=("flash_attn",))
    monkeypatch.setattr(pretrained, "read_config_json", lambda name: pytest.fail(f"{name} was read"))
    assert main(["generate", "--prompt", "hi", "--preset", "gpt2-mdlm"]) == 2
    err = capsys.readouterr().err
    assert "needs einops, not installed here: pip install einops" in err and "flash-attn" not in err


def test_installed_extras_pass_and_a_model_without_extras_needs_nothing(monkeypatch):
    without(monkeypatch, having=("flash_attn", "einops"))
    needs.check_extras("drafter", "kuleshov-group/mdlm-owt")
    without(monkeypatch, "flash_attn", "einops")
    needs.check_extras("drafter", "z-lab/Qwen3-4B-DFlash-b16")
    assert needs.missing_extras("kuleshov-group/mdlm-owt") == ["flash-attn", "einops"]
