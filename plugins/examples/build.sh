#!/usr/bin/env bash
# Builds the Python and JavaScript example plugins into OUT_DIR:
#   OUT_DIR/iso-week-py.wasm          bucket-strategy (Python, componentize-py 0.25.1)
#   OUT_DIR/fiscal-quarter-js.wasm    bucket-strategy (JavaScript, componentize-js 0.23.0, SpiderMonkey)
#   OUT_DIR/gzip-archiver-py.wasm     archiver over the host's blob store (Python)
#   OUT_DIR/prefix-archiver-js.wasm   archiver over the host's blob store (JavaScript)
# (The Rust example archiver, dir-archiver-rs, is built with the guest workspace by
# engine/build.rs.)
#
# Usage: plugins/examples/build.sh OUT_DIR
#
# Needs only python3 (with venv and pip), node and npm. Installs its own tools on first use
# (about 20 s, from PyPI and the npm registry) and reuses them afterwards:
#   plugins/examples/.tools/venv                  componentize-py==0.25.1
#   plugins/examples/fiscal-quarter-js/node_modules   from package-lock.json (npm ci); the
#                                                     JavaScript archiver uses the same install
# The WIT is ../../wit from this script; FROSTLINE_WIT_DIR overrides it.
set -euo pipefail

if [[ $# -ne 1 || -z "$1" ]]; then
    echo "usage: $0 OUT_DIR" >&2
    exit 2
fi

HERE="$(cd "$(dirname "$0")" && pwd)"
WIT_DIR="${FROSTLINE_WIT_DIR:-$HERE/../../wit}"
PY_VERSION="0.25.1"
JS_VERSION="0.23.0"
VENV="$HERE/.tools/venv"
JS_DIR="$HERE/fiscal-quarter-js"
COMPONENTIZE_JS="$JS_DIR/node_modules/.bin/componentize-js"

die() { echo "build.sh: $*" >&2; exit 1; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

for tool in python3 node npm; do
    command -v "$tool" >/dev/null 2>&1 || die "$tool is required but not on PATH"
done
[[ -d "$WIT_DIR" ]] || die "WIT directory not found: $WIT_DIR"
WIT_DIR="$(cd "$WIT_DIR" && pwd)"

mkdir -p "$1"
OUT_DIR="$(cd "$1" && pwd)"

# ---- tools ---------------------------------------------------------------------------------

if [[ "$("$VENV/bin/componentize-py" --version 2>/dev/null || true)" == "componentize-py $PY_VERSION" ]]; then
    echo "componentize-py $PY_VERSION: already installed in $VENV"
else
    echo "componentize-py $PY_VERSION: installing into $VENV"
    rm -rf "$VENV"
    python3 -m venv "$VENV" || die "python3 -m venv failed (on Debian/Ubuntu: apt-get install python3-venv)"
    "$VENV/bin/python" -m pip install --disable-pip-version-check --quiet "componentize-py==$PY_VERSION"
fi

# Installed and current: the pinned componentize-js is there, and npm's record of what it
# installed (node_modules/.package-lock.json) is not older than the committed lockfile.
installed_js="$(cd "$JS_DIR" && node -p \
    "try { require('./node_modules/@bytecodealliance/componentize-js/package.json').version } catch (e) { '' }")"
if [[ "$installed_js" == "$JS_VERSION" && -f "$JS_DIR/node_modules/@bytecodealliance/preview2-shim/package.json" \
      && ! "$JS_DIR/package-lock.json" -nt "$JS_DIR/node_modules/.package-lock.json" ]]; then
    echo "componentize-js $JS_VERSION: already installed in $JS_DIR/node_modules"
else
    echo "componentize-js $JS_VERSION: installing into $JS_DIR/node_modules (npm ci)"
    (cd "$JS_DIR" && npm ci --no-audit --no-fund --loglevel=error)
fi

# ---- components ----------------------------------------------------------------------------
# Each is written to a temporary name first, so a failed build leaves no stale .wasm behind.

# build_py NAME WORLD: componentize-py on NAME/app.py (and its helper modules) -> OUT_DIR/NAME.wasm
build_py() {
    local name="$1" world="$2" start
    start="$(now)"
    echo "building $OUT_DIR/$name.wasm"
    rm -f "$OUT_DIR/$name.wasm"
    (
        cd "$HERE/$name"
        # -p . : the app (app.py) and any helper module come from this folder.
        env -u VIRTUAL_ENV "$VENV/bin/componentize-py" --quiet -d "$WIT_DIR" -w "$world" \
            componentize -p . app -o "$OUT_DIR/$name.wasm.tmp"
    )
    mv "$OUT_DIR/$name.wasm.tmp" "$OUT_DIR/$name.wasm"
    echo "  $(wc -c <"$OUT_DIR/$name.wasm") bytes in $(since "$start") s"
}

# build_js NAME WORLD: componentize-js on NAME/app.js -> OUT_DIR/NAME.wasm
build_js() {
    local name="$1" world="$2" start
    start="$(now)"
    echo "building $OUT_DIR/$name.wasm"
    rm -f "$OUT_DIR/$name.wasm"
    (
        cd "$HERE/$name"
        # -d ...: no WASI features, so the component imports only frostline:plugin (without
        # `http fetch-event` it would import wasi:http and not link in the frostline host).
        "$COMPONENTIZE_JS" app.js --wit "$WIT_DIR" --world-name "$world" \
            -d stdio random clocks http fetch-event -o "$OUT_DIR/$name.wasm.tmp"
    )
    mv "$OUT_DIR/$name.wasm.tmp" "$OUT_DIR/$name.wasm"
    echo "  $(wc -c <"$OUT_DIR/$name.wasm") bytes in $(since "$start") s"
}

build_py iso-week-py bucket-strategy
build_js fiscal-quarter-js bucket-strategy
build_py gzip-archiver-py archiver
build_js prefix-archiver-js archiver
