#!/usr/bin/env bash
# The test command: installs what the tests need, builds every binary, runs every test (as root).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" != 0 ]; then
    echo "tests/run.sh: the privileged tests need root (network namespaces, bridges, firewall rules)" >&2
    exit 1
fi
tests/setup.sh
# Integration tests exec the plugins from target/debug, so build every binary first.
cargo build --workspace --bins
cargo test --workspace --no-fail-fast "$@"
