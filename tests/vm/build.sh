#!/usr/bin/env bash
# Builds the multi-call plugin binary cni-rs statically linked, as a node gets it (static musl:
# install/static-target.sh), for the VM tests (the guest has no libc), and prints its path. A debug
# build without debug info: it builds fastest, and the guest only waits on netlink.
set -euo pipefail
cd "$(dirname "$0")/../.."
triple="$(install/static-target.sh --install)"
RUSTFLAGS="$(install/static-target.sh --rustflags) -C debuginfo=0" "${CARGO:-cargo}" build -q --target "$triple" -p cni-rs >&2
echo "${CARGO_TARGET_DIR:-$PWD/target}/$triple/debug/cni-rs"
