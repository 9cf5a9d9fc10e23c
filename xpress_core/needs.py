"""What loading needs beyond the Python packages present: a transformers the code runs on, and the extra packages a
model's own code imports (a Hub preset's drafter with remote code). Both are checked when a model spec is resolved,
before anything downloads, so a missing or too old package is one line saying what to install, not a traceback from
inside a forward or a repository's module."""

from __future__ import annotations

import importlib.util

import transformers
from packaging.version import Version

from .errors import XpressError

# The oldest transformers the code runs on: model forwards take ``cache=`` (5.0-5.23 named it ``past_key_values``).
# requirements.txt's floor; tests/test_needs.py checks that the two agree, and CI runs the engine tests there.
TRANSFORMERS_FLOOR = "5.24.0"

# The packages a Hub model's own code imports that requirements.txt does not install: import name -> pip command
# argument. mdlm-owt's modeling code imports flash-attention (CUDA only; pip builds it against the installed torch).
MODEL_EXTRAS: dict[str, dict[str, str]] = {
    "kuleshov-group/mdlm-owt": {"flash_attn": "flash-attn", "einops": "einops"},
}


def check_transformers(version: str | None = None) -> None:
    """The installed transformers (or ``version``) is one the code runs on."""
    version = version or transformers.__version__
    if Version(version) < Version(TRANSFORMERS_FLOOR):
        raise XpressError(
            f"xPress needs transformers>={TRANSFORMERS_FLOOR} (found {version}): "
            f"pip install 'transformers>={TRANSFORMERS_FLOOR},<6'"
        )


def missing_extras(name: str) -> list[str]:
    """The pip names of the extra packages model ``name`` needs that cannot be imported here."""
    return [pip for module, pip in MODEL_EXTRAS.get(name, {}).items() if importlib.util.find_spec(module) is None]


def check_extras(role: str, name: str) -> None:
    """Every extra package that model ``name``'s own code imports is installed."""
    missing = missing_extras(name)
    if missing:
        builds = (
            " (flash-attn needs a CUDA GPU and builds against the installed torch)" if "flash-attn" in missing else ""
        )
        raise XpressError(
            f"{role} {name!r} needs {', '.join(missing)}, not installed here: pip install {' '.join(missing)}{builds}"
        )


def check_loadable(role: str, name: str) -> None:
    """Before a model spec is resolved (its config.json read, perhaps downloaded): transformers and the extras."""
    check_transformers()
    check_extras(role, name)
