#!/usr/bin/env bash
# Regenerates bindings/ from ../../../wit with wit-bindgen's C generator. Run it after the
# contract changes; the bindings are committed so that building the example needs only clang.
#
# Needs wit-bindgen-cli 0.63.0 with its C generator (about 8 minutes to build on 2 cores):
#   cargo install wit-bindgen-cli@0.63.0 --locked --no-default-features --features c
# WIT_BINDGEN names the binary when it is not on the PATH.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
"${WIT_BINDGEN:-wit-bindgen}" c "$HERE/../../../wit" --world bucket-strategy --out-dir "$HERE/bindings"
