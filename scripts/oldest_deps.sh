#!/usr/bin/env bash
# The oldest transformers and accelerate that requirements.txt admits (its floors, read from the file), in a fresh
# virtual environment: one exact decode through the CLI (scripts/exact_decode.py) and the engine and tree tests there.
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
# Over this environment's packages (the README's install: torch's CPU build, the requirements, pytest), with only the
# two floors installed in the venv itself, where they shadow the newer releases: minutes less than a whole install.
python -m venv --system-site-packages "$venv"
# shellcheck disable=SC2086
"$venv/bin/python" -m pip install --quiet $pins
"$venv/bin/python" - "$(floor transformers)" "$(floor accelerate)" <<'EOF'
import sys

import accelerate
import torch
import transformers
from packaging.version import Version

print(f"oldest admitted: transformers {transformers.__version__}, accelerate {accelerate.__version__}, torch {torch.__version__}")
if [Version(transformers.__version__), Version(accelerate.__version__)] != [Version(v) for v in sys.argv[1:]]:
    sys.exit("the venv does not import the floors it installed")
EOF
export GRADIO_ANALYTICS_ENABLED=False HF_HUB_OFFLINE=1
"$venv/bin/python" scripts/exact_decode.py
"$venv/bin/python" -m pytest -q -p no:cacheprovider tests/test_engine.py tests/test_trees.py "$@"
