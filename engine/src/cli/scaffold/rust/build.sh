#!/usr/bin/env bash
# Builds {{name}}.wasm (a wasm32-wasip2 component) and runs `frostline plugin check` on it.
# Needs Rust 1.95 with rustup (the target is installed here), and `frostline` on the
# PATH or named by FROSTLINE.
set -euo pipefail
cd "$(dirname "$0")"
rustup target add wasm32-wasip2 >/dev/null
cargo build --release --target wasm32-wasip2
cp "${CARGO_TARGET_DIR:-target}/wasm32-wasip2/release/{{crate}}.wasm" {{name}}.wasm
echo "built {{name}}.wasm ($(wc -c <{{name}}.wasm) bytes)"
./check.sh
