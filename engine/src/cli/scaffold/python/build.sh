#!/usr/bin/env bash
# Builds {{name}}.wasm from app.py with componentize-py and runs `frostline plugin check` on
# it. Needs python3 with venv; installs componentize-py {{componentize_py}} into .tools/venv on first
# use (COMPONENTIZE_PY=/path/to/componentize-py uses another install).
set -euo pipefail
cd "$(dirname "$0")"
componentize_py="${COMPONENTIZE_PY:-.tools/venv/bin/componentize-py}"
if [[ -z "${COMPONENTIZE_PY:-}" && "$("$componentize_py" --version 2>/dev/null || true)" != "componentize-py {{componentize_py}}" ]]; then
    rm -rf .tools/venv
    python3 -m venv .tools/venv
    .tools/venv/bin/python -m pip install --disable-pip-version-check --quiet "componentize-py=={{componentize_py}}"
fi
env -u VIRTUAL_ENV "$componentize_py" --quiet -d wit -w {{world}} componentize -p . app -o {{name}}.wasm
echo "built {{name}}.wasm ($(wc -c <{{name}}.wasm) bytes)"
./check.sh
