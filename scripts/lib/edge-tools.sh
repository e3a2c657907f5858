# Sourced by scripts/release and scripts/prove-arm64: installs, into $EDGE_TOOLS, what building
# and running frostline for another architecture needs, and defines the helpers both use.
#
# - Rust's musl targets (rustup), and llvm-objcopy (rustup's llvm-tools) to strip and split
#   debug info for any architecture.
# - Zig (PyPI's `ziglang`) and cargo-zigbuild, as the C compiler and linker for the musl
#   targets: Debian ships a musl C toolchain for the host (musl-tools) but none for aarch64,
#   and frostline's dependencies compile C (zstd, ring).
# - qemu-aarch64 from Debian's qemu-user-static, unpacked without installing (no root).
EDGE_TOOLS="${EDGE_TOOLS:-$HOME/.cache/frostline/tools}"
mkdir -p "$EDGE_TOOLS"

edge_rust_targets() {
    rustup set auto-self-update disable >/dev/null 2>&1 || true
    rustup target add wasm32-wasip2 "$@" >&2
    rustup component add llvm-tools >&2
    local host
    host="$(rustc -vV | sed -n 's/^host: //p')"
    LLVM_OBJCOPY="$(rustc --print sysroot)/lib/rustlib/$host/bin/llvm-objcopy"
    [ -x "$LLVM_OBJCOPY" ] || { echo "llvm-objcopy not found at $LLVM_OBJCOPY (rustup component llvm-tools)" >&2; exit 1; }
}

edge_zig() {
    local venv="$EDGE_TOOLS/zig"
    if ! "$venv/bin/cargo-zigbuild" --version >/dev/null 2>&1; then
        python3 -m venv "$venv" >&2
        "$venv/bin/pip" install --disable-pip-version-check --quiet 'ziglang==0.17.1' 'cargo-zigbuild==0.24.1' >&2
    fi
    export PATH="$venv/bin:$PATH"
}

edge_qemu() {
    local dir="$EDGE_TOOLS/qemu"
    QEMU_AARCH64="$dir/usr/bin/qemu-aarch64-static"
    if [ ! -x "$QEMU_AARCH64" ]; then
        local deb
        deb="$(mktemp -d)"
        (cd "$deb" && apt-get download qemu-user-static >&2)
        dpkg -x "$deb"/qemu-user-static_*.deb "$dir"
        rm -rf "$deb"
    fi
    "$QEMU_AARCH64" --version | head -1 >&2
}

# The version of the workspace, as Cargo.toml says.
edge_version() {
    sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1
}

# Precompiles the built-ins for TRIPLE with the full build HOST_BINARY into DIR, replacing only
# the files whose bytes changed: the lean build embeds DIR's files, and cargo rebuilds it when
# their path or modification time changes.
edge_builtins() {
    local host_binary="$1" triple="$2" dir="$3" fresh
    fresh="$(mktemp -d)"
    "$host_binary" plugin compile --target "$triple" --builtins --out "$fresh" >&2
    mkdir -p "$dir"
    for file in "$fresh"/*; do
        cmp -s "$file" "$dir/$(basename "$file")" || cp "$file" "$dir/"
    done
    rm -rf "$fresh"
}
