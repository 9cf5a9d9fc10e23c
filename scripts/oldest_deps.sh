#!/usr/bin/env bash
# The oldest transformers and accelerate that requirements.txt admits (its floors, read from the file), in a fresh
# virtual environment: one exact decode through the CLI (scripts/exact_decode.py) and the engine tests there.
#   bash scripts/oldest_deps.sh [pytest arguments]      # VENV=path to keep the environment (default: a temporary one)
# A floor the code does not run on fails here, as it would for a user whose environment holds that release.
set -euo pipefail
cd "$(dirname "$0")/.."
floor() { # the version after `NAME>=` in requirements.txt, or an error when the file names no floor for it
  local version
  version="$(sed -n "s/^$1>=\([0-9][0-9a-z.]*\).*/\1/p" requirements.txt)"
  [ -n "$version" ] || { echo "requirements.txt names no floor for $1" >&2; exit 1; }
  echo "$version"
}
pins="transformers==$(floor transformers) accelerate==$(floor accelerate)"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
venv="${VENV:-$scratch/venv}"
python -m venv "$venv"
# The CPU build of torch first, as scripts/test.sh does; then the other requirements with the two floors pinned.
"$venv/bin/python" -m pip install --quiet torch==2.13.0
grep -vE '^(transformers|accelerate)\b' requirements.txt > "$scratch/requirements.txt"
# shellcheck disable=SC2086
"$venv/bin/python" -m pip install --quiet -r "$scratch/requirements.txt" $pins "$(grep '^pytest' requirements-test.txt)"
"$venv/bin/python" -c 'import accelerate, torch, transformers
print(f"oldest admitted: transformers {transformers.__version__}, accelerate {accelerate.__version__}, torch {torch.__version__}")'
export GRADIO_ANALYTICS_ENABLED=False HF_HUB_OFFLINE=1
"$venv/bin/python" scripts/exact_decode.py
"$venv/bin/python" -m pytest -q -p no:cacheprovider tests/test_engine.py "$@"
