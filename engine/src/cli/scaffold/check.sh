#!/usr/bin/env bash
# Runs frostline's conformance checks on {{name}}.wasm: the checks the engine runs on every
# plugin it loads. `frostline` must be on the PATH, or named by FROSTLINE.
set -euo pipefail
cd "$(dirname "$0")"
"${FROSTLINE:-frostline}" plugin check {{name}}.wasm --role {{role}}{{check_args}} "$@"
