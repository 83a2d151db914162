#!/usr/bin/env bash
# Builds the multi-call plugin binary cni-rs statically linked, for the VM tests (the guest has no
# glibc), and prints its path. A debug build without debug info: it builds fastest, and the guest
# only waits on netlink. --target keeps crt-static away from build scripts and proc macros.
set -euo pipefail
cd "$(dirname "$0")/../.."
triple=x86_64-unknown-linux-gnu
RUSTFLAGS="-C target-feature=+crt-static -C debuginfo=0" "${CARGO:-cargo}" build -q --target "$triple" -p cni-rs >&2
echo "${CARGO_TARGET_DIR:-$PWD/target}/$triple/debug/cni-rs"
