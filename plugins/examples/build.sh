#!/usr/bin/env bash
# Builds the Python and JavaScript example plugins into OUT_DIR:
#   OUT_DIR/iso-week-py.wasm          bucket-strategy (Python, componentize-py 0.25.1)
#   OUT_DIR/fiscal-quarter-js.wasm    bucket-strategy (JavaScript, componentize-js 0.23.0, SpiderMonkey)
#   OUT_DIR/gzip-archiver-py.wasm     archiver over the host's blob store (Python)
#   OUT_DIR/prefix-archiver-js.wasm   archiver over the host's blob store (JavaScript)
#   OUT_DIR/hour-c.wasm               bucket-strategy (C, Debian's clang 19, wit-bindgen's C
#                                     bindings from hour-c/bindings/, wrapped by `jco new`)
# (The Rust example archiver, dir-archiver-rs, is built with the guest workspace by
# engine/build.rs.)
#
# Usage: plugins/examples/build.sh OUT_DIR
#
# Needs only python3 (with venv and pip), node and npm, and apt-get and dpkg for the C
# toolchain. Installs its own tools on first use (about 20 s, from PyPI, the npm registry and
# Debian's archive) and reuses them afterwards:
#   plugins/examples/.tools/venv                  componentize-py==0.25.1
#   plugins/examples/fiscal-quarter-js/node_modules   from package-lock.json (npm ci); the
#                                                     JavaScript archiver uses the same install,
#                                                     and the C example its jco
#   plugins/examples/.tools/c                     Debian's clang-19, lld-19, wasi-libc and
#                                                 libclang-rt-19-dev-wasm32, unpacked with
#                                                 `apt-get download` and `dpkg -x` (no root)
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

# The C toolchain: Debian's packages unpacked into .tools/c (apt-get download needs no root).
C_ROOT="$HERE/.tools/c"
C_PACKAGES=(clang-19 libclang-cpp19 libllvm19 libclang-common-19-dev libclang1-19 llvm-19-linker-tools
    lld-19 wasi-libc libclang-rt-19-dev-wasm32)
if [[ -x "$C_ROOT/usr/lib/llvm-19/bin/clang" && -f "$C_ROOT/usr/lib/wasm32-wasi/crt1-reactor.o" ]]; then
    echo "clang 19 for wasm32-wasi: already unpacked in $C_ROOT"
else
    echo "clang 19 for wasm32-wasi: unpacking Debian's packages into $C_ROOT"
    command -v apt-get >/dev/null && command -v dpkg >/dev/null ||
        die "apt-get and dpkg are needed to fetch Debian's clang-19 and wasi-libc for the C example"
    download="$(mktemp -d)"
    (cd "$download" && apt-get download "${C_PACKAGES[@]}" >/dev/null) ||
        die "apt-get download ${C_PACKAGES[*]} failed"
    rm -rf "$C_ROOT" && mkdir -p "$C_ROOT"
    for deb in "$download"/*.deb; do dpkg -x "$deb" "$C_ROOT"; done
    rm -rf "$download"
fi

# build_c NAME OUT: clang (wasm32-wasi reactor) on NAME/*.c and its wit-bindgen bindings, then
# `jco new` to wrap the core module -> OUT
build_c_to() {
    local name="$1" out="$2" core
    core="$(mktemp --suffix=.wasm)"
    (
        cd "$HERE/$name"
        LD_LIBRARY_PATH="$C_ROOT/usr/lib/x86_64-linux-gnu:$C_ROOT/usr/lib/llvm-19/lib" \
            "$C_ROOT/usr/lib/llvm-19/bin/clang" --target=wasm32-wasi -mexec-model=reactor \
            --sysroot="$C_ROOT/usr" -isystem "$C_ROOT/usr/include/wasm32-wasi" -L"$C_ROOT/usr/lib/wasm32-wasi" \
            -resource-dir "$C_ROOT/usr/lib/llvm-19/lib/clang/19" -fuse-ld="$C_ROOT/usr/lib/llvm-19/bin/wasm-ld" \
            -Os -Wall -Wextra -Werror -Wl,--strip-all -o "$core" ./*.c bindings/*.c bindings/*_component_type.o
    )
    "$JS_DIR/node_modules/.bin/jco" new "$core" -o "$out" >/dev/null
    rm -f "$core"
}

# build_c NAME: build_c_to twice, and refuse bytes that differ between the two builds.
build_c() {
    local name="$1" start again
    start="$(now)"
    echo "building $OUT_DIR/$name.wasm"
    rm -f "$OUT_DIR/$name.wasm"
    build_c_to "$name" "$OUT_DIR/$name.wasm.tmp"
    again="$(mktemp --suffix=.wasm)"
    build_c_to "$name" "$again"
    cmp -s "$OUT_DIR/$name.wasm.tmp" "$again" || die "$name: two builds gave different bytes"
    rm -f "$again"
    mv "$OUT_DIR/$name.wasm.tmp" "$OUT_DIR/$name.wasm"
    echo "  $(wc -c <"$OUT_DIR/$name.wasm") bytes in $(since "$start") s (built twice, the same bytes)"
}

build_py iso-week-py bucket-strategy
build_js fiscal-quarter-js bucket-strategy
build_py gzip-archiver-py archiver
build_js prefix-archiver-js archiver
build_c hour-c
