#!/usr/bin/env bash
# Builds {{name}}.wasm from app.js with componentize-js and runs `frostline plugin check` on it.
# Needs node and npm; installs componentize-js {{componentize_js}} into node_modules on first use
# (COMPONENTIZE_JS=/path/to/componentize-js uses another install).
set -euo pipefail
cd "$(dirname "$0")"
componentize_js="${COMPONENTIZE_JS:-node_modules/.bin/componentize-js}"
if [[ -z "${COMPONENTIZE_JS:-}" && ! -x "$componentize_js" ]]; then
    npm install --no-audit --no-fund --loglevel=error
fi
# -d ...: leave out every WASI feature, so the component imports only frostline:plugin (with
# `http fetch-event` it would import wasi:http, which frostline does not link).
"$componentize_js" app.js --wit wit --world-name {{world}} -d stdio random clocks http fetch-event -o {{name}}.wasm
echo "built {{name}}.wasm ($(wc -c <{{name}}.wasm) bytes)"
./check.sh
