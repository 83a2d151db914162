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
# The VM tests boot a static cni-rs (tests/vm/build.sh): build it before the clock of any test starts.
tests/vm/build.sh >/dev/null
log=$(mktemp)
trap 'rm -f "$log"' EXIT
set +e
cargo test --workspace --no-fail-fast "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
set -e
# One closing line for the whole run (cargo prints one per test binary).
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed;?$/) p += $i; if ($(i+1) ~ /^failed;?$/) f += $i } }
     END { printf "summary: %d passed, %d failed\n", p, f }' "$log"
exit "$rc"
