#!/usr/bin/env bash
# The prepared device run (issue 36): bash scripts/device_run.sh [--toy --device cpu] [options of device_run.py].
# Through the device tool: run(command="bash scripts/device_run.sh", carry=["runs/device_data"], timeout_s=540).
set -euo pipefail
cd "$(dirname "$0")/.."
exec timeout --kill-after=20 "${DEVICE_RUN_LIMIT_S:-530}" python3 scripts/device_run.py "$@"
